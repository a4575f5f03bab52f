//! geodwell as one node of a cluster on NATS JetStream (docs/cluster.md): every node serves the
//! whole API; the engines are partitions (devices by hash) owned one node at a time under
//! leases; what they apply and publish lives in JetStream, so a partition moves to another node
//! by replaying its input from its last checkpoint.
//!
//! - [`nats`]: the connection and everything the cluster keeps in NATS;
//! - [`fences`]: the fence log every node follows, fence writes and their message encoding;
//! - [`lease`]: leases in a key/value bucket; [`assign`]: who should own what (pure);
//! - [`partition`]: the runtime's backend for a partition this node holds; [`shared`]: what
//!   every partition task shares; [`outbox`]: its events into the events stream, once each;
//!   [`checkpoint`]: its checkpoints' format, writing and restoring; `freeze`: its checkpoint
//!   storage (the runtime's seam);
//! - [`ingest`]: fixes into the partitions' input; [`query`]: device queries to the owners;
//! - [`feed`]: the events stream into this node's event log;
//! - [`node`]: membership rounds, ownership, and the [`crate::shard::Partitions`] the service's
//!   `Shards` handle routes through; [`status`]: `GET /v1/cluster`.
//!
//! Invariants (each module says how it keeps its own):
//! - a partition's engine is a pure function of its checkpoint and its input after it, so every
//!   owner, and every replay, produces the same events with the same ids;
//! - each event id is stored once in the events stream (message ids, and publishes fenced on
//!   the partition's last event sequence and the owner's lease);
//! - a 2xx to a batch means every part is in its partition's input (PubAck, replicated).

pub mod assign;
pub mod checkpoint;
pub mod elections;
pub mod feed;
pub mod fences;
mod freeze;
pub mod hedge;
pub mod ingest;
pub mod lease;
pub mod nats;
pub mod node;
pub mod outbox;
pub mod outcome;
pub mod partition;
pub mod query;
pub mod shared;
pub mod sinks;
pub mod status;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::{ClockMode, Watermark};
use crate::config::Config;
use crate::events::EventLog;
use crate::fences::FenceMap;
use crate::shard::Shards;
use geodwell_core::fences::Fence;

pub use nats::NatsError;

