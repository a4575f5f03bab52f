//! The applier: a thread that writes journaled commits into the live redb file in the
//! background, many per transaction, so that the path of an acknowledgement holds one journal
//! append and nothing of redb.
//!
//! Invariants:
//! - Commits are applied in journal order, each exactly once: the transaction that applies
//!   commits up to `n` also stores `meta.journal_applied = n`, so a crash between the two can
//!   neither lose nor repeat one (`Store::open` applies what the journal holds above it).
//! - A journal segment is released only after the transaction covering all of it committed
//!   with fsync.
//! - The backlog (journaled, not yet applied) is bounded by [`MAX_BACKLOG_BYTES`]: a commit that
//!   would go beyond it waits up to [`ADMIT_WAIT`] for room, then fails (and is retried by the
//!   publisher, answering 503 meanwhile), so a disk that stops taking redb writes cannot grow
//!   memory.
//! - Reads of what commits wrote (warm start, the input log, stored events) first wait until the
//!   backlog they may depend on is applied ([`Applier::barrier`]).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};

use super::batch::Batch;
use super::error::{Behind, StoreError};
use super::journal::Journal;
use super::live::{Flush, Live};
use crate::telemetry as t;

/// The applier waits this long after its previous transaction before the next one, unless a
/// reader waits or the backlog is large: fewer, larger redb transactions.
pub const APPLY_EVERY: Duration = Duration::from_millis(100);
/// A backlog this large is applied at once.
const APPLY_BYTES: usize = 8 << 20;
/// Journaled commits not yet in redb, at most (bytes held in memory).
pub const MAX_BACKLOG_BYTES: usize = 256 << 20;
/// How long a commit waits for room in a full backlog before it fails.
pub const ADMIT_WAIT: Duration = Duration::from_secs(5);
/// How long a reader waits for the backlog to be applied before it fails.
const BARRIER_WAIT: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Queue {
    items: VecDeque<(u64, Batch, usize)>,
    bytes: usize,
    /// The last commit number pushed.
    pushed: u64,
    /// The last commit number durably in redb.
    applied: u64,
    urgent: bool,
    stop: bool,
    /// Why the last transaction failed, while it keeps failing.
    failing: Option<String>,
}

struct Shared {
    q: Mutex<Queue>,
    /// Wakes the applier thread.
    work: Condvar,
    /// Wakes those waiting for progress (room, or an applied position).
    progress: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The applier's handle; dropping it applies what is queued (retrying a few times) and stops
/// the thread.
pub struct Applier {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let q = self.shared.lock();
        f.debug_struct("Applier")
            .field("pushed", &q.pushed)
            .field("applied", &q.applied)
            .field("backlog_bytes", &q.bytes)
            .finish()
    }
}

