//! The single-process backend of a partition ([`crate::runtime::Backend`]): its log is the
//! shard's queue, numbered by the shard, and committed with each step's events by the
//! publisher; its event sink is the publisher; its checkpoint storage is the checkpoint writer
//! (`checkpoints.rs`); it always owns the partition.
//!
//! Invariants: every record the driver applies is one publisher step carrying its encoded
//! record (with the watermark the engine had just before it, since the advances between records
//! are not records of their own), its events and its waiting reply, so nothing a step did is
//! visible before it is durable, and positions in the log are gap-free; an advance is applied
//! only once every batch already queued was applied (event mode: a batch is queued before its
//! stamp moves the watermark, so its fixes are never judged against a watermark they moved).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use metrics::counter;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::checkpoints::WriterCheckpoints;
use super::{LocalShards, ShardMsg};
use crate::checkpoint::CkMsg;
use crate::clock::{ClockMode, Watermark};
use crate::events::health::StoreState;
use crate::events::publisher::{FixOutcome, InputRecord, PublishError, Publisher, Step, StepReply};
use crate::runtime::{Always, AppliedStep, Backend, PartitionCtx, Stop, Work};
use crate::telemetry as t;
use geodwell_core::engine::IdleRule;
use geodwell_core::event::Event;
use geodwell_core::partition::{
    Applied, ChangeLog, Driver, FenceSource, FenceUpdate, Input, Removal, record,
};
use geodwell_core::time::Ts;

/// What every shard task shares: the watermark, the publisher, persistence and shutdown.
#[derive(Clone)]
pub struct ShardCtx {
    /// The service's watermark (mode, lateness, wall clock, the published event watermark).
    pub watermark: Arc<Watermark>,
    /// Where steps go to be committed and published.
    pub publisher: Publisher,
    /// Whether input is logged and checkpointed (a store is configured).
    pub persist: bool,
    /// Where checkpoint data goes (with a store).
    pub checkpoints: Option<mpsc::Sender<CkMsg>>,
    /// Cancelled at shutdown, once ingest has stopped: the shards then drain their queues.
    pub shutdown: CancellationToken,
    /// Batches queued per shard.
    pub queue: usize,
    /// `devices.idle_ttl`: forget idle devices (`None`: never).
    pub idle: Option<IdleRule>,
    /// Rebuilds a partition from the store after a failed commit (see
    /// [`crate::events::health`]).
    pub rebuild: Rebuild,
}

/// Rebuilds partition `k` from what the store holds (the warm start's restore path, for one
/// partition); blocking.
pub type Rebuild = Arc<dyn Fn(usize) -> Result<ShardStart, RebuildError> + Send + Sync>;

