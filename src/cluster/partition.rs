//! One partition run by this node while it holds the partition's lease: its engine, fed by its
//! input subject in stream order, publishing through its [`Outbox`].
//!
//! A takeover, in order:
//! 1. **restore**: read the checkpoint pointer, rebuild the engine from the checkpoint object
//!    with the fences as of the checkpoint's fence position (or start empty);
//! 2. **suppress**: read the ids of the events the partition published after the checkpoint's
//!    mark ([`outbox::published_after`]): replaying the input after the checkpoint produces them
//!    again, with the same ids, and they must not be published twice;
//! 3. **replay**: apply the input after the checkpoint's position, publishing only what the
//!    previous owner had not published;
//! 4. **live**: caught up; the owner also writes the partition's watermark ticks now.
//!
//! Every record is applied exactly as on every other replay of it: fixes with their ingest
//! stamps, ticks as advances, fence markers as the fence log's changes up to the marker. What
//! the task does between records (draining timers carried over by the fire cap) changes when
//! events come out, never which.
//!
//! Checkpoints: every `checkpoint_interval`, when input was applied since the last one, the
//! engine freezes its state (copy on write: it goes on working), hands its devices out a chunk
//! at a time into an object, and once every event produced before the freeze is in the stream,
//! the pointer moves to it; the input before the *previous* checkpoint is then purged (one
//! checkpoint is kept as a fallback). On a graceful stop (a handover or shutdown) the task stops
//! taking input, waits for its outbox, and writes a final checkpoint, so the next owner replays
//! nothing.
//!
//! Invariants: the task acts on the partition (ticks, checkpoints, publishing) only while its
//! lease is valid; it ends when the lease is lost; it answers every query it takes.
//!
//! Why this file is long: the partition task is one state machine (restore, suppress, replay,
//! live, checkpoint, stop) over one `Part`; its checkpoint writing and restoring share its
//! freeze and pointer types and are read together with it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::message::PublishMessage;
use futures_util::StreamExt;
use metrics::{counter, gauge, histogram};
use tokio::sync::{mpsc, oneshot};

use super::checkpoint::{self, Encoder, Pointer};
use super::fences::{Change, FenceLog};
use super::ingest::{REPLY_HEADER, encode_outcomes};
use super::lease::Lease;
use super::nats::{Nats, NatsError, in_subject, outcome_subject, query_subject};
use super::outbox::{self, Outbox};
use super::query;
use super::record::{PartitionInput, decode_record, encode_tick};
use super::status::{Board, Phase, TakeoverTimes};
use crate::clock::{ClockMode, Watermark};
use crate::telemetry as t;
use geodwell_core::engine::{DeviceSummary, DeviceView, Engine, EngineConfig};
use geodwell_core::event::Event;

/// What every partition task of the node shares.
#[derive(Debug)]
pub struct Shared {
    /// NATS.
    pub nats: Nats,
    /// This node's id.
    pub node: String,
    /// The fence log's follower.
    pub fences: Arc<FenceLog>,
    /// The node's watermark (event mode: the cluster's, as this node knows it).
    pub watermark: Arc<Watermark>,
    /// Each partition engine's configuration.
    pub engine: EngineConfig,
    /// Longest device id.
    pub max_device_len: usize,
    /// `devices.idle_ttl`: the owner sweeps for idle devices (`None`: never).
    pub idle: Option<geodwell_core::engine::IdleRule>,
    /// How often to checkpoint.
    pub checkpoint_every: Duration,
    /// Where tasks report.
    pub board: Arc<Board>,
}

