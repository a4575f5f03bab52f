//! Time-driven work: raising the watermark, the wheel entries that wake devices up, and the
//! small exact-time heap (`soon`) for work that becomes ready inside the current tick.
//!
//! A wheel entry belongs to a pair (its next internal event) or to a device (its reorder-flush
//! timer, for the earliest buffered fix). Invariants:
//! - each owner has at most one live entry: the one carrying its current generation while its
//!   record says a timer is armed; rescheduling or freeing bumps the generation, so the old entry
//!   is a tombstone that `entry_live` rejects and the wheel drops;
//! - an entry sits in the tick holding the exact instant its work becomes ready (an internal
//!   event at `t` is ready at `t + 1 ms`, a buffered fix at its `ts`); the wheel fires it at the
//!   start of that tick, and work ready later in the tick waits in `soon`, so nothing is
//!   processed before its exact time.

use std::cmp::Reverse;

use crate::event::Event;
use crate::pairs::Pair;
use crate::time::{Dur, Tick, Ts};
use crate::wheel::TimerKey;

use super::records::{
    DeviceSlot, MAX_DEVICE_SLOTS, MAX_PAIR_SLOTS, NO_TICK, PairSlot, Reorders, pair_device,
};
use super::{Advanced, Engine};

/// Set in a wheel entry's [`TimerKey::slot`] when the entry is a device's reorder-flush timer,
/// the other bits being the device slot; clear when it is a pair's timer, the slot being the pair
/// slot. Both kinds of slot stay below it ([`MAX_DEVICE_SLOTS`], [`MAX_PAIR_SLOTS`]).
const FLUSH_TIMER_FLAG: u32 = 1 << 31;

const _: () = assert!(MAX_DEVICE_SLOTS <= FLUSH_TIMER_FLAG && MAX_PAIR_SLOTS <= FLUSH_TIMER_FLAG);

/// The record a wheel entry belongs to, as its [`TimerKey::slot`] encodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerOwner {
    /// A pair's timer, for its next internal event.
    Pair(PairSlot),
    /// A device's reorder-flush timer, for its earliest buffered fix.
    Flush(DeviceSlot),
}

impl TimerOwner {
    /// Decodes the owner of the entry `key`.
    #[inline]
    fn of(key: TimerKey) -> TimerOwner {
        if key.slot & FLUSH_TIMER_FLAG != 0 {
            TimerOwner::Flush(DeviceSlot(key.slot & !FLUSH_TIMER_FLAG))
        } else {
            TimerOwner::Pair(PairSlot(key.slot))
        }
    }

    /// The key of an entry of this owner carrying `generation`.
    #[inline]
    fn key(self, generation: u32) -> TimerKey {
        let slot = match self {
            TimerOwner::Pair(p) => p.0,
            TimerOwner::Flush(d) => d.0 | FLUSH_TIMER_FLAG,
        };
        TimerKey { slot, generation }
    }
}

impl Engine {
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

    /// Raises the watermark to `w` (a lower `w` is ignored, but still drains carried timers) and
    /// processes everything now due. Events go to `out`.
    pub fn advance(&mut self, w: Ts, out: &mut Vec<Event>) -> Advanced {
        let w = self.watermark.map_or(w, |cur| cur.max(w));
        self.watermark = Some(w);
        let to = self.clock.completed_tick(w);
        self.fired.clear();
        let (pairs, reorders) = (&self.pairs, &self.reorders);
        let cap = self
            .step_fires
            .map_or(self.cfg.max_fires_per_advance, |left| {
                left.min(self.cfg.max_fires_per_advance)
            });
        let fired =
            self.wheel
                .advance(to, cap, |k| entry_live(k, pairs, reorders), &mut self.fired);
        if let Some(left) = &mut self.step_fires {
            *left = left.saturating_sub(fired);
        }
        // First mark every fired entry consumed, so that rescheduling while processing never
        // counts an entry that already left the wheel as a tombstone. Entries fire at the start
        // of the tick holding their ready time; one whose exact ready time is still ahead waits
        // in `soon` for the rest of the tick.
        self.due_devices.clear();
        for i in 0..self.fired.len() {
            let key = self.fired[i].key;
            let (d, ready) = match TimerOwner::of(key) {
                TimerOwner::Flush(d) => (
                    d,
                    self.reorders.get_mut(&d).and_then(|r| {
                        r.flush_due = NO_TICK;
                        r.ready()
                    }),
                ),
                TimerOwner::Pair(slot) => {
                    let p = &mut self.pairs[slot.index()];
                    p.set_timer(None, 0);
                    let ready = self
                        .fences
                        .get(p.fence)
                        .and_then(|f| p.next_internal(&f.settings))
                        .map(|t| t.plus(Dur(1)));
                    (pair_device(&self.pairs, slot), ready)
                }
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

    /// Drops cancelled wheel entries ahead of the next ticks, examining at most `budget`: the
    /// driver calls it between ticks so that ticks only meet live entries (the same total work,
    /// without the pause). Changes nothing observable.
    pub fn sweep(&mut self, budget: usize) -> usize {
        let (pairs, reorders) = (&self.pairs, &self.reorders);
        self.wheel.sweep(budget, |k| entry_live(k, pairs, reorders))
    }

    /// Puts pair `slot` (of device `d`) on the wheel at its next internal event; a pair of a
    /// device on its delay hold is parked (no entry: the device's own timer brings it back when
    /// the hold ends, so nothing wakes for steps the hold keeps waiting).
    pub(super) fn resched_pair(&mut self, d: DeviceSlot, slot: PairSlot) {
        let held = match (self.watermark, self.reorders.get(&d)) {
            (Some(w), Some(r)) => r.held_at(w),
            _ => false,
        };
        let pair = &mut self.pairs[slot.index()];
        let Some(fence) = self.fences.get(pair.fence) else {
            return;
        };
        // An internal event at t is processed once the watermark passes t: it is ready at
        // t + 1 ms. The wheel entry goes in the tick holding that instant; the current tick's
        // work waits in `soon`, ordered by exact time.
        let ready = if held {
            None
        } else {
            pair.next_internal(&fence.settings).map(|t| t.plus(Dur(1)))
        };
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
            self.wheel
                .schedule(TimerOwner::Pair(slot).key(pair.timer_gen), Tick(due));
        }
    }

    /// Puts device `d`'s flush timer at its earliest buffered fix or the end of its delay hold,
    /// and drops the reorder block once nothing waits in it and no hold is on.
    pub(super) fn resched_device(&mut self, d: DeviceSlot) {
        let Some(reorder) = self.reorders.get_mut(&d) else {
            return;
        };
        let now = self.wheel.now().0;
        let due = match reorder.ready().map(|r| (r, self.clock.completed_tick(r).0)) {
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
                self.wheel
                    .schedule(TimerOwner::Flush(d).key(reorder.flush_gen), Tick(due));
            }
        }
        if reorder.is_idle() && reorder.flush_due == NO_TICK {
            // An idle device keeps no reorder block: one per parked device would cost ~170 MB
            // at a million devices.
            self.reorders.remove(&d);
        }
    }
}

/// Whether a wheel entry is still its owner's current timer.
fn entry_live(k: TimerKey, pairs: &[Pair], reorders: &Reorders) -> bool {
    match TimerOwner::of(k) {
        TimerOwner::Flush(d) => reorders
            .get(&d)
            .is_some_and(|r| r.flush_gen == k.generation && r.flush_due != NO_TICK),
        TimerOwner::Pair(slot) => {
            let p = &pairs[slot.index()];
            p.timer_gen == k.generation && p.has_timer()
        }
    }
}
