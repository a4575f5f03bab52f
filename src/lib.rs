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
//! - [`http`]: the HTTP / WebSocket interface.
//! - [`telemetry`]: metric names and tracing.
//!
//! [`run`] serves on a bound listener until a shutdown token is cancelled.

pub mod config;
pub mod core;
pub mod events;
pub mod http;
pub mod ingest;
pub mod shard;
pub mod state;
pub mod store;
pub mod telemetry;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::core::engine::{Engine, EngineConfig};
use crate::core::fences::{Fence, FenceErrors, FenceLimits, parse_fences_str};
use crate::events::EventLog;
use crate::shard::{ShardCtx, WallClock};
use crate::state::AppState;

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
    let fences: Vec<Arc<Fence>> = load_fences(&cfg)?.into_iter().map(Arc::new).collect();
    let wall = WallClock::start();
    let log = Arc::new(EventLog::new(cfg.log_capacity, cfg.log_max_age, 1));
    let (event_w, event_w_rx) = watch::channel(None);
    let engine_cfg = EngineConfig {
        tick: cfg.tick,
        max_fires_per_advance: cfg.max_fires_per_tick,
        max_buffered_per_device: cfg.max_buffered_per_device,
        track_dirty: false,
    };
    let shard_stop = CancellationToken::new();
    let mut senders = Vec::new();
    let mut shard_tasks = Vec::new();
    for id in 0..cfg.shards {
        let (tx, rx) = mpsc::channel(cfg.shard_queue);
        let mut engine = Engine::new(engine_cfg.clone());
        let mut sink = Vec::new();
        for f in &fences {
            engine.upsert_fence(f.clone(), &mut sink);
        }
        let ctx = ShardCtx {
            id,
            clock: cfg.clock,
            lateness: cfg.lateness,
            wall,
            event_w: event_w_rx.clone(),
            log: log.clone(),
            shutdown: shard_stop.clone(),
        };
        senders.push(tx);
        shard_tasks.push(tokio::spawn(shard::run(engine, rx, ctx)));
    }
    let fence_map: BTreeMap<String, Arc<Fence>> = fences
        .iter()
        .map(|f| (f.id.to_string(), f.clone()))
        .collect();
    metrics::gauge!(telemetry::FENCES).set(fence_map.len() as f64);
    let state = Arc::new(AppState {
        fence_limits: fence_limits(&cfg),
        cfg: cfg.clone(),
        shards: senders,
        log,
        fences: std::sync::RwLock::new(fence_map),
        fence_write: tokio::sync::Mutex::new(()),
        wall,
        max_seen: AtomicI64::new(i64::MIN),
        event_w,
        metrics,
        shutdown: shutdown.clone(),
        tasks: TaskTracker::new(),
    });
    let addr = listener.local_addr()?;
    tracing::info!(%addr, shards = cfg.shards, clock = %cfg.clock, lateness = %cfg.lateness, fences = fences.len(), "geodwell listening");
    let app = http::router(state.clone());
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await;
    // Stop: WebSocket tasks see the token and say goodbye; then the shards drain their queues.
    state.tasks.close();
    let grace = Duration::from_millis(cfg.shutdown_grace.millis().max(0) as u64);
    if tokio::time::timeout(grace, state.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("WebSocket tasks did not finish within the shutdown grace period");
    }
    shard_stop.cancel();
    for t in shard_tasks {
        let _ = tokio::time::timeout(grace, t).await;
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
