//! One process on its embedded store: the warm start, then the publisher, the checkpoint writer,
//! the shards and the fence log, started in that order; and their stop, in order, within the
//! shutdown deadline.
//!
//! Start order: warm start ([`crate::boot::boot`]) -> webhook sinks (their cursors hold back
//! the store's event trimming before the first commit) -> the publisher -> the checkpoint
//! writer -> the shards -> the fence log (a fence change some shard had not applied when the
//! process stopped is applied there now); the service builds the fence registry over it.
//!
//! Stop order (after HTTP, WebSockets and webhooks): the final checkpoint round is queued behind
//! what every shard still has to do -> the shards drain their queues -> the publisher makes its
//! last commit -> the checkpoint writer commits the last round -> the store closes, so a caller
//! may open the data directory again once `shutdown` returns.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::ServiceError;
use super::started::{Base, Running, Started, millis};
use crate::boot::{Booted, boot};
use crate::checkpoint::{Checkpointer, Status};
use crate::clock::Watermark;
use crate::cluster::status::ClusterOut;
use crate::config::{Config, Durability};
use crate::events::publisher::{self, CommitPolicy, PublisherCfg};
use crate::fences::{FenceMap, LocalFences};
use crate::shard::{self, BoxFuture, ShardCtx, Shards};
use crate::state::{AppState, ClusterStatusError, Deployment};
use crate::telemetry as t;
use crate::webhooks::Webhooks;
use geodwell_core::engine::IdleRule;
use geodwell_core::time::Dur;

/// Boots one process from its data directory and starts its parts.
pub(super) async fn start(cfg: &Config, base: &Base) -> Result<Started<Local>, ServiceError> {
    let boot_cfg = cfg.clone();
    let booted = tokio::task::spawn_blocking(move || boot(&boot_cfg))
        .await
        .map_err(ServiceError::Join)??;
    let Booted {
        store,
        log,
        fences,
        shards: starts,
        next_fence_change,
        fences_since_checkpoint,
        fence_catch_up,
        fence_log: missed_fences,
        committed,
        watermark: restored_w,
        max_seen,
        summary,
        took,
        timings,
    } = booted;
    let trigger = &base.trigger;
    let watermark = Arc::new(Watermark::new(
        cfg.clock,
        cfg.lateness,
        base.wall,
        max_seen,
        restored_w,
    ));
    let webhooks = Webhooks::start(
        &cfg.webhooks,
        store.clone(),
        log.clone(),
        base.targets,
        trigger,
    )
    .map_err(ServiceError::Webhooks)?;
    let publisher_stop = CancellationToken::new();
    let (publisher, publisher_task) = publisher::spawn(
        PublisherCfg {
            store: store
                .clone()
                .map(|s| s as Arc<dyn crate::durable::InputLog>),
            policy: match cfg.durability {
                Durability::Async => CommitPolicy::Interval(Duration::from_millis(
                    cfg.commit_interval.millis().max(1) as u64,
                )),
                Durability::Sync | Durability::None => CommitPolicy::Immediate,
            },
            restored_max_seen: max_seen,
            log_capacity: cfg.log_capacity,
            queue: 4096,
            stop: publisher_stop.clone(),
            committed,
        },
        log.clone(),
        base.wall,
    );
    // The checkpoint writer waits for the log only until the shutdown deadline.
    let abort = CancellationToken::new();
    let checkpointer = store
        .clone()
        .map(|s| crate::checkpoint::spawn(s.clone(), s, publisher.clone(), abort.clone()));
    let shard_stop = CancellationToken::new();
    let (local, shard_tasks) = shard::spawn(
        starts,
        ShardCtx {
            watermark: watermark.clone(),
            publisher: publisher.clone(),
            persist: store.is_some(),
            checkpoints: checkpointer.as_ref().map(|(c, _)| c.tx.clone()),
            shutdown: shard_stop.clone(),
            queue: cfg.shard_queue,
            // Also without idle_ttl when removed devices keep tombstones (max_delay), which the
            // sweep forgets once they are past it (ttl 0: tombstones only).
            idle: (cfg.idle_ttl > Dur::ZERO || cfg.max_delay > Dur::ZERO)
                .then_some(IdleRule { ttl: cfg.idle_ttl }),
            rebuild: rebuild_from(cfg, store.as_ref()),
        },
    );
    let shards = Shards::new(Arc::new(local.clone()));
    let map = Arc::new(FenceMap::new(&fences));
    let fence_log = Arc::new(LocalFences::new(
        map.clone(),
        publisher,
        local,
        next_fence_change,
        fences_since_checkpoint,
    ));
    // A fence change whose record was durable but that some shard had not logged as applied
    // when the process stopped is applied there now.
    for (k, from) in fence_catch_up.into_iter().enumerate() {
        if from < next_fence_change
            && let Err(e) = fence_log.catch_up_shard(k, from, &missed_fences).await
        {
            trigger.cancel();
            shard_stop.cancel();
            publisher_stop.cancel();
            return Err(ServiceError::Seed(e));
        }
    }
    if store.is_some() {
        tracing::info!(
            data_dir = %cfg.data_dir.display(),
            durability = %cfg.durability,
            devices = summary.restored.devices,
            pairs = summary.restored.pairs,
            timers = summary.timers,
            buffered_fixes = summary.restored.buffered,
            dropped_pairs = summary.restored.dropped_pairs,
            events = summary.events,
            next_seq = summary.next_seq,
            watermark = %restored_w.map_or("none".to_string(), |w| w.to_string()),
            checkpoint = summary.checkpoint_round,
            replayed_records = summary.replayed_records,
            replayed_fixes = summary.replayed_fixes,
            replayed_events_known = summary.replayed_known,
            replayed_events_new = summary.replayed_new,
            restore_ms = timings.restore.as_millis() as u64,
            replay_ms = timings.replay.as_millis() as u64,
            took_ms = took.as_millis() as u64,
            "state restored"
        );
    }
    let checkpoints = checkpointer.map(|(handle, thread)| {
        let task = tokio::spawn(checkpoint_rounds(
            fence_log.clone(),
            handle.clone(),
            millis(cfg.checkpoint_interval),
            trigger.clone(),
        ));
        Checkpoints {
            handle,
            thread,
            task,
        }
    });
    let view = Store {
        file: store.as_ref().map(|s| s.path().to_path_buf()),
        checkpoints: checkpoints.as_ref().map(|c| c.handle.status.clone()),
    };
    Ok(Started {
        shards,
        fence_map: map,
        fence_writer: fence_log.clone(),
        log,
        webhooks,
        watermark,
        deployment: Arc::new(view),
        running: Local {
            fences: fences.len(),
            shard_stop,
            shard_tasks,
            publisher_stop,
            publisher_task,
            store: store.as_ref().map(Arc::downgrade),
            fence_log,
            checkpoints,
            abort,
        },
    })
}

