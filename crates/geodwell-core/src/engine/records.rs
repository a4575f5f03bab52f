//! The engine's storage of devices and pairs: device records, their reorder buffers, the id
//! arena and the id -> slot table, the pair slots with their free list, and the per-device pair
//! lists threaded through the pair records (making, walking, linking and unlinking them).
//!
//! There is one device record per device the shard holds, so its size is most of what a parked
//! device costs. It is 40 bytes and owns no heap block:
//! - the id lives in [`IdArena`], one byte buffer for every device of the shard; the record keeps
//!   its offset. A removed device's bytes stay until the arena is compacted (when they are more
//!   than the live ones, `engine::lifecycle`);
//! - the reorder buffer and the flush timer that goes with it are a [`Reorder`] in a side table
//!   ([`Reorders`]), present only while fixes wait for the watermark (a fix that need not wait is
//!   applied without it);
//! - the pair slots are a list threaded through the pair records (`Pair::link`): the record keeps
//!   the head, the last pair's link names the device;
//! - absent times and positions are sentinels rather than `Option`s.
//!
//! Invariants: a device has a [`Reorder`] exactly while it buffers a fix or arms a flush timer; a
//! device's id is `arena.get(device.id)` for its whole life; every entry in [`DeviceIds`] is a
//! live device whose id hashes to it, with that id's current arena offset; every live pair is in
//! exactly one device's list, which ends in that device, and a free pair slot is in none
//! (`Engine::check_records` asserts all of these in tests).

use std::hash::BuildHasher;

use smallvec::SmallVec;

use crate::pairs::Pair;
use crate::time::Ts;

use super::Engine;

/// A device's index in `Engine::devices`. Slots are handed out in arrival order; a removed
/// device's slot is free ([`Device::is_free`]) and is reused by a later new device, so a slot
/// names one device from its arrival to its removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub(super) struct DeviceSlot(pub u32);

/// A pair record's index in `Engine::pairs`. Freed slots are reused; a record keeps its timer
/// generation across reuse, so the wheel entries of the slot's earlier pair stay dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub(super) struct PairSlot(pub u32);

impl DeviceSlot {
    /// The index into `Engine::devices`.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The link that ends this device's pair list.
    #[inline]
    fn list_end(self) -> u32 {
        self.0 | LIST_END_TAG
    }

    /// The device a list-ending `link` names; `None` when the link is to a next pair.
    #[inline]
    fn ending(link: u32) -> Option<DeviceSlot> {
        (link & LIST_END_TAG != 0).then_some(DeviceSlot(link & !LIST_END_TAG))
    }
}

impl PairSlot {
    /// The index into `Engine::pairs`.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The pair a `link` (or a device's `first_pair`) leads to; `None` when it ends the list.
    #[inline]
    fn linked(link: u32) -> Option<PairSlot> {
        (link & LIST_END_TAG == 0).then_some(PairSlot(link))
    }

    /// The link that leads to this pair.
    #[inline]
    fn link(self) -> u32 {
        self.0
    }
}

/// Set in a pair's `link` when it ends its device's list: the other bits are then the device
/// slot, not a next pair slot. That is how a pair finds its device without a field of its own.
const LIST_END_TAG: u32 = 1 << 31;

/// The number of device slots a shard can hold: a device slot must leave the top bit free,
/// where [`LIST_END_TAG`] (and the engine's flush-timer flag) sit when a device slot is stored
/// in a pair link (or a wheel key).
pub(super) const MAX_DEVICE_SLOTS: u32 = 1 << 31;

/// The number of pair slots, bounded like device slots so that a pair slot never looks like a
/// tagged device slot. Out of reach in practice (2^31 records are 80 GiB), so only debug builds
/// check it.
pub(super) const MAX_PAIR_SLOTS: u32 = 1 << 31;

/// Marks "no pair" in [`Device::first_pair`]. It carries [`LIST_END_TAG`], so a walk from an
/// empty list's head ends at once.
pub(super) const NO_PAIR: u32 = u32::MAX;

const _: () = assert!(
    MAX_DEVICE_SLOTS <= LIST_END_TAG
        && MAX_PAIR_SLOTS <= LIST_END_TAG
        && NO_PAIR & LIST_END_TAG != 0
);

/// Marks a free device slot in [`Device::id`] (no arena offset reaches it: the arena ends
/// before 4 GiB).
pub(super) const FREE_ID: u32 = u32::MAX;

