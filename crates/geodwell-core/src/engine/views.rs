//! Read-only views of devices for the API: one device in full ([`Engine::device`]), pages of
//! summaries in slot order ([`Engine::device_page`]), and the devices inside one fence
//! ([`Engine::fence_occupants`], [`Engine::fence_inside`]). Nothing here changes the engine.
//!
//! Pairs whose fence is gone are left out (the next fix or advance drops them). Device paging is
//! by device slot, occupancy paging by pair slot: a slot that is freed and reused during a walk
//! may make a device that arrived during the walk missing from it, never one that stayed put.
//! A free pair slot is never inside (`free_pair` clears it), so the occupancy walk needs no
//! free list.

use std::sync::Arc;

use crate::pairs::PairView;
use crate::time::Ts;

use super::records::{DeviceSlot, PairSlot, pair_device, pairs_of};
use super::{DeviceSummary, DeviceView, Engine, Occupant};

/// A device's delayed fixes the device view shows at most.
pub const DELAYED_SHOWN: usize = 8;

impl Engine {
    /// Whether slot `d` holds a removed device kept only for its frontier (a tombstone: no fix
    /// applied, none buffered, no pair). It is not a device to the API.
    pub(super) fn is_tombstone(&self, d: DeviceSlot) -> bool {
        let dev = &self.devices[d.index()];
        dev.last_applied().is_none()
            && dev.frontier().is_some()
            && dev.first_pair == super::records::NO_PAIR
            && !self.reorders.contains_key(&d)
    }

    /// The state of device `id`: its last applied fix and position, how many fixes it buffers,
    /// its pairs by fence id, its frontier and delay hold, and its latest delayed fixes; `None`
    /// for a device the engine does not hold (never seen, or removed).
    pub fn device(&self, id: &str) -> Option<DeviceView> {
        let d = self.device_ids.get(&self.ids, id)?;
        let dev = &self.devices[d.index()];
        if self.is_tombstone(d) {
            return None;
        }
        let mut pairs: Vec<(Arc<str>, PairView)> = pairs_of(&self.devices, &self.pairs, d)
            .filter_map(|p| {
                let pair = &self.pairs[p.index()];
                let fence = self.fences.get(pair.fence)?;
                Some((fence.id.clone(), pair.view(&fence.settings)))
            })
            .collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let reorder = self.reorders.get(&d);
        let delayed = self
            .delayed
            .iter()
            .rev()
            .filter(|(slot, _)| *slot == d)
            .map(|(_, f)| *f)
            .take(DELAYED_SHOWN)
            .collect();
        Some(DeviceView {
            id: Arc::from(self.ids.get(dev.id)),
            last_fix_at: dev.last_applied(),
            last_position: dev.last_position(),
            buffered: reorder.map_or(0, |r| r.fixes.len()),
            pairs,
            frontier: dev.frontier(),
            hold_until: match (reorder, self.watermark) {
                (Some(r), Some(w)) if r.held_at(w) => Some(Ts(r.hold_until)),
                _ => None,
            },
            delayed,
        })
    }

    /// One page of device summaries in slot order, starting at slot `from`, covering at most
    /// `limit` slots (free ones are skipped, so a page can be short); also returns the slot to
    /// resume from, if any remain. A device keeps its slot until it is removed, so paging never
    /// skips or repeats a device that stays, and a page costs O(limit) rather than a sort of
    /// every device.
    pub fn device_page(&self, from: u32, limit: usize) -> (Vec<DeviceSummary>, Option<u32>) {
        let start = (from as usize).min(self.devices.len());
        let end = start.saturating_add(limit).min(self.devices.len());
        let page = (start..end)
            .filter(|&d| !self.devices[d].is_free() && !self.is_tombstone(DeviceSlot(d as u32)))
            .map(|d| {
                let dev = &self.devices[d];
                let mut inside: Vec<Arc<str>> =
                    pairs_of(&self.devices, &self.pairs, DeviceSlot(d as u32))
                        .filter_map(|p| {
                            let pair = &self.pairs[p.index()];
                            if !pair.is_inside() {
                                return None;
                            }
                            self.fences.get(pair.fence).map(|f| f.id.clone())
                        })
                        .collect();
                inside.sort();
                DeviceSummary {
                    id: Arc::from(self.ids.get(dev.id)),
                    last_fix_at: dev.last_applied(),
                    last_position: dev.last_position(),
                    inside,
                }
            })
            .collect();
        let next = (end < self.devices.len()).then_some(end as u32);
        (page, next)
    }

    /// Devices inside fence `fence` now, in pair slot order from slot `from`: at most `limit` of
    /// them, after looking at no more than `scan` pair slots (so one call is a bounded pause of
    /// the shard however rare the fence's occupants are). Returns the page and the slot to resume
    /// from, `None` once every slot has been looked at. An unknown fence has no occupants.
    pub fn fence_occupants(
        &self,
        fence: &str,
        from: u32,
        limit: usize,
        scan: usize,
    ) -> (Vec<Occupant>, Option<u32>) {
        let Some(idx) = self.fences.idx_of(fence) else {
            return (Vec::new(), None);
        };
        let Some(f) = self.fences.get(idx) else {
            return (Vec::new(), None);
        };
        let start = (from as usize).min(self.pairs.len());
        let end = start.saturating_add(scan.max(1)).min(self.pairs.len());
        let mut out = Vec::new();
        for p in start..end {
            let pair = &self.pairs[p];
            if pair.fence != idx || !pair.is_inside() {
                continue;
            }
            let d = pair_device(&self.pairs, PairSlot(p as u32));
            let dev = &self.devices[d.index()];
            out.push(Occupant {
                device: Arc::from(self.ids.get(dev.id)),
                last_fix_at: dev.last_applied(),
                pair: pair.view(&f.settings),
            });
            if out.len() >= limit {
                let next = p + 1;
                return (out, (next < self.pairs.len()).then_some(next as u32));
            }
        }
        (out, (end < self.pairs.len()).then_some(end as u32))
    }

    /// How many devices are inside fence `fence` now (0 for an unknown fence). One pass over the
    /// pair slots: O(pairs), a few milliseconds per million (docs/benchmarks.md).
    pub fn fence_inside(&self, fence: &str) -> u64 {
        let Some(idx) = self.fences.idx_of(fence) else {
            return 0;
        };
        self.pairs
            .iter()
            .filter(|p| p.fence == idx && p.is_inside())
            .count() as u64
    }
}
