//! The cluster backend of a partition ([`crate::runtime::Backend`]), run by this node while it
//! holds the partition's lease: its log is the partition's subject of the input stream, read by
//! an ordered consumer; its event sink is the [`Outbox`]; its checkpoint storage is objects with
//! a pointer ([`super::freeze::ObjectCheckpoints`], format in `checkpoint.rs`); its ownership is
//! the lease.
//!
//! A takeover, in order:
//! 1. **restore**: read the checkpoint pointer, rebuild the driver from the checkpoint object
//!    with the fences as of the checkpoint's fence position (or start empty) through the
//!    runtime's one restore path ([`Driver::restore`]);
//! 2. **suppress**: read the ids of the events the partition published after the checkpoint's
//!    mark ([`outbox::published_after`]): replaying the input after the checkpoint produces them
//!    again, with the same ids, and they must not be published twice;
//! 3. **replay**: apply the input after the checkpoint's position, publishing only what the
//!    previous owner had not published;
//! 4. **live**: caught up; the owner also writes the partition's watermark ticks, idle removals
//!    and checkpoints now.
//!
//! Checkpoints: every `checkpoint_interval`, when input was applied since the last one, the
//! driver freezes its state (copy on write: it goes on working) and hands its devices out a
//! chunk at a time into an object; once every event produced before the freeze is in the
//! stream, the pointer moves to it; the input before the *previous* checkpoint is then purged
//! (one checkpoint is kept as a fallback). On a graceful stop (a handover or shutdown) the task
//! stops taking input, waits for its outbox, and writes a final checkpoint, so the next owner
//! replays nothing.
//!
//! When the input stream elects a leader ([`super::elections`]), the input consumer is
//! re-created from the record after the last one applied, beside the partition's work (the old
//! consumer goes on until the new one is made; hedged tries, [`super::hedge`]): an ordered
//! consumer lives on one server, and the one that died with its server would otherwise be
//! noticed only after two missed heartbeats (its pull requests expire after 5 s, its heartbeat
//! is half of that).
//!
//! Invariants: the backend acts on the partition (ticks, removals, checkpoints, publishing)
//! only while its lease is valid; the task ends when the lease is lost; every query taken is
//! answered.
//!
//! Why this file is long: it is one backend, whose takeover phases and `Backend` methods all
//! work on the same private state (the input consumer and its re-creation, the outbox, the
//! lease, the replay's progress); split, that state would have to be opened to other files.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, RawMessageErrorKind};
use futures_util::StreamExt;
use metrics::{counter, gauge, histogram};
use tokio::sync::mpsc;

use super::checkpoint;
use super::freeze::ObjectCheckpoints;
use super::hedge;
use super::ingest::REPLY_HEADER;
use super::lease::Lease;
use super::nats::{NatsError, in_subject, outcome_subject, query_subject};
use super::outbox::{self, Outbox};
use super::outcome::encode_outcomes;
use super::query;
use super::shared::Shared;
use super::status::{Phase, TakeoverTimes};
use crate::runtime::{AppliedStep, Backend, PartitionCtx, Query, Stop, Work};
use crate::telemetry as t;
use geodwell_core::partition::{Applied, Driver, FenceSource, Input, record};
use geodwell_core::time::Ts;

/// What a partition task is asked.
pub enum Control {
    /// A read of the engine (it answers its asker).
    Query(Query),
    /// Stop taking input, publish what is produced, write a final checkpoint, and end.
    Stop,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Control::Query(_) => "Query",
            Control::Stop => "Stop",
        })
    }
}

/// Why a partition task ended.
#[derive(Debug)]
pub enum Ended {
    /// Asked to stop (its final checkpoint written, or not if `checkpointed` is false).
    Stopped {
        /// Whether the final checkpoint was written.
        checkpointed: bool,
    },
    /// Its lease was lost: it stood down.
    LeaseLost,
    /// It failed (the lease is released so another node can try).
    Failed(PartitionError),
}