/// What a one-process service answers for itself: its store file and checkpoint rounds (none
/// with `durability = "none"`).
#[derive(Debug)]
struct Store {
    file: Option<PathBuf>,
    checkpoints: Option<Arc<Status>>,
}

impl Deployment for Store {
    fn ready(&self) -> bool {
        true
    }

    fn gauges(&self) {
        if let Some(f) = &self.file {
            metrics::gauge!(t::STORE_LOG_BYTES)
                .set(std::fs::metadata(f).map_or(0.0, |m| m.len() as f64));
        }
        if let Some(age) = self.checkpoints.as_ref().and_then(|c| c.age_secs()) {
            metrics::gauge!(t::STORE_CHECKPOINT_AGE_SECONDS).set(age);
        }
    }

    fn cluster(&self) -> BoxFuture<'_, Result<ClusterOut, ClusterStatusError>> {
        Box::pin(std::future::ready(Err(ClusterStatusError::NotACluster)))
    }
}

/// The parts of a one-process service that stop in order.
pub(super) struct Local {
    /// Fences at start (for the start-up line).
    fences: usize,
    shard_stop: CancellationToken,
    shard_tasks: Vec<JoinHandle<()>>,
    publisher_stop: CancellationToken,
    publisher_task: JoinHandle<()>,
    /// The store, to see it closed: the last connection task may drop its handle to the state
    /// (and so the store) a moment after the server has returned.
    store: Option<Weak<crate::store::Store>>,
    /// The fence log (the final checkpoint round starts there).
    fence_log: Arc<LocalFences>,
    /// The checkpoint writer and the task that starts its rounds (with a store).
    checkpoints: Option<Checkpoints>,
    /// Cancelled at the deadline: the checkpoint writer stops waiting for the log.
    abort: CancellationToken,
}

/// The checkpoint writer, its thread, and the task that starts a round every interval.
struct Checkpoints {
    handle: Checkpointer,
    thread: std::thread::JoinHandle<()>,
    task: JoinHandle<u64>,
}

impl Running for Local {
    fn announce(&self, cfg: &Config, addr: SocketAddr) {
        tracing::info!(%addr, tls = cfg.tls_cert.is_some(), shards = cfg.shards, clock = %cfg.clock, lateness = %cfg.lateness, durability = %cfg.durability, fences = self.fences, "geodwell listening");
    }

