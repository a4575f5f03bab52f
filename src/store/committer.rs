//! The group committer: many producers, one writer, few fsyncs.
//!
//! Producers call [`CommitterHandle::submit`]; the batch is queued at the call (so batches of
//! one producer commit in call order, whatever order their futures are polled in). The committer
//! task takes everything queued, merges it into one [`Batch`] (later wins, see
//! [`Batch::merge`]), commits it once, and resolves every waiter of that group.
//!
//! Invariants:
//! - A batch that was queued is never dropped: after a failed commit the merged batch is kept,
//!   merged with later batches, and retried (on the next submit in sync mode, and on a timer
//!   with back-off in any mode). The waiters of the failed commit get its error; the waiters of
//!   the commit that finally succeeds get `Ok`.
//! - Every commit the committer makes is fsync'd ([`Durability::Sync`] at the redb level) in
//!   both modes; the mode only decides when commits happen and when submitters are answered:
//!   - [`Durability::Sync`]: commit as soon as work is queued (what arrives during a commit goes
//!     into the next one); `submit` resolves after the commit holding its batch is on disk.
//!   - [`Durability::Async`]: commit at most every `commit_interval`; `submit` resolves once the
//!     batch is queued. Loss window on a crash: what was submitted in the last
//!     `commit_interval` plus the duration of one commit (more while commits fail; see
//!     [`CommitterHandle::last_error`]).
//! - Backpressure: the queue holds at most `queue_capacity` unmerged batches; beyond that an
//!   async-mode `submit` waits (after queueing its batch) until the committer has drained the
//!   queue. Sync-mode submitters wait for their commit anyway.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use super::batch::{Accum, Batch};
use super::{Durability, Store, StoreError};

/// Default for [`CommitterConfig::queue_capacity`].
pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;

/// Longest pause between retries of a failed commit.
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(5);
/// First pause before retrying a failed commit.
const MIN_RETRY_BACKOFF: Duration = Duration::from_millis(50);

/// How a [`Committer`] commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitterConfig {
    /// When submitters are answered and commits happen (see the module docs).
    pub durability: Durability,
    /// Async mode: the shortest time between two commits.
    pub commit_interval: Duration,
    /// Most queued, not yet merged batches before async submitters wait.
    pub queue_capacity: usize,
}

type Reply = oneshot::Sender<Result<(), StoreError>>;

enum Msg {
    Batch(Box<Batch>, Option<Reply>),
    Flush(Reply),
    Shutdown(Reply),
}

#[derive(Debug)]
struct Shared {
    depth: AtomicUsize,
    drained: Notify,
    capacity: usize,
    last_error: Mutex<Option<Arc<StoreError>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Shared {
    fn set_error(&self, e: Option<Arc<StoreError>>) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = e;
    }
}

/// Starts group committers.
#[derive(Debug)]
pub struct Committer;

impl Committer {
    /// Spawns a committer for `store` on the current tokio runtime with the default queue
    /// capacity.
    pub fn spawn(
        store: Arc<Store>,
        durability: Durability,
        commit_interval: Duration,
    ) -> CommitterHandle {
        Committer::spawn_with(
            store,
            CommitterConfig {
                durability,
                commit_interval,
                queue_capacity: DEFAULT_QUEUE_CAPACITY,
            },
        )
    }

    /// Spawns a committer for `store` on the current tokio runtime.
    pub fn spawn_with(store: Arc<Store>, cfg: CommitterConfig) -> CommitterHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            depth: AtomicUsize::new(0),
            drained: Notify::new(),
            capacity: cfg.queue_capacity.max(1),
            last_error: Mutex::new(None),
            task: Mutex::new(None),
        });
        let task = tokio::spawn(run(store, cfg, rx, shared.clone()));
        *shared.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        CommitterHandle {
            tx,
            shared,
            durability: cfg.durability,
        }
    }
}

/// A cheap, cloneable handle to a running committer. When every handle is dropped the
/// committer commits what it holds and stops.
#[derive(Debug, Clone)]
pub struct CommitterHandle {
    tx: mpsc::UnboundedSender<Msg>,
    shared: Arc<Shared>,
    durability: Durability,
}

