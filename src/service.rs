//! The running service: [`Service::spawn`] boots it (warm start), starts its tasks and serves
//! the API on a bound listener; [`Service::shutdown`] stops it in order within one deadline.
//!
//! Start order: warm start ([`crate::boot::boot`]) -> webhook sinks (their cursors hold back the
//! store's event trimming before the first commit) -> the publisher -> the shards -> the fence
//! registry (persisting a preload into an empty store) -> the HTTP server.
//!
//! Stop order, all within one deadline (`grace` from the moment shutdown begins): stop accepting
//! and finish in-flight requests -> WebSocket tasks say goodbye -> webhook sinks stop and write
//! their cursors -> the shards drain their queues -> the publisher makes its last commit. Work
//! that is still running at the deadline is aborted, and the log says which. When `shutdown`
//! returns, the store is closed (the data directory can be opened again).
//!
//! Why this file is long: it assembles the two kinds of service (one process, a cluster node)
//! and stops either in order; the steps share `Stopping` and read best side by side.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::boot::{BootError, Booted, boot, fence_limits};
use crate::clock::{WallClock, Watermark};
use crate::config::{Config, Durability};
use crate::events::publisher::{self, CommitPolicy, PublisherCfg};
use crate::fences::{FenceMap, FenceRegistry, LocalFences};
use crate::http::server::ServerLimits;
use crate::ingest::Ingest;
use crate::shard::{self, ShardCtx, Shards};
use crate::state::{AppState, Parts};
use crate::webhooks::{WebhookError, Webhooks};
use crate::wire::FixLimits;
use crate::{http, telemetry};
use geodwell_core::engine::IdleRule;
use geodwell_core::time::Dur;