/// Marks "no fix applied yet" in [`Device::last_applied`].
pub(super) const NO_TS: i64 = i64::MIN;
/// Marks "no flush timer armed" in [`Reorder::flush_due`].
pub(super) const NO_TICK: u64 = u64::MAX;

/// A fix waiting in a reorder buffer (the device is implied).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Buffered {
    pub ts: Ts,
    pub lat: f64,
    pub lon: f64,
    pub accuracy: Option<f64>,
    /// The shell's arrival stamp ([`Engine::set_arrival`]); 0 = unknown. Carried to the events
    /// the fix decides; changes nothing they say.
    pub arrived: u64,
}

impl Buffered {
    /// The application order of fixes of one device: by (ts, lat, lon).
    #[inline]
    pub fn key_cmp(&self, ts: Ts, lat: f64, lon: f64) -> std::cmp::Ordering {
        self.ts
            .cmp(&ts)
            .then(self.lat.total_cmp(&lat))
            .then(self.lon.total_cmp(&lon))
    }
}

/// A device record (40 bytes; `record_sizes` pins it).
#[derive(Debug)]
pub(super) struct Device {
    /// Latest applied fix, Unix ms; `NO_TS` before the first.
    pub last_applied: i64,
    /// The device's frontier, Unix ms: the latest event time of anything decided for it that a
    /// later fix could contradict (its latest applied fix, every event emitted for it, every run
    /// expiry processed); `NO_TS` before anything. A fix at or before it is late
    /// (`behind_device`). A removed device whose removal must still hold off delayed fixes
    /// keeps only this (a tombstone: no fix, no pair, nothing buffered).
    pub frontier: i64,
    /// Latest applied (lat, lon); NaN before the first fix.
    pub last_position: [f64; 2],
    /// Offset of the id in the shard's [`IdArena`].
    pub id: u32,
    /// Link to the first pair of the device's list; `NO_PAIR` when it has none.
    pub first_pair: u32,
}

impl Device {
    pub fn new(id: u32) -> Device {
        Device {
            last_applied: NO_TS,
            frontier: NO_TS,
            last_position: [f64::NAN; 2],
            id,
            first_pair: NO_PAIR,
        }
    }

    /// The record of a removed device, waiting for reuse.
    pub fn free() -> Device {
        Device::new(FREE_ID)
    }

    /// Whether the slot holds no device.
    pub fn is_free(&self) -> bool {
        self.id == FREE_ID
    }

    pub fn last_applied(&self) -> Option<Ts> {
        (self.last_applied != NO_TS).then_some(Ts(self.last_applied))
    }

    pub fn frontier(&self) -> Option<Ts> {
        (self.frontier != NO_TS).then_some(Ts(self.frontier))
    }

    /// Moves the frontier to `t` if that is later.
    pub fn raise_frontier(&mut self, t: Ts) {
        self.frontier = self.frontier.max(t.0);
    }

    pub fn last_position(&self) -> Option<(f64, f64)> {
        let [lat, lon] = self.last_position;
        (!lat.is_nan()).then_some((lat, lon))
    }
}

/// The reorder buffers by device slot. A side table rather than a field: most devices have
/// nothing waiting at any moment, and a field would cost every device record 8 bytes.
pub(super) type Reorders = hashbrown::HashMap<DeviceSlot, Reorder, foldhash::fast::RandomState>;

/// A device's reorder buffer, delay hold and flush timer: made when a fix has to wait for the
/// watermark or a fix was applied behind it, dropped when none waits and no hold is on (and the
/// timer is disarmed).
#[derive(Debug)]
pub(super) struct Reorder {
    /// Sorted by (ts, lat, lon), distinct ts.
    pub fixes: Vec<Buffered>,
    /// The watermark at which the device's delay hold ends, Unix ms (`NO_TS`: none). Until then
    /// its steps advance only up to its latest fix, not to the watermark (a fix was applied
    /// behind the watermark, and more of its queue may follow).
    pub hold_until: i64,
    /// The tick of the outstanding flush timer; `NO_TICK` when none.
    pub flush_due: u64,
    /// The generation the flush timer's wheel entry carries. A fresh `Reorder` takes the next
    /// value of an engine-wide counter, so an entry left by an earlier one stays dead.
    pub flush_gen: u32,
}

impl Reorder {
    /// An empty block whose flush timer carries generation `flush_gen`.
    pub fn new(flush_gen: u32) -> Reorder {
        Reorder {
            // Most devices hold at most one fix at a time; Vec's first growth would take four.
            fixes: Vec::with_capacity(1),
            hold_until: NO_TS,
            flush_due: NO_TICK,
            flush_gen,
        }
    }