impl Applier {
    /// Starts the thread; redb already holds every commit up to `applied`.
    pub fn spawn(live: Arc<Live>, journal: Arc<Mutex<Journal>>, applied: u64) -> Applier {
        let shared = Arc::new(Shared {
            q: Mutex::new(Queue {
                pushed: applied,
                applied,
                ..Queue::default()
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("geodwell-store-apply".into())
            .spawn(move || run(&s, &live, &journal))
            .expect("the store's applier thread starts");
        gauge!(t::STORE_APPLY_BACKLOG_BYTES).set(0.0);
        Applier {
            shared,
            thread: Some(thread),
        }
    }

    /// Waits until `bytes` more fit in the backlog (an empty backlog always takes a commit),
    /// for at most [`ADMIT_WAIT`].
    pub fn admit(&self, bytes: usize) -> Result<(), StoreError> {
        let q = self.shared.lock();
        self.hurry(
            q,
            ADMIT_WAIT,
            |q| q.bytes == 0 || q.bytes + bytes <= MAX_BACKLOG_BYTES,
            |q| Behind::Backlog {
                bytes: q.bytes as u64,
            },
        )
    }

    /// Queues journaled commit `n` (numbers must come in order).
    pub fn push(&self, n: u64, batch: Batch, bytes: usize) {
        let mut q = self.shared.lock();
        q.pushed = n;
        q.bytes += bytes;
        q.items.push_back((n, batch, bytes));
        gauge!(t::STORE_APPLY_BACKLOG_BYTES).set(q.bytes as f64);
        // A large backlog is applied at once; a first item wakes a thread that may be idle
        // without a deadline, to start the interval.
        if q.bytes >= APPLY_BYTES || q.items.len() == 1 {
            self.shared.work.notify_one();
        }
    }

    /// Waits until every commit pushed so far is durably in redb.
    pub fn barrier(&self) -> Result<(), StoreError> {
        let q = self.shared.lock();
        let target = q.pushed;
        self.hurry(
            q,
            BARRIER_WAIT,
            |q| q.applied >= target,
            |q| Behind::Barrier {
                target,
                applied: q.applied,
            },
        )
    }

    /// Asks the applier to write now and waits, for at most `wait`, until `done` holds; else
    /// fails with `gave_up`'s account of the queue.
    fn hurry(
        &self,
        mut q: MutexGuard<'_, Queue>,
        wait: Duration,
        done: impl Fn(&Queue) -> bool,
        gave_up: impl FnOnce(&Queue) -> Behind,
    ) -> Result<(), StoreError> {
        let deadline = Instant::now() + wait;
        while !done(&q) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StoreError::Applying {
                    behind: gave_up(&q),
                    failing: q.failing.clone(),
                });
            }
            q.urgent = true;
            self.shared.work.notify_one();
            q = self
                .shared
                .progress
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    /// The last commit number durably in redb.
    pub fn applied(&self) -> u64 {
        self.shared.lock().applied
    }
}

impl Drop for Applier {
    fn drop(&mut self) {
        {
            let mut q = self.shared.lock();
            q.stop = true;
            self.shared.work.notify_one();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(shared: &Shared, live: &Live, journal: &Mutex<Journal>) {
    let mut last = Instant::now();
    let mut failures_at_stop = 0;
    loop {
        let items: Vec<(u64, Batch, usize)> = {
            let mut q = shared.lock();
            loop {
                if q.items.is_empty() {
                    if q.stop {
                        return;
                    }
                    q = shared.work.wait(q).unwrap_or_else(|p| p.into_inner());
                    continue;
                }
                let since = last.elapsed();
                let wait = if q.failing.is_some() {
                    // Retry a failing transaction once a second.
                    Duration::from_secs(1)
                } else {
                    APPLY_EVERY
                };
                // A failing store is retried at its pace, however large the backlog grows.
                let hurried = q.urgent || q.bytes >= APPLY_BYTES;
                if q.stop || (hurried && q.failing.is_none()) || since >= wait {
                    break;
                }
                q = shared
                    .work
                    .wait_timeout(q, wait - since)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            q.urgent = false;
            q.items.drain(..).collect()
        };
        let n = items.last().expect("not empty").0;
        let started = Instant::now();
        let r = live.write(items.iter().map(|(_, b, _)| b), Some(n), Flush::Fsync);
        last = Instant::now();
        histogram!(t::STORE_APPLY_SECONDS).record(started.elapsed().as_secs_f64());
        let mut q = shared.lock();
        match r {
            Ok(()) => {
                q.applied = n;
                q.bytes -= items.iter().map(|(_, _, b)| b).sum::<usize>();
                q.failing = None;
                gauge!(t::STORE_APPLY_BACKLOG_BYTES).set(q.bytes as f64);
                drop(q);
                shared.progress.notify_all();
                let mut j = journal.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = j.release(n) {
                    tracing::warn!(error = %e, "journal: a segment the store file holds could not be removed");
                }
                gauge!(t::STORE_JOURNAL_BYTES).set(j.bytes() as f64);
            }
            Err(e) => {
                counter!(t::STORE_APPLY_FAILURES).increment(1);
                if q.failing.is_none() {
                    tracing::error!(error = %e, "writing journaled commits to the store file failed; they stay in the journal and are retried every second");
                } else {
                    tracing::debug!(error = %e, "writing journaled commits to the store file failed again");
                }
                q.failing = Some(e.to_string());
                for item in items.into_iter().rev() {
                    q.items.push_front(item);
                }
                if q.stop {
                    failures_at_stop += 1;
                    if failures_at_stop >= 3 {
                        tracing::error!(
                            "stopping with journaled commits not in the store file; the next start applies them"
                        );
                        return;
                    }
                }
                drop(q);
                shared.progress.notify_all();
            }
        }
    }
}
