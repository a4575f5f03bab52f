//! The running service: [`Service::spawn`] starts the deployment the configuration names (one
//! process on its embedded store, [`local`], or a node of a cluster, [`cluster`]) and serves the
//! API on a bound listener; [`Service::shutdown`] stops it in order within one deadline.
//!
//! The deployment is chosen in one place, [`Service::spawn`]; each gives back the same
//! [`Started`] parts, what the handlers may ask of it ([`Deployment`]) and how its own parts
//! stop ([`Running`]). Everything else here is the same for both.
//!
//! Stop order, all within one deadline (`grace` from the moment shutdown begins): stop accepting
//! and finish in-flight requests -> WebSocket tasks say goodbye -> webhook sinks stop and write
//! their cursors -> the deployment's own parts stop ([`Running::stop`]). Work that is still
//! running at the deadline is aborted, and the log says which. When `shutdown` returns, the
//! store is closed (the data directory can be opened again).

mod cluster;
mod error;
mod local;
mod started;

pub use error::ServiceError;
use started::{Base, Running, Started, millis};

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::boot::fence_limits;
use crate::clock::WallClock;
use crate::config::Config;
use crate::fences::FenceRegistry;
use crate::http::server::ServerLimits;
use crate::ingest::Ingest;
use crate::state::{AppState, Parts};
use crate::webhooks::{WebhookError, Webhooks};
use crate::wire::FixLimits;
use crate::{http, telemetry};

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
        let addr = listener.local_addr()?;
        let base = Base {
            metrics: telemetry::install(),
            wall: WallClock::start(),
            trigger: CancellationToken::new(),
            targets: crate::outbound::TargetPolicy {
                allow_private: cfg.allow_private_targets,
            },
        };
        // The one place the deployment is chosen.
        match cfg.cluster {
            None => {
                let started = local::start(&cfg, &base).await?;
                Ok(launch(cfg, listener, addr, base, tls, started))
            }
            Some(_) => {
                let started = cluster::start(&cfg, &base, addr).await?;
                Ok(launch(cfg, listener, addr, base, tls, started))
            }
        }
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
        task.await.unwrap_or_else(|e| Err(ServiceError::Stopped(e)))
    }
}

/// What the serve task needs to stop the service in order.
struct Stopping<R> {
    state: Arc<AppState>,
    trigger: CancellationToken,
    deadline: Arc<Mutex<Option<Instant>>>,
    default_grace: Duration,
    webhooks: Arc<Webhooks>,
    running: R,
}

/// Serves until shutdown begins, then stops every part in order within the deadline.
async fn serve<R: Running>(
    listener: TcpListener,
    router: axum::Router,
    limits: ServerLimits,
    tls: Option<Arc<crate::http::tls::Tls>>,
    s: Stopping<R>,
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
    s.running
        .stop(s.state, server, deadline, &mut aborted)
        .await;
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

/// Assembles the service's state from a started deployment and serves it on `listener`; the
/// serve task stops everything in order at shutdown.
fn launch<R: Running>(
    cfg: Config,
    listener: TcpListener,
    addr: SocketAddr,
    base: Base,
    tls: Option<Arc<crate::http::tls::Tls>>,
    started: Started<R>,
) -> Service {
    let Limits {
        max_connections,
        budget,
        fixes: limits,
    } = machine_limits(&cfg);
    let Started {
        shards,
        fence_map,
        fence_writer,
        log,
        webhooks,
        watermark,
        deployment,
        running,
    } = started;
    let fences = Arc::new(FenceRegistry::new(
        fence_map,
        fence_limits(&cfg),
        cfg.max_fences,
        fence_writer,
    ));
    let state = Arc::new(AppState::new(Parts {
        ingest: Ingest::new(limits, watermark.clone(), shards.clone()),
        shards,
        fences,
        log,
        webhooks: webhooks.clone(),
        watermark,
        metrics: base.metrics,
        shutdown: base.trigger.clone(),
        budget,
        deployment,
        cfg: cfg.clone(),
    }));
    running.announce(&cfg, addr);
    warn_if_open(&cfg, addr);
    let trigger = base.trigger;
    let deadline = Arc::new(Mutex::new(None));
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
    let stopping = Stopping {
        state: state.clone(),
        trigger: trigger.clone(),
        deadline: deadline.clone(),
        default_grace: Duration::from_millis(cfg.shutdown_grace.millis().max(0) as u64),
        webhooks,
        running,
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
