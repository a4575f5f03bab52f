//! The engine: reorder buffer, fix application and watermark advance for one shard.
//!
//! Owns the devices, the pair records, one fence index and one timer wheel. It is synchronous and
//! deterministic: the watermark and every fix come in as arguments, nothing reads a clock.
//!
//! Invariants, with `W` the engine's watermark and `F` a device's frontier (the latest event time
//! of anything decided for it: its latest applied fix, every event emitted for it, every run
//! expiry processed):
//! - A device's fixes are applied in (ts, lat, lon) order, each only once `W >= ts`; a fix with
//!   `ts <= F` is late (`behind_device`) and changes nothing, as is one more than `max_delay`
//!   behind `W` (`too_old`; with `max_delay` 0, any fix behind `W`); one with the `ts` of the
//!   latest applied or a buffered fix is a duplicate. A fix after `F` but behind `W` is applied
//!   at once, in order with the device's other fixes, and puts the device on a delay hold: its
//!   steps stop at its latest fix until `W` passes the fix's arrival plus `delay_hold`, so the
//!   rest of a delayed queue can still come. Nothing emitted is ever contradicted: a fix that
//!   could is at or before `F`.
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
//!
//! Layout: this module holds the [`Engine`] struct, its configuration and public types, the
//! constructor, the accessors and the fence changes; each submodule adds one `impl Engine` block
//! over the fields defined here:
//! - `ingest`: fix intake, the reorder buffer, applying fixes and catching pairs up to a bound;
//! - `timers`: watermark advance, wheel scheduling and sweeping, `next_due`, and which wheel
//!   entries are still live;
//! - `export`: the durable state out and back in, and dirty tracking for persistence;
//! - `views`: read-only device views and pages for the API;
//! - `records`: device and pair storage (slots, ids, reorder buffers, per-device pair lists).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use thiserror::Error;

use crate::event::Event;
use crate::fences::{Fence, FenceIdx, FenceIndex};
use crate::pairs::{Pair, PairState, PairView};
use crate::time::{Dur, Tick, TickClock, Ts};
use crate::wheel::{Fired, Wheel, WheelStats};

mod export;
mod ingest;
mod lifecycle;
mod records;
mod timers;
mod views;

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;

use ingest::to_event;
use records::{Device, DeviceIds, DeviceSlot, IdArena, PairSlot, Reorders, pair_slots, pairs_of};

pub use lifecycle::IdleRule;

/// Engine tuning.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Wheel tick length: bounds how long after `W` passes a deadline its event is emitted.
    pub tick: Dur,
    /// Most wheel entries fired by one [`Engine::advance`]; the rest carry to the next call.
    pub max_fires_per_advance: usize,
    /// Most fixes one device may hold in its reorder buffer.
    pub max_buffered_per_device: usize,
    /// Most devices the engine holds; a fix of a new device beyond it is refused
    /// ([`IngestError::TooManyDevices`]).
    pub max_devices: usize,
    /// Track devices whose durable state changed, for [`Engine::take_dirty`] (on when a store
    /// persists the engine; off saves the bookkeeping).
    pub track_dirty: bool,
    /// How far behind the watermark a fix may be and still be applied in its device's own
    /// event time; `Dur::ZERO`: every fix behind the watermark is late (`too_old`).
    pub max_delay: Dur,
    /// How long, in watermark time, a device applies only its own fixes after one arrived behind
    /// the watermark, before its steps catch up with the watermark; `Dur::ZERO`: no hold.
    pub delay_hold: Dur,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            tick: Dur::from_secs(1),
            max_fires_per_advance: 100_000,
            max_buffered_per_device: 1024,
            max_devices: usize::MAX,
            track_dirty: false,
            max_delay: Dur::ZERO,
            delay_hold: Dur::ZERO,
        }
    }
}

/// How the engine took a fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ingested {
    /// Buffered or applied.
    Accepted,
    /// Counted, not applied, for the reason given.
    Late(LateReason),
    /// Same `ts` as the latest applied or a buffered fix of the device: counted, not applied.
    Duplicate,
}

