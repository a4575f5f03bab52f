//! What a deployment gives the service once it runs, the same for both deployments: the
//! handles the state is made of, what the handlers may ask of it, and how its own parts stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{WallClock, Watermark};
use crate::config::Config;
use crate::events::EventLog;
use crate::fences::{FenceMap, FenceWriter};
use crate::outbound::TargetPolicy;
use crate::shard::Shards;
use crate::state::{AppState, Deployment};
use crate::webhooks::Webhooks;

/// What every deployment is started with.
pub(super) struct Base {
    /// The Prometheus renderer.
    pub(super) metrics: PrometheusHandle,
    /// The wall clock the watermark reads.
    pub(super) wall: WallClock,
    /// Cancelled when shutdown begins.
    pub(super) trigger: CancellationToken,
    /// Where webhook and broker sinks may connect (`server.allow_private_targets`).
    pub(super) targets: TargetPolicy,
}

/// A started deployment's parts, the same for both.
pub(super) struct Started<R> {
    pub(super) shards: Shards,
    /// The fences' read copy the registry shares with the deployment.
    pub(super) fence_map: Arc<FenceMap>,
    /// Where fence changes are persisted and sent to the partitions.
    pub(super) fence_writer: Arc<dyn FenceWriter>,
    pub(super) log: Arc<EventLog>,
    pub(super) webhooks: Arc<Webhooks>,
    pub(super) watermark: Arc<Watermark>,
    /// What the handlers may ask of the deployment.
    pub(super) deployment: Arc<dyn Deployment>,
    /// How its own parts stop.
    pub(super) running: R,
}

/// A deployment's own running parts, as the service drives them.
pub(super) trait Running: Send + 'static {
    /// Says that the service listens, and what it runs (the start-up line).
    fn announce(&self, cfg: &Config, addr: SocketAddr);

    /// Stops the deployment's parts in order by `deadline`, once HTTP, the WebSocket tasks and
    /// the webhook sinks have; `state` and `server` (an unfinished server still holds the
    /// router, and so the state) are dropped as soon as nothing the parts finish needs them.
    /// What was still running at the deadline is named in `aborted`.
    fn stop<S: Send>(
        self,
        state: Arc<AppState>,
        server: S,
        deadline: Instant,
        aborted: &mut Vec<&'static str>,
    ) -> impl Future<Output = ()> + Send;
}

/// A configured duration as a std one (at least a millisecond).
pub(super) fn millis(d: geodwell_core::time::Dur) -> Duration {
    Duration::from_millis(d.millis().max(1) as u64)
}
