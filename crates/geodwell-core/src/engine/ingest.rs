//! Fix intake and application: classifying an arriving fix (late, duplicate, accepted), the
//! per-device reorder buffer and delay hold, and bringing one device up to date
//! ([`Engine::process_device`]).
//!
//! Invariants: a fix is applied only once `W >= ts`, and only after every internal event `< ts`
//! of its device's pairs has been processed, so a fix at exactly a deadline counts for it; a fix
//! is applied only after the device's frontier `F`, so it contradicts nothing emitted. A device
//! with nothing buffered applies a fix `<= W` at once, without a reorder block. While a
//! device's delay hold is on, its steps stop at its latest fix. Every event a device emits and
//! every run expiry it processes raises its frontier. Bringing a device up to date is
//! idempotent, so a stale wake-up (from `soon` or the wheel) is harmless.

use std::sync::Arc;

use crate::event::Event;
use crate::fences::Fence;
use crate::fix::Fix;
use crate::pairs::{Alive, FixClass, Pair, PairOutput};
use crate::time::Ts;

use super::records::{Buffered, DeviceSlot, NO_PAIR, NO_TS, Reorder, pair_slots, pairs_of};
use super::{DELAYED_KEPT, DelayedFix, Engine, IngestError, Ingested, LateReason};

impl Engine {
    /// Takes one fix that arrived when the watermark was `w`. The engine first advances to `w`
    /// (events go to `out`), then classifies the fix, buffers it, and applies it at once if
    /// `ts <= W`.
    pub fn ingest(
        &mut self,
        fix: &Fix,
        w: Ts,
        out: &mut Vec<Event>,
    ) -> Result<Ingested, IngestError> {
        self.advance(w, out);
        let w = self.watermark.unwrap_or(w);
        let outcome = self.classify_and_take(fix, w, out)?;
        if fix.ts < w {
            self.remember_delayed(fix, w, outcome);
        }
        Ok(outcome)
    }

    fn classify_and_take(
        &mut self,
        fix: &Fix,
        w: Ts,
        out: &mut Vec<Event>,
    ) -> Result<Ingested, IngestError> {
        let too_old = if self.cfg.max_delay > crate::time::Dur::ZERO {
            fix.ts < w.minus(self.cfg.max_delay)
        } else {
            fix.ts < w
        };
        if too_old {
            return Ok(Ingested::Late(LateReason::TooOld));
        }
        let Some(d) = self.device_slot(&fix.device) else {
            return Err(IngestError::TooManyDevices {
                device: Arc::from(fix.device.as_str()),
            });
        };
        // The device's frontier must be what the watermark makes it, whether or not the wheel
        // has got to the device's due work yet (a fire cap can carry it to a later step): so
        // the same input is judged the same way whatever the cap.
        if self.has_due_work(d, w) {
            self.process_device(d, None, out);
        }
        let dev = &self.devices[d.index()];
        if dev.last_applied() == Some(fix.ts) {
            return Ok(Ingested::Duplicate);
        }
        if dev.frontier().is_some_and(|f| fix.ts <= f) {
            return Ok(Ingested::Late(LateReason::BehindDevice));
        }
        let new = Buffered {
            ts: fix.ts,
            lat: fix.lat,
            lon: fix.lon,
            accuracy: fix.accuracy,
            arrived: self.arrival,
        };
        if fix.ts < w {
            // Behind the watermark, after the frontier: applied now in the device's own event
            // time (every buffered fix of the device is after W, so after this one), and the
            // device waits a while for the rest of its queue.
            self.hold(d, w);
        }
        if fix.ts <= w && !self.reorders.contains_key(&d) {
            // Nothing waits and the fix is not ahead of W: apply it without buffering it.
            self.process_device(d, Some(new), out);
            return Ok(Ingested::Accepted);
        }
        // Before anything of the device changes (a checkpoint in progress copies it first).
        self.mark_dirty(d);
        let max_buffered = self.cfg.max_buffered_per_device;
        let reorder = self.reorder_of(d);
        let buffer = &mut reorder.fixes;
        let pos = buffer.partition_point(|b| b.ts < fix.ts);
        if let Some(existing) = buffer.get_mut(pos)
            && existing.ts == fix.ts
        {
            // Of fixes sharing a ts, the first in (lat, lon) order is kept, whatever arrived first.
            if existing.key_cmp(fix.ts, fix.lat, fix.lon).is_gt() {
                *existing = new;
                return Ok(Ingested::Accepted);
            }
            return Ok(Ingested::Duplicate);
        }
        if buffer.len() >= max_buffered {
            return Err(IngestError::BufferFull {
                device: Arc::from(fix.device.as_str()),
                max: max_buffered,
            });
        }
        buffer.insert(pos, new);
        self.buffered += 1;
        if fix.ts <= w {
            self.process_device(d, None, out);
        } else {
            self.resched_device(d);
        }
        Ok(Ingested::Accepted)
    }