/// Why a partition could not be rebuilt from the store (it tries again a second later).
#[derive(Debug, thiserror::Error)]
#[error("partition {partition} could not be rebuilt from the store")]
pub struct RebuildError {
    /// The partition.
    pub partition: usize,
    /// Why (the restore path's error).
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// One shard's starting point: its driver (restored and replayed) and the events the replay
/// produced that were never published (published first).
#[derive(Debug)]
pub struct ShardStart {
    /// The driver, at the shard's last input record.
    pub driver: Driver,
    /// Events to publish first.
    pub pending: Vec<Event>,
    /// Durable fence changes after the driver's fence position, applied first (a rebuild: the
    /// partition's markers for them may not have been committed).
    pub fences: ChangeLog,
}

/// Starts one task per shard (shard `k` runs `shards[k]`) and returns the handle to them and
/// the tasks, which end after a drain once `ctx.shutdown` is cancelled.
pub fn spawn(
    shards: Vec<ShardStart>,
    ctx: ShardCtx,
) -> (LocalShards, Vec<tokio::task::JoinHandle<()>>) {
    let mut senders = Vec::with_capacity(shards.len());
    let mut tasks = Vec::with_capacity(shards.len());
    let health = ctx.publisher.health().clone();
    for (id, start) in shards.into_iter().enumerate() {
        let (tx, rx) = mpsc::channel(ctx.queue.max(1));
        let mut backend = Local {
            id,
            rx,
            recovered: health.subscribe(),
            ctx: ctx.clone(),
            made: VecDeque::new(),
            fences: ChangeLog::default(),
            pending: Vec::new(),
            rebuilt: false,
            ck: WriterCheckpoints::new(id, ctx.checkpoints.clone()),
            stopping: false,
        };
        let driver = backend.start(start);
        let pctx = PartitionCtx {
            partition: id,
            watermark: ctx.watermark.clone(),
            idle: ctx.idle,
        };
        senders.push(tx);
        tasks.push(tokio::spawn(crate::runtime::run(driver, backend, pctx)));
    }
    (
        LocalShards {
            senders: senders.into(),
            health,
        },
        tasks,
    )
}

/// Who waits for a record of a shard's log.
pub enum Ticket {
    /// A batch's part: the fixes' indices in the request, and its reply.
    Fixes {
        /// Per fix, its index in the request.
        indices: Vec<usize>,
        /// Answered once the step is durable.
        reply: oneshot::Sender<StepReply>,
        /// When the batch arrived.
        arrived: Instant,
        /// The request: (id, parts).
        request: (u64, u32),
    },
    /// `DELETE /v1/devices/{id}`: whether it existed (at once), then the durable ack.
    Remove {
        /// Whether the device existed.
        reply: oneshot::Sender<bool>,
        /// Once the removal is durable.
        ack: oneshot::Sender<Result<(), PublishError>>,
    },
    /// `POST /v1/watermark`: the fix time to persist, and the durable ack.
    Advance {
        /// The fix time the watermark stands for.
        max_seen: Ts,
        /// Once the step is durable.
        ack: oneshot::Sender<Result<(), PublishError>>,
    },
    /// Nobody waits (a fence marker, an idle removal).
    None,
}

/// One shard's backend.
struct Local {
    id: usize,
    rx: mpsc::Receiver<ShardMsg>,
    ctx: ShardCtx,
    /// Records the partition made itself (idle removals), delivered before the queue.
    made: VecDeque<Input>,
    /// Fence changes sent to the shard and not applied yet, by change number.
    fences: ChangeLog,
    /// Events of the warm start's (or a rebuild's) replay, published first.
    pending: Vec<Event>,
    /// The partition was rebuilt: its next step says so (the publisher takes its steps again).
    rebuilt: bool,
    /// Sees the store take commits again (marked partitions rebuild then).
    recovered: tokio::sync::watch::Receiver<u64>,
    /// Where its checkpoints go.
    ck: WriterCheckpoints,
    /// Shutdown began: the queue is closed and drained.
    stopping: bool,
}

impl Local {
    /// Takes a starting point: its events are published first and its fence changes applied
    /// first (one marker covers them all: a marker applies every change up to its number).
    fn start(&mut self, start: ShardStart) -> Driver {
        self.pending.extend(start.pending);
        if let Some(&last) = start.fences.0.keys().next_back() {
            self.fences.0.extend(start.fences.0);
            self.made.push_back(Input::Fences(last));
        }
        start.driver
    }

    /// Whether this partition must rebuild before it goes on: a commit of its steps failed and
    /// the store takes commits again.
    fn must_rebuild(&self) -> bool {
        let health = self.ctx.publisher.health();
        health.state() == StoreState::Recovering && health.is_marked(self.id as u16)
    }

    /// Rebuilds the partition from the store (see [`crate::events::health`]): a running freeze
    /// is given up, the replay's unpublished events and the durable fence changes come first,
    /// and the next step tells the publisher to take this partition's steps again.
    async fn rebuild(&mut self, driver: &Driver) -> Work<Ticket> {
        self.ck.abort(driver).await;
        let rebuild = self.ctx.rebuild.clone();
        let id = self.id;
        match tokio::task::spawn_blocking(move || rebuild(id)).await {
            Ok(Ok(start)) => {
                tracing::info!(
                    partition = id,
                    "partition rebuilt from the store after a failed commit"
                );
                self.made.clear();
                self.fences = ChangeLog::default();
                self.pending.clear();
                self.rebuilt = true;
                Work::Reset(Box::new(self.start(start)))
            }
            Ok(Err(e)) => {
                tracing::error!(partition = id, error = %e, cause = %e.source, "partition rebuild failed; retrying in a second");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                Work::Wake
            }
            Err(e) => {
                tracing::error!(partition = id, error = %e, "partition rebuild panicked");
                Work::Stop(Stop::Lost)
            }
        }
    }

