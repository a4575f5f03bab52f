//! The publisher: the single writer between the shards and the outside world.
//!
//! Every shard step (an ingest batch, a watermark advance, a fence change) ends in one
//! [`Step`] sent here: the events it produced, the shard's input record for it (what a replay
//! needs to do the step again: the fixes with their stamps, or the fence change applied), and
//! the HTTP reply waiting for it. The publisher drains everything queued, stamps `seq` on the
//! events in that order, commits it all in **one** store transaction (group commit: concurrent
//! requests and shards share one fsync; the commit appends input and events, it never rewrites
//! device state), and only then appends the events to the in-memory log (subscribers see them)
//! and releases the replies. So:
//! - a 2xx answer to a batch means its input record and events are durable (`sync`), hence its
//!   effects: a warm start replays the record from the latest checkpoint;
//! - events produced by ticks (DWELL, vote expiry) are committed before anyone sees them;
//! - `seq` is gap-free on disk and in memory, because only this task assigns it and a failed
//!   commit publishes nothing: the failed batch stays pending (with its seqs) and is retried, merged
//!   with later work, until it commits; its waiters get an error (503) in the meantime.
//!
//! Without a store (`durability = "none"`) the same path stamps and publishes at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, histogram};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::clock::WallClock;
use crate::durable::InputLog;
use crate::events::{CompactEvent, EventLog, LoggedEvent};
use crate::store::{Batch, Flush};
use crate::telemetry as t;
use geodwell_core::engine::{IngestError, Ingested};
use geodwell_core::event::Event;
use geodwell_core::time::Ts;

/// Why a step's reply is an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The store could not commit; the data is kept and retried.
    #[error("the state store cannot commit: {0}")]
    Store(String),
    /// The publisher is gone (shutdown).
    #[error("the service is shutting down")]
    Closed,
}

/// The outcome of one fix, by its index in the request.
pub type FixOutcome = (usize, Result<Ingested, IngestError>);

/// What a waiting HTTP request gets back.
pub type StepReply = Result<Vec<FixOutcome>, PublishError>;

/// A shard's input record for one step: (shard, seq, encoded record; `store::input`).
pub type InputRecord = (u16, u64, Vec<u8>);

/// One shard step's output.
#[derive(Debug, Default)]
pub struct Step {
    /// Events produced, in order.
    pub events: Vec<Event>,
    /// The shard's input record for the step (none for a step that only advanced time).
    pub input: Option<InputRecord>,
    /// Fence changes made by the registry: (change number, encoded change).
    pub fence_changes: Vec<(u64, Vec<u8>)>,
    /// Log records a checkpoint now covers, to delete: per shard the last `seq`, and the last
    /// fence change.
    pub truncate: Option<(Vec<(u16, u64)>, u64)>,
    /// The shard's watermark after the step.
    pub watermark: Option<Ts>,
    /// Who waits for this step to be durable, and what to tell them.
    pub reply: Option<(oneshot::Sender<StepReply>, Vec<FixOutcome>)>,
    /// Fence writes wait too.
    pub ack: Option<oneshot::Sender<Result<(), PublishError>>>,
    /// Per event, in order: when what caused it happened, for the ingest-to-event latency (the
    /// arrival of the fix that decided it, or the moment the watermark passed its time).
    pub causes: Vec<Instant>,
    /// The request this step is a part of: (request id, number of parts).
    pub request: Option<(u64, u32)>,
    /// The largest fix `ts` in this step (the persisted event-mode watermark source).
    pub max_ts: Option<Ts>,
}

/// Sends steps to the publisher task.
#[derive(Debug, Clone)]
pub struct Publisher {
    tx: mpsc::Sender<Step>,
    durable: Arc<Durable>,
}

impl Publisher {
    /// Queues a step (waits while the queue is full: backpressure onto the shard).
    pub async fn send(&self, step: Step) -> Result<(), PublishError> {
        self.tx.send(step).await.map_err(|_| PublishError::Closed)
    }

    /// What the store holds so far.
    pub fn durable(&self) -> &Arc<Durable> {
        &self.durable
    }
}

/// How far the store has committed, for the checkpoint writer: per shard the last input `seq`
/// committed, and the next event `seq` the publisher will assign.
#[derive(Debug)]
pub struct Durable {
    committed: Vec<std::sync::atomic::AtomicU64>,
    next_seq: std::sync::atomic::AtomicU64,
    changed: tokio::sync::Notify,
}