/// What a partition task is asked.
#[derive(Debug)]
pub enum Control {
    /// A device's state.
    Device {
        /// Its id.
        id: String,
        /// Where to answer.
        reply: oneshot::Sender<Option<DeviceView>>,
    },
    /// A page of devices from slot `from`.
    Page {
        /// First slot.
        from: u32,
        /// Page length.
        limit: usize,
        /// Where to answer.
        reply: oneshot::Sender<(Vec<DeviceSummary>, Option<u32>)>,
    },
    /// An occupancy query ([`query::answer_occupancy`]), answered encoded as to another node.
    Ask {
        /// The query.
        req: query::Request,
        /// Where to answer.
        reply: oneshot::Sender<Vec<u8>>,
    },
    /// Stop taking input, publish what is produced, write a final checkpoint, and end.
    Stop,
}

/// Why a partition task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Asked to stop (its final checkpoint written, or not if `checkpointed` is false).
    Stopped {
        /// Whether the final checkpoint was written.
        checkpointed: bool,
    },
    /// Its lease was lost: it stood down.
    LeaseLost,
    /// It failed (the lease is released so another node can try).
    Failed(String),
}

/// Devices handed from the engine into a checkpoint object per step.
const CHECKPOINT_CHUNK: usize = 2048;
/// Device slots one idle sweep looks at.
const IDLE_SCAN: usize = 8192;

/// A checkpoint being frozen.
struct Freeze {
    enc: Encoder,
    produced: u64,
    input_seq: u64,
    fence_pos: u64,
    ev_mark: u64,
    started: Instant,
}

/// The task's state.
struct Part {
    p: u16,
    label: String,
    sh: Arc<Shared>,
    lease: Arc<Lease>,
    engine: Engine,
    /// The last input record applied.
    applied: u64,
    /// The fence stream position applied.
    fence_pos: u64,
    /// The newest `Fences` marker seen in the input.
    marker: u64,
    outbox: Outbox,
    out: Vec<Event>,
    /// A tick was published and not seen back yet (when).
    tick_outstanding: Option<Instant>,
    /// Timers carried over by the fire cap: drain before waiting.
    carried: bool,
    /// The newest checkpoint (pointer) this task knows.
    pointer: Option<Pointer>,
    /// A checkpoint being written in the background.
    writing: Option<tokio::task::JoinHandle<Option<Pointer>>>,
}

/// Runs partition `p` while `lease` holds.
pub async fn run(
    p: u16,
    lease: Arc<Lease>,
    sh: Arc<Shared>,
    control: mpsc::Receiver<Control>,
) -> Ended {
    let epoch = lease.epoch();
    sh.board.update(p, epoch, |s| s.phase = Phase::Restoring);
    let ended = match run_inner(p, lease.clone(), sh.clone(), control).await {
        Ok(e) => e,
        Err(e) => Ended::Failed(e.to_string()),
    };
    sh.board.remove(p, epoch);
    gauge!(t::CLUSTER_PARTITION_LAG, "partition" => p.to_string()).set(0.0);
    ended
}

