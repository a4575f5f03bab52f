//! Checkpoints: the engines' state written in the background, so that the input log below it can
//! be deleted and a warm start replays only what came after.
//!
//! A round, every `store.checkpoint_interval` (and at shutdown):
//! 1. the fence registry, under its write lock (no fence change in flight), sends the writer a
//!    [`CkMsg::Round`] with the fence changes since the last checkpoint, then asks every shard to
//!    checkpoint, after what is queued on it; so every shard freezes with the same fences;
//! 2. each shard freezes the devices changed since its last checkpoint (`Engine::checkpoint_begin`)
//!    at the `seq` of its last input record, and hands them out a chunk at a time between its
//!    other work; a device about to change is copied first, so every chunk is the state at the
//!    freeze;
//! 3. the writer (a thread of its own, with its own file, so ingest commits never wait for it)
//!    writes the chunks into one write transaction of `checkpoint.redb`; once every shard is done
//!    and the live file holds every input record the checkpoint covers (a checkpoint must never
//!    be ahead of the log it replaces), it writes the fences and the meta and commits;
//! 4. the publisher is told which input records and fence changes the checkpoint now covers; it
//!    deletes them in its next commit, so the log's size stays bounded.
//!
//! A round that fails (disk full) is dropped whole: the file keeps the previous checkpoint, and
//! the next round writes every device, since those of the failed round are no longer marked.
//!
//! Metrics: `geodwell_store_checkpoints_total`, `geodwell_store_checkpoint_failures_total`,
//! `geodwell_store_checkpoint_seconds`, `geodwell_store_checkpoint_devices`,
//! `geodwell_store_checkpoint_bytes`, `geodwell_store_checkpoint_age_seconds`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use metrics::{counter, gauge, histogram};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::durable::{CheckpointStorage, CheckpointTxn, InputLog};
use crate::events::publisher::{Publisher, Step};
use crate::store::{CheckpointMeta, ShardPoint};
use crate::telemetry as t;
use geodwell_core::engine::DeviceState;
use geodwell_core::time::Ts;

/// What the checkpoint writer is sent.
#[derive(Debug)]
pub enum CkMsg {
    /// A round starts (sent before any shard is asked).
    Round {
        /// The round.
        round: u64,
        /// Shards taking part.
        shards: usize,
        /// Fence changes since the last checkpoint: `(id, Some(text))` put, `(id, None)` deleted.
        fences: Vec<(String, Option<String>)>,
        /// The last fence change every shard has applied at its freeze.
        fence_change: u64,
        /// The lowest event `seq` a replay after this checkpoint can produce again.
        event_floor: u64,
        /// The store's health when the round began, read before any shard was asked.
        began: Began,
    },
    /// A chunk of one shard's frozen devices.
    Devices {
        /// The shard.
        shard: usize,
        /// The round.
        round: u64,
        /// The shard's last input `seq` at the freeze.
        seq: u64,
        /// The shard engine's watermark at the freeze.
        watermark: Option<Ts>,
        /// The parts the shard applied lately, at the freeze.
        recent: Arc<[u64]>,
        /// Devices, as they were at the freeze.
        devices: Vec<DeviceState>,
        /// Whether this is the shard's last chunk.
        done: bool,
    },
    /// A shard's freeze for `round` is gone (the shard was rebuilt after a failed commit): the
    /// round is dropped.
    Abort {
        /// The round.
        round: u64,
    },
}

/// The store's health when a round began. A partition applies a step before its commit, so
/// while a commit has failed and its partitions are not rebuilt yet, their engines hold state
/// the log does not: a round that began then, or that spans a failed commit, could freeze that
/// state and, once later records reuse the positions the failed ones had, find "its" records
/// durable and commit it. Such a round is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Began {
    /// No partition was waiting for its rebuild (the store was healthy).
    pub healthy: bool,
    /// Failed commits so far ([`crate::events::health::StoreHealth::failures`]).
    pub failures: u64,
}

impl Began {
    /// The health now, as a round's start.
    pub fn now(health: &crate::events::health::StoreHealth) -> Began {
        // Failures first: a failure between the two reads is then seen as a change, not lost.
        let failures = health.failures();
        Began {
            healthy: health.healthy(),
            failures,
        }
    }

    /// Why a round that began so cannot be committed, if it cannot.
    pub fn spoiled(&self, failures_now: u64) -> Option<&'static str> {
        if !self.healthy {
            Some("the round began while partitions waited for their rebuild after a failed commit")
        } else if failures_now != self.failures {
            Some("a commit failed while the round was running")
        } else {
            None
        }
    }
}

/// Queue length of the writer (chunks of ~2,000 devices each).
pub const QUEUE: usize = 16;

