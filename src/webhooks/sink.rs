//! One sink: its runtime state (cursor, counters, dead letters, changes not yet persisted) and
//! the task that delivers to it. The values it reports are in `status.rs`, the form the store
//! keeps of it in `persisted.rs`; neither names anything of this file.
//!
//! Invariants:
//! - The task is the only writer of the cursor, and moves it forward only: past an event once it
//!   was delivered (2xx), dead-lettered, filtered out, or found missing from both the event log
//!   and the store (then counted as dropped). So events reach the receiver in `seq` order, and
//!   none is skipped silently.
//! - Everything the store must learn (cursor, dead-letter puts and deletes) is recorded under
//!   the same lock as the in-memory change and taken by the manager's flush in one piece, so a
//!   persisted cursor never runs ahead of the dead letters written before it.
//! - Waiting (backoff, a slow receiver, an idle log) only ever blocks this sink's task: nothing
//!   else waits for it, and the stop token ends every wait at once.

use std::collections::{BTreeMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{counter, histogram};
use rand_xoshiro::Xoshiro256PlusPlus as Rng;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use serde_json::value::RawValue;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::events::{Chunk, EventFilter, EventLog, LogCursor};
use crate::store::Store;
use crate::telemetry as t;
use crate::webhooks::brokers;
use crate::webhooks::deliver::{self, Attempt};
use crate::webhooks::spec::{SinkSpec, backoff_cap, full_jitter};
use geodwell_core::event::EventKind;
use geodwell_core::time::Ts;

mod persisted;
mod status;
pub use persisted::Stats;
pub(crate) use persisted::Unflushed;
pub use status::{DeadLetter, Phase, SinkStatus, Source};

/// Events read from the log (or the store) per step.
const CHUNK: usize = 256;

#[derive(Debug)]
struct State {
    cursor: u64,
    /// The cursor the store holds (`None`: none yet).
    persisted: Option<u64>,
    dead: VecDeque<DeadLetter>,
    dead_ops: BTreeMap<u64, Option<DeadLetter>>,
    phase: Phase,
    attempt: u32,
    last_error: Option<String>,
    last_failure_at: Option<Ts>,
    last_success_at: Option<Ts>,
    retry_requested: bool,
    stats_persisted: Stats,
}

/// What the task needs from the service.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub(crate) log: Arc<EventLog>,
    pub(crate) store: Option<Arc<Store>>,
    pub(crate) client: reqwest::Client,
    /// Where deliveries may connect.
    pub(crate) policy: crate::outbound::TargetPolicy,
}

/// One event on its way to the sink: an empty `json` is one the sink skips (filtered out, or
/// undecodable).
struct Item {
    seq: u64,
    id: String,
    kind: EventKind,
    fence: Arc<str>,
    json: Arc<str>,
}

/// A sink task's own means: its broker connection and its jitter source.
struct Io {
    conn: brokers::Conn,
    rng: Rng,
}

enum Outcome {
    Delivered,
    Exhausted { attempts: u32, error: String },
    Stopped,
}

/// One sink.
#[derive(Debug)]
pub struct Sink {
    /// The definition.
    pub spec: SinkSpec,
    /// Config or API.
    pub source: Source,
    filter: EventFilter,
    st: Mutex<State>,
    /// Cancelled to end the task (shutdown or deletion).
    pub(crate) stop: CancellationToken,
    wake: Notify,
    sent: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    dropped: AtomicU64,
}

fn now() -> Ts {
    Ts(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64))
}

