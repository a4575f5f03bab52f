//! geodwell: a geofence dwell-trigger service.
//!
//! Data flows one way (DESIGN section 5):
//!
//! ```text
//! http / ingest  -- parse, validate, stamp with the watermark, route by device hash
//!   -> shard      -- one task per shard owning a core::engine::Engine (reorder buffer, fence
//!                    index, pair records, timer wheel), ticked to a monotonic deadline
//!   -> events     -- the event log (gap-free seq) -> WebSocket subscribers and pollers
//! ```
//!
//! - [`core`]: the pure, deterministic engine (no tokio, no I/O, no clock reads).
//! - [`config`]: raw TOML + environment -> validated [`config::Config`], all errors at once.
//! - [`shard`], [`ingest`], [`state`]: the async shell around the core.
//! - [`events`]: the event log and subscriptions.
//! - [`webhooks`]: delivery of events to HTTP receivers (per-sink cursor, retries, dead letters).
//! - [`http`]: the HTTP / WebSocket interface.
//! - [`telemetry`]: metric names and tracing.
//! - [`sim`]: the fleet simulator (`geodwell simulate`): a seeded trace generator and a load
//!   driver that measures ingest-to-event latency.
//!
//! [`run`] serves on a bound listener until a shutdown token is cancelled.

pub mod auth;
pub mod config;
pub mod events;
pub mod http;
pub mod ingest;
pub mod shard;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod webhooks;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{ClockMode, Config, DurabilityMode};
use crate::events::EventLog;
use crate::events::publisher::{PublisherCfg, Step};
use crate::events::{CompactEvent, Interner, JSON_CACHE, LoggedEvent};
use crate::shard::{ShardCtx, WallClock};
use crate::state::AppState;
use crate::store::{Durability, Store, StoreError};
use geodwell_core::engine::{DeviceState, Engine, EngineConfig, Restored};
use geodwell_core::fences::{Fence, FenceErrors, FenceLimits, parse_fences_str};
use geodwell_core::time::Ts;