/// Where the rounds stand, shared with the trigger and shutdown.
#[derive(Debug)]
pub struct Status {
    /// The last round committed (0: none since start).
    committed: watch::Sender<u64>,
    /// The last round that failed.
    failed: AtomicU64,
    /// A round is being written.
    busy: AtomicBool,
    /// When the last checkpoint committed.
    last: std::sync::Mutex<Option<Instant>>,
}

impl Status {
    /// The last round committed.
    pub fn committed(&self) -> u64 {
        *self.committed.borrow()
    }

    /// Whether a round is running.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// Whether `round` failed.
    pub fn failed(&self, round: u64) -> bool {
        self.failed.load(Ordering::Acquire) == round
    }

    /// Seconds since the last commit (`None`: none yet).
    pub fn age_secs(&self) -> Option<f64> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed().as_secs_f64())
    }

    /// Waits until `round` has committed or failed (or `stop` is cancelled).
    pub async fn wait(&self, round: u64, stop: &CancellationToken) {
        let mut rx = self.committed.subscribe();
        loop {
            if *rx.borrow_and_update() >= round || self.failed(round) {
                return;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            }
        }
    }
}

/// The writer's handle: its queue, and where the rounds stand.
#[derive(Debug, Clone)]
pub struct Checkpointer {
    /// The writer's queue.
    pub tx: mpsc::Sender<CkMsg>,
    /// Where the rounds stand.
    pub status: Arc<Status>,
}

/// Starts the writer thread for `storage`, covering `log`; it ends when every sender is gone.
pub fn spawn(
    storage: Arc<dyn CheckpointStorage>,
    log: Arc<dyn InputLog>,
    publisher: Publisher,
    stop: CancellationToken,
) -> (Checkpointer, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (committed, _) = watch::channel(0);
    let status = Arc::new(Status {
        committed,
        failed: AtomicU64::new(0),
        busy: AtomicBool::new(false),
        last: std::sync::Mutex::new(None),
    });
    let st = status.clone();
    let handle = tokio::runtime::Handle::current();
    let thread = std::thread::Builder::new()
        .name("geodwell-checkpoint".into())
        .spawn(move || {
            crate::machine::lower_thread_priority();
            write_loop(storage, log, publisher, rx, st, handle, stop)
        })
        .expect("the checkpoint thread starts");
    (Checkpointer { tx, status }, thread)
}

/// One round being written.
struct Round<'a> {
    round: u64,
    writer: Option<Box<dyn CheckpointTxn + 'a>>,
    positions: Vec<Option<ShardPoint>>,
    fences: Vec<(String, Option<String>)>,
    fence_change: u64,
    event_floor: u64,
    began: Began,
    started: Instant,
    error: Option<String>,
}

fn write_loop(
    storage: Arc<dyn CheckpointStorage>,
    log: Arc<dyn InputLog>,
    publisher: Publisher,
    mut rx: mpsc::Receiver<CkMsg>,
    status: Arc<Status>,
    rt: tokio::runtime::Handle,
    stop: CancellationToken,
) {
    let ck = &*storage;
    let mut current: Option<Round<'_>> = None;
    while let Some(msg) = rx.blocking_recv() {
        match msg {
            CkMsg::Round {
                round,
                shards,
                fences,
                fence_change,
                event_floor,
                began,
            } => {
                status.busy.store(true, Ordering::Release);
                let (writer, error) = match ck.begin() {
                    Ok(w) => (Some(w), None),
                    Err(e) => (None, Some(e.to_string())),
                };
                current = Some(Round {
                    round,
                    writer,
                    positions: vec![None; shards],
                    fences,
                    fence_change,
                    event_floor,
                    began,
                    started: Instant::now(),
                    error,
                });
            }
            CkMsg::Abort { round } => {
                if let Some(r) = current.take_if(|r| r.round == round) {
                    let why = "a shard was rebuilt after a failed commit".to_string();
                    finish(
                        Round {
                            error: Some(why),
                            ..r
                        },
                        ck,
                        &*log,
                        &publisher,
                        &status,
                        &rt,
                        &stop,
                    );
                    status.busy.store(false, Ordering::Release);
                }
            }
            CkMsg::Devices {
                shard,
                round,
                seq,
                watermark,
                recent,
                devices,
                done,
            } => {
                let Some(r) = current.as_mut().filter(|r| r.round == round) else {
                    continue; // a chunk of a round already dropped
                };
                if r.error.is_none()
                    && let Some(w) = r.writer.as_mut()
                    && let Err(e) = w.devices(&devices)
                {
                    r.error = Some(e.to_string());
                }
                if done && let Some(p) = r.positions.get_mut(shard) {
                    *p = Some(ShardPoint {
                        seq,
                        watermark: watermark.map(|w| w.0),
                        recent,
                    });
                }
                if r.positions.iter().all(Option::is_some) {
                    let r = current.take().expect("a round is running");
                    finish(r, ck, &*log, &publisher, &status, &rt, &stop);
                    status.busy.store(false, Ordering::Release);
                }
            }
        }
    }
}

