//! [`Batch`]: one set of changes to the store.
//!
//! Semantics of one batch, as [`super::Store::commit`] applies it: deletes before puts (so a put
//! and a delete of the same id within one batch leave the put), events inserted before
//! `trim_events_below` deletes every event with a smaller `seq`, and each `Some` scalar replaces
//! the stored value.

use std::sync::Arc;

use geodwell_core::engine::DeviceState;

/// Changes committed together in one write transaction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Device records to write (replacing any stored record of the same id).
    pub devices_put: Vec<DeviceState>,
    /// Device ids to delete.
    pub devices_del: Vec<String>,
    /// Fences to write: (fence id, GeoJSON Feature text).
    pub fences_put: Vec<(String, String)>,
    /// Fence ids to delete.
    pub fences_del: Vec<String>,
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