/// Why the service could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum RunError {
    /// The fences file could not be read.
    #[error("cannot read fences file {path}: {source}")]
    FencesRead {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The fences file is not valid.
    #[error("fences file {path} is invalid: {errors}")]
    FencesInvalid {
        /// The file.
        path: PathBuf,
        /// Every problem.
        errors: FenceErrors,
    },
    /// Too many fences in the file.
    #[error("fences file {path} holds {count} fences, more than max_fences = {max}")]
    TooManyFences {
        /// The file.
        path: PathBuf,
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The listener failed.
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
    /// The state store cannot be opened or read.
    #[error("state store: {0}")]
    Store(StoreError),
    /// The stored state is inconsistent.
    #[error("state store is inconsistent: {0}")]
    Corrupt(String),
}

/// Fence validation limits derived from the configuration.
pub fn fence_limits(cfg: &Config) -> FenceLimits {
    FenceLimits {
        max_vertices: cfg.max_vertices,
        ..FenceLimits::default()
    }
}

/// Loads the configured fences file (none configured: empty).
pub fn load_fences(cfg: &Config) -> Result<Vec<Fence>, RunError> {
    let Some(path) = &cfg.fences_file else {
        return Ok(Vec::new());
    };
    let text = std::fs::read_to_string(path).map_err(|source| RunError::FencesRead {
        path: path.clone(),
        source,
    })?;
    let fences =
        parse_fences_str(&text, &fence_limits(cfg)).map_err(|errors| RunError::FencesInvalid {
            path: path.clone(),
            errors,
        })?;
    if fences.len() > cfg.max_fences {
        return Err(RunError::TooManyFences {
            path: path.clone(),
            count: fences.len(),
            max: cfg.max_fences,
        });
    }
    Ok(fences)
}

/// Serves on `listener` until `shutdown` is cancelled; then stops accepting, closes WebSocket
/// tasks, drains the shards and returns.
pub async fn run(
    listener: TcpListener,
    cfg: Config,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let metrics = telemetry::install();
    let wall = WallClock::start();
    let started = Instant::now();

    // Warm start: the store (if any) is authoritative; the fences file seeds an empty store.
    let store = match cfg.durability {
        DurabilityMode::None => None,
        _ => Some(Arc::new(
            Store::open(&cfg.data_dir).map_err(RunError::Store)?,
        )),
    };
    let snapshot = match &store {
        Some(s) => Some(s.load(cfg.log_capacity).map_err(RunError::Store)?),
        None => None,
    };
    let (fences, seed_fences) = match &snapshot {
        Some(snap) if !snap.fences.is_empty() => {
            let limits = fence_limits(&cfg);
            let mut fences = Vec::with_capacity(snap.fences.len());
            for text in &snap.fences {
                let parsed =
                    parse_fences_str(text, &limits).map_err(|errors| RunError::FencesInvalid {
                        path: cfg.data_dir.clone(),
                        errors,
                    })?;
                fences.extend(parsed.into_iter().map(Arc::new));
            }
            (fences, false)
        }
        _ => (
            load_fences(&cfg)?
                .into_iter()
                .map(Arc::new)
                .collect::<Vec<_>>(),
            store.is_some(),
        ),
    };
    let next_seq = snapshot.as_ref().map_or(1, |s| s.next_seq.max(1));
    let tail = snapshot
        .as_ref()
        .map(|s| s.events.clone())
        .unwrap_or_default();
    let log = Arc::new(EventLog::new(
        cfg.log_capacity,
        cfg.log_max_age,
        tail.first().map_or(next_seq, |(seq, _)| *seq),
    ));
    // Decoded into the compact form the log holds, with fence ids and tags shared as in a live
    // log; the stored text is what the log rendered, so it is kept as the newest events' JSON.
    let mut interner = Interner::default();
    let mut restored_events = Vec::with_capacity(tail.len());
    let cached_from = tail.len().saturating_sub(JSON_CACHE);
    for (i, (_, json)) in tail.into_iter().enumerate() {
        let (seq, event) = CompactEvent::from_json(&json, &mut interner)
            .map_err(|e| RunError::Corrupt(e.to_string()))?;
        let text = (i >= cached_from).then(|| Arc::<str>::from(json));
        restored_events.push(LoggedEvent::new(seq, event, text));
    }
    drop(interner);
    let events_restored = restored_events.len();
    log.append_stamped(restored_events)
        .map_err(|e| RunError::Corrupt(format!("stored events: {e}")))?;
    if log.next_seq() != next_seq {
        return Err(RunError::Corrupt(format!(
            "stored events end at seq {} but the store says next_seq = {next_seq}",
            log.next_seq()
        )));
    }
    let max_seen = Arc::new(AtomicI64::new(
        snapshot
            .as_ref()
            .and_then(|s| s.max_seen)
            .unwrap_or(i64::MIN),
    ));
    let restore_w = match cfg.clock {
        ClockMode::Live => snapshot.as_ref().and_then(|s| s.watermark).map(Ts),
        ClockMode::Event => snapshot
            .as_ref()
            .and_then(|s| s.max_seen)
            .map(|m| Ts(m).minus(cfg.lateness)),
    };
    let (event_w, event_w_rx) = watch::channel(match cfg.clock {
        ClockMode::Event => restore_w,
        ClockMode::Live => None,
    });

    let durability = match cfg.durability {
        DurabilityMode::Sync => Durability::Sync,
        _ => Durability::Async,
    };
    // Webhook sinks start before the publisher's first commit: their cursors hold back the
    // store's event trimming.
    let webhooks = webhooks::Webhooks::start(&cfg, store.clone(), log.clone(), &shutdown).map_err(
        |e| match e {
            webhooks::WebhookError::Store(e) => RunError::Store(e),
            e => RunError::Corrupt(e.to_string()),
        },
    )?;
    let (publisher, publisher_task) = events::publisher::spawn(
        PublisherCfg {
            store: store.clone().map(|s| (s, durability)),
            commit_interval: Duration::from_millis(cfg.commit_interval.millis().max(1) as u64),
            log_capacity: cfg.log_capacity,
            queue: 4096,
        },
        log.clone(),
        wall,
        max_seen.clone(),
    );
    if seed_fences && !fences.is_empty() {
        let (ack, done) = tokio::sync::oneshot::channel();
        let step = Step {
            fences_put: fences
                .iter()
                .map(|f| {
                    (
                        f.id.to_string(),
                        serde_json::to_string(&f.to_feature()).unwrap_or_default(),
                    )
                })
                .collect(),
            ack: Some(ack),
            ..Step::default()
        };
        let stored = match publisher.send(step).await {
            Ok(()) => done
                .await
                .map_err(|_| events::publisher::PublishError::Closed)
                .and_then(|r| r),
            Err(e) => Err(e),
        };
        stored.map_err(|e| RunError::Corrupt(format!("cannot store the preloaded fences: {e}")))?;
    }

    let engine_cfg = EngineConfig {
        tick: cfg.tick,
        max_fires_per_advance: cfg.max_fires_per_tick,
        max_buffered_per_device: cfg.max_buffered_per_device,
        track_dirty: store.is_some(),
    };
    let mut per_shard: Vec<Vec<DeviceState>> = (0..cfg.shards).map(|_| Vec::new()).collect();
    if let Some(snap) = snapshot {
        for d in snap.devices {
            per_shard[ingest::shard_of(&d.id, cfg.shards)].push(d);
        }
    }
    let shard_stop = CancellationToken::new();
    let mut senders = Vec::new();
    let mut shard_tasks = Vec::new();
    let mut restored = Restored::default();
    let mut timers = 0;
    // Engines are rebuilt in parallel (one thread per shard): warm start is CPU-bound.
    let built: Vec<Result<(Engine, Restored), RunError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = per_shard
            .into_iter()
            .map(|devices| {
                let (engine_cfg, fences) = (&engine_cfg, &fences);
                scope.spawn(move || {
                    let mut engine = Engine::new(engine_cfg.clone());
                    let mut sink = Vec::new();
                    for f in fences {
                        engine.upsert_fence(f.clone(), &mut sink);
                    }
                    let r = engine
                        .restore(devices, restore_w)
                        .map_err(|e| RunError::Corrupt(e.to_string()))?;
                    Ok((engine, r))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(RunError::Corrupt("restoring a shard panicked".into())))
            })
            .collect()
    });
    for (id, b) in built.into_iter().enumerate() {
        let (engine, r) = b?;
        restored.devices += r.devices;
        restored.pairs += r.pairs;
        restored.dropped_pairs += r.dropped_pairs;
        restored.buffered += r.buffered;
        let ws = engine.stats().wheel;
        timers += ws.entries - ws.tombstones;
        let (tx, rx) = mpsc::channel(cfg.shard_queue);
        let ctx = ShardCtx {
            id,
            clock: cfg.clock,
            lateness: cfg.lateness,
            wall,
            event_w: event_w_rx.clone(),
            publisher: publisher.clone(),
            persist: store.is_some(),
            shutdown: shard_stop.clone(),
        };
        senders.push(tx);
        shard_tasks.push(tokio::spawn(shard::run(engine, rx, ctx)));
    }
    if store.is_some() {
        tracing::info!(
            data_dir = %cfg.data_dir.display(),
            durability = %cfg.durability,
            devices = restored.devices,
            pairs = restored.pairs,
            timers,
            buffered_fixes = restored.buffered,
            dropped_pairs = restored.dropped_pairs,
            events = events_restored,
            next_seq,
            watermark = ?restore_w,
            took_ms = started.elapsed().as_millis() as u64,
            "state restored"
        );
    }
    let fence_map: BTreeMap<String, Arc<Fence>> = fences
        .iter()
        .map(|f| (f.id.to_string(), f.clone()))
        .collect();
    metrics::gauge!(telemetry::FENCES).set(fence_map.len() as f64);
    let state = Arc::new(AppState {
        fence_limits: fence_limits(&cfg),
        auth: crate::auth::Keys::new(cfg.api_keys.clone()),
        cfg: cfg.clone(),
        shards: senders,
        log,
        publisher,
        fences: std::sync::RwLock::new(fence_map),
        fence_write: tokio::sync::Mutex::new(()),
        wall,
        max_seen,
        event_w,
        metrics,
        shutdown: shutdown.clone(),
        tasks: TaskTracker::new(),
        webhooks: webhooks.clone(),
    });
    let addr = listener.local_addr()?;
    tracing::info!(%addr, shards = cfg.shards, clock = %cfg.clock, lateness = %cfg.lateness, durability = %cfg.durability, fences = fences.len(), "geodwell listening");
    warn_if_open(&cfg, addr);
    let app = http::router(state.clone());
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await;
    // Stop: WebSocket tasks see the token and say goodbye; then the shards drain their queues;
    // then the publisher makes its last commit.
    state.tasks.close();
    let grace = Duration::from_millis(cfg.shutdown_grace.millis().max(0) as u64);
    if tokio::time::timeout(grace, state.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("WebSocket tasks did not finish within the shutdown grace period");
    }
    // Webhook sinks stop and write their cursors (fsync'd) while the store is still open.
    webhooks.stop(grace).await;
    shard_stop.cancel();
    for t in shard_tasks {
        let _ = tokio::time::timeout(grace, t).await;
    }
    drop(state);
    if tokio::time::timeout(grace, publisher_task).await.is_err() {
        tracing::warn!("the final state commit did not finish within the shutdown grace period");
    }
    tracing::info!("geodwell stopped");
    served.map_err(RunError::Io)
}

/// A server started in the background (tests, embedding).
#[derive(Debug)]
pub struct Running {
    /// The bound address.
    pub addr: SocketAddr,
    /// Cancel to stop.
    pub shutdown: CancellationToken,
    /// Resolves when the server has stopped.
    pub handle: tokio::task::JoinHandle<Result<(), RunError>>,
}

/// Binds `cfg.listen` (use port 0 for an ephemeral port) and runs the service in the background.
pub async fn start(cfg: Config) -> Result<Running, RunError> {
    let listener = TcpListener::bind(cfg.listen).await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    // Validate the fences file before reporting success.
    load_fences(&cfg)?;
    let handle = tokio::spawn(run(listener, cfg, shutdown.clone()));
    Ok(Running {
        addr,
        shutdown,
        handle,
    })
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