impl Sink {
    /// A sink starting at `cursor` with `dead` (ascending by seq) already dead-lettered;
    /// `persisted` says whether the store already holds that cursor.
    pub(crate) fn new(
        spec: SinkSpec,
        source: Source,
        cursor: u64,
        persisted: bool,
        dead: Vec<DeadLetter>,
        stop: CancellationToken,
    ) -> Sink {
        Sink {
            filter: spec.filter(),
            spec,
            source,
            st: Mutex::new(State {
                cursor,
                persisted: persisted.then_some(cursor),
                dead: dead.into(),
                dead_ops: BTreeMap::new(),
                phase: Phase::Idle,
                attempt: 0,
                last_error: None,
                last_failure_at: None,
                last_success_at: None,
                retry_requested: false,
                stats_persisted: Stats::default(),
            }),
            stop,
            wake: Notify::new(),
            sent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every mutation under this lock is a plain field update: a poisoned lock is usable.
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next `seq` this sink will look at.
    pub fn cursor(&self) -> u64 {
        self.lock().cursor
    }

    /// The status, with the lag measured against `head_seq`.
    pub fn status(&self, head_seq: u64) -> SinkStatus {
        let st = self.lock();
        SinkStatus {
            cursor: st.cursor,
            head_seq,
            lag: head_seq.saturating_sub(st.cursor),
            state: st.phase,
            attempt: st.attempt,
            sent: self.sent.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            dead_letters: st.dead.len(),
            last_error: st.last_error.clone(),
            last_failure_at: st.last_failure_at,
            last_success_at: st.last_success_at,
        }
    }

    /// The dead letters held, oldest first.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        self.lock().dead.iter().cloned().collect()
    }

    /// Asks the task to re-send every dead letter (before new events); returns how many there
    /// are now.
    pub fn request_retry(&self) -> usize {
        let n = {
            let mut st = self.lock();
            st.retry_requested = !st.dead.is_empty();
            st.dead.len()
        };
        self.wake.notify_one();
        n
    }

    /// Drops every dead letter; returns how many.
    pub fn clear_dead_letters(&self) -> usize {
        let mut st = self.lock();
        let gone: Vec<u64> = st.dead.drain(..).map(|d| d.seq).collect();
        for seq in &gone {
            st.dead_ops.insert(*seq, None);
        }
        st.retry_requested = false;
        gone.len()
    }

    fn set_phase(&self, phase: Phase, attempt: u32) {
        let mut st = self.lock();
        st.phase = phase;
        st.attempt = attempt;
    }

    fn advance(&self, next: u64) {
        let mut st = self.lock();
        st.cursor = st.cursor.max(next);
    }

    fn drop_range(&self, from: u64, to: u64) {
        let n = to.saturating_sub(from);
        if n == 0 {
            return;
        }
        self.dropped.fetch_add(n, Ordering::Relaxed);
        counter!(t::WEBHOOK_DROPPED, "sink" => self.spec.id.clone()).increment(n);
        tracing::warn!(
            sink = %self.spec.id,
            from_seq = from,
            to_seq = to,
            dropped = n,
            "webhook sink fell behind the event retention: these events are gone and were not delivered"
        );
        self.advance(to);
    }

    fn dead_letter(&self, item: &Item, attempts: u32, error: String) {
        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
        counter!(t::WEBHOOK_DEAD_LETTERED, "sink" => self.spec.id.clone()).increment(1);
        tracing::warn!(sink = %self.spec.id, seq = item.seq, event = %item.id, attempts, error = %error, "webhook event dead-lettered");
        let event = RawValue::from_string(item.json.to_string())
            .or_else(|_| RawValue::from_string("null".into()));
        let Ok(event) = event else {
            // Unreachable: the log only holds JSON it serialized itself.
            self.advance(item.seq + 1);
            return;
        };
        let dl = DeadLetter {
            seq: item.seq,
            id: item.id.clone(),
            kind: item.kind,
            fence: item.fence.to_string(),
            attempts,
            last_error: error,
            dead_lettered_at: now(),
            event,
        };
        let mut st = self.lock();
        st.dead_ops.insert(dl.seq, Some(dl.clone()));
        st.dead.push_back(dl);
        while st.dead.len() > self.spec.max_dead_letters {
            if let Some(old) = st.dead.pop_front() {
                st.dead_ops.insert(old.seq, None);
            }
        }
        st.cursor = st.cursor.max(item.seq + 1);
    }

    /// Reads the next events at or after `cursor`: from the log, or from the store when the log
    /// no longer holds them. `None`: nothing to deliver now but the cursor may have moved
    /// (events lost to retention) or the store failed; the caller loops.
    async fn next_items(&self, ctx: &Ctx, cursor: u64) -> Option<Vec<Item>> {
        let read = LogCursor::at(cursor)
            .read_or_store(&ctx.log, ctx.store.as_ref(), CHUNK)
            .await;
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(sink = %self.spec.id, error = %e, "webhook sink cannot read its backlog from the store; retrying in 1 s");
                tokio::select! {
                    _ = self.stop.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                return None;
            }
        };
        for &seq in &read.undecodable {
            // Not expected (the store holds what the log serialized); skipped loudly rather
            // than stalling the sink forever. Later events of this chunk are delivered after
            // the cursor passed this seq.
            tracing::error!(sink = %self.spec.id, seq, "stored event does not decode; skipping it");
            self.dropped.fetch_add(1, Ordering::Relaxed);
            counter!(t::WEBHOOK_DROPPED, "sink" => self.spec.id.clone()).increment(1);
        }
        let events = match read.chunk {
            Chunk::Events(events) => events,
            Chunk::Missed { to } => {
                self.drop_range(cursor, to);
                return None;
            }
        };
        let mut items: Vec<Item> = events
            .iter()
            .map(|e| Item {
                seq: e.seq,
                id: e.event.id().to_string(),
                kind: e.event.kind(),
                fence: e.event.fence().clone(),
                // Only what this sink delivers is rendered (events behind the log's JSON cache
                // have none); an empty text is skipped like a filtered-out event.
                json: if self
                    .filter
                    .matches(e.event.kind(), e.event.fence(), e.event.device())
                {
                    e.json()
                } else {
                    Arc::from("")
                },
            })
            .collect();
        items.extend(read.undecodable.iter().map(|&seq| Item {
            seq,
            id: String::new(),
            kind: EventKind::Enter,
            fence: Arc::from(""),
            json: Arc::from(""),
        }));
        items.sort_by_key(|i| i.seq);
        Some(items)
    }

