//! The device-fence pair record and its state machine (`docs/semantics.md` section 3).
//!
//! A [`Pair`] exists while a (device, fence) pair has state worth keeping: a pending ENTER run, or
//! an open visit (INSIDE, possibly with a pending EXIT run). A pair with neither is dropped by the
//! engine, so the number of records tracks devices near or inside fences, not devices times fences.
//!
//! Time model. The pair sees two kinds of input, always in event-time order per device:
//! - fixes ([`Pair::on_fix`]), classified geometrically by the engine, and
//! - *internal events* with a time of their own: dwell deadlines `entered_at + D` and the expiry of
//!   a pending confirmation run at `vote_last + confirm_within`. [`Pair::catch_up`] processes those
//!   with time **strictly before** a bound: before a fix at `ts` the bound is `ts` (so a fix at
//!   exactly a deadline is applied first and counts for it), and on a watermark advance the bound is
//!   `W` (a fix at `ts == W` is not late, so time `W` itself is not final yet).
//!
//! Dwell rule, per threshold `j` of a visit (bit `j` of the masks):
//! - it is *evaluated* once time passes its deadline `d_j`; evaluation snapshots whether the device
//!   was STALE at `d_j` (its latest applied fix, any fence, older than `stale_after`). At that moment
//!   every fix `<= d_j` of the device has been applied and none later, so `last_applied` is exactly
//!   "the latest fix at or before `d_j`".
//! - it *fires* (at = `d_j`) once evaluated, not yet fired, not STALE (or released by a later fix
//!   that does not count as outside), and not held by a pending EXIT run whose first outside fix is
//!   `<= d_j`. An EXIT ends the visit and with it every unfired threshold.
//! - during a pending ENTER run (`enter_confirm > 1`) deadlines are evaluated tentatively from the
//!   run's first fix, so that a late confirmation fires the thresholds it has already passed with
//!   the staleness they had at their deadline.

use crate::fences::FenceIdx;
use crate::fences::FenceSettings;
use crate::time::{Dur, Ts};
use packed::Ts48;

/// How one fix relates to one fence, as classified by the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixClass {
    /// Inside the fence (boundary inclusive).
    Inside,
    /// Outside the fence but within its `exit_buffer_m`: outside for ENTER, inside for EXIT.
    Buffer,
    /// Outside the fence and beyond its exit buffer.
    Outside,
}

/// What a pair asks the engine to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairOutput {
    /// ENTER of the visit starting at `entered_at`.
    Enter {
        /// First inside fix of the confirmed run.
        entered_at: Ts,
    },
    /// EXIT at `at` of the visit starting at `entered_at`.
    Exit {
        /// Visit start.
        entered_at: Ts,
        /// First outside fix of the confirmed run.
        at: Ts,
    },
    /// DWELL of `threshold` for the visit starting at `entered_at`.
    Dwell {
        /// Visit start.
        entered_at: Ts,
        /// The threshold reached.
        threshold: Dur,
    },
}

impl PairOutput {
    /// The event time the output stands for: ENTER's visit start, EXIT's `at`, DWELL's
    /// deadline.
    pub fn at(&self) -> Ts {
        match *self {
            PairOutput::Enter { entered_at } => entered_at,
            PairOutput::Exit { at, .. } => at,
            PairOutput::Dwell {
                entered_at,
                threshold,
            } => entered_at.plus(threshold),
        }
    }
}

/// What [`Pair::catch_up`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaughtUp {
    /// Whether the record still holds state.
    pub alive: Alive,
    /// The latest run expiry it processed, if any: a decision a later fix must not contradict.
    pub expired: Option<Ts>,
}

/// Whether a pair still holds state after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alive {
    /// Keep the record.
    Yes,
    /// The record holds nothing any more (OUTSIDE, no pending run): drop it.
    No,
}

/// A device-fence pair record: 40 bytes, one per live pair, so its size is a large part of what
/// a live pair costs. There is no `device` field: the engine threads a device's pairs into a
/// list through `link`, whose last element names the device. The three times are 48-bit values
/// (`Ts48`: every valid [`Ts`] is below 2^48 ms), the timer's due tick is kept as its low 24
/// bits (see [`Pair::timer_is`]), and the open-visit flag is the top bit of the vote count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// The next pair slot of the same device or, for the device's last pair, the device slot
    /// with the engine's list-end tag. Owned by the engine (`engine::records`).
    pub(crate) link: u32,
    /// The fence.
    pub fence: FenceIdx,
    /// Generation of this record's timer: a wheel entry is live only while it carries this value.
    /// Owned by the engine, which bumps it whenever it replaces or drops the entry.
    pub(crate) timer_gen: u32,
    /// The outstanding wheel entry: the low 24 bits of its due tick and, above them, its
    /// [`TimerState`] (see [`Pair::timer_is`]).
    timer: u32,
    /// Visit start while INSIDE; the pending ENTER run's first fix while OUTSIDE.
    entered: Ts48,
    /// First and last fix of the pending run (ENTER run when OUTSIDE, EXIT run when INSIDE).
    first: Ts48,
    last: Ts48,
    /// Thresholds already emitted in this visit.
    fired: u16,
    /// Evaluated thresholds that were STALE at their deadline and not yet released by a fix.
    stale: u16,
    /// Length of the pending run (0 = none; at most `MAX_CONFIRM` < 128) and, in the top bit,
    /// whether a visit is open.
    votes_inside: u8,
    /// Thresholds `0..evaluated` have had their deadline pass.
    evaluated: u8,
}