/// A running cluster node's parts.
#[derive(Debug)]
pub struct ClusterNode {
    nats: nats::Nats,
    node: String,
    fences: Arc<fences::FenceLog>,
    runtime: Arc<node::Runtime>,
    shards: Shards,
    log: Arc<EventLog>,
    feed_caught: watch::Receiver<bool>,
    member: watch::Receiver<bool>,
    sinks: sinks::NatsSinks,
    stop: CancellationToken,
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

/// What [`ClusterNode::start`] needs besides the configuration.
#[derive(Debug)]
pub struct Start {
    /// The node's watermark.
    pub watermark: Arc<Watermark>,
    /// The fences to seed an empty cluster with.
    pub preload: Vec<Fence>,
    /// The fence read copy the registry shares.
    pub map: Arc<FenceMap>,
    /// Where this node serves HTTP.
    pub http: String,
}

impl ClusterNode {
    /// Connects to NATS, sets up the cluster there (or finds it), follows its fences and events,
    /// and starts taking part in ownership. Returns once the fences and the event log are
    /// caught up.
    pub async fn start(cfg: &Config, start: Start) -> Result<ClusterNode, NatsError> {
        let cc = cfg
            .cluster
            .as_ref()
            .ok_or_else(|| NatsError::request("start a cluster node", "no [cluster] config"))?;
        let max_age = Duration::from_millis(cfg.log_max_age.millis().max(1000) as u64);
        let nats = connect_patiently(cc, max_age, cfg.log_capacity).await?;
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        start.watermark.set_external();
        let fences =
            fences::FenceLog::start(nats.clone(), start.map.clone(), start.preload, stop.clone())
                .await?;
        let (log, target) = feed::open_log(&nats, cfg.log_capacity, cfg.log_max_age).await?;
        let (caught_tx, feed_caught) = watch::channel(false);
        tasks.push(tokio::spawn(feed::follow(
            nats.clone(),
            log.clone(),
            target,
            caught_tx,
            stop.clone(),
        )));
        // A partition more than `shard_queue` records behind refuses input, like a full shard
        // queue in one process.
        let lags = Arc::new(ingest::Lags::new(nats.partitions, cfg.shard_queue as u64));
        let ingest = ingest::ClusterIngest::start(
            nats.clone(),
            &cc.node_id,
            cfg.shard_queue,
            lags.clone(),
            stop.clone(),
        )
        .await?;
        let partitions = nats.partitions as usize;
        let shared = Arc::new(shared::Shared {
            nats: nats.clone(),
            node: cc.node_id.clone(),
            fences: fences.clone(),
            watermark: start.watermark.clone(),
            engine: cfg.engine_config(partitions, true),
            max_device_len: cfg.max_device_len,
            // Also without idle_ttl when removed devices keep tombstones (max_delay), which the
            // sweep forgets once they are past it (ttl 0: tombstones only).
            idle: (cfg.idle_ttl > geodwell_core::time::Dur::ZERO
                || cfg.max_delay > geodwell_core::time::Dur::ZERO)
                .then_some(geodwell_core::engine::IdleRule { ttl: cfg.idle_ttl }),
            checkpoint_every: Duration::from_millis(cc.checkpoint_interval.millis().max(100) as u64),
            checkpoint_version: std::sync::atomic::AtomicU8::new(1),
            board: Arc::new(status::Board::default()),
        });
        let runtime = node::Runtime::new(
            shared,
            lease::Leases::new(nats.leases.clone(), &cc.node_id, nats.lease_ttl),
        );
        let sinks = sinks::NatsSinks::new(nats.clone(), nats.sinks.clone(), &cc.node_id);
        let (member_tx, member) = watch::channel(false);
        tasks.push(tokio::spawn(node::run_membership(
            node::Membership {
                nats: nats.clone(),
                node: cc.node_id.clone(),
                http: start.http,
                started_ms: start.watermark.wall().now().0,
                runtime: runtime.clone(),
                lags,
                fences: fences.clone(),
                sinks: {
                    let s = sinks.clone();
                    node::SinkNames(Arc::new(move || s.delivering()))
                },
            },
            member_tx,
            stop.clone(),
        )));
        if cfg.clock == ClockMode::Event {
            tasks.push(tokio::spawn(node::run_watermark(
                nats.clone(),
                cc.node_id.clone(),
                ingest.clone(),
                start.watermark.clone(),
                stop.clone(),
            )));
        }
        let shards = Shards::new(Arc::new(node::ClusterPartitions::new(
            nats.clone(),
            ingest,
            runtime.clone(),
        )));
        let mut caught = feed_caught.clone();
        let _ = tokio::time::timeout(Duration::from_secs(60), caught.wait_for(|c| *c)).await;
        tracing::info!(
            node = %cc.node_id,
            partitions = nats.partitions,
            replicas = nats.replicas,
            lease_ttl_ms = nats.lease_ttl.as_millis() as u64,
            fences = start.map.len(),
            events_from = log.next_seq(),
            "cluster node started"
        );
        Ok(ClusterNode {
            nats,
            node: cc.node_id.clone(),
            fences,
            runtime,
            shards,
            log,
            feed_caught,
            member,
            sinks,
            stop,
            tasks: std::sync::Mutex::new(tasks),
        })
    }

    /// The cluster's webhook sinks (shared definitions, cursors, one deliverer each).
    pub fn sinks(&self) -> Arc<dyn crate::webhooks::shared::SharedSinks> {
        Arc::new(self.sinks.clone())
    }

    /// The handle ingest and device queries route through.
    pub fn shards(&self) -> Shards {
        self.shards.clone()
    }

    /// The node's event log (fed by the events stream).
    pub fn log(&self) -> Arc<EventLog> {
        self.log.clone()
    }

    /// The fence log, the seam the fence registry writes through.
    pub fn fences(&self) -> Arc<fences::FenceLog> {
        self.fences.clone()
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.node
    }

    /// Ready: connected, event log caught up, a membership round done, and every partition
    /// this node runs live (or none: standing by).
    pub fn ready(&self) -> bool {
        let (runs, live) = self.runtime.board().counts();
        self.nats.client.connection_state() == async_nats::connection::State::Connected
            && *self.feed_caught.borrow()
            && *self.member.borrow()
            && runs == live
    }