    /// Whether device `d` has work the watermark `w` has made due that is not done yet: a
    /// buffered fix at or before `w`, or (off its delay hold) a step of a pair before `w`.
    fn has_due_work(&self, d: DeviceSlot, w: Ts) -> bool {
        match self.reorders.get(&d) {
            Some(r) if r.fixes.first().is_some_and(|b| b.ts <= w) => return true,
            Some(r) if r.held_at(w) => return false,
            _ => {}
        }
        self.devices[d.index()].first_pair != NO_PAIR
            && pairs_of(&self.devices, &self.pairs, d).any(|p| {
                let pair = &self.pairs[p.index()];
                self.fences
                    .get(pair.fence)
                    .and_then(|f| pair.next_internal(&f.settings))
                    .is_some_and(|t| t < w)
            })
    }

    /// The reorder block of device `d`, made when it has none.
    fn reorder_of(&mut self, d: DeviceSlot) -> &mut Reorder {
        self.reorders.entry(d).or_insert_with(|| {
            self.flush_gens = self.flush_gens.wrapping_add(1);
            Reorder::new(self.flush_gens)
        })
    }

    /// Puts device `d` on (or extends) its delay hold: a fix of it was taken behind the
    /// watermark `w`, so its steps stay at its latest fix until `W >= w + delay_hold`.
    fn hold(&mut self, d: DeviceSlot, w: Ts) {
        if self.cfg.delay_hold <= crate::time::Dur::ZERO {
            return;
        }
        self.mark_dirty(d);
        let until = w.plus(self.cfg.delay_hold).0;
        let r = self.reorder_of(d);
        r.hold_until = r.hold_until.max(until);
    }

    /// Keeps a fix that arrived behind the watermark for the device view (the newest
    /// [`DELAYED_KEPT`] of the engine).
    fn remember_delayed(&mut self, fix: &Fix, w: Ts, outcome: Ingested) {
        let late = match outcome {
            Ingested::Late(r) => Some(r),
            Ingested::Accepted => None,
            Ingested::Duplicate => return,
        };
        let Some(d) = self.device_ids.get(&self.ids, &fix.device) else {
            return;
        };
        if self.delayed.len() >= DELAYED_KEPT {
            self.delayed.pop_front();
        }
        self.delayed.push_back((
            d,
            DelayedFix {
                ts: fix.ts,
                behind: w.since(fix.ts),
                late,
            },
        ));
    }

    /// Applies `first` (a fix `<= W` the caller did not buffer because nothing else waits) and
    /// every buffered fix `<= W` of device `d`, processes its pairs' internal events `< W` (not
    /// while its delay hold is on) and reschedules its timers.
    pub(super) fn process_device(
        &mut self,
        d: DeviceSlot,
        first: Option<Buffered>,
        out: &mut Vec<Event>,
    ) {
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
        let held = match self.reorders.get_mut(&d) {
            Some(r) if r.held_at(w) => true,
            Some(r) => {
                r.hold_until = NO_TS;
                false
            }
            None => false,
        };
        if !held {
            self.catch_up(d, w, out);
        }
        for p in pair_slots(&self.devices, &self.pairs, d) {
            self.resched_pair(d, p);
        }
        self.resched_device(d);
    }

    /// Processes internal events strictly before `bound` for every pair of device `d`, raising
    /// its frontier by what they decide.
    pub(super) fn catch_up(&mut self, d: DeviceSlot, bound: Ts, out: &mut Vec<Event>) {
        let last = self.devices[d.index()].last_applied();
        let id_at = self.devices[d.index()].id;
        let mut decided = Ts(NO_TS);
        for p in pair_slots(&self.devices, &self.pairs, d) {
            let (ids, pair) = (&self.ids, &mut self.pairs[p.index()]);
            let alive = match self.fences.get(pair.fence) {
                // The id is looked up only when an event is made: most steps make none.
                Some(fence) => {
                    let step = pair.catch_up(&fence.settings, bound, last, &mut |o| {
                        decided = decided.max(o.at());
                        out.push(to_event(o, ids.get(id_at), fence, None))
                    });
                    if let Some(e) = step.expired {
                        decided = decided.max(e);
                    }
                    step.alive
                }
                None => Alive::No,
            };
            if alive == Alive::No {
                self.free_pair(d, p);
            }
        }
        self.devices[d.index()].raise_frontier(decided);
    }