/// Why a fix was late.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LateReason {
    /// More than `max_delay` behind the watermark (with `max_delay` 0: behind it at all).
    TooOld,
    /// At or before its device's frontier: something decided for the device since would be
    /// contradicted.
    BehindDevice,
}

impl LateReason {
    /// Every reason, for metrics exported at zero.
    pub const ALL: [LateReason; 2] = [LateReason::TooOld, LateReason::BehindDevice];

    /// The reason as the API and the metrics' `reason` label write it.
    pub fn as_str(self) -> &'static str {
        match self {
            LateReason::TooOld => "too_old",
            LateReason::BehindDevice => "behind_device",
        }
    }
}

/// A fix that arrived behind the watermark, as the engine keeps a few for the device view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayedFix {
    /// The fix's time.
    pub ts: Ts,
    /// How far behind the watermark it arrived.
    pub behind: Dur,
    /// Applied (`None`) or late, and why.
    pub late: Option<LateReason>,
}

/// Why the engine refused a fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IngestError {
    /// The shard cannot take another device: its 2^31 device slots or its 4 GiB of device ids
    /// are used up.
    #[error("this shard holds as many devices as it can; device {device:?} is refused")]
    TooManyDevices {
        /// The refused device.
        device: Arc<str>,
    },
    /// The device already holds the maximum number of fixes waiting for the watermark.
    #[error(
        "device {device:?} has {max} fixes waiting for the watermark; slow down or lower lateness"
    )]
    BufferFull {
        /// The device whose buffer is full.
        device: Arc<str>,
        /// The limit, [`EngineConfig::max_buffered_per_device`].
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
    /// The device's frontier: a fix at or before it is late (`behind_device`).
    pub frontier: Option<Ts>,
    /// Until when (watermark time) its delay hold keeps its steps at its latest fix, if on.
    pub hold_until: Option<Ts>,
    /// Its latest fixes that arrived behind the watermark, newest first (a few at most, while
    /// the engine still remembers them).
    pub delayed: Vec<DelayedFix>,
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

/// A device inside a fence (committed ENTER, no EXIT yet), for the occupancy listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Occupant {
    /// Device id.
    pub device: Arc<str>,
    /// The device's latest applied fix time.
    pub last_fix_at: Option<Ts>,
    /// The pair: visit start, thresholds fired, next due.
    pub pair: PairView,
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
    /// The frontier, Unix ms; `None` in a state stored before frontiers were kept (restored as
    /// the later of the last applied fix and the watermark).
    pub frontier: Option<i64>,
    /// The end of the delay hold, Unix ms, when one is on.
    pub hold_until: Option<i64>,
}

impl DeviceState {
    /// The state of a removed device: no fix applied, none buffered, no pairs. It holds
    /// nothing, so a store drops the device when handed one, and [`Engine::restore`] skips it.
    pub fn blank(id: &str) -> DeviceState {
        DeviceState {
            id: id.to_string(),
            last_applied: None,
            last_position: None,
            buffer: Vec::new(),
            pairs: Vec::new(),
            frontier: None,
            hold_until: None,
        }
    }

    /// Whether this state holds nothing (a removal). A removed device that still holds off
    /// delayed fixes keeps its frontier and is not blank.
    pub fn is_blank(&self) -> bool {
        self.last_applied.is_none()
            && self.buffer.is_empty()
            && self.pairs.is_empty()
            && self.frontier.is_none()
    }
}

/// What [`Engine::restore`] rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Restored {
    /// Devices rebuilt.
    pub devices: u64,
    /// Pair records rebuilt.
    pub pairs: u64,
    /// Pair records dropped because their fence no longer exists.
    pub dropped_pairs: u64,
    /// Fixes put back into reorder buffers.
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

