//! What a partition step hands the publisher ([`Step`]), and what its waiters get back.
//!
//! Invariant: a step is committed, published and answered whole, or refused whole (its waiters
//! get a [`PublishError`]); nothing of a refused step is stored or published.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::store::StoreError;
use geodwell_core::engine::{IngestError, Ingested};
use geodwell_core::event::Event;
use geodwell_core::time::Ts;

/// Why a step's reply is an error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    /// The durable log did not take the step; nothing of it is stored or applied.
    #[error(transparent)]
    Store(#[from] LogError),
    /// The publisher is gone (shutdown).
    #[error("the service is shutting down")]
    Closed,
}

/// Why the durable log did not take input, whichever backend holds it: what a 503
/// `store_unavailable` carries. Cheap to clone (one error reaches every waiter of a commit).
#[derive(Debug, Clone, thiserror::Error)]
pub enum LogError {
    /// A commit of the local store failed (nothing of it is stored).
    #[error("a commit of the state store failed: {0}")]
    Commit(#[source] Arc<StoreError>),
    /// The local store failed a commit and takes no input until a probe commits and the
    /// partitions that held refused steps have rebuilt.
    #[error("the state store does not take commits since a commit failed (it is probed every second){}", .0.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Failing(#[source] Option<Arc<StoreError>>),
    /// A cluster's stream did not take it (no acknowledgement: a leader election, a lost
    /// quorum, a server gone).
    #[error("{what}: {source}")]
    Stream {
        /// What was asked of the stream.
        what: &'static str,
        /// The client's error.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
}

impl LogError {
    /// A stream error of a cluster.
    pub fn stream(what: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        LogError::Stream {
            what,
            source: Arc::new(e),
        }
    }
}

/// The outcome of one fix, by its index in the request.
pub type FixOutcome = (usize, Result<Ingested, IngestError>);

/// What a waiting HTTP request gets back.
pub type StepReply = Result<Vec<FixOutcome>, PublishError>;

/// A shard's input record for one step: (shard, seq, encoded record; `store::input`).
pub type InputRecord = (u16, u64, Vec<u8>);

/// One shard step's output.
#[derive(Debug, Default)]
pub struct Step {
    /// Events produced, in order.
    pub events: Vec<Event>,
    /// The shard's input record for the step (none for a step that only advanced time).
    pub input: Option<InputRecord>,
    /// Fence changes made by the registry: (change number, encoded change).
    pub fence_changes: Vec<(u64, Vec<u8>)>,
    /// Log records a checkpoint now covers, to delete: per shard the last `seq`, and the last
    /// fence change.
    pub truncate: Option<(Vec<(u16, u64)>, u64)>,
    /// The shard's watermark after the step.
    pub watermark: Option<Ts>,
    /// Who waits for this step to be durable, and what to tell them.
    pub reply: Option<(oneshot::Sender<StepReply>, Vec<FixOutcome>)>,
    /// Fence writes wait too.
    pub ack: Option<oneshot::Sender<Result<(), PublishError>>>,
    /// Per event, in order: when what caused it happened, for the ingest-to-event latency (the
    /// arrival of the fix that decided it, or the moment the watermark passed its time).
    pub causes: Vec<Instant>,
    /// The request this step is a part of: (request id, number of parts).
    pub request: Option<(u64, u32)>,
    /// The largest fix `ts` in this step (the persisted event-mode watermark source).
    pub max_ts: Option<Ts>,
    /// The partition whose step this is (`None`: a fence write or a checkpoint's trim).
    pub partition: Option<u16>,
    /// The partition rebuilt from the durable log after a failed commit: its steps are taken
    /// again from this one on.
    pub rebuilt: bool,
}

impl Step {
    /// Whether the step carries nothing to commit, publish or answer.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.input.is_none()
            && self.fence_changes.is_empty()
            && self.truncate.is_none()
            && self.reply.is_none()
            && self.ack.is_none()
            && self.max_ts.is_none()
            && !self.rebuilt
    }
}