/// The top bit of `Pair::votes_inside`.
const INSIDE: u8 = 0x80;

/// The durable part of a pair record: its visit, pending run, and per-threshold state. The
/// record's place in memory and its timer are not stored: the timer is derived from the state
/// ([`Pair::next_internal`]) when the record is restored. Stored as part of the engine's
/// `DeviceState`; like it, serde-serializable only under test.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(test, derive(serde::Serialize, serde::Deserialize))]
pub struct PairState {
    /// Visit start (or pending ENTER run start), Unix ms.
    pub entered_at: i64,
    /// First fix of the pending run, Unix ms.
    pub vote_first: i64,
    /// Last fix of the pending run, Unix ms.
    pub vote_last: i64,
    /// Length of the pending run.
    pub votes: u8,
    /// Whether a visit is open.
    pub inside: bool,
    /// Thresholds whose deadline has been evaluated.
    pub evaluated: u8,
    /// Thresholds fired in this visit (bit per threshold).
    pub fired: u16,
    /// Evaluated thresholds waiting because the device was STALE (bit per threshold).
    pub stale: u16,
}

/// A read-only view of a pair's state, for APIs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairView {
    /// `"inside"`, `"entering"` (pending ENTER run) or `"inside"` with `exit_votes > 0`.
    pub inside: bool,
    /// Visit start (or pending run start when not inside).
    pub entered_at: Ts,
    /// Length of the pending run (ENTER run when outside, EXIT run when inside).
    pub votes: u8,
    /// Thresholds emitted in this visit.
    pub fired: Vec<Dur>,
    /// Thresholds whose deadline passed while the device was STALE and still wait for a fix.
    pub waiting_stale: Vec<Dur>,
    /// The next internal event time (deadline or run expiry), if any.
    pub next_due: Option<Ts>,
}

impl Pair {
    fn votes(&self) -> u8 {
        self.votes_inside & !INSIDE
    }

    fn set_votes(&mut self, votes: u8) {
        debug_assert!(votes < INSIDE);
        self.votes_inside = (self.votes_inside & INSIDE) | votes.min(INSIDE - 1);
    }

    /// Marks a freed record as holding no visit, so that walks over every pair slot (occupancy)
    /// never count it. Owned by the engine, which calls it when it frees the slot.
    pub(crate) fn clear_visit(&mut self) {
        self.votes_inside = 0;
    }

    fn set_inside(&mut self, inside: bool) {
        self.votes_inside = self.votes() | if inside { INSIDE } else { 0 };
    }

    /// A pair that has just seen its first inside fix at `ts`. Emits ENTER at once when
    /// `enter_confirm <= 1`.
    pub fn start(
        fence: FenceIdx,
        s: &FenceSettings,
        ts: Ts,
        out: &mut impl FnMut(PairOutput),
    ) -> Pair {
        let t = Ts48::new(ts);
        let mut p = Pair {
            link: 0,
            fence,
            timer_gen: 0,
            timer: 0,
            entered: t,
            first: t,
            last: t,
            votes_inside: 1,
            evaluated: 0,
            fired: 0,
            stale: 0,
        };
        if p.votes() >= s.enter_confirm.max(1) {
            p.confirm_enter(s, out);
        }
        p
    }

    /// The durable state of this record.
    pub fn state(&self) -> PairState {
        PairState {
            entered_at: self.entered.get().0,
            vote_first: self.first.get().0,
            vote_last: self.last.get().0,
            votes: self.votes(),
            inside: self.is_inside(),
            evaluated: self.evaluated,
            fired: self.fired,
            stale: self.stale,
        }
    }