/// The engine of one shard: its devices, pair records, fences and timer wheel (the module docs
/// give the invariants).
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    clock: TickClock,
    fences: FenceIndex,
    devices: Vec<Device>,
    /// Free device slots (removed devices), reused before new ones.
    free_devices: Vec<DeviceSlot>,
    /// Arena bytes of removed devices' ids, until the arena is compacted.
    dead_id_bytes: usize,
    /// Ids of devices removed since the running checkpoint froze, handed out as removals by the
    /// next one (with `track_dirty`).
    removed: Vec<Arc<str>>,
    /// Removals the running checkpoint hands out (after its copies, before its devices).
    frozen_removed: Vec<Arc<str>>,
    /// Where the next idle sweep resumes (a device slot).
    idle_cursor: u32,
    /// The arrival stamp given to the fixes ingested next ([`Engine::set_arrival`]).
    arrival: u64,
    /// Every device's id, addressed by `Device::id`.
    ids: IdArena,
    device_ids: DeviceIds,
    /// The reorder buffers of the devices that have fixes waiting, by device slot.
    reorders: Reorders,
    pairs: Vec<Pair>,
    /// Freed pair slots; their records keep their generation so old wheel entries stay dead.
    free_pairs: Vec<PairSlot>,
    /// Pair records in device lists (`pairs.len()` minus the free slots).
    live_pairs: u64,
    /// Fixes waiting in reorder buffers, over all devices.
    buffered: u64,
    wheel: Wheel,
    watermark: Option<Ts>,
    /// Wheel entries fired by the current advance (kept to reuse its allocation).
    fired: Vec<Fired>,
    /// Devices the current advance brings up to date (kept to reuse its allocation).
    due_devices: Vec<DeviceSlot>,
    /// Devices whose durable state changed since the last [`Engine::take_dirty`].
    dirty: Vec<DeviceSlot>,
    /// A bit per device slot: listed in `dirty`.
    dirty_bits: Vec<u64>,
    /// The generation the next [`Reorder`](records::Reorder) starts its flush timer at.
    flush_gens: u32,
    /// Fence candidates of the fix being applied (kept to reuse its allocation).
    candidates: Vec<FenceIdx>,
    /// Devices with work ready at an exact time inside the current tick: (ready time, device).
    /// Entries may be stale (the device was processed since); processing is idempotent.
    soon: BinaryHeap<Reverse<(Ts, DeviceSlot)>>,
    /// Fires left in the current step ([`Engine::begin_step`]); `None`: no step, each advance
    /// may fire `max_fires_per_advance`.
    step_fires: Option<usize>,
    /// The running checkpoint's devices, frozen at [`Engine::checkpoint_begin`]; those before
    /// `frozen_next` have been handed out.
    frozen: Vec<DeviceSlot>,
    frozen_next: usize,
    /// A bit per device slot: frozen and not yet handed out.
    frozen_bits: Vec<u64>,
    /// Frozen devices copied before they changed, waiting to be handed out.
    copied: Vec<DeviceState>,
    /// The latest fixes that arrived behind the watermark (at most [`DELAYED_KEPT`]), for the
    /// device view: diagnostics only, not durable, decides nothing.
    delayed: std::collections::VecDeque<(DeviceSlot, DelayedFix)>,
}

/// Fixes that arrived behind the watermark an engine remembers for the device view.
pub const DELAYED_KEPT: usize = 1024;

impl Engine {
    /// An empty engine.
    pub fn new(cfg: EngineConfig) -> Engine {
        Engine {
            clock: TickClock::new(cfg.tick),
            cfg,
            fences: FenceIndex::new(),
            devices: Vec::new(),
            free_devices: Vec::new(),
            dead_id_bytes: 0,
            removed: Vec::new(),
            frozen_removed: Vec::new(),
            idle_cursor: 0,
            arrival: 0,
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
            step_fires: None,
            frozen: Vec::new(),
            frozen_next: 0,
            frozen_bits: Vec::new(),
            copied: Vec::new(),
            delayed: std::collections::VecDeque::new(),
        }
    }

    /// Stamps the fixes ingested from now on with `token`, an opaque arrival time of the
    /// shell's (0 = unknown), which the ENTER and EXIT they decide carry in
    /// [`Event::arrived`](crate::event::Event::arrived), however long they wait in the reorder
    /// buffer. It changes nothing the engine decides or emits; a replay leaves it at 0.
    pub fn set_arrival(&mut self, token: u64) {
        self.arrival = token;
    }