impl CommitterHandle {
    /// Queues `batch` now (at the call, not when the future is first polled) and returns a
    /// future that resolves: in sync mode, once the group commit holding the batch is on disk
    /// (or with that commit's error, in which case the batch stays queued for retry); in async
    /// mode, once the queue is below capacity. Fails with [`StoreError::CommitterClosed`] if
    /// the committer has stopped (then the batch was not queued).
    pub fn submit(
        &self,
        batch: Batch,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let (reply, done) = match self.durability {
            Durability::Sync => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            Durability::Async => (None, None),
        };
        self.shared.depth.fetch_add(1, Ordering::SeqCst);
        let sent = self.tx.send(Msg::Batch(Box::new(batch), reply)).is_ok();
        if !sent {
            self.shared.depth.fetch_sub(1, Ordering::SeqCst);
        }
        let shared = self.shared.clone();
        async move {
            if !sent {
                return Err(StoreError::CommitterClosed);
            }
            if let Some(done) = done {
                return done.await.unwrap_or(Err(StoreError::CommitterClosed));
            }
            loop {
                let drained = shared.drained.notified();
                tokio::pin!(drained);
                drained.as_mut().enable();
                if shared.depth.load(Ordering::SeqCst) <= shared.capacity {
                    return Ok(());
                }
                drained.await;
            }
        }
    }

    /// Commits everything queued so far now (fsync'd, in either mode) and waits for it.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Msg::Flush(tx))
            .map_err(|_| StoreError::CommitterClosed)?;
        rx.await.unwrap_or(Err(StoreError::CommitterClosed))
    }

    /// Final flush, then stops the committer and waits for its task. If the final commit fails
    /// the committer keeps running (and retrying) and the error is returned: call again.
    pub async fn shutdown(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Shutdown(tx)).is_err() {
            return Ok(()); // already stopped
        }
        rx.await.unwrap_or(Err(StoreError::CommitterClosed))?;
        let task = self
            .shared
            .task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
        Ok(())
    }

    /// The error of the latest commit attempt, if it failed (`None` once a commit succeeds).
    /// In async mode this is how producers learn that the store is failing.
    pub fn last_error(&self) -> Option<Arc<StoreError>> {
        self.shared
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Batches queued and not yet taken by the committer.
    pub fn queued(&self) -> usize {
        self.shared.depth.load(Ordering::SeqCst)
    }
}

/// Commits `batch` on a blocking thread; always gives the batch back.
async fn commit_blocking(store: &Arc<Store>, batch: Batch) -> (Batch, Result<(), StoreError>) {
    let store = store.clone();
    let joined = tokio::task::spawn_blocking(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.commit(&batch, Durability::Sync)
        }))
        .unwrap_or_else(|p| Err(StoreError::Panicked(super::panic_text(&*p))));
        (batch, r)
    })
    .await;
    match joined {
        Ok(x) => x,
        // Unreachable in practice (the closure catches panics); the batch is gone with the
        // task, so report it loudly.
        Err(e) => (
            Batch::default(),
            Err(StoreError::Panicked(format!(
                "commit task failed, its batch is lost: {e}"
            ))),
        ),
    }
}

/// The committer task's state.
struct Run {
    cfg: CommitterConfig,
    pending: Accum,
    waiters: Vec<Reply>,
    flushers: Vec<Reply>,
    shutdown: Option<Reply>,
    /// Every handle is gone: commit what is held, then stop.
    closed: bool,
    last_commit: Option<Instant>,
    retry_at: Option<Instant>,
    backoff: Duration,
}

impl Run {
    fn sync(&self) -> bool {
        self.cfg.durability == Durability::Sync
    }

    fn first_backoff(&self) -> Duration {
        MIN_RETRY_BACKOFF.max(self.cfg.commit_interval.min(MAX_RETRY_BACKOFF))
    }

    /// When the pending data must be committed without further messages (`None`: it waits for a
    /// message, or there is none).
    fn due_at(&self) -> Option<Instant> {
        if self.pending.is_empty() {
            return None;
        }
        let interval_at = match (self.sync(), self.last_commit) {
            (false, Some(t)) => Some(t + self.cfg.commit_interval),
            (false, None) => Some(Instant::now()),
            // Sync mode commits on demand (a waiter); held data only on retry.
            (true, _) => None,
        };
        match (interval_at, self.retry_at) {
            (Some(i), Some(r)) => Some(i.max(r)),
            (i, r) => i.or(r),
        }
    }

