//! What the publisher, the checkpoint writer and the warm start of one process need of its
//! embedded store (`crate::store`), as traits. They sit below the one-process side of the
//! partition runtime's seams (`crate::runtime`); a cluster node keeps its log and checkpoints
//! in NATS JetStream through its own backend, not through these.
//!
//! - [`InputLog`]: the ordered input and the events, appended in commits that are durable when
//!   they return; read back after a position.
//! - [`CheckpointStorage`]: the engines' state at a position of the log, written as one unit
//!   ([`CheckpointTxn`]) that is either wholly there or not at all.
//!
//! Invariant for every implementation: an append that returned `Ok` with [`Flush::Fsync`]
//! survives a crash, with all of its parts; a checkpoint commit that returned `Ok` replaces the
//! previous checkpoint whole.

pub use crate::store::LogTail;
use crate::store::{
    Batch, CheckpointMeta, CheckpointStore, CheckpointWriter, Flush, Store, StoreError,
};
use geodwell_core::engine::DeviceState;

/// The input log (and the events, committed with it).
pub trait InputLog: Send + Sync + std::fmt::Debug {
    /// Appends one commit: input records, fence changes, events, trims of what a checkpoint
    /// covers, meta values. With [`Flush::Fsync`] it is durable when this returns; on error
    /// nothing of it is stored.
    fn append(&self, batch: &Batch, flush: Flush) -> Result<(), StoreError>;

    /// Each shard `k`'s records after `positions[k]` (0 for a shard beyond the slice), and the
    /// fence changes after `fence_change`.
    fn read_after(&self, positions: &[u64], fence_change: u64) -> Result<LogTail, StoreError>;

    /// Keeps the events from `seq` on out of retention trims: a replay after the latest
    /// checkpoint may produce them again and must find them.
    fn hold_replay_events_from(&self, seq: u64);
}

/// Where checkpoints are kept.
pub trait CheckpointStorage: Send + Sync {
    /// Starts writing the next checkpoint.
    fn begin(&self) -> Result<Box<dyn CheckpointTxn + '_>, StoreError>;

    /// The storage's size in bytes (for the metric), if it can tell.
    fn size_bytes(&self) -> Option<u64>;
}

/// One checkpoint being written: nothing of it is visible until [`CheckpointTxn::commit`].
pub trait CheckpointTxn {
    /// Writes device records (replacing those with the same ids).
    fn devices(&mut self, devices: &[DeviceState]) -> Result<(), StoreError>;

    /// Writes fence changes: `(id, Some(Feature text))` puts, `(id, None)` deletes.
    fn fences(&mut self, changes: &[(String, Option<String>)]) -> Result<(), StoreError>;

    /// Device records written so far.
    fn written(&self) -> u64;

    /// Commits the checkpoint with its meta; durable when this returns.
    fn commit(self: Box<Self>, meta: &CheckpointMeta) -> Result<(), StoreError>;
}

// The embedded backend: redb (`crate::store`).

impl InputLog for Store {
    fn append(&self, batch: &Batch, flush: Flush) -> Result<(), StoreError> {
        self.commit(batch, flush)
    }

    fn read_after(&self, positions: &[u64], fence_change: u64) -> Result<LogTail, StoreError> {
        Store::read_after(self, positions, fence_change)
    }

    fn hold_replay_events_from(&self, seq: u64) {
        Store::hold_replay_events_from(self, seq);
    }
}

impl CheckpointStorage for CheckpointStore {
    fn begin(&self) -> Result<Box<dyn CheckpointTxn + '_>, StoreError> {
        Ok(Box::new(self.writer()?))
    }

    fn size_bytes(&self) -> Option<u64> {
        std::fs::metadata(self.path()).ok().map(|m| m.len())
    }
}

impl CheckpointStorage for Store {
    fn begin(&self) -> Result<Box<dyn CheckpointTxn + '_>, StoreError> {
        self.checkpoints().begin()
    }

    fn size_bytes(&self) -> Option<u64> {
        self.checkpoints().size_bytes()
    }
}

impl CheckpointTxn for CheckpointWriter<'_> {
    fn devices(&mut self, devices: &[DeviceState]) -> Result<(), StoreError> {
        CheckpointWriter::devices(self, devices)
    }

    fn fences(&mut self, changes: &[(String, Option<String>)]) -> Result<(), StoreError> {
        CheckpointWriter::fences(self, changes)
    }

    fn written(&self) -> u64 {
        self.devices
    }

    fn commit(self: Box<Self>, meta: &CheckpointMeta) -> Result<(), StoreError> {
        CheckpointWriter::commit(*self, meta)
    }
}