    /// Whether the delay hold is on at watermark `w`.
    pub fn held_at(&self, w: Ts) -> bool {
        self.hold_until != NO_TS && Ts(self.hold_until) > w
    }

    /// When the device has work: its earliest buffered fix or the end of its hold, whichever
    /// comes first.
    pub fn ready(&self) -> Option<Ts> {
        let hold = (self.hold_until != NO_TS).then_some(Ts(self.hold_until));
        match (self.fixes.first().map(|b| b.ts), hold) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether it holds nothing (no fix, no hold).
    pub fn is_idle(&self) -> bool {
        self.fixes.is_empty() && self.hold_until == NO_TS
    }
}

/// Why an id could not be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ArenaFull;

/// Every device id of a shard, back to back, each behind its length as a LEB128 varint (one byte
/// up to 127 bytes). An id costs its length plus one byte, against 24 bytes inline or a heap block
/// of its own.
#[derive(Debug, Default)]
pub(super) struct IdArena {
    bytes: Vec<u8>,
}

impl IdArena {
    /// Appends `id`; returns its offset, or `ArenaFull` past 4 GiB.
    pub fn push(&mut self, id: &str) -> Result<u32, ArenaFull> {
        let at = u32::try_from(self.bytes.len())
            .ok()
            .filter(|&a| a < FREE_ID)
            .ok_or(ArenaFull)?;
        let mut n = id.len();
        loop {
            let low = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                self.bytes.push(low);
                break;
            }
            self.bytes.push(low | 0x80);
        }
        self.bytes.extend_from_slice(id.as_bytes());
        Ok(at)
    }

    /// The id bytes stored at `at` (an offset `push` returned).
    pub fn bytes(&self, at: u32) -> &[u8] {
        let mut i = at as usize;
        let mut len = 0usize;
        let mut shift = 0;
        while let Some(&b) = self.bytes.get(i) {
            i += 1;
            len |= usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        self.bytes.get(i..i + len).unwrap_or(&[])
    }

    /// Bytes the arena holds, live and dead.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// The bytes `id` takes in the arena (its length prefix included).
    pub fn cost(id: &[u8]) -> usize {
        let mut n = id.len();
        let mut prefix = 1;
        while n >= 0x80 {
            n >>= 7;
            prefix += 1;
        }
        prefix + id.len()
    }

    /// The id stored at `at`.
    pub fn get(&self, at: u32) -> &str {
        // Only whole `&str`s are pushed, so this is valid UTF-8 by construction.
        let s = std::str::from_utf8(self.bytes(at));
        debug_assert!(s.is_ok(), "the arena holds whole strings");
        s.unwrap_or_default()
    }
}

/// One entry of [`DeviceIds`]: a device's slot and its id's offset in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IdEntry {
    slot: DeviceSlot,
    at: u32,
}

/// Device id -> device slot. Each bucket holds the slot and the id's arena offset (8 bytes) and
/// a lookup compares against the id in the arena: a map keyed by `Arc<str>` would take 24 bytes
/// a bucket, about 50 bytes a device at its load factor. The offset is kept beside the slot so
/// that a lookup reaches the id bytes straight from the bucket, and the device record (which
/// the caller reads next) does not sit in the chain of dependent cache misses; it costs 4 bytes
/// a bucket (see `docs/bench-durability.md`). Hashed with foldhash, which is randomly seeded like
/// SipHash but cheaper (SipHash measured 3 % of ingest time).
#[derive(Debug, Default)]
pub(super) struct DeviceIds {
    table: hashbrown::HashTable<IdEntry>,
    hasher: foldhash::fast::RandomState,
}

impl DeviceIds {
    fn hash(&self, id: &[u8]) -> u64 {
        self.hasher.hash_one(id)
    }

    pub fn get(&self, arena: &IdArena, id: &str) -> Option<DeviceSlot> {
        let id = id.as_bytes();
        self.table
            .find(self.hash(id), |e| arena.bytes(e.at) == id)
            .map(|e| e.slot)
    }

    /// Adds slot `d` holding the id at arena offset `at`; the id must not be in the table yet.
    pub fn insert(&mut self, arena: &IdArena, d: DeviceSlot, at: u32) {
        let id = arena.bytes(at);
        debug_assert!(
            self.table
                .find(self.hash(id), |e| arena.bytes(e.at) == id)
                .is_none()
        );
        let hasher = &self.hasher;
        self.table
            .insert_unique(hasher.hash_one(id), IdEntry { slot: d, at }, |e| {
                hasher.hash_one(arena.bytes(e.at))
            });
    }

