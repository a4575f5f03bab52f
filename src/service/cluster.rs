//! A node of a cluster on NATS JetStream (`[cluster]` set; docs/cluster.md): the engines are the
//! cluster's partitions, reached through NATS; fences, events, checkpoints and webhook cursors
//! live there. Started after the preloaded fences are read; stopped (after HTTP, WebSockets
//! and webhooks) by leaving the cluster: every partition checkpoints and releases its lease.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::time::Instant;

use super::error::ServiceError;
use super::started::{Base, Running, Started};
use crate::clock::Watermark;
use crate::cluster::status::ClusterOut;
use crate::cluster::{ClusterNode, Start};
use crate::config::Config;
use crate::fences::FenceMap;
use crate::shard::BoxFuture;
use crate::state::{AppState, ClusterStatusError, Deployment};
use crate::webhooks::Webhooks;

/// Joins the cluster: connects to NATS, follows its fences and events, takes part in ownership.
pub(super) async fn start(
    cfg: &Config,
    base: &Base,
    addr: SocketAddr,
) -> Result<Started<Node>, ServiceError> {
    let preload_cfg = cfg.clone();
    let preload = tokio::task::spawn_blocking(move || crate::boot::load_preload(&preload_cfg))
        .await
        .map_err(ServiceError::Join)??;
    let watermark = Arc::new(Watermark::new(
        cfg.clock,
        cfg.lateness,
        base.wall,
        None,
        None,
    ));
    let map = Arc::new(FenceMap::default());
    let node = ClusterNode::start(
        cfg,
        Start {
            watermark: watermark.clone(),
            preload,
            map: map.clone(),
            http: addr.to_string(),
        },
    )
    .await
    .map_err(ServiceError::Cluster)?;
    let node = Arc::new(node);
    let webhooks = Webhooks::start_shared(
        &cfg.webhooks,
        node.sinks(),
        node.log(),
        base.targets,
        &base.trigger,
    );
    Ok(Started {
        shards: node.shards(),
        fence_map: map,
        fence_writer: node.fences(),
        log: node.log(),
        webhooks,
        watermark,
        deployment: Arc::new(Node(node.clone())),
        running: Node(node),
    })
}

/// A running cluster node, as the service's handlers and its stop see it.
#[derive(Debug)]
pub(super) struct Node(Arc<ClusterNode>);

impl Deployment for Node {
    fn ready(&self) -> bool {
        self.0.ready()
    }

    fn gauges(&self) {}

    fn cluster(&self) -> BoxFuture<'_, Result<ClusterOut, ClusterStatusError>> {
        Box::pin(async {
            self.0
                .status()
                .await
                .map_err(ClusterStatusError::Unavailable)
        })
    }
}

impl Running for Node {
    fn announce(&self, cfg: &Config, addr: SocketAddr) {
        tracing::info!(%addr, tls = cfg.tls_cert.is_some(), node = self.0.node_id(), clock = %cfg.clock, lateness = %cfg.lateness, "geodwell listening (cluster node)");
    }

    async fn stop<S: Send>(
        self,
        state: Arc<AppState>,
        server: S,
        deadline: Instant,
        _aborted: &mut Vec<&'static str>,
    ) {
        self.0
            .stop(deadline.saturating_duration_since(Instant::now()))
            .await;
        drop(state);
        drop(server);
    }
}