    /// The work a queued message is.
    fn work(&mut self, msg: ShardMsg, driver: &Driver) -> Work<Ticket> {
        let pos = driver.applied() + 1;
        let record = |input, arrival, ticket| Work::Record {
            pos,
            input,
            arrival,
            ticket,
        };
        match msg {
            ShardMsg::Fixes {
                fixes,
                arrived,
                request,
                reply,
            } => {
                let mut indices = Vec::with_capacity(fixes.len());
                let fixes = fixes
                    .into_iter()
                    .map(|s| {
                        indices.push(s.index);
                        (s.fix, s.w)
                    })
                    .collect();
                let arrival = self.ctx.watermark.wall().stamp_of(arrived);
                let ticket = Ticket::Fixes {
                    indices,
                    reply,
                    arrived,
                    request,
                };
                record(
                    Input::Fixes {
                        w_before: None,
                        fixes,
                    },
                    arrival,
                    ticket,
                )
            }
            ShardMsg::UpsertFence(f, n) => {
                self.fences.0.insert(n, FenceUpdate::Put(f));
                record(Input::Fences(n), 0, Ticket::None)
            }
            ShardMsg::RemoveFence(id, n) => {
                self.fences.0.insert(n, FenceUpdate::Delete(id));
                record(Input::Fences(n), 0, Ticket::None)
            }
            ShardMsg::RemoveDevice { id, reply, ack } => {
                let removal = Removal {
                    w_before: None,
                    idle: None,
                    ids: vec![id],
                };
                record(Input::Removed(removal), 0, Ticket::Remove { reply, ack })
            }
            ShardMsg::Advance { to, max_seen, ack } => {
                record(Input::Tick(to), 0, Ticket::Advance { max_seen, ack })
            }
            ShardMsg::Checkpoint { round, full } if self.ck.enabled() => {
                self.ck.begin(round);
                Work::Checkpoint { full }
            }
            ShardMsg::Checkpoint { .. } => Work::Wake,
            ShardMsg::Query(q) => Work::Query(q),
        }
    }

    /// The step of record `s`, without its events: its encoded record and whoever waits, and
    /// when its batch arrived.
    fn step_of(&self, s: AppliedStep<'_, Ticket>) -> (Step, Option<Instant>) {
        let mut step = Step::default();
        let mut batch = None;
        let AppliedStep {
            pos,
            input,
            w_before,
            applied,
            ticket,
            ..
        } = s;
        if self.ctx.persist {
            step.input = Some(self.encode(pos, input, w_before));
        }
        match (ticket, applied) {
            (
                Ticket::Fixes {
                    indices,
                    reply,
                    arrived,
                    request,
                },
                Applied::Fixes(outcomes),
            ) => {
                step.max_ts = fixes_max_ts(input);
                let outcomes: Vec<FixOutcome> = indices.into_iter().zip(outcomes).collect();
                step.reply = Some((reply, outcomes));
                step.request = Some(request);
                batch = Some(arrived);
            }
            (Ticket::Remove { reply, ack }, Applied::Removed(n)) => {
                if n > 0 {
                    counter!(t::DEVICES_REMOVED, "reason" => "delete").increment(n as u64);
                }
                let _ = reply.send(n > 0);
                step.ack = Some(ack);
            }
            (Ticket::Advance { max_seen, ack }, _) => {
                step.max_ts = Some(max_seen);
                step.ack = Some(ack);
            }
            (Ticket::None, Applied::Removed(n)) if n > 0 => {
                counter!(t::DEVICES_REMOVED, "reason" => "idle").increment(n as u64);
            }
            _ => {}
        }
        (step, batch)
    }

    /// Record `pos` as the log keeps it: with the watermark the engine had reached before it.
    fn encode(&self, pos: u64, input: &Input, w_before: Option<Ts>) -> InputRecord {
        let mut rec = Vec::with_capacity(16);
        match input {
            Input::Fixes { fixes, .. } => {
                rec.reserve(fixes.len() * 48);
                record::encode_fixes(
                    w_before,
                    fixes.len(),
                    fixes.iter().map(|(f, s)| (f, *s)),
                    &mut rec,
                );
            }
            Input::Removed(r) => record::encode(
                &Input::Removed(Removal {
                    w_before,
                    ..r.clone()
                }),
                &mut rec,
            ),
            other => record::encode(other, &mut rec),
        }
        (self.id as u16, pos, rec)
    }

    /// Hands `step`, with the events produced so far, to the publisher. False once it is gone.
    async fn publish(
        &mut self,
        driver: &mut Driver,
        mut step: Step,
        batch: Option<Instant>,
    ) -> bool {
        let mut events = std::mem::take(&mut self.pending);
        events.extend(driver.take_events());
        step.rebuilt = std::mem::take(&mut self.rebuilt);
        if events.is_empty() && step.is_empty() {
            return true;
        }
        step.partition = Some(self.id as u16);
        step.causes = events.iter().map(|e| self.cause(e, batch)).collect();
        step.events = events;
        step.watermark = driver.watermark();
        self.ctx.publisher.send(step).await.is_ok()
    }

