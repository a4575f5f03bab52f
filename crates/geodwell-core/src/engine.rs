//! The engine: reorder buffer, fix application and watermark advance for one shard.
//!
//! Owns the devices, the pair records, one fence index and one timer wheel. It is synchronous and
//! deterministic: the watermark and every fix come in as arguments, nothing reads a clock.
//!
//! Invariants, with `W` the engine's watermark:
//! - A device's fixes are applied in (ts, lat, lon) order, each only once `W >= ts`; a fix with
//!   `ts < W` when it reaches the engine, or before its device's last applied fix, is late and
//!   changes nothing; one with the `ts` of an applied or buffered fix is a duplicate.
//! - Per device, fixes and the pairs' internal events (dwell deadlines, run expiries) are processed
//!   in event-time order: before a fix at `ts` every internal event `< ts` of the device's pairs is
//!   processed, and a watermark advance processes internal events `< W`. Devices are independent,
//!   so the wheel only decides *when* a device is brought up to date, never *what* it emits: the
//!   emitted events depend on the fixes alone, whatever their arrival order within the lateness,
//!   the batch split, the tick length or the shard count.
//! - `advance(W)` is exact, not tick-quantized: afterwards every buffered fix `<= W` is applied and
//!   every internal event `< W` processed (unless the fire cap carried work). So the emitted events
//!   are a function of the fixes and the final watermark alone.
//! - Each pair has at most one live wheel entry (for its next internal event) and each device one
//!   (for its earliest buffered fix), in the tick that holds the exact instant the work becomes
//!   ready: the wheel brings the device up at the start of that tick, and the rest of the tick is
//!   covered by a small exact-time heap (`soon`). The wheel never fires before its tick; the
//!   engine never acts before the exact time. Rescheduling bumps the record's generation; the old
//!   entry becomes a tombstone the wheel drops when it meets it.

use smallvec::SmallVec;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use thiserror::Error;

use crate::event::Event;
use crate::fences::{Fence, FenceIdx, FenceIndex};
use crate::fix::Fix;
use crate::pairs::{Alive, FixClass, Pair, PairOutput, PairState, PairView};
use crate::time::{Dur, Tick, TickClock, Ts};
use crate::wheel::{Fired, TimerKey, Wheel, WheelStats};

mod records;

use records::{Device, DeviceIds, IdArena, NO_PAIR, NO_TICK, NO_TS, Reorder, Reorders};

/// Marks a wheel slot as a device's reorder-flush timer rather than a pair's timer.
const DEVICE_BIT: u32 = 1 << 31;

/// Engine tuning.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Wheel tick length: bounds how long after `W` passes a deadline its event is emitted.
    pub tick: Dur,
    /// Most wheel entries fired by one [`Engine::advance`]; the rest carry to the next call.
    pub max_fires_per_advance: usize,
    /// Most fixes one device may hold in its reorder buffer.
    pub max_buffered_per_device: usize,
    /// Track devices whose durable state changed, for [`Engine::take_dirty`] (on when a store
    /// persists the engine; off saves the bookkeeping).
    pub track_dirty: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            tick: Dur::from_secs(1),
            max_fires_per_advance: 100_000,
            max_buffered_per_device: 1024,
            track_dirty: false,
        }
    }
}

/// How the engine took a fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ingested {
    /// Buffered or applied.
    Accepted,
    /// Older than the watermark or than the device's last applied fix: counted, not applied.
    Late,
    /// Same `ts` as an applied or buffered fix of the device: counted, not applied.
    Duplicate,
}

/// Why the engine refused a fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IngestError {
    /// The shard cannot take another device: its 2^31 device slots or its 4 GiB of device ids
    /// are used up.
    #[error("this shard holds as many devices as it can; device {device:?} is refused")]
    TooManyDevices {
        /// The device.
        device: Arc<str>,
    },
    /// The device already holds the maximum number of fixes waiting for the watermark.
    #[error(
        "device {device:?} has {max} fixes waiting for the watermark; slow down or lower lateness"
    )]
    BufferFull {
        /// The device.
        device: Arc<str>,
        /// The limit.
        max: usize,
    },
}