/// Commits a round whose shards are all done (once the log holds what it covers), or drops it.
fn finish(
    r: Round<'_>,
    storage: &dyn CheckpointStorage,
    log: &dyn InputLog,
    publisher: &Publisher,
    status: &Status,
    rt: &tokio::runtime::Handle,
    stop: &CancellationToken,
) {
    let Round {
        round,
        writer,
        positions,
        mut fences,
        fence_change,
        event_floor,
        began,
        started,
        error,
    } = r;
    let shards_at: Vec<ShardPoint> = positions.into_iter().flatten().collect();
    let seqs: Vec<u64> = shards_at.iter().map(|p| p.seq).collect();
    let fail = |why: String| {
        counter!(t::STORE_CHECKPOINT_FAILURES).increment(1);
        status.failed.store(round, Ordering::Release);
        tracing::error!(round, error = %why, "checkpoint failed; the previous one stays, the next round writes every device");
    };
    if let Some(e) = error {
        return fail(e);
    }
    let Some(mut writer) = writer else {
        return fail("no writer".into());
    };
    let health = publisher.health();
    if let Some(why) = began.spoiled(health.failures()) {
        return fail(why.into());
    }
    // Never ahead of the log: every record the checkpoint covers must be durable first.
    if !rt.block_on(
        publisher
            .durable()
            .wait_for(&seqs, health, began.failures, stop),
    ) {
        return fail(
            "stopped, or a commit failed, before the log held the records the checkpoint covers"
                .into(),
        );
    }
    let devices = writer.written();
    let meta = CheckpointMeta {
        round,
        shards: shards_at.len() as u32,
        fence_change,
        event_floor,
        shards_at,
    };
    let written = writer
        .fences(&std::mem::take(&mut fences))
        .and_then(|()| writer.commit(&meta));
    if let Err(e) = written {
        return fail(e.to_string());
    }
    let took = started.elapsed();
    counter!(t::STORE_CHECKPOINTS).increment(1);
    histogram!(t::STORE_CHECKPOINT_SECONDS).record(took.as_secs_f64());
    gauge!(t::STORE_CHECKPOINT_DEVICES).set(devices as f64);
    if let Some(bytes) = storage.size_bytes() {
        gauge!(t::STORE_CHECKPOINT_BYTES).set(bytes as f64);
    }
    gauge!(t::STORE_CHECKPOINT_AGE_SECONDS).set(0.0);
    *status.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    log.hold_replay_events_from(event_floor);
    tracing::debug!(
        round,
        devices,
        took_ms = took.as_millis() as u64,
        "checkpoint written"
    );
    status.committed.send_replace(round);
    // The round's chunks were allocated and freed on the shards' and this thread's arenas: hand
    // the memory back rather than let it stay in the process's size.
    if devices > 0 {
        crate::budget::trim();
    }
    // The records below the checkpoint go in the publisher's next commit.
    let truncate = (
        seqs.iter()
            .enumerate()
            .map(|(k, &s)| (k as u16, s))
            .collect(),
        fence_change,
    );
    let _ = rt.block_on(publisher.send(Step {
        truncate: Some(truncate),
        ..Step::default()
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::health::StoreHealth;
    use crate::store::{Behind, StoreError};

    fn failure() -> Arc<StoreError> {
        Arc::new(StoreError::Applying {
            behind: Behind::Backlog { bytes: 1 },
            failing: Some("no space".into()),
        })
    }

    #[test]
    fn a_round_begun_during_an_outage_or_spanning_a_failed_commit_is_dropped() {
        let h = StoreHealth::default();
        let before = Began::now(&h);
        assert_eq!(before.spoiled(h.failures()), None);
        h.failed(failure());
        h.mark(0);
        assert!(before.spoiled(h.failures()).is_some(), "spans a failure");
        let failing = Began::now(&h);
        assert!(failing.spoiled(h.failures()).is_some(), "began failing");
        h.probe_committed();
        let recovering = Began::now(&h);
        assert!(
            recovering.spoiled(h.failures()).is_some(),
            "began before partition 0 rebuilt"
        );
        h.rebuilt(0);
        let after = Began::now(&h);
        assert_eq!(after.spoiled(h.failures()), None, "healthy again");
    }
}