    /// Drops slot `d` (holding `id`) from the table.
    pub fn remove(&mut self, id: &str, d: DeviceSlot) {
        if let Ok(e) = self
            .table
            .find_entry(self.hash(id.as_bytes()), |e| e.slot == d)
        {
            e.remove();
        }
    }

    pub fn reserve(&mut self, arena: &IdArena, additional: usize) {
        let hasher = &self.hasher;
        self.table
            .reserve(additional, |e| hasher.hash_one(arena.bytes(e.at)));
    }

    /// Points every entry at its device's id offset again, after the arena was rebuilt (the id
    /// bytes, and so the hashes, are unchanged).
    pub fn rebase(&mut self, devices: &[Device]) {
        for e in self.table.iter_mut() {
            e.at = devices[e.slot.index()].id;
        }
    }
}

impl Engine {
    /// The slot of device `id`, made if new; `None` when the shard has no room for another.
    pub(super) fn device_slot(&mut self, id: &str) -> Option<DeviceSlot> {
        if let Some(d) = self.device_ids.get(&self.ids, id) {
            return Some(d);
        }
        if let Some(&d) = self.free_devices.last() {
            let at = self.ids.push(id).ok()?;
            self.free_devices.pop();
            self.devices[d.index()] = Device::new(at);
            self.device_ids.insert(&self.ids, d, at);
            return Some(d);
        }
        let d = u32::try_from(self.devices.len())
            .ok()
            .filter(|&d| d < MAX_DEVICE_SLOTS && (d as usize) < self.cfg.max_devices)
            .map(DeviceSlot)?;
        let at = self.ids.push(id).ok()?;
        self.devices.push(Device::new(at));
        self.device_ids.insert(&self.ids, d, at);
        Some(d)
    }

    /// Stores `pair` in a free slot and appends it to device `d`'s list.
    pub(super) fn insert_pair(&mut self, d: DeviceSlot, mut pair: Pair) {
        pair.link = d.list_end();
        let slot = match self.free_pairs.pop() {
            Some(slot) => {
                pair.timer_gen = self.pairs[slot.index()].timer_gen;
                self.pairs[slot.index()] = pair;
                slot
            }
            None => {
                let slot = PairSlot(self.pairs.len() as u32);
                debug_assert!(
                    slot.0 < MAX_PAIR_SLOTS,
                    "pair slots must leave the tag bit free"
                );
                self.pairs.push(pair);
                slot
            }
        };
        match PairSlot::linked(self.devices[d.index()].first_pair) {
            None => self.devices[d.index()].first_pair = slot.link(),
            Some(mut last) => {
                while let Some(next) = PairSlot::linked(self.pairs[last.index()].link) {
                    last = next;
                }
                self.pairs[last.index()].link = slot.link();
            }
        }
        self.live_pairs += 1;
    }

    /// Unlinks pair `slot` from device `d`'s list and frees it, tombstoning its timer.
    pub(super) fn free_pair(&mut self, d: DeviceSlot, slot: PairSlot) {
        let next = self.pairs[slot.index()].link;
        let head = &mut self.devices[d.index()].first_pair;
        if *head == slot.link() {
            *head = match PairSlot::linked(next) {
                Some(_) => next,
                None => NO_PAIR,
            };
        } else {
            let mut prev = PairSlot(*head);
            while self.pairs[prev.index()].link != slot.link() {
                let link = self.pairs[prev.index()].link;
                debug_assert!(
                    PairSlot::linked(link).is_some(),
                    "pair {} is not in device {}'s list",
                    slot.0,
                    d.0
                );
                prev = PairSlot(link);
            }
            self.pairs[prev.index()].link = next;
        }
        let pair = &mut self.pairs[slot.index()];
        if pair.has_timer() {
            self.wheel.cancelled();
        }
        pair.set_timer(None, 0);
        pair.clear_visit();
        pair.timer_gen = pair.timer_gen.wrapping_add(1);
        self.free_pairs.push(slot);
        self.live_pairs -= 1;
    }
}

/// Device `d`'s pair slots in list order, walking the links.
#[inline]
pub(super) fn pairs_of<'a>(
    devices: &[Device],
    pairs: &'a [Pair],
    d: DeviceSlot,
) -> impl Iterator<Item = PairSlot> + 'a {
    std::iter::successors(PairSlot::linked(devices[d.index()].first_pair), move |&p| {
        PairSlot::linked(pairs[p.index()].link)
    })
}