    /// Whether a commit (or, with nothing pending, an answer to the waiters) is due now.
    fn due_now(&self, now: Instant) -> bool {
        let retry_ok = self.retry_at.is_none_or(|r| now >= r);
        !self.flushers.is_empty()
            || self.shutdown.is_some()
            || !self.waiters.is_empty()
            || (self.closed && (retry_ok || self.pending.is_empty()))
            || self.due_at().is_some_and(|at| at <= now)
    }

    fn take(&mut self, m: Msg, shared: &Shared) {
        match m {
            Msg::Batch(b, reply) => {
                shared.depth.fetch_sub(1, Ordering::SeqCst);
                self.pending.add(*b);
                self.waiters.extend(reply);
            }
            Msg::Flush(r) => self.flushers.push(r),
            Msg::Shutdown(r) => {
                if let Some(old) = self.shutdown.replace(r) {
                    let _ = old.send(Ok(()));
                }
            }
        }
    }
}

async fn run(
    store: Arc<Store>,
    cfg: CommitterConfig,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    shared: Arc<Shared>,
) {
    let mut st = Run {
        cfg,
        pending: Accum::default(),
        waiters: Vec::new(),
        flushers: Vec::new(),
        shutdown: None,
        closed: false,
        last_commit: None,
        retry_at: None,
        backoff: Duration::ZERO,
    };
    st.backoff = st.first_backoff();
    loop {
        if !st.due_now(Instant::now()) {
            let at = st.due_at();
            if st.closed {
                // Only a retry of held data is left (due_now is true when nothing is held).
                tokio::time::sleep_until(at.unwrap_or_else(Instant::now)).await;
            } else {
                let msg = match at {
                    Some(at) => tokio::select! {
                        m = rx.recv() => Some(m),
                        _ = tokio::time::sleep_until(at) => None,
                    },
                    None => Some(rx.recv().await),
                };
                match msg {
                    Some(Some(m)) => st.take(m, &shared),
                    Some(None) => st.closed = true,
                    None => {}
                }
            }
        }
        // Take everything else already queued: one group.
        while !st.closed {
            match rx.try_recv() {
                Ok(m) => st.take(m, &shared),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => st.closed = true,
            }
        }
        shared.drained.notify_waiters();

        let now = Instant::now();
        if !st.due_now(now) {
            continue;
        }
        // Due: commit what is held (flush, shutdown, sync waiters, interval or retry time), or,
        // with nothing held, just answer whoever waits.
        let result: Result<(), Arc<StoreError>> = if st.pending.is_empty() {
            Ok(())
        } else {
            let batch = std::mem::take(&mut st.pending).into_batch();
            let (batch, r) = commit_blocking(&store, batch).await;
            st.last_commit = Some(Instant::now());
            match r {
                Ok(()) => {
                    shared.set_error(None);
                    st.retry_at = None;
                    st.backoff = st.first_backoff();
                    Ok(())
                }
                Err(e) => {
                    tracing::error!(error = %e, "store commit failed; keeping the batch for retry");
                    // Keep the data; later batches merge on top of it.
                    st.pending.add(batch);
                    let e = Arc::new(e);
                    shared.set_error(Some(e.clone()));
                    st.retry_at = Some(Instant::now() + st.backoff);
                    st.backoff = (st.backoff * 2).min(MAX_RETRY_BACKOFF);
                    Err(e)
                }
            }
        };
        let reply = |r: &Result<(), Arc<StoreError>>| match r {
            Ok(()) => Ok(()),
            Err(e) => Err(StoreError::Shared(e.clone())),
        };
        for w in st.waiters.drain(..).chain(st.flushers.drain(..)) {
            let _ = w.send(reply(&result));
        }
        if let Some(s) = st.shutdown.take() {
            let _ = s.send(reply(&result));
            if result.is_ok() {
                return;
            }
        }
        if st.closed && st.pending.is_empty() {
            return;
        }
    }
}
