//! A deliberately naive reference implementation of `docs/semantics.md` sections 2-4, used as a
//! test oracle.
//!
//! It sees the whole trace at once and reads the rules directly: per device and fence it walks the
//! applied fixes in event-time order to find visits (debounce, hysteresis, accuracy filter, run
//! expiry), then judges every threshold of every visit on its own: deadline passed, EXIT not at or
//! before it, STALE from the device's full fix list, the EXIT run pending at the deadline and its
//! outcome, release of a STALE dwell by a later fix that does not count as outside. It shares no
//! code or state machine with [`crate::engine`], is quadratic in places, and is not for
//! production use.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::event::Event;
use crate::fences::{Fence, FenceSettings};
use crate::fix::Fix;
use crate::time::{Dur, Ts};

/// The events `docs/semantics.md` sections 2-4 define for `fixes` once the watermark has reached `w_final`
/// (every fix with `ts <= w_final` applied; fixes arrive within the lateness, so none is late).
/// Sorted by (device, fence, at, kind).
pub fn expected_events(fences: &[Arc<Fence>], fixes: &[Fix], w_final: Ts) -> Vec<Event> {
    let inputs: Vec<Input> = fixes.iter().cloned().map(Input::Fix).collect();
    expected_events_with_removals(fences, &inputs, w_final)
}

/// One input of a trace with device removals, in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A fix.
    Fix(Fix),
    /// `DELETE` of `device` while the watermark was `w`: the device's life so far ends there
    /// (its fixes up to `w` count, its visits end without EXIT, nothing of it fires later), and
    /// its later fixes start a new life from nothing.
    Remove {
        /// The device.
        device: Arc<str>,
        /// The watermark at the removal.
        w: Ts,
    },
}

/// [`expected_events`] for a trace in which devices are removed (docs/semantics.md, device
/// lifecycle): each life of a device (its fixes between removals, in arrival order) is judged
/// on its own, up to the watermark at the removal that ended it, or `w_final` for the last.
/// Idle expiry is not modeled: it must change no event, so a run with expiries is held to
/// exactly these events.
pub fn expected_events_with_removals(
    fences: &[Arc<Fence>],
    inputs: &[Input],
    w_final: Ts,
) -> Vec<Event> {
    // Per device, its lives: (fixes, watermark the life is judged up to).
    let mut lives: BTreeMap<Arc<str>, Vec<(Vec<&Fix>, Ts)>> = BTreeMap::new();
    for i in inputs {
        match i {
            Input::Fix(f) => {
                let l = lives.entry(Arc::from(f.device.as_str())).or_default();
                if l.is_empty() {
                    l.push((Vec::new(), w_final));
                }
                if let Some(last) = l.last_mut() {
                    last.0.push(f);
                }
            }
            Input::Remove { device, w } => {
                let l = lives.entry(device.clone()).or_default();
                if let Some(last) = l.last_mut() {
                    last.1 = *w;
                }
                l.push((Vec::new(), w_final));
            }
        }
    }
    let mut events = Vec::new();
    for (dev, l) in lives {
        for (fx, w_end) in l {
            let mut fx: Vec<&Fix> = fx.into_iter().filter(|f| f.ts <= w_end).collect();
            fx.sort_by(|a, b| a.order(b));
            fx.dedup_by(|b, a| a.ts == b.ts); // keeps the first in (ts, lat, lon) order
            for fence in fences {
                naive_pair(&dev, fence, &fx, w_end, &mut events, &mut None);
            }
        }
    }
    events.sort_by(|a, b| {
        (&a.device, &a.fence, a.at, a.kind, a.dwell_s)
            .cmp(&(&b.device, &b.fence, b.at, b.kind, b.dwell_s))
    });
    events
}

#[derive(Clone, Copy)]
struct Run1 {
    first: Ts,
    last: Ts,
    count: u8,
}

struct Visit {
    entered_at: Ts,
    /// The fix that confirmed the ENTER.
    enter_fix: Pos,
    /// (EXIT time, ts of the fix that confirmed it)
    exit: Option<(Ts, Ts)>,
    /// The fix that confirmed the EXIT.
    exit_fix: Option<Pos>,
}

