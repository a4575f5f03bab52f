//! Device lifecycle: removing a device ([`Engine::remove_device`]) and finding devices that have
//! gone idle ([`Engine::expire_idle`]).
//!
//! Invariants:
//! - Removing a device drops its pairs (their timers become tombstones), its buffered fixes
//!   and its id, and emits nothing: an open visit ends without an EXIT. The slot is free until a
//!   new device takes it; a later fix of the same id starts a new device from nothing.
//! - A device is idle under [`IdleRule`] only when forgetting it cannot change any event: it has
//!   no pair (no open visit, no pending run), no fix waiting, and its last fix is at least
//!   `ttl` (> 0) behind the watermark, so any later fix it could get that the old record would
//!   have judged (late or duplicate) is behind the watermark and late for a new one too.
//! - Both are input: the shell logs the removed ids as a record in the input, so a replay
//!   removes exactly the same devices at the same point ([`Engine::remove_device`] replays
//!   both). The arena bytes of removed ids are reclaimed by compaction once they outweigh the
//!   live ones.

use std::sync::Arc;

use crate::time::{Dur, Ts};

use super::Engine;
use super::records::{Device, DeviceSlot, IdArena, NO_PAIR, pair_slots};

/// When a device counts as idle: no fix for `ttl` of event time (and nothing open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleRule {
    /// How long without a fix; at least 1 ms.
    pub ttl: Dur,
}

/// Arena bytes below which removed ids are never compacted away (not worth a pass).
const COMPACT_MIN_DEAD: usize = 1 << 20;

impl Engine {
    /// Removes device `id`: its pairs, timers, buffered fixes and id; emits no event. Returns
    /// false for an unknown device.
    pub fn remove_device(&mut self, id: &str) -> bool {
        let Some(d) = self.device_ids.get(&self.ids, id) else {
            return false;
        };
        // Before anything changes (a checkpoint in progress copies it first).
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
        self.device_ids.remove(id, d);
        self.dead_id_bytes += IdArena::cost(id.as_bytes());
        self.devices[d.index()] = Device::free();
        self.free_devices.push(d);
        if self.cfg.track_dirty {
            self.removed.push(Arc::from(id));
        }
        self.maybe_compact_ids();
        true
    }

    /// Looks at up to `scan` device slots from where the last call stopped (wrapping around)
    /// and returns the ids of those idle under `rule` at watermark `w`, without removing them:
    /// the caller logs them and removes each with [`Engine::remove_device`], the same calls a
    /// replay makes.
    pub fn expire_idle(&mut self, rule: IdleRule, w: Ts, scan: usize) -> Vec<Arc<str>> {
        let mut out = Vec::new();
        let n = self.devices.len();
        if n == 0 || rule.ttl <= Dur::ZERO {
            return out;
        }
        let bound = w.minus(rule.ttl);
        let mut at = (self.idle_cursor as usize) % n;
        for _ in 0..scan.min(n) {
            let d = DeviceSlot(at as u32);
            if self.idle_at(d, bound) {
                out.push(Arc::from(self.ids.get(self.devices[at].id)));
            }
            at = (at + 1) % n;
        }
        self.idle_cursor = at as u32;
        out
    }

    /// Whether device `id` is idle under `rule` at watermark `w` (false for an unknown device).
    pub fn is_idle(&self, id: &str, rule: IdleRule, w: Ts) -> bool {
        match self.device_ids.get(&self.ids, id) {
            Some(d) => self.idle_at(d, w.minus(rule.ttl)) && rule.ttl > Dur::ZERO,
            None => false,
        }
    }

    /// Device `d` holds nothing that a later fix could depend on, and its last fix is at or
    /// before `bound`.
    fn idle_at(&self, d: DeviceSlot, bound: Ts) -> bool {
        let dev = &self.devices[d.index()];
        !dev.is_free()
            && dev.first_pair == NO_PAIR
            && !self.reorders.contains_key(&d)
            && dev.last_applied().is_none_or(|t| t <= bound)
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