    /// Applies one fix to device `d`: first its pairs' earlier internal events, then the fix to
    /// every pair it already has and to every fence whose exact test it passes.
    fn apply(&mut self, d: DeviceSlot, b: Buffered, out: &mut Vec<Event>) {
        self.rejudge_from(d, b.ts);
        self.catch_up(d, b.ts, out);
        let dev = &mut self.devices[d.index()];
        dev.last_applied = b.ts.0;
        dev.raise_frontier(b.ts);
        dev.last_position = [b.lat, b.lon];
        let ignored = |f: &Fence| matches!((b.accuracy, f.settings.max_accuracy_m), (Some(a), Some(max)) if a > max);

        let id_at = self.devices[d.index()].id;
        let mut decided = b.ts;
        for p in pair_slots(&self.devices, &self.pairs, d) {
            let (ids, pair) = (&self.ids, &mut self.pairs[p.index()]);
            let Some(fence) = self.fences.get(pair.fence) else {
                self.free_pair(d, p);
                continue;
            };
            if ignored(fence) {
                continue;
            }
            // A device the fence's scope no longer covers is outside it, as if the geometry
            // had moved away.
            let class = if fence.settings.devices.matches(ids.get(id_at)) {
                classify(fence, pair.is_inside(), b.lon, b.lat)
            } else {
                FixClass::Outside
            };
            let alive = pair.on_fix(&fence.settings, b.ts, class, &mut |o| {
                decided = decided.max(o.at());
                out.push(to_event(o, ids.get(id_at), fence, Some(&b)))
            });
            if alive == Alive::No {
                self.free_pair(d, p);
            }
        }
        self.start_pairs(d, &b, &ignored, out);
        self.devices[d.index()].raise_frontier(decided);
    }

    /// Before a fix at `ts` is applied to device `d`: its pairs take back the judgement of
    /// every deadline at or after `ts` (a fix that arrived behind the watermark; for any other
    /// fix there is none).
    fn rejudge_from(&mut self, d: DeviceSlot, ts: Ts) {
        for p in pair_slots(&self.devices, &self.pairs, d) {
            let pair = &mut self.pairs[p.index()];
            if let Some(fence) = self.fences.get(pair.fence) {
                pair.rejudge_from(&fence.settings, ts);
            }
        }
    }

    /// Starts a pair of device `d` with every fence the fix `b` is inside that the device has
    /// no pair with yet.
    fn start_pairs(
        &mut self,
        d: DeviceSlot,
        b: &Buffered,
        ignored: &impl Fn(&Fence) -> bool,
        out: &mut Vec<Event>,
    ) {
        let id_at = self.devices[d.index()].id;
        let mut candidates = std::mem::take(&mut self.candidates);
        candidates.clear();
        self.fences.candidates(b.lon, b.lat, &mut candidates);
        for &idx in &candidates {
            let has_pair =
                pairs_of(&self.devices, &self.pairs, d).any(|p| self.pairs[p.index()].fence == idx);
            if has_pair {
                continue;
            }
            let Some(fence) = self.fences.get(idx) else {
                continue;
            };
            if ignored(fence)
                || fence.active_since.is_some_and(|since| b.ts < since)
                || !fence.settings.devices.matches(self.ids.get(id_at))
                || !fence.contains(b.lon, b.lat)
            {
                continue;
            }
            let ids = &self.ids;
            let pair = Pair::start(idx, &fence.settings, b.ts, &mut |o| {
                out.push(to_event(o, ids.get(id_at), fence, Some(b)))
            });
            self.insert_pair(d, pair);
        }
        self.candidates = candidates;
    }
}

/// How a fix at (lon, lat) relates to `fence` for a pair that is `inside` it or not: the exit
/// buffer only counts for a pair with an open visit.
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

/// The event a pair's output stands for, for `device` and `fence`; `fix` is the fix being
/// applied, if any (ENTER and EXIT are only ever decided by one, and carry its position).
#[inline]
pub(super) fn to_event(
    o: PairOutput,
    device: &str,
    fence: &Fence,
    fix: Option<&Buffered>,
) -> Event {
    let device = &device;
    let tags = &fence.settings.tags;
    let e = match o {
        PairOutput::Enter { entered_at } => Event::enter(device, &fence.id, entered_at, tags),
        PairOutput::Exit { entered_at, at } => Event::exit(device, &fence.id, entered_at, at, tags),
        PairOutput::Dwell {
            entered_at,
            threshold,
        } => {
            return Event::dwell(device, &fence.id, entered_at, threshold, tags)
                .named(fence.name.as_ref());
        }
    };
    let e = e.named(fence.name.as_ref());
    match fix {
        Some(b) => {
            let mut e = e.at_fix(b.lat, b.lon, b.accuracy);
            e.arrived = b.arrived;
            e
        }
        None => e,
    }
}
