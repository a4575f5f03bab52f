//! Hashed hierarchical timer wheel (API skeleton; the implementation lands with the wheel work).

use crate::core::time::Tick;

/// Identifies the record a timer belongs to: the wheel treats it as opaque. A timer is live while
/// the owner's record still carries the same `gen`; cancel is the owner bumping its generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerKey {
    /// Slot of the owning record.
    pub slot: u32,
    /// Generation of the owning record when the timer was scheduled.
    pub generation: u32,
}

/// One timer handed back by [`Wheel::advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fired {
    /// The timer's key.
    pub key: TimerKey,
    /// The tick it was scheduled for (never later than the tick it fired in).
    pub due: Tick,
}

/// Counters describing the wheel's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WheelStats {
    /// Entries stored anywhere in the wheel (live and dead).
    pub entries: u64,
    /// Entries known to be dead (cancelled) but not yet dropped.
    pub tombstones: u64,
    /// Due entries waiting because a per-call fire cap was hit.
    pub carry: u64,
}

/// The timer wheel.
#[derive(Debug)]
pub struct Wheel {
    now: Tick,
}

impl Wheel {
    /// A wheel whose current tick is `start`.
    pub fn new(start: Tick) -> Wheel {
        Wheel { now: start }
    }
    /// The last tick fully processed.
    pub fn now(&self) -> Tick {
        self.now
    }
    /// Schedules `key` at `due`; a due tick `<= now()` fires on the next advance.
    pub fn schedule(&mut self, key: TimerKey, due: Tick) {
        let _ = (key, due);
        todo!()
    }
    /// Notes that the owner of one scheduled entry bumped its generation.
    pub fn cancelled(&mut self) {
        todo!()
    }
    /// Fires due entries up to `to`, at most `max_fires`, carrying the rest.
    pub fn advance<F: FnMut(TimerKey) -> bool>(
        &mut self,
        to: Tick,
        max_fires: usize,
        is_live: F,
        out: &mut Vec<Fired>,
    ) -> usize {
        let _ = (to, max_fires, is_live, out);
        todo!()
    }
    /// The earliest tick at which `advance` may fire something.
    pub fn next_due(&self) -> Option<Tick> {
        todo!()
    }
    /// Current counters.
    pub fn stats(&self) -> WheelStats {
        todo!()
    }
}