    async fn stop<S: Send>(
        self,
        state: Arc<AppState>,
        server: S,
        deadline: Instant,
        aborted: &mut Vec<&'static str>,
    ) {
        let final_round = final_round(self.checkpoints, &self.fence_log, &self.abort, deadline);
        let (final_round, checkpoint_thread) = final_round.await;
        // The shards drain their queues, then the publisher commits what they handed it.
        self.shard_stop.cancel();
        for mut task in self.shard_tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                task.abort();
                if !aborted.contains(&"shards") {
                    aborted.push("shards");
                }
            }
        }
        drop(state);
        // An unfinished server (aborted at the deadline) still holds the router and its state.
        drop(server);
        self.publisher_stop.cancel();
        let mut publisher_task = self.publisher_task;
        if tokio::time::timeout_at(deadline, &mut publisher_task)
            .await
            .is_err()
        {
            publisher_task.abort();
            aborted.push("the final state commit");
        }
        // The writer commits the last round once the log holds everything it covers.
        if let Some((round, status)) = final_round {
            let done = tokio::time::timeout_at(deadline, status.wait(round, &self.abort)).await;
            if done.is_err() || status.committed() < round {
                aborted.push("the final checkpoint");
            }
        }
        self.abort.cancel();
        if let Some(thread) = checkpoint_thread {
            // Every sender is gone once the shards, the round task and the handle are: the
            // thread ends on its own.
            let joined = tokio::task::spawn_blocking(move || thread.join());
            if tokio::time::timeout_at(deadline, joined).await.is_err() {
                aborted.push("the checkpoint writer");
            }
        }
        closed(self.store.as_ref(), deadline, aborted).await;
    }
}

/// Queues the last checkpoint round on every shard behind what it still has to do, so it
/// covers everything and the next start replays nothing. Returns the round and where rounds
/// stand (when it was queued), and the writer's thread.
async fn final_round(
    checkpoints: Option<Checkpoints>,
    fence_log: &LocalFences,
    abort: &CancellationToken,
    deadline: Instant,
) -> (
    Option<(u64, Arc<Status>)>,
    Option<std::thread::JoinHandle<()>>,
) {
    let Some(Checkpoints {
        handle,
        thread,
        task,
    }) = checkpoints
    else {
        return (None, None);
    };
    let last = match tokio::time::timeout_at(deadline, task).await {
        Ok(Ok(r)) => r,
        _ => handle.status.committed(),
    };
    // A round the task started and did not see finish is still being written.
    let _ = tokio::time::timeout_at(deadline, handle.status.wait(last, abort)).await;
    let round = last.max(handle.status.committed()) + 1;
    let queued = fence_log.checkpoint(round, &handle, false).await.is_ok();
    (queued.then(|| (round, handle.status.clone())), Some(thread))
}

/// Waits for the store to close: a caller that reopens the data directory after `shutdown`
/// returns (a restart in the same process, `store check`) must find the file closed.
async fn closed(
    store: Option<&Weak<crate::store::Store>>,
    deadline: Instant,
    aborted: &mut Vec<&'static str>,
) {
    let Some(store) = store else { return };
    while store.strong_count() > 0 {
        if Instant::now() >= deadline {
            aborted.push("closing the store (a task still holds it)");
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Starts a checkpoint round every `every` until `stop`; returns the last round started. A
/// round still being written when the next is due is waited for (a slow disk lengthens the
/// interval); a round that failed makes the next one write every device.
async fn checkpoint_rounds(
    fences: Arc<LocalFences>,
    ck: Checkpointer,
    every: Duration,
    stop: CancellationToken,
) -> u64 {
    let mut round = ck.status.committed();
    let mut full = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return round,
            _ = tokio::time::sleep(every) => {}
        }
        round += 1;
        match fences.checkpoint(round, &ck, full).await {
            Ok(fence_change) => {
                ck.status.wait(round, &stop).await;
                if ck.status.committed() >= round {
                    fences.checkpointed(fence_change).await;
                    full = false;
                } else if ck.status.failed(round) {
                    full = true;
                } else {
                    return round; // stopping
                }
            }
            Err(_) => return round,
        }
    }
}

/// How a partition rebuilds from the store after a failed commit (the warm start's restore
/// path for one partition). Without a store no commit can fail, and so nothing asks.
fn rebuild_from(cfg: &Config, store: Option<&Arc<crate::store::Store>>) -> crate::shard::Rebuild {
    let cfg = cfg.clone();
    let store = store.map(Arc::downgrade);
    Arc::new(move |k| {
        let failed = |e: crate::boot::BootError| crate::shard::RebuildError {
            partition: k,
            source: Box::new(e),
        };
        let store = store
            .as_ref()
            .and_then(Weak::upgrade)
            .ok_or(crate::boot::BootError::NoStore)
            .map_err(failed)?;
        crate::boot::restore_shard(&cfg, &store, k).map_err(failed)
    })
}
