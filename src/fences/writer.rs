//! The seam between the fence registry and a deployment's fence log: the [`FenceWriter`] trait
//! and what crosses it (the changes of one write, the check run against the fences it follows,
//! and what a write did or why it failed).
//!
//! Invariant: this file depends only on the read copy ([`FenceMap`]), so the registry and every
//! writer (the local one beside it, the cluster's) can share these types without depending on
//! each other.

use thiserror::Error;

use super::map::{FenceMap, Stored};
use geodwell_core::fences::FenceErrors;

/// Why a fence write was refused or failed.
#[derive(Debug, Error)]
pub enum FenceWriteError {
    /// The GeoJSON is not a valid fence (every problem listed).
    #[error("{0}")]
    Invalid(FenceErrors),
    /// A FeatureCollection without features.
    #[error("the FeatureCollection holds no features")]
    Empty,
    /// The write would hold more fences than allowed.
    #[error("{would} fences would exceed the limit of {max}")]
    TooMany {
        /// Fences after the write.
        would: usize,
        /// The limit.
        max: usize,
    },
    /// No fence with this id.
    #[error("no fence with id {0:?}")]
    NotFound(String),
    /// The durable log cannot take the change; nothing changed.
    #[error(transparent)]
    Store(#[from] crate::events::publisher::LogError),
    /// The service is shutting down.
    #[error("the service is shutting down")]
    ShuttingDown,
    /// A cluster node's writes kept meeting other nodes' writes; nothing changed.
    #[error("fence writes kept meeting other nodes' writes; try again")]
    Contended,
    /// A cluster node stored the change, and has not applied it itself in time: it is durable
    /// and reaches every partition; the read copy of this node follows.
    #[error("fence change {0} is stored but this node has not applied it yet")]
    NotApplied(u64),
    /// A cluster node's write met another node's write first (retried internally; seen by
    /// callers only when seeding).
    #[error("another fence write came first")]
    Conflict,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Fences that did not exist before.
    pub created: usize,
    /// Fences that replaced one with the same id.
    pub replaced: usize,
}

/// One fence write's changes, in order.
#[derive(Debug, Clone)]
pub enum FenceWrite {
    /// Insert or replace.
    Put(Stored),
    /// Delete the fence with this id.
    Delete(String),
}

/// A fence check run against the fences a write follows: what the write will report, or why it
/// is refused.
pub type FenceCheck<'a> =
    Box<dyn Fn(&FenceMap) -> Result<Written, FenceWriteError> + Send + Sync + 'a>;

/// Where fence writes go: the seam between the registry and a deployment's fence log
/// ([`LocalFences`](super::LocalFences) in one process, `crate::cluster::fences::FenceLog` on a
/// cluster node).
pub trait FenceWriter: Send + Sync + std::fmt::Debug {
    /// Writes `changes` as one change, all or nothing, once `check` passed against the fences
    /// as of the position the change follows; returns `check`'s answer once the change is
    /// durable, reaches every partition's input, and is in the read copy.
    fn write<'a>(
        &'a self,
        changes: Vec<FenceWrite>,
        check: FenceCheck<'a>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Written, FenceWriteError>> + Send + 'a>>;
}
