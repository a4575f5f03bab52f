//! What this node says about itself and its partitions: the status board its partition tasks
//! write, which its heartbeat carries to the other nodes, and the typed answer of
//! `GET /v1/cluster` assembled from every node's heartbeat and the leases.
//!
//! Invariant: the board holds an entry exactly for the partitions this node runs (a task
//! removes its entry when it ends); every field is bounded (a few numbers per partition).

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Where a partition task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Loading its checkpoint.
    Restoring,
    /// Re-applying input after the checkpoint (nothing it publishes is new to the stream
    /// unless the previous owner had not published it).
    Replaying,
    /// Caught up with its input.
    Live,
    /// Handing over (a final checkpoint) or standing down.
    Stopping,
}

/// How long each step of a takeover took, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TakeoverTimes {
    /// Reading and decoding the checkpoint and rebuilding the engine.
    pub restore_ms: u64,
    /// Reading what the partition already published after the checkpoint.
    pub suppress_ms: u64,
    /// Re-applying the input after the checkpoint, until caught up.
    pub replay_ms: u64,
    /// Input records re-applied.
    pub replayed_records: u64,
}

/// One partition as its owner reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PartitionStatus {
    /// The partition.
    pub partition: u16,
    /// The owner's lease epoch (the lease key's revision when it was taken).
    pub epoch: u64,
    /// Where the task stands.
    pub phase: Phase,
    /// The last input record applied (a stream sequence of the input stream).
    pub input_position: u64,
    /// Input records not applied yet.
    pub lag_records: u64,
    /// The input position of the newest checkpoint (0: none).
    pub checkpoint_position: u64,
    /// When the newest checkpoint was written (Unix ms; 0: none).
    pub checkpoint_at_ms: i64,
    /// The takeover that started this task, once it caught up.
    pub takeover: Option<TakeoverTimes>,
}

/// This node's partitions, as its tasks report them.
#[derive(Debug, Default)]
pub struct Board {
    parts: Mutex<BTreeMap<u16, PartitionStatus>>,
}

impl Board {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, PartitionStatus>> {
        self.parts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes partition `p`'s entry (creating it with `epoch`).
    pub fn update(&self, p: u16, epoch: u64, f: impl FnOnce(&mut PartitionStatus)) {
        let mut g = self.lock();
        let e = g.entry(p).or_insert_with(|| PartitionStatus {
            partition: p,
            epoch,
            phase: Phase::Restoring,
            input_position: 0,
            lag_records: 0,
            checkpoint_position: 0,
            checkpoint_at_ms: 0,
            takeover: None,
        });
        e.epoch = epoch;
        f(e);
    }

    /// Removes partition `p`'s entry if it still belongs to `epoch`.
    pub fn remove(&self, p: u16, epoch: u64) {
        let mut g = self.lock();
        if g.get(&p).is_some_and(|e| e.epoch == epoch) {
            g.remove(&p);
        }
    }

    /// Every entry.
    pub fn all(&self) -> Vec<PartitionStatus> {
        self.lock().values().cloned().collect()
    }

    /// How many partitions run here, and how many are live.
    pub fn counts(&self) -> (usize, usize) {
        let g = self.lock();
        (
            g.len(),
            g.values().filter(|e| e.phase == Phase::Live).count(),
        )
    }
}

/// What a node's heartbeat (its entry in the nodes bucket) holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The node id.
    pub node: String,
    /// Where it serves HTTP.
    pub http: String,
    /// When it started (Unix ms).
    pub started_ms: i64,
    /// Its partitions.
    pub partitions: Vec<PartitionStatus>,
    /// The webhook sinks it delivers.
    pub sinks: Vec<String>,
    /// The newest checkpoint object version it reads (absent in an earlier build's heartbeat:
    /// version 1).
    #[serde(default)]
    pub reads_checkpoint_version: u8,
}

/// A node in `GET /v1/cluster`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NodeOut {
    /// The node id.
    pub node: String,
    /// Where it serves HTTP.
    pub http: String,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// Partitions it owns.
    pub partitions: u64,
    /// The webhook sinks it delivers.
    pub sinks: Vec<String>,
    /// Whether this is the node that answered.
    pub this: bool,
}

/// A partition in `GET /v1/cluster`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PartitionOut {
    /// The partition.
    pub partition: u16,
    /// Its owner (`None`: unowned, being taken over).
    pub owner: Option<String>,
    /// The live node the assignment gives it to (`None`: no live node). It differs from
    /// `owner` while the partition waits to be handed over (membership settles for a lease
    /// lifetime first) or taken over.
    pub assigned: Option<String>,
    /// The owner's lease epoch.
    pub epoch: Option<u64>,
    /// As the owner reports it (`None` before its first heartbeat after taking it).
    pub status: Option<PartitionStatus>,
}

/// `GET /v1/cluster`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClusterOut {
    /// The node that answered.
    pub node: String,
    /// Partitions (fixed when the cluster was created).
    pub partitions: u16,
    /// Replicas of what this node created.
    pub replicas: usize,
    /// The lease time to live, ms.
    pub lease_ttl_ms: u64,
    /// Live nodes, by id.
    pub nodes: Vec<NodeOut>,
    /// Every partition.
    pub partition_owners: Vec<PartitionOut>,
    /// Partitions without an owner.
    pub unowned: u64,
}