async fn run_inner(
    p: u16,
    lease: Arc<Lease>,
    sh: Arc<Shared>,
    mut control: mpsc::Receiver<Control>,
) -> Result<Ended, NatsError> {
    let epoch = lease.epoch();
    let t0 = Instant::now();
    let (engine, pointer) = restore(&sh, p).await?;
    let restore_ms = t0.elapsed().as_millis() as u64;
    let (applied, fence_pos, ev_mark) = pointer
        .as_ref()
        .map_or((0, 0, 0), |c| (c.input_seq, c.fence_pos, c.ev_mark));
    let t1 = Instant::now();
    let (suppress, last): (HashSet<u128>, u64) =
        outbox::published_after(&sh.nats, p, ev_mark).await?;
    let suppress_ms = t1.elapsed().as_millis() as u64;
    let suppressed = suppress.len();
    let (outbox, outbox_task) = Outbox::spawn(sh.nats.clone(), p, lease.clone(), last, suppress);
    let mut part = Part {
        p,
        label: p.to_string(),
        sh: sh.clone(),
        lease: lease.clone(),
        engine,
        applied,
        fence_pos,
        marker: fence_pos,
        outbox,
        out: Vec::new(),
        tick_outstanding: None,
        carried: false,
        pointer,
        writing: None,
    };
    let mut queries = sh
        .nats
        .client
        .subscribe(query_subject(p))
        .await
        .map_err(|e| NatsError::request("subscribe to partition queries", e))?;
    let consumer = sh
        .nats
        .input
        .create_consumer(pull::OrderedConfig {
            filter_subject: in_subject(p),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: applied + 1,
            },
            ..Default::default()
        })
        .await
        .map_err(|e| NatsError::request("partition input consumer", e))?;
    let mut caught_up = consumer.cached_info().num_pending == 0;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| NatsError::request("partition input consumer", e))?;
    let t2 = Instant::now();
    let mut replayed = 0u64;
    let mut times = TakeoverTimes {
        restore_ms,
        suppress_ms,
        replay_ms: 0,
        replayed_records: 0,
    };
    let phase = if caught_up {
        Phase::Live
    } else {
        Phase::Replaying
    };
    sh.board.update(p, epoch, |s| {
        s.phase = phase;
        s.input_position = applied;
        s.checkpoint_position = applied;
        s.checkpoint_at_ms = part.pointer.as_ref().map_or(0, |c| c.at_ms);
        if caught_up {
            s.takeover = Some(times);
        }
    });
    tracing::info!(
        partition = p,
        epoch,
        from = applied,
        fence_pos,
        suppressed,
        restore_ms,
        suppress_ms,
        "partition taken"
    );
    counter!(t::CLUSTER_TAKEOVERS).increment(1);
    let mut w_rx = sh.watermark.subscribe();
    let mut ck_timer = tokio::time::interval(sh.checkpoint_every);
    ck_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ck_timer.reset();
    let mut housekeeping = tokio::time::interval(Duration::from_millis(500));
    let mut idle_timer = tokio::time::interval(Duration::from_millis(100));
    idle_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut fence_behind_since: Option<Instant> = None;
    let mut freeze: Option<Freeze> = None;
    let clock = sh.watermark.mode();
    let ended = loop {
        if part.carried {
            part.engine.begin_step();
            let w = part.engine.watermark();
            if let Some(w) = w {
                part.carried = part.engine.advance(w, &mut part.out).carried;
            } else {
                part.carried = false;
            }
            part.engine.end_step();
            if !part.flush().await {
                break Ended::LeaseLost;
            }
            tokio::task::yield_now().await;
        }
        let tick_at = if caught_up && !part.carried {
            part.tick_due(clock)
        } else {
            None
        };
        tokio::select! {
            biased;
            _ = lease.lost().cancelled() => break Ended::LeaseLost,
            c = control.recv() => match c {
                Some(Control::Device { id, reply }) => {
                    let _ = reply.send(part.engine.device(&id));
                }
                Some(Control::Page { from, limit, reply }) => {
                    let _ = reply.send(part.engine.device_page(from, limit));
                }
                Some(Control::Ask { req, reply }) => {
                    let _ = reply.send(
                        query::answer_occupancy(&part.engine, &req).unwrap_or_default(),
                    );
                }
                Some(Control::Stop) | None => {
                    let checkpointed = part.final_checkpoint(freeze.take()).await;
                    break Ended::Stopped { checkpointed };
                }
            },
            m = messages.next() => {
                let m = match m {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => {
                        tracing::warn!(partition = p, error = %e, "partition input; retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                    None => return Err(NatsError::request("partition input", "consumer ended")),
                };
                let info = m.info().map_err(|e| NatsError::request("partition input", e))?;
                let (seq, pending) = (info.stream_sequence, info.pending);
                if seq <= part.applied {
                    continue;
                }
                if seq > part.applied + 1 && part.applied > 0 {
                    // Only a purge removes input, and only input a checkpoint covers.
                    tracing::debug!(partition = p, from = part.applied, to = seq, "input gap (purged records of subjects sharing the stream)");
                }
                let reply = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(REPLY_HEADER))
                    .map(|v| v.as_str().to_string());
                let rec = decode_record(&m.payload, sh.max_device_len).map_err(|e| NatsError::Corrupt {
                    what: format!("input record {seq} of partition {p}"),
                    detail: e.0,
                })?;
                if !caught_up {
                    replayed += 1;
                }
                part.apply(seq, rec, reply, caught_up).await?;
                if !part.flush().await {
                    break Ended::LeaseLost;
                }
                gauge!(t::CLUSTER_PARTITION_LAG, "partition" => part.label.clone()).set(pending as f64);
                if pending == 0 && !caught_up {
                    caught_up = true;
                    times.replay_ms = t2.elapsed().as_millis() as u64;
                    times.replayed_records = replayed;
                    histogram!(t::CLUSTER_TAKEOVER_SECONDS, "phase" => "restore").record(restore_ms as f64 / 1000.0);
                    histogram!(t::CLUSTER_TAKEOVER_SECONDS, "phase" => "suppress").record(suppress_ms as f64 / 1000.0);
                    histogram!(t::CLUSTER_TAKEOVER_SECONDS, "phase" => "replay").record(times.replay_ms as f64 / 1000.0);
                    tracing::info!(partition = p, epoch, replayed, replay_ms = times.replay_ms, "partition live");
                }
                let (applied, live) = (part.applied, caught_up);
                sh.board.update(p, epoch, |s| {
                    s.input_position = applied;
                    s.lag_records = pending;
                    if live {
                        s.phase = Phase::Live;
                        s.takeover.get_or_insert(times);
                    }
                });
            }
            q = queries.next() => {
                if let Some(q) = q {
                    part.answer(q).await;
                }
            }
            _ = sleep_until(tick_at), if tick_at.is_some() => part.publish_tick(clock).await,
            _ = idle_timer.tick(), if caught_up && sh.idle.is_some() => part.publish_idle().await,
            changed = w_rx.changed(), if clock == ClockMode::Event => {
                if changed.is_err() {
                    break Ended::Stopped { checkpointed: false };
                }
            }
            _ = ck_timer.tick(), if freeze.is_none() && part.writing.is_none() => {
                if caught_up && lease.valid() && part.applied > part.pointer.as_ref().map_or(0, |c| c.input_seq) {
                    freeze = Some(part.begin_checkpoint());
                }
            }
            // The frozen devices go into the object a chunk at a time between records.
            _ = std::future::ready(()), if freeze.is_some() => {
                if let Some(f) = freeze.as_mut() {
                    let mut devices = Vec::with_capacity(CHECKPOINT_CHUNK);
                    let done = part.engine.checkpoint_next(CHECKPOINT_CHUNK, &mut devices);
                    f.enc.devices(&devices);
                    if done && let Some(f) = freeze.take() {
                        part.writing = Some(tokio::spawn(write_checkpoint(
                            sh.clone(), p, lease.clone(), part.outbox.clone(), f, part.pointer.clone(),
                        )));
                    }
                }
                // This branch is always ready: without a yield the task would hand out a whole
                // round before the tasks sharing its worker thread (HTTP ingest) could run.
                tokio::task::yield_now().await;
            }
            _ = housekeeping.tick() => {
                if let Some(w) = part.writing.as_ref()
                    && w.is_finished()
                    && let Some(w) = part.writing.take()
                    && let Ok(Some(ptr)) = w.await
                {
                    let (pos, at) = (ptr.input_seq, ptr.at_ms);
                    part.pointer = Some(ptr);
                    sh.board.update(p, epoch, |s| {
                        s.checkpoint_position = pos;
                        s.checkpoint_at_ms = at;
                    });
                }
                // A fence change whose writer stopped before every partition had its marker:
                // the owner writes the marker itself once the change has waited a while.
                let applied_fences = sh.fences.applied();
                if applied_fences > part.marker && caught_up {
                    let since = *fence_behind_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_secs(2) && lease.valid() {
                        if let Ok(ack) = sh.fences.publish_marker(p, applied_fences).await {
                            let _ = ack.await;
                        }
                        fence_behind_since = None;
                    }
                } else {
                    fence_behind_since = None;
                }
                if let Some(ew) = part.engine.watermark() {
                    gauge!(t::WATERMARK_LAG_SECONDS, "shard" => part.label.clone())
                        .set(sh.watermark.wall().now().since(ew).as_secs_f64().max(0.0));
                }
                if let Some(ptr) = part.pointer.as_ref() {
                    gauge!(t::CLUSTER_CHECKPOINT_AGE_SECONDS, "partition" => part.label.clone())
                        .set((sh.watermark.wall().now().0 - ptr.at_ms).max(0) as f64 / 1000.0);
                }
            }
        }
    };
    // Whatever was produced goes out while the lease holds, then the outbox ends.
    drop(part.outbox);
    let _ = tokio::time::timeout(Duration::from_secs(10), outbox_task).await;
    if let Some(w) = part.writing.take() {
        let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
    }
    Ok(ended)
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}

