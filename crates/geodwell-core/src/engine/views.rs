//! Read-only views of devices for the API: one device in full ([`Engine::device`]) and pages of
//! summaries in slot order ([`Engine::device_page`]). Nothing here changes the engine.
//!
//! Pairs whose fence is gone are left out (the next fix or advance drops them). Paging is by
//! slot, which is stable because device slots are never reused.

use std::sync::Arc;

use crate::pairs::PairView;

use super::records::{DeviceSlot, pairs_of};
use super::{DeviceSummary, DeviceView, Engine};

impl Engine {
    /// The state of device `id`: its last applied fix and position, how many fixes it buffers,
    /// and its pairs by fence id; `None` for a device the engine has never seen.
    pub fn device(&self, id: &str) -> Option<DeviceView> {
        let d = self.device_ids.get(&self.devices, &self.ids, id)?;
        let dev = &self.devices[d.index()];
        let mut pairs: Vec<(Arc<str>, PairView)> = pairs_of(&self.devices, &self.pairs, d)
            .filter_map(|p| {
                let pair = &self.pairs[p.index()];
                let fence = self.fences.get(pair.fence)?;
                Some((fence.id.clone(), pair.view(&fence.settings)))
            })
            .collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        Some(DeviceView {
            id: Arc::from(self.ids.get(dev.id)),
            last_fix_at: dev.last_applied(),
            last_position: dev.last_position(),
            buffered: self.reorders.get(&d).map_or(0, |r| r.fixes.len()),
            pairs,
        })
    }

    /// One page of device summaries in slot order, starting at slot `from`, at most `limit`
    /// long; also returns the slot to resume from, if any devices remain. Slot order is stable
    /// (slots are never reused), so paging never skips or repeats a device, and a page costs
    /// O(limit) rather than a sort of every device.
    pub fn device_page(&self, from: u32, limit: usize) -> (Vec<DeviceSummary>, Option<u32>) {
        let start = (from as usize).min(self.devices.len());
        let end = start.saturating_add(limit).min(self.devices.len());
        let page = (start..end)
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
}