/// A deciding fix's position: (lat, lon, accuracy).
type Pos = (f64, f64, Option<f64>);

fn pos(f: &Fix) -> Pos {
    (f.lat, f.lon, f.accuracy)
}

fn naive_pair(
    dev: &Arc<str>,
    fence: &Fence,
    all: &[&Fix],
    w_final: Ts,
    events: &mut Vec<Event>,
    expired: &mut Option<Ts>,
) {
    let s = &fence.settings;
    // A fence whose `devices` scope does not cover the device has nothing to do with it.
    if !s.devices.matches(dev) {
        return;
    }
    let cw = s.confirm_within;
    let ignored = |f: &Fix| matches!((f.accuracy, s.max_accuracy_m), (Some(a), Some(m)) if a > m);
    let fx: Vec<&Fix> = all.iter().copied().filter(|f| !ignored(f)).collect();
    let in_geom = |f: &Fix| fence.contains(f.lon, f.lat);
    let counts_outside = |f: &Fix| {
        let in_buffer = s.exit_buffer_m > 0.0 && fence.distance_m(f.lon, f.lat) <= s.exit_buffer_m;
        !in_geom(f) && !in_buffer
    };

    // Pass 1: visits, and after each fix the pair's (inside, run) state.
    let mut visits: Vec<Visit> = Vec::new();
    let mut after: Vec<(bool, Option<Run1>)> = Vec::new();
    let (mut inside, mut run): (bool, Option<Run1>) = (false, None);
    for f in &fx {
        if let Some(r) = run
            && f.ts.since(r.last) > cw
        {
            *expired = (*expired).max(Some(r.last.plus(cw)));
            run = None;
        }
        let push = |run: Option<Run1>| match run {
            Some(r) => Run1 {
                last: f.ts,
                count: r.count + 1,
                ..r
            },
            None => Run1 {
                first: f.ts,
                last: f.ts,
                count: 1,
            },
        };
        if inside {
            if counts_outside(f) {
                let r = push(run);
                if r.count >= s.exit_confirm {
                    let v = visits.last_mut().unwrap();
                    v.exit = Some((r.first, f.ts));
                    v.exit_fix = Some(pos(f));
                    inside = false;
                    run = None;
                } else {
                    run = Some(r);
                }
            } else {
                run = None;
            }
        } else if in_geom(f) {
            let r = push(run);
            if r.count >= s.enter_confirm {
                visits.push(Visit {
                    entered_at: r.first,
                    enter_fix: pos(f),
                    exit: None,
                    exit_fix: None,
                });
                inside = true;
                run = None;
            } else {
                run = Some(r);
            }
        } else {
            run = None;
        }
        after.push((inside, run));
    }
    if let Some(r) = run
        && r.last.plus(cw) < w_final
    {
        *expired = (*expired).max(Some(r.last.plus(cw)));
    }

    let name = fence.name.as_ref();
    for v in &visits {
        let (lat, lon, acc) = v.enter_fix;
        events.push(
            Event::enter(dev, &fence.id, v.entered_at, &s.tags)
                .named(name)
                .at_fix(lat, lon, acc),
        );
        if let (Some((x, _)), Some((lat, lon, acc))) = (v.exit, v.exit_fix) {
            events.push(
                Event::exit(dev, &fence.id, v.entered_at, x, &s.tags)
                    .named(name)
                    .at_fix(lat, lon, acc),
            );
        }
        for &dur in &s.dwell {
            if dwell_fires(v, dur, s, &fx, &after, all, w_final, &counts_outside) {
                events.push(Event::dwell(dev, &fence.id, v.entered_at, dur, &s.tags).named(name));
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn dwell_fires(
    v: &Visit,
    dur: Dur,
    s: &FenceSettings,
    fx: &[&Fix],
    after: &[(bool, Option<Run1>)],
    all: &[&Fix],
    w_final: Ts,
    counts_outside: &dyn Fn(&Fix) -> bool,
) -> bool {
    let d = v.entered_at.plus(dur);
    if d >= w_final {
        return false; // the deadline has not passed yet
    }
    if v.exit.is_some_and(|(x, _)| x <= d) {
        return false; // the visit was over by the deadline
    }
    // STALE: the device's latest fix (any fence, ignored or not) at or before d.
    let latest = all.iter().filter(|f| f.ts <= d).map(|f| f.ts).max();
    let released = match (s.stale_after, latest) {
        (None, _) => true,
        (Some(limit), Some(l)) => d.since(l) <= limit,
        (Some(_), None) => false,
    };
    // The EXIT run pending at d (only while the visit is confirmed inside at d).
    let k = fx
        .iter()
        .rposition(|f| f.ts <= d)
        .expect("the visit's first fix is <= d");
    let mut blocking = match after[k] {
        (true, Some(r)) if d <= r.last.plus(s.confirm_within) => Some(r),
        _ => None,
    };
    if blocking.is_none() && released {
        return true;
    }
    let end = v.exit.map(|(_, confirm)| confirm);
    for f in fx.iter().filter(|f| f.ts > d) {
        if let Some(r) = blocking
            && f.ts.since(r.last) > s.confirm_within
        {
            blocking = None; // the run expired before this fix
            if released {
                return true;
            }
        }
        if end.is_some_and(|e| f.ts >= e) {
            return false; // the visit ended (this fix confirmed its EXIT)
        }
        if counts_outside(f) {
            if let Some(r) = &mut blocking {
                r.last = f.ts;
            }
        } else {
            // A fix that does not count as outside breaks any run and releases a STALE dwell.
            return true;
        }
    }
    if let Some(r) = blocking
        && w_final > r.last.plus(s.confirm_within)
    {
        return released;
    }
    blocking.is_none() && released
}

/// One input of a trace delivered with delays: a fix with the watermark it arrived under, a
/// removal, or a move of the watermark alone (other devices' data, time passing).
#[derive(Debug, Clone, PartialEq)]
pub enum Arrival {
    /// A fix arriving while the watermark was `w` (raised to `w` first).
    Fix {
        /// The fix.
        fix: Fix,
        /// The watermark it arrived under.
        w: Ts,
    },
    /// `DELETE` of `device`, at the current watermark.
    Remove {
        /// The device.
        device: Arc<str>,
    },
    /// The watermark moves to `w` (if later).
    Advance {
        /// The new watermark.
        w: Ts,
    },
}

/// How a fix was taken, as the reference judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Buffered or applied.
    Accepted,
    /// More than `max_delay` behind the watermark (`max_delay` 0: behind it at all).
    TooOld,
    /// At or before its device's frontier.
    BehindDevice,
    /// Same `ts` as the latest applied or a buffered fix (and not first in (lat, lon) order).
    Duplicate,
}

/// The rules of `docs/semantics.md` section 2.5 for delayed data, read directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayRules {
    /// `time.max_delay` (0: any fix behind the watermark is late).
    pub max_delay: Dur,
    /// `time.delay_hold` (0: no hold).
    pub delay_hold: Dur,
}

/// One life of a device in [`expected_with_delays`].
#[derive(Default)]
struct Life {
    /// Applied fixes, in application (= ts) order.
    applied: Vec<Fix>,
    /// Fixes ahead of the watermark, by ts.
    buffered: BTreeMap<i64, Fix>,
    /// The watermark at which the delay hold ends (none: `Ts::MIN`).
    hold_until: Option<Ts>,
}

impl Life {
    /// The device's steps are processed up to this bound (strictly before it): the watermark,
    /// or its latest fix while the delay hold is on.
    fn bound(&self, w: Ts) -> Ts {
        match (self.hold_until, self.applied.last()) {
            (Some(h), Some(last)) if h > w => last.ts,
            _ => w,
        }
    }

    /// Applies every buffered fix at or before `w`.
    fn flush(&mut self, w: Ts) {
        while let Some((&ts, _)) = self.buffered.first_key_value() {
            if ts > w.0 {
                break;
            }
            let (_, f) = self.buffered.pop_first().unwrap();
            self.applied.push(f);
        }
    }

    /// The events of this life as of the bound `b`, and its frontier then.
    fn judge(&self, dev: &Arc<str>, fences: &[Arc<Fence>], b: Ts) -> (Vec<Event>, Option<Ts>) {
        let fx: Vec<&Fix> = self.applied.iter().collect();
        let mut events = Vec::new();
        let mut expired = None;
        for fence in fences {
            naive_pair(dev, fence, &fx, b, &mut events, &mut expired);
        }
        let decided = events
            .iter()
            .map(|e| e.at)
            .chain(self.applied.last().map(|f| f.ts))
            .chain(expired)
            .max();
        (events, decided)
    }
}

/// The events `docs/semantics.md` defines for `arrivals` under the delayed-data rules, once the
/// watermark has reached `w_final`, and each fix's outcome in arrival order. Each device's
/// frontier is recomputed from scratch at every arrival (the latest of its applied fixes, the
/// events its applied fixes give up to its bound, and the run expiries before it), so nothing
/// here shares the engine's bookkeeping. Sorted like [`expected_events`].
pub fn expected_with_delays(
    fences: &[Arc<Fence>],
    arrivals: &[Arrival],
    rules: DelayRules,
    w_final: Ts,
) -> (Vec<Event>, Vec<Outcome>) {
    let mut w = Ts::MIN;
    let mut lives: BTreeMap<Arc<str>, Life> = BTreeMap::new();
    // Removed devices: the frontier their tombstone holds.
    let mut tombs: BTreeMap<Arc<str>, Ts> = BTreeMap::new();
    let mut events = Vec::new();
    let mut outcomes = Vec::new();
    for a in arrivals {
        match a {
            Arrival::Advance { w: to } => w = w.max(*to),
            Arrival::Remove { device } => {
                let Some(mut life) = lives.remove(device) else {
                    continue;
                };
                life.flush(w);
                let (ev, _) = life.judge(device, fences, life.bound(w));
                events.extend(ev);
                if rules.max_delay > Dur::ZERO {
                    tombs.insert(device.clone(), w);
                }
            }
            Arrival::Fix { fix, w: at } => {
                w = w.max(*at);
                let dev: Arc<str> = Arc::from(fix.device.as_str());
                let o = take(fix, w, rules, fences, &dev, &mut lives, &tombs);
                outcomes.push(o);
            }
        }
    }
    w = w.max(w_final);
    for (dev, mut life) in lives {
        life.flush(w);
        let (ev, _) = life.judge(&dev, fences, life.bound(w));
        events.extend(ev);
    }
    events.sort_by(|a, b| {
        (&a.device, &a.fence, a.at, a.kind, a.dwell_s)
            .cmp(&(&b.device, &b.fence, b.at, b.kind, b.dwell_s))
    });
    (events, outcomes)
}

/// Judges one arriving fix at watermark `w` and takes it into its device's life.
fn take(
    fix: &Fix,
    w: Ts,
    rules: DelayRules,
    fences: &[Arc<Fence>],
    dev: &Arc<str>,
    lives: &mut BTreeMap<Arc<str>, Life>,
    tombs: &BTreeMap<Arc<str>, Ts>,
) -> Outcome {
    let too_old = if rules.max_delay > Dur::ZERO {
        fix.ts < w.minus(rules.max_delay)
    } else {
        fix.ts < w
    };
    if too_old {
        return Outcome::TooOld;
    }
    let life = lives.entry(dev.clone()).or_default();
    life.flush(w);
    let (_, decided) = life.judge(dev, fences, life.bound(w));
    let frontier = decided.max(tombs.get(dev).copied());
    if life.applied.last().is_some_and(|l| l.ts == fix.ts) {
        return Outcome::Duplicate;
    }
    if frontier.is_some_and(|f| fix.ts <= f) {
        if life.applied.is_empty() && life.buffered.is_empty() {
            lives.remove(dev);
        }
        return Outcome::BehindDevice;
    }
    if fix.ts > w {
        return match life.buffered.get(&fix.ts.0) {
            Some(b) if b.order(fix).is_le() => Outcome::Duplicate,
            _ => {
                life.buffered.insert(fix.ts.0, fix.clone());
                Outcome::Accepted
            }
        };
    }
    if fix.ts < w && rules.delay_hold > Dur::ZERO {
        let until = w.plus(rules.delay_hold);
        life.hold_until = Some(life.hold_until.map_or(until, |h| h.max(until)));
    }
    life.applied.push(fix.clone());
    Outcome::Accepted
}