    /// Sends one event, retrying with backoff until it is delivered, attempts run out, or the
    /// sink stops.
    async fn deliver(&self, ctx: &Ctx, io: &mut Io, id: &str, body: &str) -> Outcome {
        let sink = self.spec.id.clone();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            if attempt > 1 {
                self.retried.fetch_add(1, Ordering::Relaxed);
                counter!(t::WEBHOOK_RETRIES, "sink" => sink.clone()).increment(1);
            }
            self.set_phase(Phase::Delivering, attempt);
            let started = Instant::now();
            let res = tokio::select! {
                _ = self.stop.cancelled() => return Outcome::Stopped,
                a = deliver::attempt(&ctx.client, ctx.policy, &mut io.conn, &self.spec, id, body) => a,
            };
            histogram!(t::WEBHOOK_DELIVERY_SECONDS, "sink" => sink.clone())
                .record(started.elapsed().as_secs_f64());
            match res {
                Attempt::Delivered => {
                    self.sent.fetch_add(1, Ordering::Relaxed);
                    counter!(t::WEBHOOK_SENT, "sink" => sink.clone()).increment(1);
                    self.lock().last_success_at = Some(now());
                    return Outcome::Delivered;
                }
                Attempt::Failed { error, retry_after } => {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    counter!(t::WEBHOOK_FAILED, "sink" => sink.clone()).increment(1);
                    {
                        let mut st = self.lock();
                        st.last_error = Some(error.clone());
                        st.last_failure_at = Some(now());
                    }
                    tracing::debug!(sink = %sink, event = %id, attempt, error = %error, "webhook attempt failed");
                    if attempt >= self.spec.max_attempts {
                        return Outcome::Exhausted {
                            attempts: attempt,
                            error,
                        };
                    }
                    let max = Duration::from_millis(self.spec.backoff_max.millis() as u64);
                    let cap = backoff_cap(self.spec.backoff_base, self.spec.backoff_max, attempt);
                    let mut delay = full_jitter(cap, io.rng.next_u64());
                    if let Some(ra) = retry_after {
                        delay = delay.max(ra.min(max));
                    }
                    self.set_phase(Phase::Retrying, attempt);
                    tokio::select! {
                        _ = self.stop.cancelled() => return Outcome::Stopped,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Re-sends every dead letter held when called (oldest first). Delivered ones leave the
    /// list; failed ones stay with their attempts added up. Returns false if the sink stopped.
    async fn redeliver(&self, ctx: &Ctx, io: &mut Io) -> bool {
        let todo = self.dead_letters();
        for dl in todo {
            if self.stop.is_cancelled() {
                return false;
            }
            let outcome = self.deliver(ctx, io, &dl.id, dl.event.get()).await;
            let mut st = self.lock();
            // It may have been cleared (or pushed out) meanwhile.
            let Some(pos) = st.dead.iter().position(|d| d.seq == dl.seq) else {
                continue;
            };
            match outcome {
                Outcome::Delivered => {
                    st.dead.remove(pos);
                    st.dead_ops.insert(dl.seq, None);
                }
                Outcome::Exhausted { attempts, error } => {
                    let d = &mut st.dead[pos];
                    d.attempts = d.attempts.saturating_add(attempts);
                    d.last_error = error;
                    d.dead_lettered_at = now();
                    let d = d.clone();
                    st.dead_ops.insert(d.seq, Some(d));
                }
                Outcome::Stopped => return false,
            }
        }
        true
    }

    /// The sink's task: deliver from the cursor on, in order, until stopped.
    pub(crate) async fn run(self: Arc<Self>, ctx: Ctx) {
        let seed = std::collections::hash_map::RandomState::new()
            .hash_one((&self.spec.id, std::time::SystemTime::now()));
        let mut io = Io {
            conn: brokers::Conn::default(),
            rng: Rng::seed_from_u64(seed),
        };
        let mut head = ctx.log.watch();
        'run: while !self.stop.is_cancelled() {
            let retry = std::mem::take(&mut self.lock().retry_requested);
            if retry {
                if !self.redeliver(&ctx, &mut io).await {
                    break;
                }
                continue;
            }
            let cursor = self.cursor();
            let Some(items) = self.next_items(&ctx, cursor).await else {
                continue;
            };
            if items.is_empty() {
                self.set_phase(Phase::Idle, 0);
                tokio::select! {
                    _ = self.stop.cancelled() => break,
                    changed = head.changed() => if changed.is_err() { break },
                    _ = self.wake.notified() => {}
                }
                continue;
            }
            for item in items {
                if item.json.is_empty() {
                    self.advance(item.seq + 1);
                    continue;
                }
                match self.deliver(&ctx, &mut io, &item.id, &item.json).await {
                    Outcome::Delivered => self.advance(item.seq + 1),
                    Outcome::Exhausted { attempts, error } => {
                        self.dead_letter(&item, attempts, error)
                    }
                    Outcome::Stopped => break 'run,
                }
                if self.lock().retry_requested {
                    break;
                }
            }
        }
        self.set_phase(Phase::Stopped, 0);
    }
}

// What the store learns of a sink: taken, acknowledged or given back under the sink's lock, so
// the store's copy is a snapshot of memory and never ahead of it; after a crash the counters
// resume from the last flush (a few deliveries may be counted again when their events are sent
// again: at least once).
impl Sink {
    /// Takes the changes the store has not seen.
    pub(crate) fn take_unflushed(&self) -> Unflushed {
        let mut st = self.lock();
        Unflushed {
            cursor: (st.persisted != Some(st.cursor)).then_some(st.cursor),
            dead: std::mem::take(&mut st.dead_ops),
            stats: Some(self.stats_of(&st)).filter(|s| *s != st.stats_persisted),
        }
    }

    /// The store now holds `p`.
    pub(crate) fn flushed(&self, p: &Unflushed) {
        let mut st = self.lock();
        if let Some(c) = p.cursor {
            st.persisted = Some(c);
        }
        if let Some(s) = p.stats {
            st.stats_persisted = s;
        }
    }

    /// Committing `p` failed: keep its dead-letter changes for the next flush (behind any newer
    /// change of the same seq). The cursor needs nothing: it is still unpersisted.
    pub(crate) fn restore_unflushed(&self, p: Unflushed) {
        let mut st = self.lock();
        for (seq, op) in p.dead {
            st.dead_ops.entry(seq).or_insert(op);
        }
    }

    /// The sink with its counters and times restored from the store (counted as persisted).
    pub(crate) fn with_stats(self, s: Stats) -> Sink {
        self.sent.store(s.sent, Ordering::Relaxed);
        self.failed.store(s.failed, Ordering::Relaxed);
        self.retried.store(s.retried, Ordering::Relaxed);
        self.dead_lettered.store(s.dead_lettered, Ordering::Relaxed);
        self.dropped.store(s.dropped, Ordering::Relaxed);
        {
            let mut st = self.lock();
            st.last_success_at = s.last_success_at;
            st.last_failure_at = s.last_failure_at;
            st.stats_persisted = s;
        }
        self
    }

    /// The counters and times now.
    pub(crate) fn stats(&self) -> Stats {
        let st = self.lock();
        self.stats_of(&st)
    }

    /// The counters and times now, with `st` the locked state.
    fn stats_of(&self, st: &State) -> Stats {
        Stats {
            sent: self.sent.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            last_success_at: st.last_success_at,
            last_failure_at: st.last_failure_at,
        }
    }
}
