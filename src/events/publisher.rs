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
//!   commit publishes nothing: its waiters get an error (503), what it held is dropped (its
//!   seqs are assigned again), and the store's health ([`StoreHealth`]) takes over: the
//!   partitions whose steps it held rebuild from the durable log, ingest refuses input until
//!   they have, and the store is probed every second. A refused request is never applied to
//!   what is committed or published.
//!
//! Without a store (`durability = "none"`) the same path stamps and publishes at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, histogram};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::health::{StoreHealth, StoreState};
use crate::clock::WallClock;
use crate::durable::InputLog;
use crate::events::{CompactEvent, EventLog, LoggedEvent};
use crate::store::{Batch, Flush};
use crate::telemetry as t;
use geodwell_core::event::Event;
use geodwell_core::time::Ts;

pub use super::step::{FixOutcome, InputRecord, LogError, PublishError, Step, StepReply};

/// Sends steps to the publisher task.
#[derive(Debug, Clone)]
pub struct Publisher {
    tx: mpsc::Sender<Step>,
    durable: Arc<Durable>,
    health: Arc<StoreHealth>,
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

    /// Whether the store takes commits.
    pub fn health(&self) -> &Arc<StoreHealth> {
        &self.health
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

    /// Waits until every shard `k` has `seqs[k]` committed (false when `stop` is cancelled, or
    /// the store has failed more than `failures` commits: the partitions a failed commit held
    /// are rebuilt, and positions they had reached in memory are numbered again).
    pub async fn wait_for(
        &self,
        seqs: &[u64],
        health: &StoreHealth,
        failures: u64,
        stop: &CancellationToken,
    ) -> bool {
        loop {
            if health.failures() != failures {
                return false;
            }
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
    let health = Arc::new(StoreHealth::default());
    let run = Run {
        next_seq: log.next_seq(),
        p: Uncommitted {
            max_seen: cfg.restored_max_seen,
            ..Uncommitted::default()
        },
        committed_max_seen: cfg.restored_max_seen,
        last_commit: Instant::now(),
        cfg,
        log,
        wall,
        durable: durable.clone(),
        health: health.clone(),
    };
    let handle = tokio::spawn(run.run(rx));
    (
        Publisher {
            tx,
            durable,
            health,
        },
        handle,
    )
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
    /// Largest fix ts among committed and pending steps.
    max_seen: Option<i64>,
    /// Per shard, the last input seq in this batch.
    inputs_upto: Vec<(u16, u64)>,
    /// The partitions whose steps it holds.
    partitions: std::collections::BTreeSet<u16>,
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

    /// Answers every waiter with `err`.
    fn refuse(&mut self, err: &PublishError) {
        for (tx, _) in self.replies.drain(..) {
            let _ = tx.send(Err(err.clone()));
        }
        for tx in self.acks.drain(..) {
            let _ = tx.send(Err(err.clone()));
        }
    }
}

/// The publisher task's state.
struct Run {
    cfg: PublisherCfg,
    log: Arc<EventLog>,
    wall: WallClock,
    durable: Arc<Durable>,
    health: Arc<StoreHealth>,
    /// The `seq` the next event gets.
    next_seq: u64,
    p: Uncommitted,
    /// The largest fix time committed.
    committed_max_seen: Option<i64>,
    last_commit: Instant,
}

impl Run {
    async fn run(mut self, mut rx: mpsc::Receiver<Step>) {
        loop {
            let first = match self.wait(&mut rx).await {
                Wait::Step(s) => Some(*s),
                Wait::Timer => None,
                Wait::End => return self.finish().await,
            };
            let steps = gather(first, &mut rx).await;
            for s in steps {
                self.take(s);
            }
            self.settle();
        }
    }

    /// Waits for work; while the store fails, probes it every second even without work. In
    /// async mode, wakes at the commit interval.
    async fn wait(&self, rx: &mut mpsc::Receiver<Step>) -> Wait {
        let wait = if self.health.state() == StoreState::Failing {
            Some(Duration::from_secs(1))
        } else if let (Some(_), CommitPolicy::Interval(every)) = (&self.cfg.store, self.cfg.policy)
            && !self.p.is_empty()
        {
            Some(every.saturating_sub(self.last_commit.elapsed()))
        } else {
            None
        };
        let next = next(rx, &self.cfg.stop);
        match wait {
            Some(d) => match tokio::time::timeout(d, next).await {
                Ok(Some(s)) => Wait::Step(Box::new(s)),
                Ok(None) => Wait::End,
                Err(_) => Wait::Timer,
            },
            None => next.await.map_or(Wait::End, |s| Wait::Step(Box::new(s))),
        }
    }

    /// Takes one step: stamps its events and adds it to what the next commit holds; refuses it
    /// while the store fails (or its partition has yet to rebuild).
    fn take(&mut self, s: Step) {
        if s.rebuilt
            && let Some(k) = s.partition
        {
            self.health.rebuilt(k);
        }
        let refused = match (self.health.state(), s.partition) {
            (StoreState::Failing, _) => true,
            (StoreState::Recovering, Some(k)) => self.health.is_marked(k),
            _ => false,
        };
        if refused {
            return self.refuse(s);
        }
        if let Some(k) = s.partition {
            self.p.partitions.insert(k);
        }
        if let Some(t) = s.max_ts {
            self.p.max_seen = Some(self.p.max_seen.map_or(t.0, |m| m.max(t.0)));
        }
        self.stamp(s.events);
        let p = &mut self.p;
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

    /// A step the store cannot take now: its waiters get a 503, its partition rebuilds.
    fn refuse(&self, s: Step) {
        if let Some(k) = s.partition {
            self.health.mark(k);
        }
        let err = PublishError::Store(LogError::Failing(self.health.reason()));
        if let Some((tx, _)) = s.reply {
            let _ = tx.send(Err(err.clone()));
        }
        if let Some(tx) = s.ack {
            let _ = tx.send(Err(err));
        }
    }

    /// Stamps `seq` on events and renders them once.
    fn stamp(&mut self, events: Vec<Event>) {
        let now = self.wall.now();
        for mut e in events {
            e.seq = self.next_seq;
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
            self.next_seq += 1;
            // Rendered once here: the store keeps this text and the log keeps it for the
            // live readers (equal to what rendering the compact form gives).
            let json: Arc<str> = serde_json::to_string(&e)
                .unwrap_or_else(|_| "{}".to_string())
                .into();
            self.p.batch.events.push((e.seq, json.clone()));
            self.p
                .events
                .push(LoggedEvent::new(e.seq, compact, Some(json)));
        }
    }

    /// Commits what is pending when due (or probes a failing store); in async mode answers at
    /// once and commits at the interval.
    fn settle(&mut self) {
        self.durable
            .next_seq
            .store(self.next_seq, std::sync::atomic::Ordering::Release);
        if self.health.state() == StoreState::Failing {
            if self.commit() {
                tracing::info!("a probe commit succeeded; rebuilding the partitions it failed for");
                self.health.probe_committed();
            }
            return;
        }
        let due = match (&self.cfg.store, self.cfg.policy) {
            (Some(_), CommitPolicy::Interval(every)) => self.last_commit.elapsed() >= every,
            _ => true,
        };
        if due {
            self.commit();
        } else {
            // async: answer now, publish and persist at the next interval.
            for (tx, outcomes) in self.p.replies.drain(..) {
                let _ = tx.send(Ok(outcomes));
            }
            for tx in self.p.acks.drain(..) {
                let _ = tx.send(Ok(()));
            }
        }
    }

    /// Every sender is gone, or the publisher was stopped: a last commit (retried a few times)
    /// before the task ends.
    async fn finish(mut self) {
        for _ in 0..3 {
            if self.p.is_empty() || self.commit() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tracing::error!(
            "final state commit failed; the last steps since the previous commit are lost"
        );
    }

    /// Commits what is pending (with a store) and publishes it; false when the commit failed
    /// (what it held is dropped: see [`StoreHealth`]).
    fn commit(&mut self) -> bool {
        if let Some(store) = self.cfg.store.clone()
            && let Err(e) = self.write(&*store)
        {
            self.failed(e);
            return false;
        }
        self.committed_max_seen = self.p.max_seen;
        self.publish();
        true
    }

    /// Writes what is pending to the store.
    fn write(&mut self, store: &dyn InputLog) -> Result<(), crate::store::StoreError> {
        let p = &mut self.p;
        p.batch.watermark = p.watermark.map(|w| w.0);
        // The event-mode watermark is persisted from the fixes this commit holds, not from the
        // live counter, which may already include requests that are not committed yet.
        p.batch.max_seen = p.max_seen;
        p.batch.next_seq = Some(self.next_seq);
        // Store retention follows the in-memory log, which drops events by count and by age.
        let by_count = self.next_seq.saturating_sub(self.cfg.log_capacity as u64);
        let by_age = self.log.read(0, 0).first_seq;
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
        self.last_commit = Instant::now();
        res?;
        counter!(t::STORE_COMMITS).increment(1);
        let bytes: usize = p.batch.inputs.iter().map(|(_, _, r)| r.len()).sum();
        counter!(t::STORE_LOG_APPENDED_BYTES).increment(bytes as u64);
        Ok(())
    }

    /// A commit failed: its waiters get a 503, what it held is dropped and its partitions
    /// rebuild; the store is probed from now on.
    fn failed(&mut self, e: crate::store::StoreError) {
        counter!(t::STORE_COMMIT_FAILURES).increment(1);
        if self.health.state() != StoreState::Failing {
            tracing::error!(error = %e, "state store commit failed; refusing input until it commits again (probed every second)");
        }
        let e = Arc::new(e);
        self.health.failed(e.clone());
        let mut p = std::mem::take(&mut self.p);
        p.refuse(&PublishError::Store(LogError::Commit(e)));
        for k in &p.partitions {
            self.health.mark(*k);
        }
        self.p = Uncommitted {
            max_seen: self.committed_max_seen,
            ..Uncommitted::default()
        };
        self.next_seq = self.log.next_seq();
        self.durable
            .next_seq
            .store(self.next_seq, std::sync::atomic::Ordering::Release);
    }

    /// Publishes what was committed: the log, the durable positions, the answers.
    fn publish(&mut self) {
        let p = &mut self.p;
        // Without a store nothing is durable, but nothing waits for it either (no checkpoints).
        for (shard, seq) in p.inputs_upto.drain(..) {
            self.durable.set(shard, seq);
        }
        self.durable.changed.notify_waiters();
        for e in &p.events {
            counter!(t::EVENTS_EMITTED, "type" => e.event.kind().as_str()).increment(1);
        }
        if let Err(e) = self.log.append_stamped(std::mem::take(&mut p.events)) {
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
        p.partitions.clear();
    }
}

/// What waiting for work gave.
enum Wait {
    Step(Box<Step>),
    Timer,
    End,
}

/// Drains what is queued after `first`. All parts of one request commit together: a crash then
/// keeps a whole request or none of it, and its re-sent copy meets the same state everywhere.
/// The missing parts are already being processed by their partitions, so waiting for them is
/// short.
async fn gather(first: Option<Step>, rx: &mut mpsc::Receiver<Step>) -> Vec<Step> {
    let mut steps: Vec<Step> = first.into_iter().collect();
    while steps.len() < 4096 {
        match rx.try_recv() {
            Ok(s) => steps.push(s),
            Err(_) => break,
        }
    }
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
    steps
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