impl Part {
    /// Applies input record `seq`; fix outcomes go back to the node that ingested them.
    async fn apply(
        &mut self,
        seq: u64,
        rec: PartitionInput,
        reply: Option<String>,
        live: bool,
    ) -> Result<(), NatsError> {
        self.engine.begin_step();
        match rec {
            PartitionInput::Fixes(fixes) => {
                let outcomes: Vec<_> = fixes
                    .iter()
                    .map(|(fix, stamp)| self.engine.ingest(fix, *stamp, &mut self.out))
                    .collect();
                // Replies to requests still waiting; a replayed record's request is long gone.
                if live
                    && let Some((node, req)) = reply.as_deref().and_then(|r| r.rsplit_once('.'))
                    && let Ok(req) = req.parse::<u64>()
                {
                    let _ = self
                        .sh
                        .nats
                        .client
                        .publish(
                            outcome_subject(node),
                            encode_outcomes(req, &outcomes).into(),
                        )
                        .await;
                }
            }
            PartitionInput::Removed(r) => {
                let n = crate::shard::apply_removal(&mut self.engine, &r, &mut self.out);
                let reason = if r.idle.is_some() { "idle" } else { "delete" };
                if live {
                    counter!(t::DEVICES_REMOVED, "reason" => reason).increment(n as u64);
                }
            }
            PartitionInput::Tick(w) => {
                self.tick_outstanding = None;
                self.carried = self.engine.advance(w, &mut self.out).carried;
            }
            PartitionInput::Fences(c) => {
                self.marker = self.marker.max(c);
                if c > self.fence_pos {
                    if !self
                        .sh
                        .fences
                        .wait_applied(c, Duration::from_secs(60))
                        .await
                    {
                        return Err(NatsError::request(
                            "apply a fence marker",
                            format!("fence change {c} not applied on this node within 60s"),
                        ));
                    }
                    let changes = self
                        .sh
                        .fences
                        .changes_between(self.fence_pos, c)
                        .map_err(|e| NatsError::request("apply a fence marker", e))?;
                    for ch in changes {
                        match ch {
                            Change::Put(f) => {
                                self.engine.upsert_fence(f, &mut self.out);
                            }
                            Change::Delete(id) => {
                                self.engine.remove_fence(&id);
                            }
                        }
                    }
                    self.fence_pos = c;
                }
            }
        }
        self.engine.end_step();
        self.applied = seq;
        Ok(())
    }

