//! Persistence: the durable state of devices out ([`Engine::export`], [`Engine::take_dirty`])
//! and back in ([`Engine::restore`]).
//!
//! Invariants: a device's durable state is its id, its last applied fix and position, its
//! frontier and delay hold, its buffered fixes and its pair states, fences named by id; timers
//! are not stored but derived from that state on restore, so a restored engine emits exactly
//! what the running one would have.
//! With `track_dirty`, every device whose durable state changed since the last `take_dirty` is
//! listed once in `dirty` (its bit set in `dirty_bits`), so storing what `take_dirty` returns
//! keeps a store equal to `export()`.

use crate::pairs::Pair;
use crate::time::Ts;
use crate::wheel::Wheel;

use super::records::{Buffered, DeviceSlot, NO_TS, Reorder, pair_slots, pairs_of};
use super::{DeviceState, Engine, RestoreError, Restored};

impl Engine {
    /// The durable state of every device, in slot order.
    pub fn export(&self) -> Vec<DeviceState> {
        (0..self.devices.len() as u32)
            .filter(|&d| !self.devices[d as usize].is_free())
            .map(|d| self.export_device(DeviceSlot(d)))
            .collect()
    }

    /// The durable state of device `d`.
    pub(super) fn export_device(&self, d: DeviceSlot) -> DeviceState {
        let dev = &self.devices[d.index()];
        let reorder = self.reorders.get(&d);
        DeviceState {
            id: self.ids.get(dev.id).to_string(),
            last_applied: dev.last_applied().map(|t| t.0),
            last_position: dev.last_position(),
            frontier: dev.frontier().map(|t| t.0),
            hold_until: reorder.map(|r| r.hold_until).filter(|&h| h != NO_TS),
            buffer: reorder
                .map_or(&[][..], |r| &r.fixes)
                .iter()
                .map(|b| (b.ts.0, b.lat, b.lon, b.accuracy))
                .collect(),
            pairs: pairs_of(&self.devices, &self.pairs, d)
                .filter_map(|p| {
                    let pair = &self.pairs[p.index()];
                    let fence = self.fences.get(pair.fence)?;
                    Some((fence.id.to_string(), pair.state()))
                })
                .collect(),
        }
    }

    /// Rebuilds devices, pairs and timers from exported state into an engine that has its fences
    /// but no device yet, at watermark `w`. Nothing is emitted here: deadlines that passed while
    /// the state was stored fire, with the ids they would have had, on the next
    /// [`Engine::advance`], exactly as if the engine had been running.
    pub fn restore(
        &mut self,
        devices: Vec<DeviceState>,
        w: Option<Ts>,
    ) -> Result<Restored, RestoreError> {
        if !self.devices.is_empty() {
            return Err(RestoreError::NotEmpty(self.devices.len()));
        }
        if let Some(w) = w {
            self.watermark = Some(w);
            self.wheel = Wheel::new(self.clock.completed_tick(w));
        }
        let mut r = Restored::default();
        self.devices.reserve(devices.len());
        self.device_ids.reserve(&self.ids, devices.len());
        for st in devices {
            // A removal handed out by a checkpoint: nothing to hold.
            if st.is_blank() {
                continue;
            }
            let Some(d) = self.device_slot(&st.id) else {
                return Err(RestoreError::TooManyDevices(self.devices.len()));
            };
            let dev = &mut self.devices[d.index()];
            dev.last_applied = st.last_applied.unwrap_or(NO_TS);
            // A state stored before frontiers were kept: everything up to the watermark it was
            // stored at may have been decided.
            dev.frontier = match st.frontier {
                Some(f) => f,
                None => dev.last_applied.max(w.map_or(NO_TS, |w| w.0)),
            };
            dev.last_position = st
                .last_position
                .map_or([f64::NAN; 2], |(lat, lon)| [lat, lon]);
            let mut fixes: Vec<Buffered> = st
                .buffer
                .iter()
                .map(|&(ts, lat, lon, accuracy)| Buffered {
                    arrived: 0,
                    ts: Ts(ts),
                    lat,
                    lon,
                    accuracy,
                })
                .collect();
            fixes.sort_by(|a, b| a.key_cmp(b.ts, b.lat, b.lon));
            self.buffered += fixes.len() as u64;
            r.buffered += fixes.len() as u64;
            if !fixes.is_empty() || st.hold_until.is_some() {
                self.flush_gens = self.flush_gens.wrapping_add(1);
                let mut reorder = Reorder::new(self.flush_gens);
                reorder.fixes = fixes;
                reorder.hold_until = st.hold_until.unwrap_or(NO_TS);
                self.reorders.insert(d, reorder);
            }
            for (fence_id, ps) in &st.pairs {
                let Some(idx) = self.fences.idx_of(fence_id) else {
                    r.dropped_pairs += 1;
                    continue;
                };
                let Some(fence) = self.fences.get(idx) else {
                    r.dropped_pairs += 1;
                    continue;
                };
                let pair = Pair::from_state(idx, ps, &fence.settings);
                self.insert_pair(d, pair);
                r.pairs += 1;
            }
            for p in pair_slots(&self.devices, &self.pairs, d) {
                self.resched_pair(d, p);
            }
            self.resched_device(d);
            r.devices += 1;
        }
        Ok(r)
    }