    /// When what made `e` happened, for the ingest-to-event latency: the arrival of the fix that
    /// decided it (an ENTER or EXIT carries it, however long the fix waited in the reorder
    /// buffer); else the moment the watermark passed its time: live, the wall clock at
    /// `at + lateness`; event, the arrival of the batch whose step made it (its stamp moved the
    /// watermark) or, in a step of its own, when the published watermark last moved.
    fn cause(&self, e: &Event, batch: Option<Instant>) -> Instant {
        let wm = &self.ctx.watermark;
        if let Some(at) = wm.wall().instant_of(e.arrived) {
            return at;
        }
        match wm.mode() {
            ClockMode::Live => wm.wall().instant_at(e.at.plus(wm.lateness())),
            ClockMode::Event => batch.unwrap_or_else(|| wm.moved_at()),
        }
    }
}

/// The largest fix time of a fixes record (the persisted event-mode watermark's source).
fn fixes_max_ts(input: &Input) -> Option<Ts> {
    match input {
        Input::Fixes { fixes, .. } => fixes.iter().map(|(f, _)| f.ts).max(),
        _ => None,
    }
}

impl Backend for Local {
    type Ticket = Ticket;
    type Ended = ();
    type Checkpoints = WriterCheckpoints;
    type Owner = Always;

    async fn next(&mut self, driver: &Driver) -> Work<Ticket> {
        if self.must_rebuild() {
            return self.rebuild(driver).await;
        }
        if let Some(input) = self.made.pop_front() {
            return Work::Record {
                pos: driver.applied() + 1,
                input,
                arrival: 0,
                ticket: Ticket::None,
            };
        }
        if self.stopping {
            return match self.rx.recv().await {
                Some(m) => self.work(m, driver),
                None => Work::Stop(Stop::Asked),
            };
        }
        let ck = self.ck.wants_room(driver);
        tokio::select! {
            biased;
            _ = self.ctx.shutdown.cancelled() => {
                self.stopping = true;
                self.rx.close();
                Work::Wake
            }
            m = self.rx.recv() => match m {
                Some(m) => self.work(m, driver),
                None => Work::Stop(Stop::Asked),
            },
            permit = async { ck?.reserve_owned().await.ok() }, if ck.is_some() => {
                self.ck.room(permit);
                Work::CheckpointRoom
            }
            // The store takes commits again: a marked partition rebuilds on its next turn.
            _ = self.recovered.changed() => Work::Wake,
        }
    }

    fn fences(&self) -> &dyn FenceSource {
        &self.fences
    }

    async fn applied(&mut self, driver: &mut Driver, s: AppliedStep<'_, Ticket>) -> bool {
        if matches!(s.input, Input::Fences(_)) {
            let upto = driver.fence_pos();
            self.fences.0.retain(|&n, _| n > upto);
        }
        let (step, batch) = self.step_of(s);
        self.publish(driver, step, batch).await
    }

    async fn flush(&mut self, driver: &mut Driver) -> bool {
        self.publish(driver, Step::default(), None).await
    }

    async fn tick(&mut self, driver: &mut Driver, w: Ts) {
        // Event mode: batches already queued here were stamped before the published watermark
        // moved on (a batch is queued before its stamp is published): apply them first, or
        // their fixes would look late. The watermark was read before this look at the queue: a
        // published stamp implies its batch was queued before, so it is either seen here or
        // already applied.
        if self.ctx.watermark.mode() == ClockMode::Event && !self.rx.is_empty() {
            return;
        }
        let started = Instant::now();
        driver.advance(w);
        metrics::histogram!(t::WHEEL_TICK_SECONDS).record(started.elapsed().as_secs_f64());
    }

    async fn append(&mut self, _driver: &Driver, input: Input) {
        self.made.push_back(input);
    }

    fn checkpoints(&mut self) -> &mut WriterCheckpoints {
        &mut self.ck
    }

    fn owner(&self) -> Always {
        Always
    }

    async fn housekeeping(&mut self, _driver: &Driver) {}

    async fn finish(mut self, mut driver: Driver, _stop: Stop) {
        let _ = self.flush(&mut driver).await;
        self.ck.finish(&mut driver).await;
    }
}