    /// Hands the events produced so far to the outbox. False once the outbox stopped (the lease
    /// was lost).
    async fn flush(&mut self) -> bool {
        if self.out.is_empty() {
            return true;
        }
        let now = self.sh.watermark.wall().now();
        let mut events = std::mem::take(&mut self.out);
        for e in &mut events {
            e.emitted_at = Some(now);
        }
        self.outbox.send(events).await
    }

    /// When the owner should write a tick, if it should.
    fn tick_due(&self, clock: ClockMode) -> Option<Instant> {
        if self
            .tick_outstanding
            .is_some_and(|t| t.elapsed() < Duration::from_secs(2))
        {
            return None;
        }
        let due = self.engine.next_due()?;
        let wm = &self.sh.watermark;
        match clock {
            ClockMode::Live => Some(wm.wall().instant_at(due.plus(wm.lateness()))),
            ClockMode::Event => {
                let w = wm.current()?;
                (due <= w && self.engine.watermark().is_none_or(|e| e < w)).then(Instant::now)
            }
        }
    }

    /// Looks for idle devices and, if any, writes their removal to the partition's input, with
    /// the idle TTL: applied when it comes back, to those still idle then (not waited for).
    async fn publish_idle(&mut self) {
        let (Some(rule), Some(w)) = (self.sh.idle, self.engine.watermark()) else {
            return;
        };
        if !self.lease.valid() {
            return;
        }
        let ids = self.engine.expire_idle(rule, w, IDLE_SCAN);
        if ids.is_empty() {
            return;
        }
        let mut rec = Vec::new();
        crate::store::input::encode_removal(
            &crate::store::input::Removal {
                w_before: None,
                idle: Some(rule.ttl),
                ids: ids.iter().map(|s| s.to_string()).collect(),
            },
            &mut rec,
        );
        let msg = PublishMessage::build().payload(rec.into());
        match self.sh.nats.js.send_publish(in_subject(self.p), msg).await {
            Ok(ack) => {
                tokio::spawn(async move {
                    let _ = ack.await;
                });
            }
            Err(e) => tracing::debug!(partition = self.p, error = %e, "idle removal not published"),
        }
    }

