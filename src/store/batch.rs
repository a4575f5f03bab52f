//! [`Batch`]: one set of changes to the store.
//!
//! Semantics of one batch, as [`super::Store::commit`] applies it: input records and fence
//! changes inserted before the truncations (a checkpoint never covers records of the same
//! commit), events inserted before `trim_events_below` deletes every event with a smaller `seq`,
//! and each `Some` scalar replaces the stored value.

use std::sync::Arc;

/// Changes to the live file, committed together in one write transaction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Input records to append: (shard, seq, record).
    pub inputs: Vec<(u16, u64, Vec<u8>)>,
    /// Fence changes to append: (change number, change).
    pub fence_changes: Vec<(u64, Vec<u8>)>,
    /// Per shard, delete its input records up to this `seq` (a checkpoint covers them).
    pub truncate_inputs: Vec<(u16, u64)>,
    /// Delete fence changes up to this number (every shard's checkpoint has them).
    pub truncate_fence_changes: Option<u64>,
    /// Events to append: (seq, event JSON text).
    pub events: Vec<(u64, Arc<str>)>,
    /// Delete every stored event with a `seq` below this (retention).
    pub trim_events_below: Option<u64>,
    /// The new watermark, Unix ms.
    pub watermark: Option<i64>,
    /// The new highest fix time seen (event clock mode), Unix ms.
    pub max_seen: Option<i64>,
    /// The `seq` the next event will get.
    pub next_seq: Option<u64>,
    /// Delivery cursors to write: (sink name, next seq to deliver).
    pub cursors: Vec<(String, u64)>,
}