/// Device `d`'s pair slots in list order: a copy, for the loops that free or insert pairs.
#[inline]
pub(super) fn pair_slots(
    devices: &[Device],
    pairs: &[Pair],
    d: DeviceSlot,
) -> SmallVec<[PairSlot; 8]> {
    pairs_of(devices, pairs, d).collect()
}

/// The device whose list holds pair `slot`: the tag at the end of the list.
#[inline]
pub(super) fn pair_device(pairs: &[Pair], slot: PairSlot) -> DeviceSlot {
    let mut cur = slot;
    loop {
        let link = pairs[cur.index()].link;
        if let Some(d) = DeviceSlot::ending(link) {
            return d;
        }
        cur = PairSlot(link);
    }
}

#[cfg(test)]
impl Engine {
    /// Checks the record invariants: every live pair is in exactly one device's list, the list
    /// ends in that device, free slots are in no list, and a device holds a reorder block only
    /// while it buffers a fix or arms a flush timer.
    pub(crate) fn check_records(&self) {
        let mut seen = vec![false; self.pairs.len()];
        let mut count = 0u64;
        let mut free = 0;
        for d in (0..self.devices.len() as u32).map(DeviceSlot) {
            if self.devices[d.index()].is_free() {
                assert_eq!(self.devices[d.index()].first_pair, NO_PAIR);
                assert!(!self.reorders.contains_key(&d));
                assert!(self.free_devices.contains(&d));
                free += 1;
                continue;
            }
            for p in pair_slots(&self.devices, &self.pairs, d) {
                assert!(!seen[p.index()], "pair {} listed twice", p.0);
                seen[p.index()] = true;
                assert_eq!(pair_device(&self.pairs, p), d);
                count += 1;
            }
            if let Some(r) = self.reorders.get(&d) {
                assert!(!r.is_idle() || r.flush_due != NO_TICK);
            }
            let id = self.ids.get(self.devices[d.index()].id);
            assert_eq!(self.device_ids.get(&self.ids, id), Some(d));
        }
        assert_eq!(count, self.live_pairs);
        assert_eq!(free, self.free_devices.len());
        assert_eq!(self.device_ids.table.len() + free, self.devices.len());
        for e in self.device_ids.table.iter() {
            assert_eq!(
                e.at,
                self.devices[e.slot.index()].id,
                "entry of slot {}",
                e.slot.0
            );
        }
        for &f in &self.free_pairs {
            assert!(!seen[f.index()], "free pair {} is listed", f.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_round_trips_ids_of_any_length() {
        let mut a = IdArena::default();
        let ids: Vec<String> = [0usize, 1, 11, 127, 128, 300, 20_000]
            .iter()
            .map(|&n| "é".repeat(n / 2) + &"x".repeat(n % 2))
            .collect();
        let at: Vec<u32> = ids.iter().map(|id| a.push(id).unwrap()).collect();
        for (id, &at) in ids.iter().zip(&at) {
            assert_eq!(a.get(at), id);
        }
        // One length byte up to 127 bytes.
        assert_eq!(at[2] + 1 + 11, at[3]);
    }

    #[test]
    fn compacting_the_arena_keeps_every_lookup() {
        let mut e = Engine::new(crate::engine::EngineConfig::default());
        let id = |i: usize| format!("{i:0>60}");
        let n = 40_000;
        let slots: Vec<DeviceSlot> = (0..n).map(|i| e.device_slot(&id(i)).unwrap()).collect();
        let before = e.ids.len();
        // Removing 3 of 4 devices leaves more dead bytes than live ones: the arena is rebuilt.
        for i in (0..n).filter(|i| i % 4 != 0) {
            assert!(e.remove_device(&id(i)));
        }
        assert!(e.ids.len() < before, "the arena was not compacted");
        e.check_records();
        for (i, &slot) in slots.iter().enumerate() {
            let found = e.device_ids.get(&e.ids, &id(i));
            assert_eq!(found, (i % 4 == 0).then_some(slot), "device {i}");
        }
        // New devices take the freed slots and are found too.
        for i in n..n + 100 {
            let d = e.device_slot(&id(i)).unwrap();
            assert_eq!(e.device_ids.get(&e.ids, &id(i)), Some(d));
        }
        e.check_records();
    }
}