impl IngestError {
    /// The stable code an item error carries in API answers and the `reason` of the rejection
    /// metric.
    pub fn code(&self) -> &'static str {
        match self {
            IngestError::TooManyDevices { .. } => "too_many_devices",
            IngestError::BufferFull { .. } => "buffer_full",
        }
    }
}

/// Result of a watermark advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Advanced {
    /// Wheel entries fired.
    pub fired: usize,
    /// Whether due entries were left for the next call by the fire cap.
    pub carried: bool,
}

/// Engine-wide counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineStats {
    /// Devices known.
    pub devices: u64,
    /// Live pair records.
    pub pairs: u64,
    /// Fixes waiting in reorder buffers.
    pub buffered: u64,
    /// Wheel counters.
    pub wheel: WheelStats,
}

/// A device's state, for APIs and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceView {
    /// Device id.
    pub id: Arc<str>,
    /// Latest applied fix time.
    pub last_fix_at: Option<Ts>,
    /// Latest applied position (lat, lon).
    pub last_position: Option<(f64, f64)>,
    /// Fixes waiting for the watermark.
    pub buffered: usize,
    /// Pair records, by fence id, sorted.
    pub pairs: Vec<(Arc<str>, PairView)>,
}

/// A device in a listing: where it is and which fences it is inside (committed ENTER, no EXIT
/// yet).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSummary {
    /// Device id.
    pub id: Arc<str>,
    /// Latest applied fix time.
    pub last_fix_at: Option<Ts>,
    /// Latest applied position (lat, lon).
    pub last_position: Option<(f64, f64)>,
    /// Ids of the fences the device is inside, sorted.
    pub inside: Vec<Arc<str>>,
}

/// The durable state of one device: what [`Engine::export`] writes and [`Engine::restore`]
/// reads. Fences are named by id, so the state survives fence slots being renumbered. The
/// service stores it with its own binary codec; the serde derives exist only for the model test
/// that round-trips an export through JSON.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(test, derive(serde::Serialize, serde::Deserialize))]
pub struct DeviceState {
    /// Device id.
    pub id: String,
    /// Latest applied fix, Unix ms.
    pub last_applied: Option<i64>,
    /// Latest applied position (lat, lon).
    pub last_position: Option<(f64, f64)>,
    /// Fixes waiting for the watermark: (ts ms, lat, lon, accuracy), in application order.
    pub buffer: Vec<(i64, f64, f64, Option<f64>)>,
    /// Pair records, by fence id.
    pub pairs: Vec<(String, PairState)>,
}

/// What [`Engine::restore`] rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Restored {
    /// Devices.
    pub devices: u64,
    /// Pair records.
    pub pairs: u64,
    /// Pair records dropped because their fence no longer exists.
    pub dropped_pairs: u64,
    /// Buffered fixes.
    pub buffered: u64,
}

/// Why a restore was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RestoreError {
    /// Restore must start from an engine that holds no device yet.
    #[error("restore needs an engine without devices; this one has {0}")]
    NotEmpty(usize),
    /// The stored devices do not fit one shard (2^31 slots, 4 GiB of ids).
    #[error("the stored devices do not fit one shard; {0} were restored")]
    TooManyDevices(usize),
}

/// A fix waiting in a reorder buffer (the device is implied).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Buffered {
    ts: Ts,
    lat: f64,
    lon: f64,
    accuracy: Option<f64>,
}

impl Buffered {
    fn key_cmp(&self, ts: Ts, lat: f64, lon: f64) -> std::cmp::Ordering {
        self.ts
            .cmp(&ts)
            .then(self.lat.total_cmp(&lat))
            .then(self.lon.total_cmp(&lon))
    }
}

/// One shard's engine.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    clock: TickClock,
    fences: FenceIndex,
    devices: Vec<Device>,
    /// Every device's id, addressed by `Device::id`.
    ids: IdArena,
    device_ids: DeviceIds,
    /// The reorder buffers of the devices that have fixes waiting, by device slot.
    reorders: Reorders,
    pairs: Vec<Pair>,
    /// Freed pair slots; their records keep their generation so old wheel entries stay dead.
    free_pairs: Vec<u32>,
    live_pairs: u64,
    buffered: u64,
    wheel: Wheel,
    watermark: Option<Ts>,
    fired: Vec<Fired>,
    due_devices: Vec<u32>,
    /// Devices whose durable state changed since the last [`Engine::take_dirty`].
    dirty: Vec<u32>,
    /// A bit per device slot: listed in `dirty`.
    dirty_bits: Vec<u64>,
    /// The generation the next [`Reorder`] starts its flush timer at.
    flush_gens: u32,
    /// Fence candidates of the fix being applied (kept to reuse its allocation).
    candidates: Vec<FenceIdx>,
    /// Devices with work ready at an exact time inside the current tick: (ready time, device).
    /// Entries may be stale (the device was processed since); processing is idempotent.
    soon: BinaryHeap<Reverse<(Ts, u32)>>,
}

