//! Device lifecycle: removing a device ([`Engine::remove_device`]), finding devices that have
//! gone idle ([`Engine::expire_idle`]) and forgetting them ([`Engine::forget_device`]).
//!
//! Invariants:
//! - Removing a device drops its pairs (their wheel entries become dead), its buffered fixes
//!   and its fixes' state, and emits nothing: an open visit ends without an EXIT. With
//!   `max_delay` on, the record stays as a *tombstone* holding only its frontier, raised to the
//!   watermark of the removal: a delayed fix from before the removal is late (`behind_device`),
//!   not the first fix of a new device; a later fix starts a new device from nothing. Without
//!   `max_delay` (or once its frontier is more than `max_delay` behind the watermark) nothing
//!   of it is kept: such a fix would be `too_old` anyway.
//! - A device is idle under [`IdleRule`] only when forgetting it cannot change any event: it has
//!   no pair (no open visit, no pending run), no fix waiting, no hold, and its frontier is more
//!   than `max(ttl, max_delay)` behind the watermark, so any later fix it could get that the old
//!   record would have judged late is `too_old` for a new one too. A tombstone is idle once its
//!   frontier is more than `max_delay` behind (`ttl` 0 looks for tombstones only).
//! - Both are input: the shell logs the removed ids as a record in the input, so a replay
//!   removes exactly the same devices at the same point ([`Engine::remove_device`] replays
//!   both). The arena bytes of removed ids are reclaimed by compaction once they outweigh the
//!   live ones.

use std::sync::Arc;

use crate::time::{Dur, Ts};

use super::Engine;
use super::records::{Device, DeviceSlot, IdArena, NO_PAIR, pair_slots};

/// When a device counts as idle: nothing decided for it for `ttl` of event time (and nothing
/// open). A `ttl` of 0 finds only tombstones past `max_delay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleRule {
    /// How long without a fix; 0: tombstones only.
    pub ttl: Dur,
}

/// Arena bytes below which removed ids are never compacted away (not worth a pass).
const COMPACT_MIN_DEAD: usize = 1 << 20;

impl Engine {
    /// Removes device `id`: its pairs, timers and buffered fixes; emits no event. Keeps a
    /// tombstone with `max_delay` on (module docs). Returns false for a device the engine does
    /// not hold (a tombstone included).
    pub fn remove_device(&mut self, id: &str) -> bool {
        let Some(d) = self.device_ids.get(&self.ids, id) else {
            return false;
        };
        if self.is_tombstone(d) {
            return false;
        }
        match self.watermark {
            Some(w) if self.cfg.max_delay > Dur::ZERO => {
                self.clear_device(d);
                let dev = &mut self.devices[d.index()];
                dev.last_applied = super::records::NO_TS;
                dev.last_position = [f64::NAN; 2];
                dev.raise_frontier(w);
            }
            _ => self.drop_device(d, id),
        }
        true
    }

    /// Forgets device `id` entirely, as idle expiry does (a device idle under an [`IdleRule`],
    /// or a tombstone whose frontier is past `max_delay`). Returns false for an unknown device.
    pub fn forget_device(&mut self, id: &str) -> bool {
        let Some(d) = self.device_ids.get(&self.ids, id) else {
            return false;
        };
        self.clear_device(d);
        self.drop_device(d, id);
        true
    }

    /// Drops device `d`'s pairs and reorder block (before anything changes, a checkpoint in
    /// progress copies it).
    fn clear_device(&mut self, d: DeviceSlot) {
        self.mark_dirty(d);
        for p in pair_slots(&self.devices, &self.pairs, d) {
            self.free_pair(d, p);
        }
        if let Some(r) = self.reorders.remove(&d) {
            self.buffered -= r.fixes.len() as u64;
            if r.flush_due != super::records::NO_TICK {
                self.wheel.cancelled();
            }
        }
    }

    /// Frees device `d`'s slot and id.
    fn drop_device(&mut self, d: DeviceSlot, id: &str) {
        self.mark_dirty(d);
        if self.reorders.contains_key(&d) || self.devices[d.index()].first_pair != NO_PAIR {
            self.clear_device(d);
        }
        self.device_ids.remove(id, d);
        self.dead_id_bytes += IdArena::cost(id.as_bytes());
        self.devices[d.index()] = Device::free();
        self.free_devices.push(d);
        if self.cfg.track_dirty {
            self.removed.push(Arc::from(id));
        }
        self.maybe_compact_ids();
    }

    /// Looks at up to `scan` device slots from where the last call stopped (wrapping around)
    /// and returns the ids of those idle under `rule` at watermark `w` (tombstones past
    /// `max_delay` included), without forgetting them: the caller logs them and forgets each
    /// with [`Engine::forget_device`], the same calls a replay makes.
    pub fn expire_idle(&mut self, rule: IdleRule, w: Ts, scan: usize) -> Vec<Arc<str>> {
        let mut out = Vec::new();
        let n = self.devices.len();
        if n == 0 {
            return out;
        }
        let mut at = (self.idle_cursor as usize) % n;
        for _ in 0..scan.min(n) {
            let d = DeviceSlot(at as u32);
            if self.idle_at(d, rule, w) {
                out.push(Arc::from(self.ids.get(self.devices[at].id)));
            }
            at = (at + 1) % n;
        }
        self.idle_cursor = at as u32;
        out
    }

    /// Whether device `id` is idle under `rule` at watermark `w` (false for an unknown device).
    pub fn is_idle(&self, id: &str, rule: IdleRule, w: Ts) -> bool {
        self.device_ids
            .get(&self.ids, id)
            .is_some_and(|d| self.idle_at(d, rule, w))
    }

    /// Device `d` holds nothing that a later fix could depend on: a tombstone whose frontier is
    /// more than `max_delay` behind `w`, or (with `rule.ttl` > 0) a device without pairs,
    /// buffered fixes or hold whose frontier is more than `max(ttl, max_delay)` behind `w`.
    fn idle_at(&self, d: DeviceSlot, rule: IdleRule, w: Ts) -> bool {
        let dev = &self.devices[d.index()];
        if dev.is_free() {
            return false;
        }
        let before = |keep: Dur| dev.frontier().is_none_or(|f| f < w.minus(keep));
        if self.is_tombstone(d) {
            return before(self.cfg.max_delay);
        }
        rule.ttl > Dur::ZERO
            && dev.first_pair == NO_PAIR
            && !self.reorders.contains_key(&d)
            && before(rule.ttl.max(self.cfg.max_delay))
    }

    /// Rebuilds the id arena without removed ids once they take more than the live ones.
    fn maybe_compact_ids(&mut self) {
        if self.dead_id_bytes < COMPACT_MIN_DEAD || self.dead_id_bytes * 2 < self.ids.len() {
            return;
        }
        let mut fresh = IdArena::default();
        for dev in self.devices.iter_mut().filter(|d| !d.is_free()) {
            // Every live id fits again: the new arena is smaller than the old one.
            if let Ok(at) = fresh.push(self.ids.get(dev.id)) {
                dev.id = at;
            }
        }
        self.ids = fresh;
        self.dead_id_bytes = 0;
        self.device_ids.rebase(&self.devices);
    }
}