/// Why the service could not start, or stopped with an error.
#[derive(Debug, Error)]
pub enum ServiceError {
    /// The warm start failed (nothing was served).
    #[error(transparent)]
    Boot(#[from] BootError),
    /// The webhook sinks could not be restored.
    #[error("webhooks")]
    Webhooks(#[source] WebhookError),
    /// The preloaded fences could not be stored.
    #[error("cannot store the preloaded fences")]
    Seed(#[source] crate::fences::FenceWriteError),
    /// The listener failed.
    #[error("server")]
    Io(#[from] std::io::Error),
    /// The warm start task panicked or was cancelled.
    #[error("the warm start did not finish: {0}")]
    Join(String),
    /// The TLS certificate or key cannot be used.
    #[error("TLS")]
    Tls(#[source] crate::http::tls::TlsError),
    /// The cluster node could not start (NATS unreachable, or its streams not usable).
    #[error("cluster")]
    Cluster(#[source] crate::cluster::NatsError),
}

/// A running service.
#[derive(Debug)]
pub struct Service {
    addr: SocketAddr,
    state: Arc<AppState>,
    tls: Option<Arc<crate::http::tls::Tls>>,
    trigger: CancellationToken,
    deadline: Arc<Mutex<Option<Instant>>>,
    task: JoinHandle<Result<(), ServiceError>>,
}

impl Service {
    /// Boots the service from `cfg` and serves on `listener` in the background. Returns once the
    /// warm start is done and the server accepts requests; a start that fails returns its error
    /// and leaves nothing running.
    pub async fn spawn(cfg: Config, listener: TcpListener) -> Result<Service, ServiceError> {
        // Before anything is opened: a certificate that cannot be used stops the start.
        let tls = match (&cfg.tls_cert, &cfg.tls_key) {
            (Some(c), Some(k)) => Some(Arc::new(
                crate::http::tls::Tls::load(c, k).map_err(ServiceError::Tls)?,
            )),
            _ => None,
        };
        if cfg.cluster.is_some() {
            return Service::spawn_cluster(cfg, listener, tls).await;
        }
        let addr = listener.local_addr()?;
        let metrics = telemetry::install();
        let wall = WallClock::start();
        let boot_cfg = cfg.clone();
        let booted = tokio::task::spawn_blocking(move || boot(&boot_cfg))
            .await
            .map_err(|e| ServiceError::Join(e.to_string()))??;
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
        let trigger = CancellationToken::new();
        let watermark = Arc::new(Watermark::new(
            cfg.clock,
            cfg.lateness,
            wall,
            max_seen,
            restored_w,
        ));
        let webhooks = Webhooks::start(
            &cfg.webhooks,
            store.clone(),
            log.clone(),
            crate::outbound::TargetPolicy {
                allow_private: cfg.allow_private_targets,
            },
            &trigger,
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
            wall,
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
                // Also without idle_ttl when removed devices keep tombstones (max_delay), which the sweep
                // forgets once they are past it (ttl 0: tombstones only).
                idle: (cfg.idle_ttl > Dur::ZERO || cfg.max_delay > Dur::ZERO)
                    .then_some(IdleRule { ttl: cfg.idle_ttl }),
                rebuild: rebuild_from(&cfg, store.as_ref()),
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
        let registry = Arc::new(FenceRegistry::new(
            map,
            fence_limits(&cfg),
            cfg.max_fences,
            fence_log.clone(),
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
        let Limits {
            max_connections,
            budget,
            fixes: limits,
        } = machine_limits(&cfg);
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
        let state = Arc::new(AppState::new(Parts {
            ingest: Ingest::new(limits, watermark.clone(), shards.clone()),
            shards,
            fences: registry.clone(),
            log,
            webhooks: webhooks.clone(),
            watermark,
            metrics,
            shutdown: trigger.clone(),
            budget,
            store_file: store.as_ref().map(|s| s.path().to_path_buf()),
            checkpoints: checkpoints.as_ref().map(|c| c.handle.status.clone()),
            cluster: None,
            cfg: cfg.clone(),
        }));
        tracing::info!(%addr, tls = cfg.tls_cert.is_some(), shards = cfg.shards, clock = %cfg.clock, lateness = %cfg.lateness, durability = %cfg.durability, fences = fences.len(), "geodwell listening");
        warn_if_open(&cfg, addr);
        let deadline = Arc::new(Mutex::new(None));
        let stopping = Stopping {
            state: state.clone(),
            trigger: trigger.clone(),
            deadline: deadline.clone(),
            default_grace: Duration::from_millis(cfg.shutdown_grace.millis().max(0) as u64),
            webhooks,
            backend: Backend::Local(LocalParts {
                shard_stop,
                shard_tasks,
                publisher_stop,
                publisher_task,
                store: store.as_ref().map(Arc::downgrade),
                fence_log,
                checkpoints,
                abort,
            }),
        };
        Ok(launch(&cfg, listener, addr, stopping, max_connections, tls))
    }

    /// A cluster node (`[cluster]` set): the engines are the cluster's partitions, reached
    /// through NATS; fences, events and checkpoints live there (docs/cluster.md).
    async fn spawn_cluster(
        cfg: Config,
        listener: TcpListener,
        tls: Option<Arc<crate::http::tls::Tls>>,
    ) -> Result<Service, ServiceError> {
        let addr = listener.local_addr()?;
        let metrics = telemetry::install();
        let wall = WallClock::start();
        let preload_cfg = cfg.clone();
        let preload = tokio::task::spawn_blocking(move || crate::boot::load_preload(&preload_cfg))
            .await
            .map_err(|e| ServiceError::Join(e.to_string()))??;
        let watermark = Arc::new(Watermark::new(cfg.clock, cfg.lateness, wall, None, None));
        let map = Arc::new(crate::fences::FenceMap::default());
        let node = crate::cluster::ClusterNode::start(
            &cfg,
            crate::cluster::Start {
                watermark: watermark.clone(),
                preload,
                map: map.clone(),
                http: addr.to_string(),
            },
        )
        .await
        .map_err(ServiceError::Cluster)?;
        let node = Arc::new(node);
        let trigger = CancellationToken::new();
        let log = node.log();
        let webhooks = Webhooks::start_shared(
            &cfg.webhooks,
            node.sinks(),
            log.clone(),
            crate::outbound::TargetPolicy {
                allow_private: cfg.allow_private_targets,
            },
            &trigger,
        );
        let registry = Arc::new(FenceRegistry::new(
            map,
            fence_limits(&cfg),
            cfg.max_fences,
            node.fences(),
        ));
        let Limits {
            max_connections,
            budget,
            fixes: limits,
        } = machine_limits(&cfg);
        let shards = node.shards();
        let state = Arc::new(AppState::new(Parts {
            ingest: Ingest::new(limits, watermark.clone(), shards.clone()),
            shards,
            fences: registry,
            log,
            webhooks: webhooks.clone(),
            watermark,
            metrics,
            shutdown: trigger.clone(),
            budget,
            store_file: None,
            checkpoints: None,
            cluster: Some(node.clone()),
            cfg: cfg.clone(),
        }));
        tracing::info!(%addr, tls = cfg.tls_cert.is_some(), node = node.node_id(), clock = %cfg.clock, lateness = %cfg.lateness, "geodwell listening (cluster node)");
        warn_if_open(&cfg, addr);
        let deadline = Arc::new(Mutex::new(None));
        let stopping = Stopping {
            state: state.clone(),
            trigger: trigger.clone(),
            deadline: deadline.clone(),
            default_grace: Duration::from_millis(cfg.shutdown_grace.millis().max(0) as u64),
            webhooks,
            backend: Backend::Cluster(node),
        };
        Ok(launch(&cfg, listener, addr, stopping, max_connections, tls))
    }

    /// Binds `cfg.listen` (port 0: an ephemeral port) and spawns the service on it.
    pub async fn start(cfg: Config) -> Result<Service, ServiceError> {
        let listener = TcpListener::bind(cfg.listen).await?;
        Service::spawn(cfg, listener).await
    }

    /// The address the service listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the API keys (SIGHUP reload): requests from now on are checked against them.
    /// Returns how many there are now (0: authentication off).
    pub fn reload_keys(&self, keys: Vec<crate::auth::ApiKey>) -> usize {
        let n = keys.len();
        self.state.set_keys(keys);
        n
    }

    /// Applies the configured webhook / broker sinks of a reloaded configuration (SIGHUP).
    pub async fn reload_sinks(
        &self,
        configured: &[crate::webhooks::spec::SinkSpec],
    ) -> Result<crate::webhooks::ReloadReport, WebhookError> {
        self.state.webhooks().reload_config(configured).await
    }

    /// Reads the TLS certificate and key of a reloaded configuration (SIGHUP): new connections
    /// use them. `Ok(None)` without TLS; an error changes nothing.
    pub fn reload_tls(
        &self,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<Option<crate::http::tls::Installed>, crate::http::tls::TlsError> {
        match &self.tls {
            Some(t) => t.reload(cert, key).map(Some),
            None => Ok(None),
        }
    }

    /// Whether the server speaks TLS (switching it on or off takes a restart).
    pub fn has_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The service's router, for in-process requests (`tower::ServiceExt::oneshot`); it serves
    /// the same state as the listener.
    pub fn router(&self) -> axum::Router {
        http::router(self.state.clone())
    }

    /// Starts the shutdown: everything must be stopped within `grace` from now.
    pub fn begin_shutdown(&self, grace: Duration) {
        {
            let mut d = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
            let at = Instant::now() + grace;
            // A second call can only bring the deadline forward.
            *d = Some(d.map_or(at, |cur| cur.min(at)));
        }
        self.trigger.cancel();
    }

    /// Stops the service within `grace` (see the module docs for the order) and returns once it
    /// has stopped.
    pub async fn shutdown(self, grace: Duration) -> Result<(), ServiceError> {
        self.begin_shutdown(grace);
        self.wait().await
    }

    /// Waits until the service has stopped (after [`Service::begin_shutdown`], or an error).
    pub async fn wait(self) -> Result<(), ServiceError> {
        let Service { state, task, .. } = self;
        drop(state);
        task.await
            .unwrap_or_else(|e| Err(ServiceError::Join(e.to_string())))
    }
}

/// What the serve task needs to stop the service in order.
struct Stopping {
    state: Arc<AppState>,
    trigger: CancellationToken,
    deadline: Arc<Mutex<Option<Instant>>>,
    default_grace: Duration,
    webhooks: Arc<Webhooks>,
    backend: Backend,
}

/// What stops after the common part (HTTP, WebSockets, webhooks).
enum Backend {
    /// One process: shards, the publisher, the checkpoint writer, the store.
    Local(LocalParts),
    /// A cluster node: its partitions checkpoint and are released.
    Cluster(Arc<crate::cluster::ClusterNode>),
}

/// The parts of a one-process service that stop in order.
struct LocalParts {
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
    handle: crate::checkpoint::Checkpointer,
    thread: std::thread::JoinHandle<()>,
    task: JoinHandle<u64>,
}

/// Starts a checkpoint round every `every` until `stop`; returns the last round started. A
/// round still being written when the next is due is waited for (a slow disk lengthens the
/// interval); a round that failed makes the next one write every device.
async fn checkpoint_rounds(
    fences: Arc<LocalFences>,
    ck: crate::checkpoint::Checkpointer,
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

/// Serves until shutdown begins, then stops every part in order within the deadline.
async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ServerLimits,
    tls: Option<Arc<crate::http::tls::Tls>>,
    s: Stopping,
) -> Result<(), ServiceError> {
    let mut server = Box::pin(crate::http::server::serve(
        listener,
        router,
        limits,
        tls,
        s.trigger.clone(),
    ));
    let mut served = tokio::select! {
        () = &mut server => Some(()),
        _ = s.trigger.cancelled() => None,
    };
    // Whoever cancelled without a deadline (an error path) gets the configured grace.
    let deadline = {
        let mut d = s.deadline.lock().unwrap_or_else(|p| p.into_inner());
        *d.get_or_insert_with(|| Instant::now() + s.default_grace)
    };
    s.trigger.cancel();
    let mut aborted: Vec<&str> = Vec::new();
    if served.is_none() {
        served = match tokio::time::timeout_at(deadline, &mut server).await {
            Ok(()) => Some(()),
            Err(_) => {
                aborted.push("in-flight HTTP requests");
                None
            }
        };
    }
    // WebSocket tasks see the token and say goodbye.
    let tasks = s.state.tasks().clone();
    tasks.close();
    if tokio::time::timeout_at(deadline, tasks.wait())
        .await
        .is_err()
    {
        aborted.push("WebSocket tasks");
    }
    // Webhook sinks stop and write their cursors (fsync'd) while the store is still open.
    s.webhooks
        .stop(deadline.saturating_duration_since(Instant::now()))
        .await;
    drop(s.webhooks);
    match s.backend {
        Backend::Local(l) => stop_local(l, s.state, server, deadline, &mut aborted).await,
        Backend::Cluster(node) => {
            node.stop(deadline.saturating_duration_since(Instant::now()))
                .await;
            drop(s.state);
            drop(server);
        }
    }
    if aborted.is_empty() {
        tracing::info!("geodwell stopped");
    } else {
        tracing::warn!(
            aborted = %aborted.join(", "),
            "geodwell stopped at the shutdown deadline; what was still running was aborted"
        );
    }
    let _ = served;
    Ok(())
}

/// Stops the parts of a one-process service in order: the final checkpoint round is queued, the
/// shards drain, the publisher commits, the checkpoint writer finishes, the store closes.
async fn stop_local<S>(
    l: LocalParts,
    state: Arc<AppState>,
    server: S,
    deadline: Instant,
    aborted: &mut Vec<&'static str>,
) {
    // The last checkpoint round is queued on every shard behind what it still has to do, so it
    // covers everything: the next start replays nothing.
    let mut final_round = None;
    let mut checkpoint_thread = None;
    if let Some(Checkpoints {
        handle,
        thread,
        task,
    }) = l.checkpoints
    {
        let last = match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(r)) => r,
            _ => handle.status.committed(),
        };
        // A round the task started and did not see finish is still being written.
        let _ = tokio::time::timeout_at(deadline, handle.status.wait(last, &l.abort)).await;
        let round = last.max(handle.status.committed()) + 1;
        if l.fence_log.checkpoint(round, &handle, false).await.is_ok() {
            final_round = Some((round, handle.status.clone()));
        }
        checkpoint_thread = Some(thread);
    }
    // The shards drain their queues, then the publisher commits what they handed it.
    l.shard_stop.cancel();
    for mut t in l.shard_tasks {
        if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
            t.abort();
            if !aborted.contains(&"shards") {
                aborted.push("shards");
            }
        }
    }
    drop(state);
    // An unfinished server (aborted at the deadline) still holds the router and its state.
    drop(server);
    l.publisher_stop.cancel();
    let mut publisher_task = l.publisher_task;
    if tokio::time::timeout_at(deadline, &mut publisher_task)
        .await
        .is_err()
    {
        publisher_task.abort();
        aborted.push("the final state commit");
    }
    // The writer commits the last round once the log holds everything it covers.
    if let Some((round, status)) = final_round {
        let done = tokio::time::timeout_at(deadline, status.wait(round, &l.abort)).await;
        if done.is_err() || status.committed() < round {
            aborted.push("the final checkpoint");
        }
    }
    l.abort.cancel();
    if let Some(thread) = checkpoint_thread {
        // Every sender is gone once the shards, the round task and the handle are: the thread
        // ends on its own.
        let joined = tokio::task::spawn_blocking(move || thread.join());
        if tokio::time::timeout_at(deadline, joined).await.is_err() {
            aborted.push("the checkpoint writer");
        }
    }
    // A caller that reopens the data directory after `shutdown` returns (a restart in the same
    // process, `store check`) must find the file closed.
    if let Some(store) = &l.store {
        while store.strong_count() > 0 {
            if Instant::now() >= deadline {
                aborted.push("closing the store (a task still holds it)");
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// The limits a service runs with, resolved against the machine.
struct Limits {
    max_connections: usize,
    budget: crate::budget::MemoryBudget,
    fixes: FixLimits,
}

/// Resolves the machine-derived limits (connections from the open-files limit, the memory
/// budget), says what they are, and exports them.
fn machine_limits(cfg: &Config) -> Limits {
    let open_files = crate::machine::raise_open_files();
    let max_connections = match cfg.max_connections {
        0 => open_files.map_or(1024, crate::machine::default_max_connections),
        n => n,
    };
    let queued_bytes = match cfg.max_queued_bytes {
        0 => crate::machine::default_queued_bytes(crate::machine::memory_bytes()),
        n => n,
    };
    tracing::info!(
        open_files = open_files.map_or("unknown".to_string(), |n| n.to_string()),
        max_connections,
        max_queued_bytes = queued_bytes,
        max_devices = cfg.max_devices,
        max_subscribers = cfg.max_subscribers,
        "limits"
    );
    metrics::gauge!(telemetry::HTTP_CONNECTIONS_MAX).set(max_connections as f64);
    metrics::gauge!(telemetry::DEVICES_MAX).set(cfg.max_devices as f64);
    metrics::gauge!(telemetry::SUBSCRIBERS_MAX).set(cfg.max_subscribers as f64);
    Limits {
        max_connections,
        budget: crate::budget::MemoryBudget::new(queued_bytes),
        fixes: FixLimits {
            max_device_len: cfg.max_device_len,
            // Both clock modes: a replay or backfill lies in the past, and one fix from the far
            // future would move an event-mode watermark past all real input for good.
            max_future: Some(cfg.max_future),
        },
    }
}

/// Starts serving the state on `listener`; the serve task stops everything in order at
/// shutdown.
fn launch(
    cfg: &Config,
    listener: TcpListener,
    addr: SocketAddr,
    stopping: Stopping,
    max_connections: usize,
    tls: Option<Arc<crate::http::tls::Tls>>,
) -> Service {
    let (state, trigger, deadline) = (
        stopping.state.clone(),
        stopping.trigger.clone(),
        stopping.deadline.clone(),
    );
    let router = http::router(state.clone());
    // MQTT ingest starts with the server (the state's task tracker: shutdown waits for its last
    // batch and acknowledgements).
    if let (Some(mqtt), Some(status)) = (cfg.mqtt.clone(), state.mqtt()) {
        let limits = crate::mqtt::MqttLimits {
            max_bytes: cfg.max_body_bytes,
            max_batch: cfg.max_batch,
            budget: state.budget().clone(),
        };
        crate::mqtt::spawn(
            mqtt,
            state.clone(),
            limits,
            state.tasks(),
            status.clone(),
            trigger.clone(),
        );
    }
    let server_limits = ServerLimits {
        max_connections,
        header_timeout: millis(cfg.header_timeout),
        write_timeout: millis(cfg.write_timeout),
    };
    let task = tokio::spawn(serve(
        listener,
        router,
        server_limits,
        tls.clone(),
        stopping,
    ));
    Service {
        addr,
        state,
        tls,
        trigger,
        deadline,
        task,
    }
}

fn millis(d: geodwell_core::time::Dur) -> Duration {
    Duration::from_millis(d.millis().max(1) as u64)
}

/// Says loudly when authentication is off; louder when the address is reachable from other
/// machines.
fn warn_if_open(cfg: &Config, addr: SocketAddr) {
    if !cfg.api_keys.is_empty() {
        tracing::info!(
            keys = cfg.api_keys.len(),
            open_metrics = cfg.open_metrics,
            "authentication is on"
        );
        return;
    }
    if addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "AUTHENTICATION IS OFF: any local process can send fixes, read events and change fences. \
             Configure [auth] api_keys (or GEODWELL_API_KEYS) before exposing this service."
        );
    } else {
        tracing::error!(
            %addr,
            "AUTHENTICATION IS OFF ON A NON-LOOPBACK ADDRESS: anyone who can reach this address can \
             send fixes, read events and change fences. Configure [auth] api_keys (or GEODWELL_API_KEYS)."
        );
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
            .and_then(std::sync::Weak::upgrade)
            .ok_or(crate::boot::BootError::NoStore)
            .map_err(failed)?;
        crate::boot::restore_shard(&cfg, &store, k).map_err(failed)
    })
}