    /// Rebuilds a record from its durable state. Per-threshold state beyond the fence's current
    /// thresholds is dropped (the fence may have changed while the state was stored).
    pub fn from_state(fence: FenceIdx, st: &PairState, s: &FenceSettings) -> Pair {
        let n = s.dwell.len().min(16);
        let mask = if n >= 16 { u16::MAX } else { (1u16 << n) - 1 };
        let mut p = Pair {
            link: 0,
            fence,
            timer_gen: 0,
            timer: 0,
            entered: Ts48::new(Ts(st.entered_at)),
            first: Ts48::new(Ts(st.vote_first)),
            last: Ts48::new(Ts(st.vote_last)),
            votes_inside: 0,
            evaluated: st.evaluated.min(n as u8),
            fired: st.fired & mask,
            stale: st.stale & mask,
        };
        p.set_votes(st.votes.min(INSIDE - 1));
        p.set_inside(st.inside);
        p
    }

    /// Whether a visit is open.
    pub fn is_inside(&self) -> bool {
        self.votes_inside & INSIDE != 0
    }

    /// Visit start (or pending ENTER run start).
    pub fn entered_at(&self) -> Ts {
        self.entered.get()
    }

    fn deadline(&self, s: &FenceSettings, j: usize) -> Ts {
        self.entered.get().plus(s.dwell[j])
    }

    fn expiry(&self, s: &FenceSettings) -> Option<Ts> {
        (self.votes() > 0).then(|| self.last.get().plus(s.confirm_within))
    }

    fn next_deadline(&self, s: &FenceSettings) -> Option<Ts> {
        let j = self.evaluated as usize;
        (j < s.dwell.len()).then(|| self.deadline(s, j))
    }

