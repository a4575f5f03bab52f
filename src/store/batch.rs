//! [`Batch`]: one set of changes to the store, and how batches merge.
//!
//! Semantics of one batch, as [`super::Store::commit`] applies it: deletes before puts (so a put
//! and a delete of the same id within one batch leave the put), events inserted before
//! `trim_events_below` deletes every event with a smaller `seq`, and each `Some` scalar replaces
//! the stored value. Merging batch `b` into `a` gives the batch whose commit equals committing
//! `a` then `b`.

use std::collections::BTreeMap;
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

impl Batch {
    /// Whether committing this batch would change nothing.
    pub fn is_empty(&self) -> bool {
        self.devices_put.is_empty()
            && self.devices_del.is_empty()
            && self.fences_put.is_empty()
            && self.fences_del.is_empty()
            && self.events.is_empty()
            && self.trim_events_below.is_none()
            && self.watermark.is_none()
            && self.max_seen.is_none()
            && self.next_seq.is_none()
            && self.cursors.is_empty()
    }

    /// Merges `other`, which happened after `self`, into `self`: later puts win, a put after a
    /// delete of the same id wins, a delete after a put wins, later scalars and cursors win,
    /// trims take the highest bound (dropping merged events below it). Costs
    /// O((|self| + |other|) log n).
    pub fn merge(&mut self, other: Batch) {
        let mut acc = Accum::default();
        acc.add(std::mem::take(self));
        acc.add(other);
        *self = acc.into_batch();
    }
}

/// A batch held as maps, so that merging costs only the size of what is merged in.
#[derive(Debug, Default)]
pub(crate) struct Accum {
    /// `None` = delete.
    devices: BTreeMap<String, Option<DeviceState>>,
    fences: BTreeMap<String, Option<String>>,
    events: BTreeMap<u64, Arc<str>>,
    trim: Option<u64>,
    watermark: Option<i64>,
    max_seen: Option<i64>,
    next_seq: Option<u64>,
    cursors: BTreeMap<String, u64>,
}

impl Accum {
    /// Applies `b` after everything held.
    pub(crate) fn add(&mut self, b: Batch) {
        let Batch {
            devices_put,
            devices_del,
            fences_put,
            fences_del,
            events,
            trim_events_below,
            watermark,
            max_seen,
            next_seq,
            cursors,
        } = b;
        for id in devices_del {
            self.devices.insert(id, None);
        }
        for d in devices_put {
            self.devices.insert(d.id.clone(), Some(d));
        }
        for id in fences_del {
            self.fences.insert(id, None);
        }
        for (id, f) in fences_put {
            self.fences.insert(id, Some(f));
        }
        self.events.extend(events);
        if let Some(t) = trim_events_below {
            let t = self.trim.map_or(t, |old| old.max(t));
            self.trim = Some(t);
            // Events below the bound would be written and deleted in the same transaction.
            self.events = self.events.split_off(&t);
        }
        self.watermark = watermark.or(self.watermark);
        self.max_seen = max_seen.or(self.max_seen);
        self.next_seq = next_seq.or(self.next_seq);
        self.cursors.extend(cursors);
    }

    /// The held changes as one batch (puts and deletes sorted by key, which redb inserts
    /// fastest).
    pub(crate) fn into_batch(self) -> Batch {
        let mut b = Batch {
            trim_events_below: self.trim,
            watermark: self.watermark,
            max_seen: self.max_seen,
            next_seq: self.next_seq,
            events: self.events.into_iter().collect(),
            cursors: self.cursors.into_iter().collect(),
            ..Batch::default()
        };
        for (id, d) in self.devices {
            match d {
                Some(d) => b.devices_put.push(d),
                None => b.devices_del.push(id),
            }
        }
        for (id, f) in self.fences {
            match f {
                Some(f) => b.fences_put.push((id, f)),
                None => b.fences_del.push(id),
            }
        }
        b
    }
}