/// Why a partition task failed.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    /// NATS failed it (its checkpoint, input or events could not be read or written).
    #[error("partition failed in NATS")]
    Nats(#[source] NatsError),
    /// A fence marker in its input names fence changes this node's fence log does not hold.
    #[error("partition input names fence changes this node does not hold")]
    MissingFences(#[source] geodwell_core::partition::MissingFences),
}

/// How long a fence marker waits for this node's fence log to reach it.
const FENCE_WAIT: Duration = Duration::from_secs(60);
/// A tick written (or failed to be written) and not seen back for this long is written again.
const TICK_RETRY: Duration = Duration::from_secs(2);

/// Who waits for a record of the partition's input: the node that ingested it, named in its
/// reply header; and the records still behind it when it was read.
pub struct Ticket {
    reply: Option<String>,
    pending: u64,
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
    let ended = match start(p, lease, sh.clone(), control).await {
        Ok((driver, part)) => {
            let ctx = PartitionCtx {
                partition: usize::from(p),
                watermark: sh.watermark.clone(),
                idle: sh.idle,
            };
            crate::runtime::run(driver, part, ctx).await
        }
        Err(e) => Ended::Failed(PartitionError::Nats(e)),
    };
    sh.board.remove(p, epoch);
    gauge!(t::CLUSTER_PARTITION_LAG, "partition" => p.to_string()).set(0.0);
    ended
}

/// The takeover's restore and suppress phases: the driver at the checkpoint, and the backend
/// reading the input after it.
async fn start(
    p: u16,
    lease: Arc<Lease>,
    sh: Arc<Shared>,
    control: mpsc::Receiver<Control>,
) -> Result<(Driver, Partition), NatsError> {
    let t0 = Instant::now();
    let (driver, pointer) = checkpoint::restore(&sh, p).await?;
    let restore_ms = t0.elapsed().as_millis() as u64;
    let ev_mark = pointer.as_ref().map_or(0, |c| c.ev_mark);
    let t1 = Instant::now();
    let (suppress, last): (HashSet<u128>, u64) =
        outbox::published_after(&sh.nats, p, ev_mark).await?;
    let suppress_ms = t1.elapsed().as_millis() as u64;
    let suppressed = suppress.len();
    let (outbox, outbox_task) = Outbox::spawn(sh.nats.clone(), p, lease.clone(), last, suppress);
    let checkpoint_at_ms = pointer.as_ref().map_or(0, |c| c.at_ms);
    let ck = ObjectCheckpoints::new(sh.clone(), p, lease.clone(), outbox.clone(), pointer);
    let queries = sh
        .nats
        .client
        .subscribe(query_subject(p))
        .await
        .map_err(|e| NatsError::request("subscribe to partition queries", e))?;
    let elected = sh.nats.elections.input();
    let (messages, caught_up) = input_consumer(&sh, p, driver.applied() + 1).await?;
    let times = TakeoverTimes {
        restore_ms,
        suppress_ms,
        replay_ms: 0,
        replayed_records: 0,
    };
    let epoch = lease.epoch();
    let (applied, fence_pos) = (driver.applied(), driver.fence_pos());
    sh.board.update(p, epoch, |s| {
        s.phase = if caught_up {
            Phase::Live
        } else {
            Phase::Replaying
        };
        s.input_position = applied;
        s.checkpoint_position = applied;
        s.checkpoint_at_ms = checkpoint_at_ms;
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
    let mut ck_timer = tokio::time::interval(sh.checkpoint_every);
    ck_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ck_timer.reset();
    let part = Partition {
        p,
        label: p.to_string(),
        sh,
        lease,
        outbox,
        outbox_task,
        messages,
        elected,
        resubscribing: None,
        bridge_at: None,
        heard: Instant::now(),
        waiting: None,
        stall_timer: tokio::time::interval(INPUT_STALL),
        queries,
        control,
        caught_up,
        replayed: 0,
        times,
        replay_started: Instant::now(),
        marker: fence_pos,
        tick_outstanding: None,
        ck,
        ck_timer,
        fence_behind_since: None,
        failed: None,
    };
    Ok((driver, part))
}

/// The ordered consumer of the partition's input.
type Messages = async_nats::jetstream::consumer::pull::Ordered;

/// How long a pull request of the input consumer lives: its idle heartbeat is half of it, and
/// two missed heartbeats make the client library re-create the consumer (when no leader
/// election announced the loss first).
const INPUT_PULL_EXPIRES: Duration = Duration::from_secs(5);

/// The partition's input from stream sequence `from`, and whether nothing is pending.
async fn input_consumer(sh: &Shared, p: u16, from: u64) -> Result<(Messages, bool), NatsError> {
    let consumer = sh
        .nats
        .input
        .create_consumer(pull::OrderedConfig {
            filter_subject: in_subject(p),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from,
            },
            max_expires: INPUT_PULL_EXPIRES,
            ..Default::default()
        })
        .await
        .map_err(|e| NatsError::request("partition input consumer", e))?;
    let caught_up = consumer.cached_info().num_pending == 0;
    let messages = consumer
        .messages()
        .await
        .map_err(|e| NatsError::request("partition input consumer", e))?;
    Ok((messages, caught_up))
}

/// Tries of one round of [`resubscribe`] (5 s to 7 s when none succeeds).
const RESUBSCRIBE_TRIES: usize = 20;

/// Re-creates the input consumer from `from` through hedged tries ([`super::hedge`]) until one
/// succeeds, warning once after a round without success: the old consumer may never recover on
/// its own, so giving up could leave the partition without input for good. A newer election or
/// a stall check replaces this future.
async fn resubscribe(sh: Arc<Shared>, p: u16, from: u64) -> Messages {
    let mut warned = false;
    loop {
        match hedge::hedged(RESUBSCRIBE_TRIES, || input_consumer(&sh, p, from)).await {
            Ok((messages, _)) => return messages,
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(partition = p, error = %e, "input consumer not re-created yet; still trying");
            }
            Err(e) => tracing::debug!(partition = p, error = %e, "re-creating the input consumer"),
        }
    }
}

/// How long a partition may hear nothing from its input consumer before it asks the stream
/// whether input is waiting; input found waiting at two checks in a row (not applied in
/// between) means the consumer has stalled, and it is re-created.
const INPUT_STALL: Duration = Duration::from_secs(5);

/// The stream sequence of the newest record on partition `p`'s input subject (0: none), within
/// 1 s; `None` when the stream did not answer.
async fn last_input(sh: &Shared, p: u16) -> Option<u64> {
    let subject = in_subject(p);
    let last = sh.nats.input.get_last_raw_message_by_subject(&subject);
    match tokio::time::timeout(Duration::from_secs(1), last).await {
        Ok(Ok(m)) => Some(m.sequence),
        Ok(Err(e)) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Some(0),
        Ok(Err(e)) => {
            tracing::debug!(partition = p, error = %e, "checking the partition's input for a stall");
            None
        }
        Err(_) => None,
    }
}

/// How long a re-creation of the input consumer may take before the partition reads its input
/// from the stream's leader directly (a re-creation takes milliseconds when JetStream's meta
/// leader is there).
const BRIDGE_AFTER: Duration = Duration::from_millis(500);

/// How long the bridge waits after finding no input waiting (or no answer).
const BRIDGE_IDLE: Duration = Duration::from_millis(100);

/// Reads, at `at`, the record after stream sequence `next - 1` on partition `p`'s subject from
/// the input stream's leader (`None`: nothing there yet, or no answer within 1 s).
///
/// Why: a consumer is made through JetStream's meta leader, and when the server lost was the
/// meta leader too, no consumer can be made until the meta group elects another, which was seen
/// to take 10 s, twice as long as the streams' own elections. A read by sequence needs only the
/// stream's leader, so the partition's input (and its events) go on as soon as the stream has
/// one. One request per record: slower than a consumer, so it only bridges until the consumer
/// is back.
async fn bridge(sh: &Shared, p: u16, next: u64, at: Option<Instant>) -> Option<StreamMessage> {
    crate::runtime::sleep_until(at).await;
    let get = sh
        .nats
        .input
        .raw_message_builder()
        .sequence(next)
        .next_by_subject(in_subject(p))
        .send();
    match tokio::time::timeout(Duration::from_secs(1), get).await {
        Ok(Ok(m)) => Some(m),
        Ok(Err(e)) if e.kind() == RawMessageErrorKind::NoMessageFound => None,
        Ok(Err(e)) => {
            tracing::debug!(partition = p, error = %e, "reading the input from the stream's leader");
            None
        }
        Err(_) => None,
    }
}

/// A re-creation of the input consumer under way.
type Resubscribing = std::pin::Pin<Box<dyn std::future::Future<Output = Messages> + Send>>;

/// One partition's backend.
struct Partition {
    p: u16,
    label: String,
    sh: Arc<Shared>,
    lease: Arc<Lease>,
    outbox: Outbox,
    outbox_task: tokio::task::JoinHandle<()>,
    messages: Messages,
    /// The input stream's leader elections: the consumer is re-created on each.
    elected: tokio::sync::watch::Receiver<u64>,
    /// The input consumer being re-created after an election or a stall, while the old one
    /// goes on.
    resubscribing: Option<Resubscribing>,
    /// While the re-creation takes long, when the input is next read from the stream's leader
    /// directly ([`bridge`]).
    bridge_at: Option<Instant>,
    /// When the input consumer last delivered a message (or was created).
    heard: Instant,
    /// The newest input the last stall check found waiting beyond what was applied.
    waiting: Option<u64>,
    /// Ticks every [`INPUT_STALL`]: the stall check.
    stall_timer: tokio::time::Interval,
    queries: async_nats::Subscriber,
    control: mpsc::Receiver<Control>,
    /// The input read so far reached the stream's end once (replay done).
    caught_up: bool,
    replayed: u64,
    times: TakeoverTimes,
    replay_started: Instant,
    /// The newest fence marker seen in the input.
    marker: u64,
    /// A tick was written and not seen back yet (when).
    tick_outstanding: Option<Instant>,
    /// Where its checkpoints go.
    ck: ObjectCheckpoints,
    ck_timer: tokio::time::Interval,
    /// Since when the node's fence log is ahead of the markers in this partition's input.
    fence_behind_since: Option<Instant>,
    /// Why the partition stops, when it failed.
    failed: Option<NatsError>,
}

/// What one wait of [`Partition::next`] produced before it is turned into work.
enum Got {
    Work(Work<Ticket>),
    Message(Option<Result<Box<async_nats::jetstream::Message>, NatsError>>),
    /// The input stream has a new leader.
    Elected,
    /// Time to check the input consumer for a stall.
    StallCheck,
    /// A re-created input consumer.
    Resubscribed(Box<Messages>),
    /// The next record read from the stream's leader while the consumer is re-created
    /// (`None`: none waiting, or no answer).
    Bridged(Option<Box<StreamMessage>>),
    Again,
}

impl Partition {
    /// Every [`INPUT_STALL`]: if the consumer has been silent that long, asks the stream for
    /// the newest input; input that was already waiting at the previous check and is still not
    /// applied means the consumer stalled (it does not always recover on its own after the
    /// stream lost its quorum), so it is re-created from the record after `applied`.
    async fn check_stall(&mut self, applied: u64) {
        if self.heard.elapsed() < INPUT_STALL {
            self.waiting = None;
            return;
        }
        let Some(last) = last_input(&self.sh, self.p).await else {
            return;
        };
        let waited = self.waiting.is_some_and(|w| w > applied);
        self.waiting = (last > applied).then_some(last);
        if waited && last > applied {
            tracing::warn!(
                partition = self.p,
                applied,
                last,
                "input consumer stalled with input waiting; re-creating it"
            );
            counter!(t::CLUSTER_INPUT_STALLS).increment(1);
            self.waiting = None;
            self.resubscribe_from(applied + 1);
        }
    }

    /// Starts re-creating the input consumer from stream sequence `from` (replacing a
    /// re-creation under way); the old consumer goes on meanwhile.
    fn resubscribe_from(&mut self, from: u64) {
        self.resubscribing = Some(Box::pin(resubscribe(self.sh.clone(), self.p, from)));
        self.bridge_at = Some(Instant::now() + BRIDGE_AFTER);
    }

    /// Turns an input message into a record (waiting for this node's fence log to reach a
    /// fence marker), or why the partition must stop.
    async fn record(
        &mut self,
        m: async_nats::jetstream::Message,
    ) -> Result<Work<Ticket>, NatsError> {
        let info = m
            .info()
            .map_err(|e| NatsError::request("partition input", e))?;
        let (pos, pending) = (info.stream_sequence, info.pending);
        self.record_at(pos, pending, m.headers.as_ref(), &m.payload)
            .await
    }

    /// The work a record read from the input (through the consumer or the bridge) becomes:
    /// none when it is at or before `applied` (delivered again); a record that does not decode
    /// stops the partition.
    fn unless_applied(
        &mut self,
        r: Result<Work<Ticket>, NatsError>,
        applied: u64,
    ) -> Option<Work<Ticket>> {
        match r {
            Ok(Work::Record { pos, .. }) if pos <= applied => None,
            Ok(w) => Some(w),
            Err(e) => {
                self.failed = Some(e);
                Some(Work::Stop(Stop::Lost))
            }
        }
    }

    /// Turns the record at stream sequence `pos` (with `pending` more after it) into work.
    async fn record_at(
        &mut self,
        pos: u64,
        pending: u64,
        headers: Option<&async_nats::HeaderMap>,
        payload: &[u8],
    ) -> Result<Work<Ticket>, NatsError> {
        let reply = headers
            .and_then(|h| h.get(REPLY_HEADER))
            .map(|v| v.as_str().to_string());
        let input =
            record::decode(payload, self.sh.max_device_len).map_err(|e| NatsError::Corrupt {
                what: format!("input record {pos} of partition {}", self.p),
                source: e.into(),
            })?;
        if let Input::Fences(c) = input
            && !self.sh.fences.wait_applied(c, FENCE_WAIT).await
        {
            return Err(NatsError::request(
                "apply a fence marker",
                format!("fence change {c} not applied on this node within 60s"),
            ));
        }
        Ok(Work::Record {
            pos,
            input,
            arrival: 0,
            ticket: Ticket { reply, pending },
        })
    }

    /// A query from another node (or this one), answered on its reply subject.
    fn answer(&self, q: async_nats::Message) -> Work<Ticket> {
        let Some(reply) = q.reply.clone() else {
            return Work::Wake;
        };
        let client = self.sh.nats.client.clone();
        Work::Query(Box::new(move |engine| {
            let body = match query::Request::decode(&q.payload) {
                Some(req) => query::answer(engine, &req),
                None => b"{}".to_vec(),
            };
            tokio::spawn(async move {
                let _ = client.publish(reply, body.into()).await;
            });
        }))
    }

    /// Whether a checkpoint is due now.
    fn checkpoint_due(&self, driver: &Driver) -> bool {
        self.caught_up && self.lease.valid() && self.ck.behind(driver)
    }

    /// Notes a record applied: replay progress, the lag, the board.
    fn progress(&mut self, pos: u64, pending: u64) {
        if !self.caught_up {
            self.replayed += 1;
        }
        gauge!(t::CLUSTER_PARTITION_LAG, "partition" => self.label.clone()).set(pending as f64);
        if pending == 0 && !self.caught_up {
            self.caught_up = true;
            self.times.replay_ms = self.replay_started.elapsed().as_millis() as u64;
            self.times.replayed_records = self.replayed;
            let phases = [
                ("restore", self.times.restore_ms),
                ("suppress", self.times.suppress_ms),
                ("replay", self.times.replay_ms),
            ];
            for (phase, ms) in phases {
                histogram!(t::CLUSTER_TAKEOVER_SECONDS, "phase" => phase)
                    .record(ms as f64 / 1000.0);
            }
            tracing::info!(
                partition = self.p,
                epoch = self.lease.epoch(),
                replayed = self.replayed,
                replay_ms = self.times.replay_ms,
                "partition live"
            );
        }
        let (live, times) = (self.caught_up, self.times);
        self.sh.board.update(self.p, self.lease.epoch(), |s| {
            s.input_position = pos;
            s.lag_records = pending;
            if live {
                s.phase = Phase::Live;
                s.takeover.get_or_insert(times);
            }
        });
    }

    /// Writes `input` to the partition's input (not waited for: it is applied when it comes
    /// back, like any record).
    async fn write(&mut self, input: &Input) -> bool {
        write_record(self.sh.clone(), self.lease.clone(), self.p, input).await
    }

    /// Takes a finished checkpoint write's pointer.
    async fn checkpoint_written(&mut self) {
        if let Some(ptr) = self.ck.written().await {
            let (pos, at) = (ptr.input_seq, ptr.at_ms);
            self.sh.board.update(self.p, self.lease.epoch(), |s| {
                s.checkpoint_position = pos;
                s.checkpoint_at_ms = at;
            });
        }
    }

    /// A fence change whose writer stopped before every partition had its marker: the owner
    /// writes the marker itself once the change has waited a while.
    async fn fence_catch_up(&mut self) {
        let applied = self.sh.fences.applied();
        if applied <= self.marker || !self.caught_up {
            self.fence_behind_since = None;
            return;
        }
        let since = *self.fence_behind_since.get_or_insert_with(Instant::now);
        if since.elapsed() > Duration::from_secs(2) && self.lease.valid() {
            if let Ok(ack) = self.sh.fences.publish_marker(self.p, applied).await {
                let _ = ack.await;
            }
            self.fence_behind_since = None;
        }
    }

    /// The checkpoint of a graceful stop: everything the engine holds, once its events are out.
    async fn final_checkpoint(&mut self, driver: &mut Driver) -> bool {
        self.sh
            .board
            .update(self.p, self.lease.epoch(), |s| s.phase = Phase::Stopping);
        self.ck.settle().await;
        if !self.flush(driver).await {
            return false;
        }
        self.ck.write_final(driver).await
    }
}

/// Writes `input` to partition `p`'s input while `lease` is valid (not waited for).
async fn write_record(sh: Arc<Shared>, lease: Arc<Lease>, p: u16, input: &Input) -> bool {
    if !lease.valid() {
        return false;
    }
    let msg = PublishMessage::build().payload(record::to_bytes(input).into());
    match sh.nats.js.send_publish(in_subject(p), msg).await {
        Ok(ack) => {
            tokio::spawn(async move {
                let _ = ack.await;
            });
            true
        }
        Err(e) => {
            tracing::debug!(partition = p, error = %e, "record not written");
            false
        }
    }
}

impl Backend for Partition {
    type Ticket = Ticket;
    type Ended = Ended;
    type Checkpoints = ObjectCheckpoints;
    type Owner = Arc<Lease>;

    async fn next(&mut self, driver: &Driver) -> Work<Ticket> {
        loop {
            let can_checkpoint = self.ck.idle();
            let resubscribing_on = self.resubscribing.is_some();
            // Only a live partition bridges: one still replaying waits for its consumer, which
            // knows how much input is pending.
            let bridge_at = self
                .bridge_at
                .filter(|_| resubscribing_on && self.caught_up);
            let (sh, p, next) = (&self.sh, self.p, driver.applied() + 1);
            let retry_tick = self.tick_outstanding.map(|t| t + TICK_RETRY);
            let resubscribing = &mut self.resubscribing;
            let got = tokio::select! {
                biased;
                c = self.control.recv() => Got::Work(match c {
                    Some(Control::Query(q)) => Work::Query(q),
                    Some(Control::Stop) | None => Work::Stop(Stop::Asked),
                }),
                Ok(()) = self.elected.changed() => Got::Elected,
                _ = self.stall_timer.tick(), if !resubscribing_on => Got::StallCheck,
                // A tick not back in time is written again: with no input and no new watermark
                // nothing else would wake the task, and the partition's last deadlines (the
                // trace's final DWELLs) would never fire.
                () = crate::runtime::sleep_until(retry_tick), if retry_tick.is_some() => Got::Work(Work::Wake),
                m = async { resubscribing.as_mut().expect("guarded").await }, if resubscribing_on => Got::Resubscribed(Box::new(m)),
                m = bridge(sh, p, next, bridge_at), if bridge_at.is_some() => Got::Bridged(m.map(Box::new)),
                m = self.messages.next() => Got::Message(
                    m.map(|r| r.map(Box::new).map_err(|e| NatsError::request("partition input", e))),
                ),
                q = self.queries.next() => match q {
                    Some(q) => Got::Work(self.answer(q)),
                    None => Got::Again,
                },
                _ = self.ck_timer.tick(), if can_checkpoint => if self.checkpoint_due(driver) {
                    Got::Work(Work::Checkpoint { full: true })
                } else {
                    Got::Again
                },
                // The frozen devices go into the object a chunk at a time between records (the
                // task yields after each chunk).
                () = std::future::ready(()), if self.ck.freezing() => Got::Work(Work::CheckpointRoom),
            };
            match got {
                Got::Work(w) => return w,
                Got::Again => continue,
                Got::Elected => {
                    // From the record after the last one applied: what the old consumer
                    // delivers meanwhile is applied, and delivered again by the new one, which
                    // skips it (at or before the driver's position).
                    self.resubscribe_from(driver.applied() + 1);
                }
                Got::StallCheck => self.check_stall(driver.applied()).await,
                Got::Bridged(None) => {
                    self.bridge_at = Some(Instant::now() + BRIDGE_IDLE);
                }
                Got::Bridged(Some(m)) => {
                    self.bridge_at = Some(Instant::now());
                    counter!(t::CLUSTER_INPUT_BRIDGED).increment(1);
                    let r = self
                        .record_at(m.sequence, 1, Some(&m.headers), &m.payload)
                        .await;
                    if let Some(w) = self.unless_applied(r, driver.applied()) {
                        return w;
                    }
                }
                Got::Resubscribed(m) => {
                    self.resubscribing = None;
                    self.bridge_at = None;
                    self.messages = *m;
                    self.heard = Instant::now();
                    tracing::debug!(partition = self.p, "input consumer re-created");
                }
                Got::Message(None) => {
                    self.failed = Some(NatsError::request("partition input", "consumer ended"));
                    return Work::Stop(Stop::Lost);
                }
                Got::Message(Some(Err(e))) => {
                    tracing::warn!(partition = self.p, error = %e, "partition input; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Got::Message(Some(Ok(m))) => {
                    self.heard = Instant::now();
                    let r = self.record(*m).await;
                    if let Some(w) = self.unless_applied(r, driver.applied()) {
                        return w;
                    }
                }
            }
        }
    }

    fn fences(&self) -> &dyn FenceSource {
        &*self.sh.fences
    }

    async fn applied(&mut self, driver: &mut Driver, s: AppliedStep<'_, Ticket>) -> bool {
        let live = self.caught_up;
        match (&s.applied, s.input) {
            (Applied::Fixes(outcomes), _) => {
                // Replies to requests still waiting; a replayed record's request is long gone.
                if live
                    && let Some((node, req)) =
                        s.ticket.reply.as_deref().and_then(|r| r.rsplit_once('.'))
                    && let Ok(req) = req.parse::<u64>()
                {
                    let _ = self
                        .sh
                        .nats
                        .client
                        .publish(outcome_subject(node), encode_outcomes(req, outcomes).into())
                        .await;
                }
            }
            (Applied::Removed(n), Input::Removed(r)) if live && *n > 0 => {
                let reason = if r.idle.is_some() { "idle" } else { "delete" };
                counter!(t::DEVICES_REMOVED, "reason" => reason).increment(*n as u64);
            }
            (Applied::Tick, _) => self.tick_outstanding = None,
            (Applied::Fences, Input::Fences(c)) => self.marker = self.marker.max(*c),
            _ => {}
        }
        self.progress(s.pos, s.ticket.pending);
        self.flush(driver).await
    }

    async fn flush(&mut self, driver: &mut Driver) -> bool {
        if !driver.has_events() {
            return true;
        }
        let now = self.sh.watermark.wall().now();
        let mut events = driver.take_events();
        for e in &mut events {
            e.emitted_at = Some(now);
        }
        self.outbox.send(events).await
    }

    async fn tick(&mut self, driver: &mut Driver, w: Ts) {
        if !self.caught_up
            || self
                .tick_outstanding
                .is_some_and(|t| t.elapsed() < TICK_RETRY)
        {
            return;
        }
        // A tick written earlier and not back (lost with a leader, or never written) is
        // written again if still due; [`Partition::next`] wakes the task for that.
        self.tick_outstanding = None;
        let due = driver.next_due().is_some_and(|d| d <= w);
        if due && driver.watermark().is_none_or(|e| e < w) {
            if self.write(&Input::Tick(w)).await {
                counter!(t::CLUSTER_TICKS).increment(1);
            }
            self.tick_outstanding = Some(Instant::now());
        }
    }

    async fn append(&mut self, _driver: &Driver, input: Input) {
        if self.caught_up {
            self.write(&input).await;
        }
    }

    fn checkpoints(&mut self) -> &mut ObjectCheckpoints {
        &mut self.ck
    }

    fn owner(&self) -> Arc<Lease> {
        self.lease.clone()
    }

    async fn housekeeping(&mut self, _driver: &Driver) {
        self.checkpoint_written().await;
        self.fence_catch_up().await;
        if let Some(ptr) = self.ck.pointer() {
            gauge!(t::CLUSTER_CHECKPOINT_AGE_SECONDS, "partition" => self.label.clone())
                .set((self.sh.watermark.wall().now().0 - ptr.at_ms).max(0) as f64 / 1000.0);
        }
    }

    async fn finish(mut self, mut driver: Driver, stop: Stop) -> Ended {
        let ended = match (stop, self.failed.take()) {
            (_, Some(e)) => Ended::Failed(PartitionError::Nats(e)),
            (Stop::Failed(missing), None) => Ended::Failed(PartitionError::MissingFences(missing)),
            (Stop::Lost, None) => Ended::LeaseLost,
            (Stop::Asked, None) => Ended::Stopped {
                checkpointed: self.final_checkpoint(&mut driver).await,
            },
        };
        // Whatever was produced goes out while the lease holds, then the outbox ends.
        let Partition {
            outbox,
            outbox_task,
            ck,
            ..
        } = self;
        let writing = ck.finish();
        drop(outbox);
        let _ = tokio::time::timeout(Duration::from_secs(10), outbox_task).await;
        if let Some(w) = writing {
            let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
        }
        ended
    }
}