    /// Starts a step: until [`Engine::end_step`], every advance together (those inside
    /// [`Engine::ingest`] included) fires at most `max_fires_per_advance` wheel entries; the
    /// rest carry. A driver brackets each unit of work (a batch, a watermark move) with it, so a
    /// jump of the watermark over millions of due timers and buffered fixes is worked off in
    /// bounded slices between which it can take new input. Changes only *when* work happens,
    /// never what it emits.
    pub fn begin_step(&mut self) {
        self.step_fires = Some(self.cfg.max_fires_per_advance);
    }

    /// Ends the current step (see [`Engine::begin_step`]).
    pub fn end_step(&mut self) {
        self.step_fires = None;
    }

    /// The configuration the engine was built with.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The fences the engine evaluates fixes against.
    pub fn fences(&self) -> &FenceIndex {
        &self.fences
    }

    /// The current watermark (`None` before the first).
    pub fn watermark(&self) -> Option<Ts> {
        self.watermark
    }

    /// Engine-wide counters: devices, live pairs, buffered fixes and the wheel's own.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            devices: (self.devices.len() - self.free_devices.len()) as u64,
            pairs: self.live_pairs,
            buffered: self.buffered,
            wheel: self.wheel.stats(),
        }
    }

    /// Inserts or replaces a fence. Geometry changes apply from each device's next fix; changed
    /// dwell thresholds are re-mapped onto open visits (see [`Pair::remap_thresholds`]).
    pub fn upsert_fence(&mut self, fence: Arc<Fence>, out: &mut Vec<Event>) -> FenceIdx {
        let (idx, old) = self.fences.upsert(fence.clone());
        if let Some(old) = old
            && old.settings.dwell != fence.settings.dwell
        {
            for d in (0..self.devices.len() as u32).map(DeviceSlot) {
                if !pairs_of(&self.devices, &self.pairs, d)
                    .any(|p| self.pairs[p.index()].fence == idx)
                {
                    continue;
                }
                // Before the device's pairs change (a checkpoint in progress copies it first).
                self.mark_dirty(d);
                let mut touched = false;
                let last = self.devices[d.index()].last_applied();
                let id_at = self.devices[d.index()].id;
                let mut decided = Ts(records::NO_TS);
                for p in pair_slots(&self.devices, &self.pairs, d) {
                    let (ids, pair) = (&self.ids, &mut self.pairs[p.index()]);
                    if pair.fence == idx {
                        pair.remap_thresholds(
                            &old.settings.dwell,
                            &fence.settings,
                            last,
                            &mut |o| {
                                decided = decided.max(o.at());
                                out.push(to_event(o, ids.get(id_at), &fence, None))
                            },
                        );
                        touched = true;
                    }
                }
                self.devices[d.index()].raise_frontier(decided);
                if touched {
                    self.process_device(d, None, out);
                }
            }
        }
        idx
    }

    /// Removes a fence: its pairs are dropped and their timers cancelled, without events.
    pub fn remove_fence(&mut self, id: &str) -> bool {
        let Some(idx) = self.fences.idx_of(id) else {
            return false;
        };
        // Before anything changes, while the fence is still there (a checkpoint in progress
        // copies these devices first, pairs of this fence included).
        for d in (0..self.devices.len() as u32).map(DeviceSlot) {
            if pairs_of(&self.devices, &self.pairs, d).any(|p| self.pairs[p.index()].fence == idx) {
                self.mark_dirty(d);
            }
        }
        let Some((idx, _)) = self.fences.remove(id) else {
            return false;
        };
        for d in (0..self.devices.len() as u32).map(DeviceSlot) {
            for p in pair_slots(&self.devices, &self.pairs, d) {
                if self.pairs[p.index()].fence == idx {
                    self.free_pair(d, p);
                }
            }
        }
        true
    }
}
