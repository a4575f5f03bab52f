//! Sinks shared by the nodes of a cluster: their definitions, cursors and dead letters live in
//! a store every node reads ([`SharedSinks`], implemented on NATS by the cluster module), and
//! each sink is delivered by one node at a time, the holder of its lease ([`Tenure`]). The
//! manager's side, the rounds that follow this store, is `rounds.rs`.
//!
//! Invariants:
//! - A [`Tenure`] is the right to deliver one sink and to write its cursor and dead letters: its
//!   holder writes only while [`Tenure::valid`] says so, and stops delivering the moment
//!   [`Tenure::lost`] is cancelled.
//! - This file names nothing of the manager, so the cluster module implements [`SharedSinks`]
//!   without depending on it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::sink::DeadLetter;

/// A boxed future (the trait is used as an object).
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// How often the manager re-reads the shared definitions, renews and takes tenures, and writes
/// the cursors of the sinks it delivers.
pub const ROUND: Duration = Duration::from_millis(500);

/// A sink's shared delivery state.
#[derive(Debug, Clone, Default)]
pub struct SharedState {
    /// The next `seq` to look at (`None`: never written; the sink starts at the log head).
    pub cursor: Option<u64>,
    /// Dead letters, ascending by seq.
    pub dead: Vec<DeadLetter>,
}

/// The right to deliver one sink, until `lost` is cancelled.
#[derive(Clone)]
pub struct Tenure {
    /// Cancelled when the tenure is lost (or released).
    pub lost: CancellationToken,
    /// Whether the holder may still write (not lost, renewed recently enough).
    pub valid: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for Tenure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenure")
            .field("lost", &self.lost.is_cancelled())
            .finish()
    }
}

/// Where a cluster keeps its sinks, and who delivers each.
pub trait SharedSinks: Send + Sync + std::fmt::Debug + 'static {
    /// Every sink created over the API: id -> stored definition JSON.
    fn definitions(&self) -> BoxFuture<'_, Result<BTreeMap<String, String>, String>>;
    /// Stores a new API sink starting at `cursor`: false when one with this id exists.
    fn create(&self, id: &str, json: String, cursor: u64) -> BoxFuture<'_, Result<bool, String>>;
    /// Forgets an API sink: its definition, cursor and dead letters.
    fn remove(&self, id: &str) -> BoxFuture<'_, Result<(), String>>;
    /// A sink's cursor and dead letters.
    fn state(&self, id: &str) -> BoxFuture<'_, Result<SharedState, String>>;
    /// Writes a sink's cursor (when given) and dead-letter changes (`Some`: put, `None`: delete).
    fn save(
        &self,
        id: &str,
        cursor: Option<u64>,
        dead: Vec<(u64, Option<DeadLetter>)>,
    ) -> BoxFuture<'_, Result<(), String>>;
    /// Takes sink `id`'s tenure if it is this node's turn and nobody holds it; renewing it is
    /// the implementation's business until it is lost or released.
    fn acquire(&self, id: &str) -> BoxFuture<'_, Option<Tenure>>;
    /// Gives a tenure up (at shutdown, or when the sink is deleted).
    fn release(&self, id: &str) -> BoxFuture<'_, ()>;
}
