//! What every partition task of a cluster node shares: the connection, the fence log, the
//! watermark, the engines' configuration and the status board.

use std::sync::Arc;
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
}