    /// Writes a tick to the partition's input (applied when it comes back, like any record).
    async fn publish_tick(&mut self, clock: ClockMode) {
        let wm = &self.sh.watermark;
        let w = match clock {
            ClockMode::Live => Some(wm.wall().now().minus(wm.lateness())),
            ClockMode::Event => wm.current(),
        };
        let Some(w) = w else { return };
        if !self.lease.valid() {
            return;
        }
        self.tick_outstanding = Some(Instant::now());
        let msg = PublishMessage::build().payload(encode_tick(w).into());
        match self.sh.nats.js.send_publish(in_subject(self.p), msg).await {
            Ok(ack) => {
                // Not waited for: the tick is seen back in the input.
                tokio::spawn(async move {
                    let _ = ack.await;
                });
                counter!(t::CLUSTER_TICKS).increment(1);
            }
            Err(e) => tracing::debug!(partition = self.p, error = %e, "tick not published"),
        }
    }

    /// Answers a query from another node (or this one).
    async fn answer(&mut self, q: async_nats::Message) {
        let Some(reply) = q.reply.clone() else { return };
        let body = match query::Request::decode(&q.payload) {
            Some(query::Request::Device { id }) => query::encode_device(self.engine.device(&id)),
            Some(query::Request::Page { from, limit }) => {
                let (page, next) = self.engine.device_page(from, limit.min(query::MAX_PAGE));
                query::encode_page(&page, next)
            }
            Some(req) => query::answer_occupancy(&self.engine, &req).unwrap_or_default(),
            None => b"{}".to_vec(),
        };
        let _ = self.sh.nats.client.publish(reply, body.into()).await;
    }

    fn begin_checkpoint(&mut self) -> Freeze {
        self.engine.mark_all_dirty();
        self.engine.checkpoint_begin();
        let acked = self.outbox.acked();
        Freeze {
            enc: Encoder::new(
                self.p,
                self.applied,
                self.fence_pos,
                acked.last,
                self.engine.watermark(),
            ),
            produced: self.outbox.produced(),
            input_seq: self.applied,
            fence_pos: self.fence_pos,
            ev_mark: acked.last,
            started: Instant::now(),
        }
    }