    /// The time of the next internal event (deadline or run expiry). It is processed once the
    /// bound passes it, so the wheel should fire at the first tick ending after it.
    pub fn next_internal(&self, s: &FenceSettings) -> Option<Ts> {
        match (self.next_deadline(s), self.expiry(s)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Processes internal events with time strictly before `bound`, in time order.
    /// `last_applied` is the device's latest applied fix time.
    pub fn catch_up(
        &mut self,
        s: &FenceSettings,
        bound: Ts,
        last_applied: Option<Ts>,
        out: &mut impl FnMut(PairOutput),
    ) -> CaughtUp {
        let mut expired = None;
        loop {
            let d = self.next_deadline(s).filter(|&d| d < bound);
            let e = self.expiry(s).filter(|&e| e < bound);
            match (d, e) {
                // A deadline at the same instant as a run expiry is evaluated first: at that
                // instant the run is still valid (a gap equal to confirm_within counts).
                (Some(d), None) => self.evaluate(s, d, last_applied, out),
                (Some(d), Some(e)) if d <= e => self.evaluate(s, d, last_applied, out),
                (_, Some(e)) => {
                    // The pending run expired: no confirming fix came within confirm_within.
                    expired = Some(e);
                    self.set_votes(0);
                    if !self.is_inside() {
                        return CaughtUp {
                            alive: Alive::No,
                            expired,
                        };
                    }
                    self.try_fire(s, out);
                }
                (None, None) => {
                    return CaughtUp {
                        alive: Alive::Yes,
                        expired,
                    };
                }
            }
        }
    }

    /// Takes back the evaluation of every threshold whose deadline is at or after `ts`, before a
    /// fix at `ts` that arrived after the watermark had passed those deadlines is applied: they
    /// were judged without it, and are judged again once time passes them. None of them has
    /// fired (a fired deadline is at or before the device's frontier, and such a fix is after
    /// it), so this changes no emitted event.
    pub fn rejudge_from(&mut self, s: &FenceSettings, ts: Ts) {
        let keep = (0..self.evaluated as usize)
            .take_while(|&j| self.deadline(s, j) < ts)
            .count();
        if keep == self.evaluated as usize {
            return;
        }
        let kept = if keep >= 16 {
            u16::MAX
        } else {
            (1u16 << keep) - 1
        };
        debug_assert_eq!(
            self.fired & !kept,
            0,
            "a fired threshold at or after a fix that is after the frontier"
        );
        self.stale &= kept;
        self.fired &= kept;
        self.evaluated = keep as u8;
    }

    /// Evaluates the next threshold at its deadline `d`: snapshot staleness, then fire if free.
    fn evaluate(
        &mut self,
        s: &FenceSettings,
        d: Ts,
        last_applied: Option<Ts>,
        out: &mut impl FnMut(PairOutput),
    ) {
        debug_assert!(
            last_applied.is_none_or(|l| l <= d),
            "a fix after a deadline was applied before the deadline was evaluated"
        );
        let stale = match (s.stale_after, last_applied) {
            (Some(limit), Some(last)) => d.since(last) > limit,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if stale {
            self.stale |= 1 << self.evaluated;
        }
        self.evaluated += 1;
        self.try_fire(s, out);
    }

    /// Applies one fix at `ts` (after [`Pair::catch_up`] to `ts`). Fixes ignored for this fence
    /// (accuracy filter) must not be passed here.
    pub fn on_fix(
        &mut self,
        s: &FenceSettings,
        ts: Ts,
        class: FixClass,
        out: &mut impl FnMut(PairOutput),
    ) -> Alive {
        if self.is_inside() {
            if class == FixClass::Outside {
                self.vote(ts);
                if self.votes() >= s.exit_confirm.max(1) {
                    // Thresholds still unfired die with the visit: a STALE one waited for a fix that
                    // does not count as outside, and one held by this run had its deadline after
                    // the EXIT time.
                    out(PairOutput::Exit {
                        entered_at: self.entered.get(),
                        at: self.first.get(),
                    });
                    self.set_inside(false);
                    self.set_votes(0);
                    return Alive::No;
                }
            } else {
                // Inside, or within the exit buffer: breaks an EXIT run and releases every
                // threshold that was waiting because the device was STALE at its deadline.
                self.set_votes(0);
                self.stale = 0;
                self.try_fire(s, out);
            }
            Alive::Yes
        } else if class == FixClass::Inside {
            self.vote(ts);
            if self.votes() == 1 {
                // A fresh run: its first fix is the tentative visit start.
                self.entered = Ts48::new(ts);
                self.evaluated = 0;
                self.fired = 0;
            }
            // Like an inside fix of an open visit, a later fix of the run releases tentative
            // thresholds that were STALE at their deadline.
            self.stale = 0;
            if self.votes() >= s.enter_confirm.max(1) {
                self.confirm_enter(s, out);
            }
            Alive::Yes
        } else {
            // An outside fix breaks a pending ENTER run.
            self.set_votes(0);
            Alive::No
        }
    }

    fn vote(&mut self, ts: Ts) {
        if self.votes() == 0 {
            self.first = Ts48::new(ts);
        }
        self.set_votes(self.votes().saturating_add(1));
        self.last = Ts48::new(ts);
    }

    fn confirm_enter(&mut self, s: &FenceSettings, out: &mut impl FnMut(PairOutput)) {
        self.set_inside(true);
        self.set_votes(0);
        self.entered = Ts48::new(self.first.get());
        out(PairOutput::Enter {
            entered_at: self.entered.get(),
        });
        self.try_fire(s, out);
    }

    /// Emits every evaluated, unfired threshold that nothing holds back.
    fn try_fire(&mut self, s: &FenceSettings, out: &mut impl FnMut(PairOutput)) {
        if !self.is_inside() {
            return;
        }
        for j in 0..self.evaluated as usize {
            let bit = 1u16 << j;
            if self.fired & bit != 0 || self.stale & bit != 0 {
                continue;
            }
            if self.votes() > 0 && self.first.get() <= self.deadline(s, j) {
                continue;
            }
            self.fired |= bit;
            out(PairOutput::Dwell {
                entered_at: self.entered.get(),
                threshold: s.dwell[j],
            });
        }
    }

    /// Re-maps per-threshold state after the fence's thresholds changed from `old` to `new`.
    /// Thresholds present in both keep their state. A new threshold whose deadline already passed
    /// (before the old evaluated ones, or before `last_applied`, the device's latest fix) counts
    /// as evaluated and not STALE: it fires at the next step unless a pending run holds it.
    pub fn remap_thresholds(
        &mut self,
        old: &[Dur],
        s: &FenceSettings,
        last_applied: Option<Ts>,
        out: &mut impl FnMut(PairOutput),
    ) {
        let new = &s.dwell;
        let passed = old
            .get(..self.evaluated as usize)
            .and_then(|e| e.last().copied());
        let (mut fired, mut stale, mut evaluated) = (0u16, 0u16, 0u8);
        for (j, d) in new.iter().enumerate() {
            let deadline = self.entered.get().plus(*d);
            if passed.is_some_and(|p| *d <= p) || last_applied.is_some_and(|l| deadline < l) {
                evaluated = j as u8 + 1;
                if let Some(i) = old.iter().position(|o| o == d) {
                    fired |= ((self.fired >> i) & 1) << j;
                    stale |= ((self.stale >> i) & 1) << j;
                }
            }
        }
        self.fired = fired;
        self.stale = stale;
        self.evaluated = evaluated;
        self.try_fire(s, out);
    }

    /// A snapshot for APIs and tests.
    pub fn view(&self, s: &FenceSettings) -> PairView {
        let pick = |mask: u16| {
            s.dwell
                .iter()
                .enumerate()
                .filter(|(j, _)| mask & (1 << j) != 0)
                .map(|(_, d)| *d)
                .collect()
        };
        PairView {
            inside: self.is_inside(),
            entered_at: self.entered.get(),
            votes: self.votes(),
            fired: pick(self.fired),
            waiting_stale: pick(self.stale & !self.fired),
            next_due: self.next_internal(s),
        }
    }
}

mod packed;
#[cfg(test)]
mod tests;