impl Engine {
    /// An empty engine.
    pub fn new(cfg: EngineConfig) -> Engine {
        Engine {
            clock: TickClock::new(cfg.tick),
            cfg,
            fences: FenceIndex::new(),
            devices: Vec::new(),
            ids: IdArena::default(),
            device_ids: DeviceIds::default(),
            reorders: Reorders::default(),
            pairs: Vec::new(),
            free_pairs: Vec::new(),
            live_pairs: 0,
            buffered: 0,
            wheel: Wheel::new(Tick(0)),
            watermark: None,
            fired: Vec::new(),
            due_devices: Vec::new(),
            soon: BinaryHeap::new(),
            dirty: Vec::new(),
            dirty_bits: Vec::new(),
            flush_gens: 0,
            candidates: Vec::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The fence index.
    pub fn fences(&self) -> &FenceIndex {
        &self.fences
    }

    /// The current watermark (`None` before the first).
    pub fn watermark(&self) -> Option<Ts> {
        self.watermark
    }

    /// Counters.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            devices: self.devices.len() as u64,
            pairs: self.live_pairs,
            buffered: self.buffered,
            wheel: self.wheel.stats(),
        }
    }

    /// The event time at which the next [`Engine::advance`] may have work: the driver may sleep
    /// until the watermark reaches it. `None` when nothing is pending.
    pub fn next_due(&self) -> Option<Ts> {
        // A wheel entry due at tick k fires once W reaches the start of tick k (k * T).
        let wheel = self.wheel.next_due().map(|t| self.clock.tick_end(t));
        let soon = self.soon.peek().map(|Reverse((r, _))| *r);
        match (wheel, soon) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Inserts or replaces a fence. Geometry changes apply from each device's next fix; changed
    /// dwell thresholds are re-mapped onto open visits (see [`Pair::remap_thresholds`]).
    pub fn upsert_fence(&mut self, fence: Arc<Fence>, out: &mut Vec<Event>) -> FenceIdx {
        let (idx, old) = self.fences.upsert(fence.clone());
        if let Some(old) = old
            && old.settings.dwell != fence.settings.dwell
        {
            for d in 0..self.devices.len() {
                let mut touched = false;
                let last = self.devices[d].last_applied();
                let id_at = self.devices[d].id;
                for p in pair_slots(&self.devices, &self.pairs, d as u32) {
                    let (ids, pair) = (&self.ids, &mut self.pairs[p as usize]);
                    if pair.fence == idx {
                        pair.remap_thresholds(
                            &old.settings.dwell,
                            &fence.settings,
                            last,
                            &mut |o| out.push(to_event(o, ids.get(id_at), &fence)),
                        );
                        touched = true;
                    }
                }
                if touched {
                    self.process_device(d as u32, None, out);
                }
            }
        }
        idx
    }

    /// Removes a fence: its pairs are dropped and their timers cancelled, without events.
    pub fn remove_fence(&mut self, id: &str) -> bool {
        let Some((idx, _)) = self.fences.remove(id) else {
            return false;
        };
        for d in 0..self.devices.len() as u32 {
            for p in pair_slots(&self.devices, &self.pairs, d) {
                if self.pairs[p as usize].fence == idx {
                    self.free_pair(d, p);
                    self.mark_dirty(d);
                }
            }
        }
        true
    }

    /// Takes one fix that arrived when the watermark was `w`. The engine first advances to `w`
    /// (events go to `out`), then classifies the fix, buffers it, and applies it at once if `ts <= W`.
    pub fn ingest(
        &mut self,
        fix: &Fix,
        w: Ts,
        out: &mut Vec<Event>,
    ) -> Result<Ingested, IngestError> {
        self.advance(w, out);
        let w = self.watermark.unwrap_or(w);
        if fix.ts < w {
            return Ok(Ingested::Late);
        }
        let Some(d) = self.device_slot(&fix.device) else {
            return Err(IngestError::TooManyDevices {
                device: fix.device.clone(),
            });
        };
        let dev = &self.devices[d as usize];
        if let Some(last) = dev.last_applied() {
            if fix.ts < last {
                return Ok(Ingested::Late);
            }
            if fix.ts == last {
                return Ok(Ingested::Duplicate);
            }
        }
        let new = Buffered {
            ts: fix.ts,
            lat: fix.lat,
            lon: fix.lon,
            accuracy: fix.accuracy,
        };
        if fix.ts <= w && !self.reorders.contains_key(&d) {
            // Nothing waits and the fix is not ahead of W: apply it without buffering it.
            self.process_device(d, Some(new), out);
            return Ok(Ingested::Accepted);
        }
        let reorder = self.reorders.entry(d).or_insert_with(|| {
            self.flush_gens = self.flush_gens.wrapping_add(1);
            Reorder {
                // Most devices hold at most one fix at a time; Vec's first growth would take four.
                fixes: Vec::with_capacity(1),
                flush_due: NO_TICK,
                flush_gen: self.flush_gens,
            }
        });
        let buffer = &mut reorder.fixes;
        let pos = buffer.partition_point(|b| b.ts < fix.ts);
        if let Some(existing) = buffer.get_mut(pos)
            && existing.ts == fix.ts
        {
            // Of fixes sharing a ts, the first in (lat, lon) order is kept, whatever arrived first.
            if existing.key_cmp(fix.ts, fix.lat, fix.lon).is_gt() {
                *existing = new;
                self.mark_dirty(d);
                return Ok(Ingested::Accepted);
            }
            return Ok(Ingested::Duplicate);
        }
        if buffer.len() >= self.cfg.max_buffered_per_device {
            return Err(IngestError::BufferFull {
                device: fix.device.clone(),
                max: self.cfg.max_buffered_per_device,
            });
        }
        buffer.insert(pos, new);
        self.buffered += 1;
        self.mark_dirty(d);
        if fix.ts <= w {
            self.process_device(d, None, out);
        } else {
            self.resched_device(d);
        }
        Ok(Ingested::Accepted)
    }

    /// Raises the watermark to `w` (a lower `w` is ignored, but still drains carried timers) and
    /// processes everything now due. Events go to `out`.
    pub fn advance(&mut self, w: Ts, out: &mut Vec<Event>) -> Advanced {
        let w = self.watermark.map_or(w, |cur| cur.max(w));
        self.watermark = Some(w);
        let to = self.clock.completed_tick(w);
        self.fired.clear();
        let (pairs, reorders) = (&self.pairs, &self.reorders);
        let fired = self.wheel.advance(
            to,
            self.cfg.max_fires_per_advance,
            |k| entry_live(k, pairs, reorders),
            &mut self.fired,
        );
        // First mark every fired entry consumed, so that rescheduling while processing never
        // counts an entry that already left the wheel as a tombstone. Entries fire at the start
        // of the tick holding their ready time; one whose exact ready time is still ahead waits
        // in `soon` for the rest of the tick.
        self.due_devices.clear();
        for i in 0..self.fired.len() {
            let key = self.fired[i].key;
            let (d, ready) = if key.slot & DEVICE_BIT != 0 {
                let d = key.slot & !DEVICE_BIT;
                (
                    d,
                    self.reorders.get_mut(&d).and_then(|r| {
                        r.flush_due = NO_TICK;
                        r.fixes.first().map(|b| b.ts)
                    }),
                )
            } else {
                let p = &mut self.pairs[key.slot as usize];
                p.set_timer(None, 0);
                let ready = self
                    .fences
                    .get(p.fence)
                    .and_then(|f| p.next_internal(&f.settings))
                    .map(|t| t.plus(Dur(1)));
                (pair_device(&self.pairs, key.slot), ready)
            };
            match ready {
                Some(r) if r > w => self.soon.push(Reverse((r, d))),
                _ => self.due_devices.push(d),
            }
        }
        while let Some(&Reverse((r, d))) = self.soon.peek() {
            if r > w {
                break;
            }
            self.soon.pop();
            self.due_devices.push(d);
        }
        self.due_devices.sort_unstable();
        self.due_devices.dedup();
        let due = std::mem::take(&mut self.due_devices);
        for &d in &due {
            self.process_device(d, None, out);
        }
        self.due_devices = due;
        Advanced {
            fired,
            carried: self.wheel.stats().carry > 0,
        }
    }

    /// The durable state of every device, in slot order.
    pub fn export(&self) -> Vec<DeviceState> {
        (0..self.devices.len() as u32)
            .map(|d| self.export_device(d))
            .collect()
    }

    fn export_device(&self, d: u32) -> DeviceState {
        let dev = &self.devices[d as usize];
        DeviceState {
            id: self.ids.get(dev.id).to_string(),
            last_applied: dev.last_applied().map(|t| t.0),
            last_position: dev.last_position(),
            buffer: self
                .reorders
                .get(&d)
                .map_or(&[][..], |r| &r.fixes)
                .iter()
                .map(|b| (b.ts.0, b.lat, b.lon, b.accuracy))
                .collect(),
            pairs: pairs_of(&self.devices, &self.pairs, d)
                .filter_map(|p| {
                    let pair = &self.pairs[p as usize];
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
        self.device_ids
            .reserve(&self.devices, &self.ids, devices.len());
        for st in devices {
            let Some(d) = self.device_slot(&st.id) else {
                return Err(RestoreError::TooManyDevices(self.devices.len()));
            };
            let dev = &mut self.devices[d as usize];
            dev.last_applied = st.last_applied.unwrap_or(NO_TS);
            dev.last_position = st
                .last_position
                .map_or([f64::NAN; 2], |(lat, lon)| [lat, lon]);
            let mut fixes: Vec<Buffered> = st
                .buffer
                .iter()
                .map(|&(ts, lat, lon, accuracy)| Buffered {
                    ts: Ts(ts),
                    lat,
                    lon,
                    accuracy,
                })
                .collect();
            fixes.sort_by(|a, b| a.key_cmp(b.ts, b.lat, b.lon));
            self.buffered += fixes.len() as u64;
            r.buffered += fixes.len() as u64;
            if !fixes.is_empty() {
                self.flush_gens = self.flush_gens.wrapping_add(1);
                self.reorders.insert(
                    d,
                    Reorder {
                        fixes,
                        flush_due: NO_TICK,
                        flush_gen: self.flush_gens,
                    },
                );
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

    /// Drops cancelled wheel entries ahead of the next ticks, examining at most `budget`: the
    /// driver calls it between ticks so that ticks only meet live entries (the same total work,
    /// without the pause). Changes nothing observable.
    pub fn sweep(&mut self, budget: usize) -> usize {
        let (pairs, reorders) = (&self.pairs, &self.reorders);
        self.wheel.sweep(budget, |k| entry_live(k, pairs, reorders))
    }

    /// A device's state.
    pub fn device(&self, id: &str) -> Option<DeviceView> {
        let d = self.device_ids.get(&self.devices, &self.ids, id)?;
        let dev = &self.devices[d as usize];
        let mut pairs: Vec<(Arc<str>, PairView)> = pairs_of(&self.devices, &self.pairs, d)
            .filter_map(|p| {
                let pair = &self.pairs[p as usize];
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
                let mut inside: Vec<Arc<str>> = pairs_of(&self.devices, &self.pairs, d as u32)
                    .filter_map(|p| {
                        let pair = &self.pairs[p as usize];
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

    /// The slot of device `id`, made if new; `None` when the shard has no room for another.
    fn device_slot(&mut self, id: &str) -> Option<u32> {
        if let Some(d) = self.device_ids.get(&self.devices, &self.ids, id) {
            return Some(d);
        }
        let d = u32::try_from(self.devices.len())
            .ok()
            .filter(|&d| d < DEVICE_BIT)?;
        let at = self.ids.push(id).ok()?;
        self.devices.push(Device::new(at));
        self.device_ids.insert(&self.devices, &self.ids, d);
        Some(d)
    }

    /// Applies `first` (a fix `<= W` the caller did not buffer because nothing else waits) and
    /// every buffered fix `<= W` of device `d`, processes its pairs' internal events `< W` and
    /// reschedules its timers.
    fn process_device(&mut self, d: u32, first: Option<Buffered>, out: &mut Vec<Event>) {
        let Some(w) = self.watermark else { return };
        self.mark_dirty(d);
        if let Some(b) = first {
            debug_assert!(b.ts <= w && !self.reorders.contains_key(&d));
            self.apply(d, b, out);
        }
        while let Some(reorder) = self.reorders.get_mut(&d) {
            match reorder.fixes.first() {
                Some(b) if b.ts <= w => {
                    let b = reorder.fixes.remove(0);
                    self.buffered -= 1;
                    self.apply(d, b, out);
                }
                _ => break,
            }
        }
        self.catch_up(d, w, out);
        for p in pair_slots(&self.devices, &self.pairs, d) {
            self.resched_pair(d, p);
        }
        self.resched_device(d);
    }

    /// Processes internal events strictly before `bound` for every pair of device `d`.
    fn catch_up(&mut self, d: u32, bound: Ts, out: &mut Vec<Event>) {
        let last = self.devices[d as usize].last_applied();
        let id_at = self.devices[d as usize].id;
        for p in pair_slots(&self.devices, &self.pairs, d) {
            let (ids, pair) = (&self.ids, &mut self.pairs[p as usize]);
            let alive = match self.fences.get(pair.fence) {
                // The id is looked up only when an event is made: most steps make none.
                Some(fence) => pair.catch_up(&fence.settings, bound, last, &mut |o| {
                    out.push(to_event(o, ids.get(id_at), fence))
                }),
                None => Alive::No,
            };
            if alive == Alive::No {
                self.free_pair(d, p);
            }
        }
    }

    /// Applies one fix to device `d`: first its pairs' earlier internal events, then the fix to
    /// every pair it already has and to every fence whose exact test it passes.
    fn apply(&mut self, d: u32, b: Buffered, out: &mut Vec<Event>) {
        self.catch_up(d, b.ts, out);
        let dev = &mut self.devices[d as usize];
        dev.last_applied = b.ts.0;
        dev.last_position = [b.lat, b.lon];
        let ignored = |f: &Fence| matches!((b.accuracy, f.settings.max_accuracy_m), (Some(a), Some(max)) if a > max);

        let id_at = self.devices[d as usize].id;
        for p in pair_slots(&self.devices, &self.pairs, d) {
            let (ids, pair) = (&self.ids, &mut self.pairs[p as usize]);
            let Some(fence) = self.fences.get(pair.fence) else {
                self.free_pair(d, p);
                continue;
            };
            if ignored(fence) {
                continue;
            }
            let class = classify(fence, pair.is_inside(), b.lon, b.lat);
            let alive = pair.on_fix(&fence.settings, b.ts, class, &mut |o| {
                out.push(to_event(o, ids.get(id_at), fence))
            });
            if alive == Alive::No {
                self.free_pair(d, p);
            }
        }

        let mut candidates = std::mem::take(&mut self.candidates);
        candidates.clear();
        self.fences.candidates(b.lon, b.lat, &mut candidates);
        for &idx in &candidates {
            let has_pair = pairs_of(&self.devices, &self.pairs, d)
                .any(|p| self.pairs[p as usize].fence == idx);
            if has_pair {
                continue;
            }
            let Some(fence) = self.fences.get(idx) else {
                continue;
            };
            if ignored(fence) || !fence.contains(b.lon, b.lat) {
                continue;
            }
            let ids = &self.ids;
            let pair = Pair::start(idx, &fence.settings, b.ts, &mut |o| {
                out.push(to_event(o, ids.get(id_at), fence))
            });
            self.insert_pair(d, pair);
        }
        self.candidates = candidates;
    }

    /// Stores `pair` in a free slot and appends it to device `d`'s list.
    fn insert_pair(&mut self, d: u32, mut pair: Pair) {
        pair.link = d | DEVICE_BIT;
        let slot = match self.free_pairs.pop() {
            Some(slot) => {
                pair.timer_gen = self.pairs[slot as usize].timer_gen;
                self.pairs[slot as usize] = pair;
                slot
            }
            None => {
                let slot = self.pairs.len() as u32;
                debug_assert!(slot < DEVICE_BIT, "pair slots must leave the flag bit free");
                self.pairs.push(pair);
                slot
            }
        };
        let head = self.devices[d as usize].first_pair;
        if head & DEVICE_BIT != 0 {
            self.devices[d as usize].first_pair = slot;
        } else {
            let mut last = head;
            while self.pairs[last as usize].link & DEVICE_BIT == 0 {
                last = self.pairs[last as usize].link;
            }
            self.pairs[last as usize].link = slot;
        }
        self.live_pairs += 1;
    }

    /// Unlinks pair `slot` from device `d`'s list and frees it, tombstoning its timer.
    fn free_pair(&mut self, d: u32, slot: u32) {
        let next = self.pairs[slot as usize].link;
        let head = &mut self.devices[d as usize].first_pair;
        if *head == slot {
            *head = if next & DEVICE_BIT != 0 {
                NO_PAIR
            } else {
                next
            };
        } else {
            let mut prev = *head;
            while self.pairs[prev as usize].link != slot {
                prev = self.pairs[prev as usize].link;
                debug_assert!(
                    prev & DEVICE_BIT == 0,
                    "pair {slot} is not in device {d}'s list"
                );
            }
            self.pairs[prev as usize].link = next;
        }
        let pair = &mut self.pairs[slot as usize];
        if pair.has_timer() {
            self.wheel.cancelled();
        }
        pair.set_timer(None, 0);
        pair.timer_gen = pair.timer_gen.wrapping_add(1);
        self.free_pairs.push(slot);
        self.live_pairs -= 1;
    }

    /// Puts pair `slot` (of device `d`) on the wheel at its next internal event.
    fn resched_pair(&mut self, d: u32, slot: u32) {
        let pair = &mut self.pairs[slot as usize];
        let Some(fence) = self.fences.get(pair.fence) else {
            return;
        };
        // An internal event at t is processed once the watermark passes t: it is ready at
        // t + 1 ms. The wheel entry goes in the tick holding that instant; the current tick's
        // work waits in `soon`, ordered by exact time.
        let ready = pair.next_internal(&fence.settings).map(|t| t.plus(Dur(1)));
        let now = self.wheel.now().0;
        let (due, soon) = match ready.map(|r| (r, self.clock.completed_tick(r).0)) {
            Some((r, k)) if k <= now => (None, Some(r)),
            Some((_, k)) => (Some(k), None),
            None => (None, None),
        };
        if let Some(r) = soon {
            self.soon.push(Reverse((r, d)));
        }
        if pair.timer_is(due, now) {
            return;
        }
        if pair.has_timer() {
            self.wheel.cancelled();
        }
        pair.timer_gen = pair.timer_gen.wrapping_add(1);
        pair.set_timer(due, now);
        if let Some(due) = due {
            self.wheel.schedule(
                TimerKey {
                    slot,
                    generation: pair.timer_gen,
                },
                Tick(due),
            );
        }
    }

    /// Puts device `d`'s flush timer at its earliest buffered fix, and drops the reorder block
    /// once nothing waits in it.
    fn resched_device(&mut self, d: u32) {
        let Some(reorder) = self.reorders.get_mut(&d) else {
            return;
        };
        let now = self.wheel.now().0;
        let due = match reorder
            .fixes
            .first()
            .map(|b| (b.ts, self.clock.completed_tick(b.ts).0))
        {
            Some((r, k)) if k <= now => {
                self.soon.push(Reverse((r, d)));
                None
            }
            Some((_, k)) => Some(k),
            None => None,
        };
        let armed = (reorder.flush_due != NO_TICK).then_some(reorder.flush_due);
        if due != armed {
            if armed.is_some() {
                self.wheel.cancelled();
            }
            reorder.flush_gen = reorder.flush_gen.wrapping_add(1);
            reorder.flush_due = due.unwrap_or(NO_TICK);
            if let Some(due) = due {
                self.wheel.schedule(
                    TimerKey {
                        slot: d | DEVICE_BIT,
                        generation: reorder.flush_gen,
                    },
                    Tick(due),
                );
            }
        }
        if reorder.fixes.is_empty() && reorder.flush_due == NO_TICK {
            // An idle device keeps no buffer (at a million devices that was ~170 MB).
            self.reorders.remove(&d);
        }
    }

    fn mark_dirty(&mut self, d: u32) {
        if !self.cfg.track_dirty {
            return;
        }
        let (word, bit) = ((d / 64) as usize, 1u64 << (d % 64));
        if word >= self.dirty_bits.len() {
            self.dirty_bits.resize(word + 1, 0);
        }
        if self.dirty_bits[word] & bit == 0 {
            self.dirty_bits[word] |= bit;
            self.dirty.push(d);
        }
    }

    /// The durable state of every device changed since the previous call (for incremental
    /// persistence: storing these keeps a store equal to [`Engine::export`]).
    pub fn take_dirty(&mut self) -> Vec<DeviceState> {
        let dirty = std::mem::take(&mut self.dirty);
        let out = dirty.iter().map(|&d| self.export_device(d)).collect();
        for d in dirty {
            self.dirty_bits[(d / 64) as usize] &= !(1u64 << (d % 64));
        }
        out
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
        for d in 0..self.devices.len() as u32 {
            for p in pair_slots(&self.devices, &self.pairs, d) {
                assert!(!seen[p as usize], "pair {p} listed twice");
                seen[p as usize] = true;
                assert_eq!(pair_device(&self.pairs, p), d);
                count += 1;
            }
            if let Some(r) = self.reorders.get(&d) {
                assert!(!r.fixes.is_empty() || r.flush_due != NO_TICK);
            }
            let id = self.ids.get(self.devices[d as usize].id);
            assert_eq!(self.device_ids.get(&self.devices, &self.ids, id), Some(d));
        }
        assert_eq!(count, self.live_pairs);
        for &f in &self.free_pairs {
            assert!(!seen[f as usize], "free pair {f} is listed");
        }
    }
}

/// Whether a wheel entry is still its owner's current timer.
fn entry_live(k: TimerKey, pairs: &[Pair], reorders: &Reorders) -> bool {
    if k.slot & DEVICE_BIT != 0 {
        reorders
            .get(&(k.slot & !DEVICE_BIT))
            .is_some_and(|r| r.flush_gen == k.generation && r.flush_due != NO_TICK)
    } else {
        let p = &pairs[k.slot as usize];
        p.timer_gen == k.generation && p.has_timer()
    }
}

/// Device `d`'s pair slots in list order, walking the links.
fn pairs_of<'a>(devices: &[Device], pairs: &'a [Pair], d: u32) -> impl Iterator<Item = u32> + 'a {
    // A link with the device bit (or `NO_PAIR`) ends the list.
    let slot = |link: u32| (link & DEVICE_BIT == 0).then_some(link);
    std::iter::successors(slot(devices[d as usize].first_pair), move |&p| {
        slot(pairs[p as usize].link)
    })
}

/// Device `d`'s pair slots in list order: a copy, for the loops that free or insert pairs.
fn pair_slots(devices: &[Device], pairs: &[Pair], d: u32) -> SmallVec<[u32; 8]> {
    pairs_of(devices, pairs, d).collect()
}

/// The device whose list holds pair `slot`: the tag at the end of the list.
fn pair_device(pairs: &[Pair], slot: u32) -> u32 {
    let mut cur = slot;
    loop {
        let link = pairs[cur as usize].link;
        if link & DEVICE_BIT != 0 {
            return link & !DEVICE_BIT;
        }
        cur = link;
    }
}

fn classify(fence: &Fence, inside: bool, lon: f64, lat: f64) -> FixClass {
    if fence.contains(lon, lat) {
        FixClass::Inside
    } else if inside
        && fence.settings.exit_buffer_m > 0.0
        && fence.within_m(lon, lat, fence.settings.exit_buffer_m)
    {
        FixClass::Buffer
    } else {
        FixClass::Outside
    }
}

fn to_event(o: PairOutput, device: &str, fence: &Fence) -> Event {
    let device = &device;
    let tags = &fence.settings.tags;
    match o {
        PairOutput::Enter { entered_at } => Event::enter(device, &fence.id, entered_at, tags),
        PairOutput::Exit { entered_at, at } => Event::exit(device, &fence.id, entered_at, at, tags),
        PairOutput::Dwell {
            entered_at,
            threshold,
        } => Event::dwell(device, &fence.id, entered_at, threshold, tags),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod model;