    /// The checkpoint of a graceful stop: everything the engine holds, once its events are out.
    async fn final_checkpoint(&mut self, running: Option<Freeze>) -> bool {
        self.sh
            .board
            .update(self.p, self.lease.epoch(), |s| s.phase = Phase::Stopping);
        if let Some(w) = self.writing.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
        }
        if !self.flush().await {
            return false;
        }
        if self.applied <= self.pointer.as_ref().map_or(0, |c| c.input_seq) {
            return true;
        }
        // A half-handed-out checkpoint is finished by the new freeze (the engine merges them).
        drop(running);
        let mut f = self.begin_checkpoint();
        loop {
            let mut devices = Vec::with_capacity(CHECKPOINT_CHUNK);
            let done = self.engine.checkpoint_next(CHECKPOINT_CHUNK, &mut devices);
            f.enc.devices(&devices);
            if done {
                break;
            }
        }
        let w = write_checkpoint(
            self.sh.clone(),
            self.p,
            self.lease.clone(),
            self.outbox.clone(),
            f,
            self.pointer.clone(),
        );
        matches!(
            tokio::time::timeout(Duration::from_secs(20), w).await,
            Ok(Some(_))
        )
    }
}

/// Writes a frozen checkpoint: the object, then (once every event produced before the freeze is
/// in the stream, and while the lease holds) the pointer; then purges the input the previous
/// checkpoint covered and deletes the object before it. Returns the new pointer once it moved.
async fn write_checkpoint(
    sh: Arc<Shared>,
    p: u16,
    lease: Arc<Lease>,
    outbox: Outbox,
    f: Freeze,
    previous: Option<Pointer>,
) -> Option<Pointer> {
    let Freeze {
        enc,
        produced,
        input_seq,
        fence_pos,
        ev_mark,
        started,
    } = f;
    let devices = enc.count();
    let bytes = enc.finish();
    let object = format!("ck-{p}-{}-{input_seq}", lease.epoch());
    let put = sh
        .nats
        .objects
        .put(
            async_nats::jetstream::object_store::ObjectMetadata {
                name: object.clone(),
                chunk_size: Some(256 * 1024),
                ..Default::default()
            },
            &mut bytes.as_slice(),
        )
        .await;
    if let Err(e) = put {
        counter!(t::CLUSTER_CHECKPOINT_FAILURES).increment(1);
        tracing::warn!(partition = p, error = %e, "checkpoint object not written");
        return None;
    }
    if !outbox.wait_acked(produced).await || !lease.valid() {
        let _ = sh.nats.objects.delete(object.as_str()).await;
        return None;
    }
    let ptr = Pointer {
        object: object.clone(),
        input_seq,
        fence_pos,
        ev_mark,
        previous: previous.as_ref().map(|c| (c.object.clone(), c.input_seq)),
        node: sh.node.clone(),
        epoch: lease.epoch(),
        at_ms: sh.watermark.wall().now().0,
        devices,
        bytes: bytes.len() as u64,
    };
    match checkpoint::move_pointer(&sh.nats, p, &ptr).await {
        Ok(true) => {}
        Ok(false) => {
            // The pointer is already as far (a newer holder, or a later write of this one):
            // this object is not needed, unless the pointer names it as its fallback.
            let named = checkpoint::read_pointer(&sh.nats, p).await.map(|c| {
                c.is_some_and(|(c, _)| {
                    c.object == object || c.previous.as_ref().is_some_and(|(o, _)| *o == object)
                })
            });
            if matches!(named, Ok(false)) {
                let _ = sh.nats.objects.delete(object.as_str()).await;
            }
            return None;
        }
        // Unknown whether it moved: the object stays (an orphan at worst).
        Err(_) => return None,
    }
    counter!(t::CLUSTER_CHECKPOINTS).increment(1);
    histogram!(t::CLUSTER_CHECKPOINT_SECONDS).record(started.elapsed().as_secs_f64());
    gauge!(t::CLUSTER_CHECKPOINT_BYTES, "partition" => p.to_string()).set(bytes.len() as f64);
    // The previous checkpoint stays as the fallback: its input is kept, the one before goes.
    if let Some(prev) = previous
        && let Some((older, older_seq)) = prev.previous
    {
        let _ = sh.nats.objects.delete(older.as_str()).await;
        let _ = sh
            .nats
            .input
            .purge()
            .filter(in_subject(p))
            .sequence(older_seq + 1)
            .await;
    }
    Some(ptr)
}

