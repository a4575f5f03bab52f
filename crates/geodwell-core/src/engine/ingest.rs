//! Fix intake and application: classifying an arriving fix (late, duplicate, accepted), the
//! per-device reorder buffer, and bringing one device up to date ([`Engine::process_device`]).
//!
//! Invariants: a fix is applied only once `W >= ts`, and only after every internal event `< ts`
//! of its device's pairs has been processed, so a fix at exactly a deadline counts for it. A
//! device with nothing buffered applies a fix `<= W` at once, without a reorder block. Bringing a
//! device up to date is idempotent, so a stale wake-up (from `soon` or the wheel) is harmless.

use std::sync::Arc;

use crate::event::Event;
use crate::fences::Fence;
use crate::fix::Fix;
use crate::pairs::{Alive, FixClass, Pair, PairOutput};
use crate::time::Ts;

use super::records::{Buffered, DeviceSlot, NO_TICK, Reorder, pair_slots, pairs_of};
use super::{Engine, IngestError, Ingested};

impl Engine {
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
                device: Arc::from(fix.device.as_str()),
            });
        };
        let dev = &self.devices[d.index()];
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
            arrived: self.arrival,
        };
        if fix.ts <= w && !self.reorders.contains_key(&d) {
            // Nothing waits and the fix is not ahead of W: apply it without buffering it.
            self.process_device(d, Some(new), out);
            return Ok(Ingested::Accepted);
        }
        // Before anything of the device changes (a checkpoint in progress copies it first).
        self.mark_dirty(d);
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
                return Ok(Ingested::Accepted);
            }
            return Ok(Ingested::Duplicate);
        }
        if buffer.len() >= self.cfg.max_buffered_per_device {
            return Err(IngestError::BufferFull {
                device: Arc::from(fix.device.as_str()),
                max: self.cfg.max_buffered_per_device,
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

    /// Applies `first` (a fix `<= W` the caller did not buffer because nothing else waits) and
    /// every buffered fix `<= W` of device `d`, processes its pairs' internal events `< W` and
    /// reschedules its timers.
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
        self.catch_up(d, w, out);
        for p in pair_slots(&self.devices, &self.pairs, d) {
            self.resched_pair(d, p);
        }
        self.resched_device(d);
    }

    /// Processes internal events strictly before `bound` for every pair of device `d`.
    pub(super) fn catch_up(&mut self, d: DeviceSlot, bound: Ts, out: &mut Vec<Event>) {
        let last = self.devices[d.index()].last_applied();
        let id_at = self.devices[d.index()].id;
        for p in pair_slots(&self.devices, &self.pairs, d) {
            let (ids, pair) = (&self.ids, &mut self.pairs[p.index()]);
            let alive = match self.fences.get(pair.fence) {
                // The id is looked up only when an event is made: most steps make none.
                Some(fence) => pair.catch_up(&fence.settings, bound, last, &mut |o| {
                    out.push(to_event(o, ids.get(id_at), fence, None))
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
    fn apply(&mut self, d: DeviceSlot, b: Buffered, out: &mut Vec<Event>) {
        self.catch_up(d, b.ts, out);
        let dev = &mut self.devices[d.index()];
        dev.last_applied = b.ts.0;
        dev.last_position = [b.lat, b.lon];
        let ignored = |f: &Fence| matches!((b.accuracy, f.settings.max_accuracy_m), (Some(a), Some(max)) if a > max);

        let id_at = self.devices[d.index()].id;
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
                out.push(to_event(o, ids.get(id_at), fence, Some(&b)))
            });
            if alive == Alive::No {
                self.free_pair(d, p);
            }
        }

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
                || !fence.settings.devices.matches(self.ids.get(id_at))
                || !fence.contains(b.lon, b.lat)
            {
                continue;
            }
            let ids = &self.ids;
            let pair = Pair::start(idx, &fence.settings, b.ts, &mut |o| {
                out.push(to_event(o, ids.get(id_at), fence, Some(&b)))
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