    /// Lists device `d` for the next [`Engine::take_dirty`] (once; nothing without `track_dirty`).
    /// Called *before* any change to the device's durable state: while a checkpoint is being
    /// taken, a device it still has to hand out is copied here first, as it was at the freeze.
    #[inline]
    pub(super) fn mark_dirty(&mut self, d: DeviceSlot) {
        if !self.cfg.track_dirty || self.devices[d.index()].is_free() {
            return;
        }
        let (word, bit) = (d.index() / 64, 1u64 << (d.0 % 64));
        if self.frozen_bits.get(word).is_some_and(|w| w & bit != 0) {
            self.frozen_bits[word] &= !bit;
            let copy = self.export_device(d);
            self.copied.push(copy);
        }
        if word >= self.dirty_bits.len() {
            self.dirty_bits.resize(word + 1, 0);
        }
        if self.dirty_bits[word] & bit == 0 {
            self.dirty_bits[word] |= bit;
            self.dirty.push(d);
        }
    }

    /// Marks every device changed, so that the next checkpoint hands all of them out (after a
    /// checkpoint that could not be stored).
    pub fn mark_all_dirty(&mut self) {
        for d in 0..self.devices.len() as u32 {
            self.mark_dirty(DeviceSlot(d));
        }
    }

    /// Starts a checkpoint: freezes the set of devices whose durable state changed since the
    /// previous checkpoint (or [`Engine::take_dirty`]), as of now, and returns how many there
    /// are. [`Engine::checkpoint_next`] then hands them out a few at a time, each as it was at
    /// this moment, while the engine goes on taking input: a device about to change is copied
    /// first (copy on write). Storing every device handed out, over the previous checkpoint,
    /// gives the engine's state at the freeze. A checkpoint still running is finished first
    /// (its devices are handed out with the new one's).
    pub fn checkpoint_begin(&mut self) -> usize {
        self.frozen_removed.append(&mut self.removed);
        let dirty = std::mem::take(&mut self.dirty);
        for &d in &dirty {
            let (word, bit) = (d.index() / 64, 1u64 << (d.0 % 64));
            self.dirty_bits[word] &= !bit;
            if word >= self.frozen_bits.len() {
                self.frozen_bits.resize(word + 1, 0);
            }
            if self.frozen_bits[word] & bit == 0 {
                self.frozen_bits[word] |= bit;
                self.frozen.push(d);
            }
        }
        self.frozen.len() - self.frozen_next + self.copied.len() + self.frozen_removed.len()
    }

    /// Hands out up to `max` devices of the running checkpoint (copies made on write first) into
    /// `out`; true once the checkpoint has handed out every device (nothing is running then).
    pub fn checkpoint_next(&mut self, max: usize, out: &mut Vec<DeviceState>) -> bool {
        let mut n = 0;
        // Copies first, then removals, then devices: a copy (as at an earlier freeze) must
        // not land after the removal that followed it, and a device removed and made again
        // before the freeze must land after its removal.
        while n < max
            && let Some(copy) = self.copied.pop()
        {
            out.push(copy);
            n += 1;
        }
        while n < max
            && self.copied.is_empty()
            && let Some(id) = self.frozen_removed.pop()
        {
            out.push(DeviceState::blank(&id));
            n += 1;
        }
        while n < max
            && self.copied.is_empty()
            && self.frozen_removed.is_empty()
            && self.frozen_next < self.frozen.len()
        {
            let d = self.frozen[self.frozen_next];
            self.frozen_next += 1;
            let (word, bit) = (d.index() / 64, 1u64 << (d.0 % 64));
            if self.frozen_bits[word] & bit != 0 && !self.devices[d.index()].is_free() {
                self.frozen_bits[word] &= !bit;
                out.push(self.export_device(d));
                n += 1;
            }
        }
        let done = self.frozen_next >= self.frozen.len()
            && self.copied.is_empty()
            && self.frozen_removed.is_empty();
        if done {
            self.frozen.clear();
            self.frozen_next = 0;
        }
        done
    }

    /// Devices the running checkpoint has still to hand out (0: none running).
    pub fn checkpoint_pending(&self) -> usize {
        self.frozen.len() - self.frozen_next + self.copied.len() + self.frozen_removed.len()
    }

    /// The durable state of every device changed since the previous call (for incremental
    /// persistence: storing these keeps a store equal to [`Engine::export`]).
    /// Removed devices come first, as blank states ([`DeviceState::is_blank`]).
    pub fn take_dirty(&mut self) -> Vec<DeviceState> {
        let dirty = std::mem::take(&mut self.dirty);
        let mut out: Vec<DeviceState> = std::mem::take(&mut self.removed)
            .iter()
            .map(|id| DeviceState::blank(id))
            .collect();
        out.extend(
            dirty
                .iter()
                .filter(|d| !self.devices[d.index()].is_free())
                .map(|&d| self.export_device(d)),
        );
        for d in dirty {
            self.dirty_bits[d.index() / 64] &= !(1u64 << (d.0 % 64));
        }
        out
    }
}