impl Durable {
    /// Per shard, `committed[k]` starting at `start[k]`.
    pub fn new(start: &[u64], next_seq: u64) -> Durable {
        Durable {
            committed: start
                .iter()
                .map(|&s| std::sync::atomic::AtomicU64::new(s))
                .collect(),
            next_seq: std::sync::atomic::AtomicU64::new(next_seq),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// The last input `seq` of `shard` the store holds.
    pub fn committed(&self, shard: usize) -> u64 {
        self.committed
            .get(shard)
            .map_or(0, |c| c.load(std::sync::atomic::Ordering::Acquire))
    }

    /// The `seq` the publisher will assign to the next event.
    pub fn next_seq(&self) -> u64 {
        self.next_seq.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until every shard `k` has `seqs[k]` committed (or `stop` is cancelled; false then).
    pub async fn wait_for(&self, seqs: &[u64], stop: &CancellationToken) -> bool {
        loop {
            let notified = self.changed.notified();
            if seqs
                .iter()
                .enumerate()
                .all(|(k, &s)| self.committed(k) >= s)
            {
                return true;
            }
            tokio::select! {
                _ = notified => {}
                _ = stop.cancelled() => return false,
                // Belt and braces: a notification between the check and the wait is not lost
                // (`notified` was created first), but a periodic look costs nothing.
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }

    fn set(&self, shard: u16, seq: u64) {
        if let Some(c) = self.committed.get(shard as usize) {
            c.fetch_max(seq, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

/// When the publisher commits to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitPolicy {
    /// Every drained group of steps is committed (fsync'd) before anyone is answered
    /// (`durability = "sync"`).
    Immediate,
    /// Steps are answered at once and committed at most this long after (`durability = "async"`).
    Interval(Duration),
}

/// The publisher's configuration.
#[derive(Debug, Clone)]
pub struct PublisherCfg {
    /// The input log; `None` keeps everything in memory (`durability = "none"`).
    pub store: Option<Arc<dyn InputLog>>,
    /// When commits happen.
    pub policy: CommitPolicy,
    /// The largest fix time a previous run committed (event clock mode), persisted again with
    /// every commit.
    pub restored_max_seen: Option<i64>,
    /// Events the store keeps (older ones are trimmed).
    pub log_capacity: usize,
    /// Queue length.
    pub queue: usize,
    /// Per shard, the last input `seq` the store already holds (from the warm start).
    pub committed: Vec<u64>,
    /// Cancelled to stop: the publisher takes no new steps, commits what is queued, and ends.
    pub stop: CancellationToken,
}

/// Starts the publisher task; it ends, after a final commit, once `cfg.stop` is cancelled (or
/// every [`Publisher`] is dropped) and its queue is drained.
pub fn spawn(
    cfg: PublisherCfg,
    log: Arc<EventLog>,
    wall: WallClock,
) -> (Publisher, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(cfg.queue.max(1));
    let durable = Arc::new(Durable::new(&cfg.committed, log.next_seq()));
    let handle = tokio::spawn(run(cfg, rx, log, wall, durable.clone()));
    (Publisher { tx, durable }, handle)
}

/// What has been stamped but not yet committed and published.
#[derive(Default)]
struct Uncommitted {
    batch: Batch,
    events: Vec<LoggedEvent>,
    replies: Vec<(oneshot::Sender<StepReply>, Vec<FixOutcome>)>,
    acks: Vec<oneshot::Sender<Result<(), PublishError>>>,
    causes: Vec<Instant>,
    watermark: Option<Ts>,
    /// Largest fix ts among committed and pending steps (never reset: it only grows).
    max_seen: Option<i64>,
    /// Per shard, the last input seq in this batch.
    inputs_upto: Vec<(u16, u64)>,
}

impl Uncommitted {
    fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.replies.is_empty()
            && self.acks.is_empty()
            && self.batch.inputs.is_empty()
            && self.batch.fence_changes.is_empty()
            && self.batch.truncate_inputs.is_empty()
            && self.watermark.is_none()
    }
}

async fn run(
    cfg: PublisherCfg,
    mut rx: mpsc::Receiver<Step>,
    log: Arc<EventLog>,
    wall: WallClock,
    durable: Arc<Durable>,
) {
    let mut next_seq = log.next_seq();
    let mut p = Uncommitted {
        max_seen: cfg.restored_max_seen,
        ..Uncommitted::default()
    };
    let mut last_commit = Instant::now();
    let mut failing = false;
    loop {
        // Wait for work; while a commit is failing, retry every second even without new work.
        // In async mode, wake at the commit interval.
        let wait = if failing {
            Some(Duration::from_secs(1))
        } else if let (Some(_), CommitPolicy::Interval(every)) = (&cfg.store, cfg.policy)
            && !p.is_empty()
        {
            Some(every.saturating_sub(last_commit.elapsed()))
        } else {
            None
        };
        let first = match wait {
            Some(d) => match tokio::time::timeout(d, next(&mut rx, &cfg.stop)).await {
                Ok(Some(s)) => Some(s),
                Ok(None) => return finish(&cfg, &log, &mut p, next_seq, &durable).await,
                Err(_) => None, // timer: retry or async commit
            },
            None => match next(&mut rx, &cfg.stop).await {
                Some(s) => Some(s),
                None => return finish(&cfg, &log, &mut p, next_seq, &durable).await,
            },
        };
        let mut steps: Vec<Step> = first.into_iter().collect();
        while steps.len() < 4096 {
            match rx.try_recv() {
                Ok(s) => steps.push(s),
                Err(_) => break,
            }
        }
        // All shard parts of one request commit together: a crash then keeps a whole request or
        // none of it, and its re-sent copy meets the same state everywhere. The missing parts are
        // already being processed by their shards, so waiting for them is short.
        let mut open: HashMap<u64, u32> = HashMap::new();
        let note = |open: &mut HashMap<u64, u32>, s: &Step| {
            if let Some((id, parts)) = s.request {
                let seen = open.entry(id).or_insert(0);
                *seen += 1;
                if *seen >= parts {
                    open.remove(&id);
                }
            }
        };
        for s in &steps {
            note(&mut open, s);
        }
        while !open.is_empty() {
            match tokio::time::timeout(Duration::from_secs(2), rx.recv()).await {
                Ok(Some(s)) => {
                    note(&mut open, &s);
                    steps.push(s);
                }
                _ => break,
            }
        }
        let now = wall.now();
        for s in steps {
            if let Some(t) = s.max_ts {
                p.max_seen = Some(p.max_seen.map_or(t.0, |m| m.max(t.0)));
            }
            for mut e in s.events {
                e.seq = next_seq;
                e.emitted_at = Some(now);
                let compact = match CompactEvent::from_event(&e) {
                    Ok(c) => c,
                    Err(err) => {
                        // Unreachable for events the engine builds; dropped before it takes a
                        // seq, so the log and the store stay gap-free.
                        tracing::error!(error = %err, "event not published");
                        continue;
                    }
                };
                next_seq += 1;
                // Rendered once here: the store keeps this text and the log keeps it for the
                // live readers (equal to what rendering the compact form gives).
                let json: Arc<str> = serde_json::to_string(&e)
                    .unwrap_or_else(|_| "{}".to_string())
                    .into();
                p.batch.events.push((e.seq, json.clone()));
                p.events.push(LoggedEvent::new(e.seq, compact, Some(json)));
            }
            if let Some((shard, seq, rec)) = s.input {
                p.inputs_upto.push((shard, seq));
                p.batch.inputs.push((shard, seq, rec));
            }
            p.batch.fence_changes.extend(s.fence_changes);
            if let Some((shards, fences)) = s.truncate {
                p.batch.truncate_inputs.extend(shards);
                p.batch.truncate_fence_changes = Some(
                    p.batch
                        .truncate_fence_changes
                        .map_or(fences, |f| f.max(fences)),
                );
            }
            if let Some(w) = s.watermark {
                p.watermark = Some(p.watermark.map_or(w, |c| c.max(w)));
            }
            p.replies.extend(s.reply);
            p.acks.extend(s.ack);
            p.causes.extend(s.causes);
        }
        let due = match (&cfg.store, cfg.policy) {
            (Some(_), CommitPolicy::Interval(every)) => last_commit.elapsed() >= every,
            _ => true,
        };
        durable
            .next_seq
            .store(next_seq, std::sync::atomic::Ordering::Release);
        if due || failing {
            failing = !commit(&cfg, &log, &mut p, &mut last_commit, next_seq, &durable);
        } else {
            // async: answer now, publish and persist at the next interval.
            for (tx, outcomes) in p.replies.drain(..) {
                let _ = tx.send(Ok(outcomes));
            }
            for tx in p.acks.drain(..) {
                let _ = tx.send(Ok(()));
            }
        }
    }
}

/// The next step; once `stop` is cancelled the queue is closed, so what is queued is still
/// returned and then `None`.
async fn next(rx: &mut mpsc::Receiver<Step>, stop: &CancellationToken) -> Option<Step> {
    tokio::select! {
        biased;
        s = rx.recv() => s,
        _ = stop.cancelled() => {
            rx.close();
            rx.recv().await
        }
    }
}

/// Every sender is gone, or the publisher was stopped: a last commit (retried a few times) before the task ends.
async fn finish(
    cfg: &PublisherCfg,
    log: &EventLog,
    p: &mut Uncommitted,
    next_seq: u64,
    durable: &Durable,
) {
    let mut last = Instant::now();
    for _ in 0..3 {
        if p.is_empty() || commit(cfg, log, p, &mut last, next_seq, durable) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::error!("final state commit failed; the last steps since the previous commit are lost");
}

/// Commits `p` (if there is a store) and publishes it; returns false when the commit failed (the
/// data stays in `p` for the retry).
fn commit(
    cfg: &PublisherCfg,
    log: &EventLog,
    p: &mut Uncommitted,
    last_commit: &mut Instant,
    next_seq: u64,
    durable: &Durable,
) -> bool {
    if let Some(store) = &cfg.store {
        p.batch.watermark = p.watermark.map(|w| w.0);
        // The event-mode watermark is persisted from the fixes this commit holds, not from the
        // live counter, which may already include requests that are not committed yet.
        p.batch.max_seen = p.max_seen;
        p.batch.next_seq = Some(next_seq);
        // Store retention follows the in-memory log, which drops events by count and by age.
        let by_count = next_seq.saturating_sub(cfg.log_capacity as u64);
        let by_age = log.read(0, 0).first_seq;
        p.batch.trim_events_below = Some(by_count.max(by_age)).filter(|&t| t > 0);
        let started = Instant::now();
        // Both policies commit with fsync: `Interval` only changes *when* (answering before
        // the commit); a commit without fsync would not survive a crash.
        // The commit (B-tree writes + fsync) blocks: let the runtime move other tasks off this
        // worker meanwhile (a current-thread runtime, e.g. in unit tests, just runs it).
        let multi = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let res = if multi {
            tokio::task::block_in_place(|| store.append(&p.batch, Flush::Fsync))
        } else {
            store.append(&p.batch, Flush::Fsync)
        };
        histogram!(t::STORE_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
        *last_commit = Instant::now();
        if let Err(e) = res {
            counter!(t::STORE_COMMIT_FAILURES).increment(1);
            tracing::error!(error = %e, "state store commit failed; keeping the data and retrying");
            let err = PublishError::Store(e.to_string());
            for (tx, _) in p.replies.drain(..) {
                let _ = tx.send(Err(err.clone()));
            }
            for tx in p.acks.drain(..) {
                let _ = tx.send(Err(err.clone()));
            }
            return false;
        }
        counter!(t::STORE_COMMITS).increment(1);
        let bytes: usize = p.batch.inputs.iter().map(|(_, _, r)| r.len()).sum();
        counter!(t::STORE_LOG_APPENDED_BYTES).increment(bytes as u64);
    }
    // Without a store nothing is durable, but nothing waits for it either (no checkpoints).
    for (shard, seq) in p.inputs_upto.drain(..) {
        durable.set(shard, seq);
    }
    durable.changed.notify_waiters();
    for e in &p.events {
        counter!(t::EVENTS_EMITTED, "type" => e.event.kind().as_str()).increment(1);
    }
    if let Err(e) = log.append_stamped(std::mem::take(&mut p.events)) {
        // Unreachable: this task is the log's only writer and stamps seqs from its next_seq.
        tracing::error!(error = %e, "events committed but not published to the log");
    }
    let now = Instant::now();
    for c in p.causes.drain(..) {
        histogram!(t::INGEST_TO_EVENT_SECONDS)
            .record(now.saturating_duration_since(c).as_secs_f64());
    }
    for (tx, outcomes) in p.replies.drain(..) {
        let _ = tx.send(Ok(outcomes));
    }
    for tx in p.acks.drain(..) {
        let _ = tx.send(Ok(()));
    }
    p.batch = Batch::default();
    p.watermark = None;
    true
}
