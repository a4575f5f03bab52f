//! What every partition task of a cluster node shares: the connection, the fence log, the
//! watermark, the engines' configuration and the status board.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use super::fences::FenceLog;
use super::nats::Nats;
use super::status::Board;
use crate::clock::Watermark;
use geodwell_core::engine::EngineConfig;

/// What every partition task of the node shares.
#[derive(Debug)]
pub struct Shared {
    /// NATS.
    pub nats: Nats,
    /// This node's id.
    pub node: String,
    /// The fence log's follower.
    pub fences: Arc<FenceLog>,
    /// The node's watermark (event mode: the cluster's, as this node knows it).
    pub watermark: Arc<Watermark>,
    /// Each partition engine's configuration.
    pub engine: EngineConfig,
    /// Longest device id.
    pub max_device_len: usize,
    /// `devices.idle_ttl`: the owner sweeps for idle devices (`None`: never).
    pub idle: Option<geodwell_core::engine::IdleRule>,
    /// How often to checkpoint.
    pub checkpoint_every: Duration,
    /// Where tasks report.
    pub board: Arc<Board>,
    /// The checkpoint object version every live node reads (see [`Shared::checkpoint_version`]).
    pub(super) checkpoint_version: AtomicU8,
}

impl Shared {
    /// The checkpoint object version to write: the newest every live node reads, as the last
    /// membership round found it (1 until a round has read the heartbeats), so that a node of
    /// an earlier version can take over a partition during a node-by-node upgrade.
    pub fn checkpoint_version(&self) -> u8 {
        self.checkpoint_version.load(Ordering::Relaxed)
    }

    /// Sets the checkpoint object version to write (the membership round's finding,
    /// `checkpoint::readable_by_all`).
    pub fn set_checkpoint_version(&self, v: u8) {
        self.checkpoint_version.store(v, Ordering::Relaxed);
    }
}