    /// `GET /v1/cluster`: every node's heartbeat and every partition's owner.
    pub async fn status(&self) -> Result<status::ClusterOut, NatsError> {
        let nodes = node::live_nodes(&self.nats).await?;
        let holders = lease::Leases::new(self.nats.leases.clone(), &self.node, self.nats.lease_ttl)
            .holders()
            .await?;
        let mut reported: BTreeMap<u16, status::PartitionStatus> = BTreeMap::new();
        for h in nodes.values() {
            for s in &h.partitions {
                reported.insert(s.partition, s.clone());
            }
        }
        // This node's own partitions as they are now, not as of its last heartbeat.
        for s in self.runtime.board().all() {
            reported.insert(s.partition, s);
        }
        let ids: Vec<String> = nodes.keys().cloned().collect();
        let assigned = assign::owners(self.nats.partitions, &ids);
        let mut owners = Vec::with_capacity(self.nats.partitions as usize);
        let mut unowned = 0;
        for p in 0..self.nats.partitions {
            let holder = holders.get(&node::partition_lease(p));
            if holder.is_none() {
                unowned += 1;
            }
            owners.push(status::PartitionOut {
                partition: p,
                owner: holder.map(|h| h.node.clone()),
                assigned: assigned.get(usize::from(p)).map(|n| n.to_string()),
                epoch: holder.map(|h| h.epoch),
                status: reported
                    .get(&p)
                    .filter(|s| holder.is_some_and(|h| h.epoch == s.epoch))
                    .cloned(),
            });
        }
        Ok(status::ClusterOut {
            node: self.node.clone(),
            partitions: self.nats.partitions,
            replicas: self.nats.replicas,
            lease_ttl_ms: self.nats.lease_ttl.as_millis() as u64,
            nodes: nodes
                .values()
                .map(|h| status::NodeOut {
                    node: h.node.clone(),
                    http: h.http.clone(),
                    started_at: geodwell_core::time::Ts(h.started_ms).to_string(),
                    partitions: holders.values().filter(|x| x.node == h.node).count() as u64,
                    sinks: h.sinks.clone(),
                    this: h.node == self.node,
                })
                .collect(),
            partition_owners: owners,
            unowned,
        })
    }

    /// Leaves the cluster within `grace`: the heartbeat goes first (others stop ranking this
    /// node), then every partition stops with a final checkpoint and its lease is released.
    pub async fn stop(&self, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        // Membership rounds go on renewing the leases while the partitions stop, and take
        // nothing new.
        self.runtime.leave();
        let _ = self.nats.nodes.delete(&self.node).await;
        self.runtime.stop_all(deadline).await;
        let _ = self.nats.nodes.delete(&self.node).await;
        self.stop.cancel();
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in tasks {
            t.abort();
        }
        let _ = tokio::time::timeout_at(deadline, self.nats.client.flush()).await;
    }
}

/// How long a starting node keeps trying to set the cluster up while NATS is not ready yet (a
/// JetStream cluster that has just started elects its leaders for a few seconds, and nodes
/// started with it would otherwise exit).
const SETUP_PATIENCE: Duration = Duration::from_secs(60);

/// [`nats::Nats::connect`], tried again for up to [`SETUP_PATIENCE`] while the failure is one
/// that time can cure (a timeout, no leader yet); a server without JetStream or a stored value
/// that does not decode fails at once.
async fn connect_patiently(
    cc: &crate::config::ClusterConfig,
    max_age: Duration,
    log_capacity: usize,
) -> Result<nats::Nats, NatsError> {
    let t0 = std::time::Instant::now();
    let mut wait = Duration::from_millis(250);
    loop {
        match nats::Nats::connect(cc, max_age, log_capacity).await {
            Ok(n) => return Ok(n),
            Err(e @ (NatsError::NoJetStream(_) | NatsError::Corrupt { .. })) => return Err(e),
            Err(e) if t0.elapsed() < SETUP_PATIENCE => {
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "NATS not ready for this node yet; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(4));
            }
            Err(e) => return Err(e),
        }
    }
}