/// Rebuilds partition `p`'s engine from its newest checkpoint (falling back to the one before
/// when the newest cannot be read), or an empty engine.
async fn restore(sh: &Shared, p: u16) -> Result<(Engine, Option<Pointer>), NatsError> {
    let Some((ptr, _)) = checkpoint::read_pointer(&sh.nats, p).await? else {
        // A partition that never checkpointed starts empty, at fence position 0: its input holds
        // a marker for every fence change since the cluster began.
        return Ok((Engine::new(sh.engine.clone()), None));
    };
    match restore_from(sh, p, &ptr.object).await {
        Ok((engine, ck)) if ck.input_seq == ptr.input_seq => Ok((engine, Some(ptr))),
        Ok(_) => Err(NatsError::Corrupt {
            what: format!("checkpoint {}", ptr.object),
            detail: "its position is not the pointer's".into(),
        }),
        Err(e) => {
            let Some((older, older_seq)) = ptr.previous.clone() else {
                return Err(e);
            };
            tracing::warn!(partition = p, error = %e, fallback = %older, "newest checkpoint unreadable; using the one before");
            let (engine, ck) = restore_from(sh, p, &older).await?;
            let fallback = Pointer {
                object: older,
                input_seq: older_seq,
                fence_pos: ck.fence_pos,
                ev_mark: ck.ev_mark,
                previous: None,
                at_ms: 0,
                devices: ck.devices.len() as u64,
                bytes: 0,
                ..ptr
            };
            Ok((engine, Some(fallback)))
        }
    }
}

async fn restore_from(
    sh: &Shared,
    p: u16,
    object: &str,
) -> Result<(Engine, checkpoint::Checkpoint), NatsError> {
    let bytes = super::fences::read_object(&sh.nats, object).await?;
    let mut ck = tokio::task::spawn_blocking(move || checkpoint::decode(&bytes))
        .await
        .map_err(|e| NatsError::request("decode a checkpoint", e))?
        .map_err(|e| NatsError::Corrupt {
            what: format!("checkpoint {object}"),
            detail: e.0,
        })?;
    if ck.partition != p {
        return Err(NatsError::Corrupt {
            what: format!("checkpoint {object}"),
            detail: format!("it is partition {}'s", ck.partition),
        });
    }
    let fence_pos = ck.fence_pos;
    if !sh
        .fences
        .wait_applied(fence_pos, Duration::from_secs(60))
        .await
    {
        return Err(NatsError::request(
            "restore a checkpoint",
            format!("fence position {fence_pos} not reached on this node"),
        ));
    }
    let fences = sh
        .fences
        .set_at(fence_pos)
        .map_err(|e| NatsError::request("restore a checkpoint", e))?;
    let devices = std::mem::take(&mut ck.devices);
    let cfg = sh.engine.clone();
    let w = ck.watermark;
    let engine = tokio::task::spawn_blocking(move || {
        let mut engine = Engine::new(cfg);
        let mut sink = Vec::new();
        for f in fences {
            engine.upsert_fence(f, &mut sink);
        }
        engine.restore(devices, w).map(|_| engine)
    })
    .await
    .map_err(|e| NatsError::request("restore a checkpoint", e))?
    .map_err(|e| NatsError::Corrupt {
        what: format!("checkpoint {object}"),
        detail: e.to_string(),
    })?;
    Ok((engine, ck))
}
