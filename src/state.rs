//! The service state every HTTP handler and WebSocket task is given: the handles of the
//! service's parts, reached through methods (the fields are private, so a handler cannot run a
//! protocol that belongs to one of those parts).

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::Keys;
use crate::budget::MemoryBudget;
use crate::clock::Watermark;
use crate::cluster::status::ClusterOut;
use crate::config::Config;
use crate::events::EventLog;
use crate::fences::FenceRegistry;
use crate::ingest::Ingest;
use crate::shard::{BoxFuture, Shards};
use crate::webhooks::Webhooks;
use geodwell_core::time::Ts;

/// Shared state of a running service.
#[derive(Debug)]
pub struct AppState {
    cfg: Config,
    /// Swapped whole on a reload (SIGHUP); a request checks against the set it read.
    auth: std::sync::RwLock<Arc<Keys>>,
    ingest: Ingest,
    shards: Shards,
    fences: Arc<FenceRegistry>,
    log: Arc<EventLog>,
    webhooks: Arc<Webhooks>,
    watermark: Arc<Watermark>,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    mqtt: Option<Arc<crate::mqtt::MqttStatus>>,
    budget: MemoryBudget,
    deployment: Arc<dyn Deployment>,
    subscribers: Arc<tokio::sync::Semaphore>,
    ingest_sockets: Arc<tokio::sync::Semaphore>,
}

/// The parts an [`AppState`] is made of (see `crate::service`, which builds them).
#[derive(Debug)]
pub struct Parts {
    /// Validated configuration.
    pub cfg: Config,
    /// Ingest (validation, stamping, routing).
    pub ingest: Ingest,
    /// The shards.
    pub shards: Shards,
    /// The fence registry.
    pub fences: Arc<FenceRegistry>,
    /// The event log (read side).
    pub log: Arc<EventLog>,
    /// The webhook sinks.
    pub webhooks: Arc<Webhooks>,
    /// The watermark.
    pub watermark: Arc<Watermark>,
    /// The Prometheus renderer.
    pub metrics: PrometheusHandle,
    /// Cancelled when shutdown starts.
    pub shutdown: CancellationToken,
    /// The memory budget for queued input.
    pub budget: MemoryBudget,
    /// What the deployment (one process, or a cluster node) answers for itself.
    pub deployment: Arc<dyn Deployment>,
}

/// What differs between the two deployments as the handlers see them: one process on its
/// embedded store, or a node of a cluster on NATS JetStream (`crate::service` builds either,
/// and nothing else names which one runs).
pub trait Deployment: Send + Sync + std::fmt::Debug {
    /// Whether the deployment's own parts are ready, besides the partitions running (a cluster
    /// node: connected to NATS, its event log caught up, a membership round done).
    fn ready(&self) -> bool;

    /// Sets the deployment's own gauges just before a scrape (the store file's size, the last
    /// checkpoint's age).
    fn gauges(&self);

    /// `GET /v1/cluster`: the cluster as this node sees it.
    fn cluster(&self) -> BoxFuture<'_, Result<ClusterOut, ClusterStatusError>>;
}

/// Why `GET /v1/cluster` has no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClusterStatusError {
    /// The service runs as one process on its embedded store.
    #[error("this node runs on its embedded store, not in a cluster ([cluster] nats_urls)")]
    NotACluster,
    /// NATS could not be asked.
    #[error("the cluster cannot be read")]
    Unavailable(#[source] crate::cluster::NatsError),
}

impl AsRef<Ingest> for AppState {
    fn as_ref(&self) -> &Ingest {
        &self.ingest
    }
}

impl AppState {
    /// Assembles the state; API keys come from `parts.cfg`.
    pub fn new(parts: Parts) -> AppState {
        AppState {
            subscribers: Arc::new(tokio::sync::Semaphore::new(parts.cfg.max_subscribers)),
            ingest_sockets: Arc::new(tokio::sync::Semaphore::new(parts.cfg.max_ws_connections)),
            budget: parts.budget,
            deployment: parts.deployment,
            mqtt: parts
                .cfg
                .mqtt
                .is_some()
                .then(|| Arc::new(crate::mqtt::MqttStatus::default())),
            auth: std::sync::RwLock::new(Arc::new(Keys::new(parts.cfg.api_keys.clone()))),
            cfg: parts.cfg,
            ingest: parts.ingest,
            shards: parts.shards,
            fences: parts.fences,
            log: parts.log,
            webhooks: parts.webhooks,
            watermark: parts.watermark,
            metrics: parts.metrics,
            shutdown: parts.shutdown,
            tasks: TaskTracker::new(),
        }
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The API keys now (authentication is off when there are none).
    pub fn keys(&self) -> Arc<Keys> {
        self.auth.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the API keys (a reload): requests from now on are checked against `keys`.
    pub fn set_keys(&self, keys: Vec<crate::auth::ApiKey>) {
        let new = Arc::new(Keys::new(keys));
        *self.auth.write().unwrap_or_else(|p| p.into_inner()) = new;
    }

    /// Ingest: the one path every transport's fixes take.
    pub fn ingest(&self) -> &Ingest {
        &self.ingest
    }

    /// The shards (device state and listings).
    pub fn shards(&self) -> &Shards {
        &self.shards
    }

    /// The fence registry.
    pub fn fences(&self) -> &FenceRegistry {
        &self.fences
    }

    /// The event log.
    pub fn log(&self) -> &Arc<EventLog> {
        &self.log
    }

    /// The webhook sinks.
    pub fn webhooks(&self) -> &Webhooks {
        &self.webhooks
    }

    /// The current watermark (`None` in event mode before the first fix).
    pub fn watermark(&self) -> Option<Ts> {
        self.watermark.current()
    }

    /// The metrics in Prometheus text format.
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    /// Cancelled once shutdown starts (WebSocket tasks say goodbye when it is).
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Whether shutdown has started.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// What the deployment answers for itself (readiness, its gauges, the cluster's status).
    pub fn deployment(&self) -> &dyn Deployment {
        &*self.deployment
    }

    /// The memory budget for queued input.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// A place for one more event subscriber (`events.max_subscribers`), held while it is
    /// connected; `None` when all are taken.
    pub fn subscriber_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.subscribers.clone().try_acquire_owned().ok()
    }

    /// A place for one more ingest WebSocket (`ingest.max_ws_connections`), held while it is
    /// connected; `None` when all are taken.
    pub fn ingest_socket_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.ingest_sockets.clone().try_acquire_owned().ok()
    }

    /// The MQTT ingest connection's state, when `[mqtt]` is on.
    pub fn mqtt(&self) -> Option<&Arc<crate::mqtt::MqttStatus>> {
        self.mqtt.as_ref()
    }

    /// Background tasks that shutdown waits for (WebSocket connections, MQTT ingest).
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }
}
