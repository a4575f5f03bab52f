//! Ingest-to-event latency bookkeeping for the simulator.
//!
//! Owns: which batch carried each device's recent fixes, when each batch was sent, and the
//! histograms of (event arrival - send of the input that caused it).
//!
//! Invariants:
//! - Sender tasks write device rings and batch send times just before a batch goes out; the
//!   subscriber reads both. Entries are single `AtomicU64`s so no lock sits on the per-fix path; a reader that
//!   finds an entry overwritten (the device sent more than [`RING`] fixes since, or the batch
//!   slot was reused) counts the event as unmatched instead of guessing.
//! - The cause of an event: ENTER / EXIT are caused by the fix that completed the confirmation
//!   run, the (k-1)-th fix after the one at the event's `at` for a fence with confirm count k.
//!   DWELL is caused by the input that moved the watermark past its deadline: in event clock
//!   mode the first batch whose largest `ts` reaches `at + lateness`, in live mode the wall
//!   instant `at + lateness`, provided a remembered fix shows the device fresh at the deadline
//!   (checked when the fence has `stale_after`) and the first counting fix of the device after
//!   the deadline did not go out after that input. Otherwise the DWELL may have been held back
//!   (the device STALE, or an EXIT run pending) and released by a later fix that is not outside
//!   the fence, or by the run's expiry: which one, the tracker cannot tell (it does not know
//!   where a fix lies), so such a DWELL is counted as unmatched rather than measured from a
//!   guess. The same holds, for a fence with `exit_confirm > 1`,
//!   when the device's latest counting fix at or before the deadline (none remembered: unmatched)
//!   may have started an EXIT run and a later batch than the deadline's moved the watermark past
//!   that run's expiry (`confirm_within` after the fix) before the DWELL arrived: the deadline
//!   or the expiry released it. (Measuring such DWELLs from the deadline's batch, or
//!   from the first fix after the deadline, produced the single outliers of hundreds of
//!   milliseconds to seconds in `benches/e2e.sh`: the event was released by a later input.)

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Recent fixes remembered per device.
pub const RING: usize = 4;
const TS_BITS: u32 = 38;
const ID_BITS: u32 = 64 - TS_BITS;
const ID_MASK: u64 = (1 << ID_BITS) - 1;
const SEND_SLOTS: usize = 1 << 22;
const SEND_US_BITS: u32 = 40;
const MARKS: usize = 65_536;

/// Per-fence facts the latency attribution needs.
#[derive(Debug, Clone, Copy)]
pub struct FenceFacts {
    /// `enter_confirm`.
    pub enter_confirm: u8,
    /// `exit_confirm`.
    pub exit_confirm: u8,
    /// `stale_after` in ms, if on.
    pub stale_after_ms: Option<i64>,
    /// `max_accuracy_m`, if on: less accurate fixes do not count towards a confirmation.
    pub max_accuracy_m: Option<f64>,
    /// `confirm_within` in ms: a pending run expires this long after its latest fix.
    pub confirm_within_ms: i64,
}

/// How the server's watermark moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatermarkModel {
    /// `W = max ts seen - lateness`.
    Event {
        /// Lateness, ms.
        lateness_ms: i64,
    },
    /// `W = wall now - lateness`; `wall_ms_at_t0` is the Unix time at the tracker's `t0`.
    Live {
        /// Lateness, ms.
        lateness_ms: i64,
        /// Unix ms at `t0`.
        wall_ms_at_t0: i64,
    },
}

/// Latency percentiles of one event type, microseconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    /// Events measured.
    pub count: u64,
    /// Events whose cause could not be attributed.
    pub unmatched: u64,
    /// Median, µs.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// 99.9th percentile, µs.
    pub p999_us: u64,
    /// Largest, µs.
    pub max_us: u64,
}

/// The shared bookkeeping.
#[derive(Debug)]
pub struct Tracker {
    t0: Instant,
    start_ts: i64,
    model: WatermarkModel,
    rings: Vec<[AtomicU64; RING]>,
    /// Reported accuracy of each ring entry (f32 bits), for the fences' accuracy filters.
    accuracy: Vec<[AtomicU32; RING]>,
    sends: Vec<AtomicU64>,
    /// (running max of batch max ts, send µs) in send order, for DWELL attribution.
    marks: Mutex<VecDeque<(i64, u64)>>,
    fences: HashMap<String, FenceFacts>,
    prefix: String,
    hist: Mutex<Hists>,
}

#[derive(Debug)]
struct Hists {
    by_type: [Histogram<u64>; 3],
    all: Histogram<u64>,
    unmatched: [u64; 3],
}

/// Event types the tracker knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// ENTER.
    Enter = 0,
    /// EXIT.
    Exit = 1,
    /// DWELL.
    Dwell = 2,
}

fn new_hist() -> Histogram<u64> {
    // 1 µs .. 10 min at 3 significant digits; creation only fails for invalid bounds.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

impl Tracker {
    /// Bookkeeping for `devices` devices whose fixes start at `start_ts`.
    pub fn new(
        devices: u32,
        start_ts: i64,
        model: WatermarkModel,
        fences: HashMap<String, FenceFacts>,
        prefix: String,
    ) -> Tracker {
        Tracker {
            t0: Instant::now(),
            start_ts,
            model,
            rings: (0..devices)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            accuracy: (0..devices)
                .map(|_| std::array::from_fn(|_| AtomicU32::new(0)))
                .collect(),
            sends: (0..SEND_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            marks: Mutex::new(VecDeque::new()),
            fences,
            prefix,
            hist: Mutex::new(Hists {
                by_type: [new_hist(), new_hist(), new_hist()],
                all: new_hist(),
                unmatched: [0; 3],
            }),
        }
    }

    /// The same bookkeeping under another watermark model (e.g. a live model anchored at `t0`).
    pub fn with_model(mut self, model: WatermarkModel) -> Tracker {
        self.model = model;
        self
    }

    /// The instant latencies are measured from.
    pub fn t0(&self) -> Instant {
        self.t0
    }

    /// µs since `t0`.
    pub fn now_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    /// Sender side: the fix of `device` at `ts` goes out in `batch`. It replaces the device's
    /// oldest remembered fix.
    pub fn note_fix(&self, device: u32, ts: i64, batch: u64, accuracy: f32) {
        let Some(ring) = self.rings.get(device as usize) else {
            return;
        };
        let rel = (ts - self.start_ts).max(0) as u64 & ((1 << TS_BITS) - 1);
        let (oldest, _) = ring
            .iter()
            .enumerate()
            .map(|(i, a)| (i, a.load(Relaxed)))
            .min_by_key(|&(_, v)| v)
            .unwrap_or((0, 0));
        self.accuracy[device as usize][oldest].store(accuracy.to_bits(), Relaxed);
        ring[oldest].store((rel << ID_BITS) | (batch & ID_MASK), Relaxed);
    }

    /// Sender side: `batch`, whose largest `ts` is `max_ts`, went on the wire now.
    pub fn note_send(&self, batch: u64, max_ts: i64) -> u64 {
        let us = self.now_us();
        let slot = (batch as usize) & (SEND_SLOTS - 1);
        let tag = batch >> SEND_SLOTS.trailing_zeros();
        self.sends[slot].store((tag << SEND_US_BITS) | (us + 1), Relaxed);
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        let top = marks.back().map_or(i64::MIN, |m| m.0).max(max_ts);
        marks.push_back((top, us));
        // Keep about a minute of history at 1,000 batches/s.
        if marks.len() > MARKS {
            marks.pop_front();
        }
        us
    }

    /// The largest `ts` of any batch sent so far.
    pub fn max_sent_ts(&self) -> Option<i64> {
        let marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        marks.back().map(|m| m.0)
    }

    fn send_us(&self, batch_low: u64) -> Option<u64> {
        // `batch_low` holds the batch id's low ID_BITS; the slot's tag gives the rest.
        let slot = (batch_low as usize) & (SEND_SLOTS - 1);
        let v = self.sends[slot].load(Relaxed);
        if v == 0 {
            return None;
        }
        let tag = v >> SEND_US_BITS;
        let id = (tag << SEND_SLOTS.trailing_zeros()) | slot as u64;
        (id & ID_MASK == batch_low).then_some((v & ((1 << SEND_US_BITS) - 1)) - 1)
    }

    /// The device's remembered fixes, oldest first: (ts, batch id low bits, accuracy).
    fn recent(&self, device: u32) -> Vec<(i64, u64, f32)> {
        let (Some(ring), Some(acc)) = (
            self.rings.get(device as usize),
            self.accuracy.get(device as usize),
        ) else {
            return Vec::new();
        };
        let mut v: Vec<(i64, u64, f32)> = ring
            .iter()
            .zip(acc)
            .map(|(a, b)| (a.load(Relaxed), f32::from_bits(b.load(Relaxed))))
            .filter(|&(e, _)| e != 0)
            .map(|(e, a)| ((e >> ID_BITS) as i64 + self.start_ts, e & ID_MASK, a))
            .collect();
        v.sort_unstable_by_key(|x| (x.0, x.1));
        v
    }

    fn device_of(&self, id: &str) -> Option<u32> {
        id.strip_prefix(&self.prefix)?.parse().ok()
    }

    /// The first send (µs since `t0`) of a batch that moved the watermark past `t`, if one
    /// went out yet (event clock), or the wall instant it passes `t` (live clock).
    fn watermark_passes_us(&self, t: i64) -> Option<u64> {
        match self.model {
            WatermarkModel::Event { lateness_ms } => {
                // The engine processes a deadline once the watermark is past it.
                let need = t + lateness_ms + 1;
                let marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
                let i = marks.partition_point(|m| m.0 < need);
                // Marks older than the history make the cause unknowable.
                if i == 0 && marks.len() == MARKS {
                    return None;
                }
                marks.get(i).map(|m| m.1)
            }
            WatermarkModel::Live {
                lateness_ms,
                wall_ms_at_t0,
            } => {
                let due_ms = t + lateness_ms - wall_ms_at_t0;
                Some((due_ms.max(0) as u64) * 1000)
            }
        }
    }

    /// When the input that caused this event was sent (µs since `t0`), if known, for an event
    /// that arrived at `arrived_us`.
    pub fn cause_us(
        &self,
        kind: Kind,
        device: &str,
        fence: &str,
        at: i64,
        arrived_us: u64,
    ) -> Option<u64> {
        let facts = self.fences.get(fence).copied();
        let dev = self.device_of(device)?;
        // Fixes less accurate than the fence's filter neither count towards a run nor break or
        // extend one (section 5.10).
        let max_acc = facts.and_then(|f| f.max_accuracy_m);
        let counts = |a: f32| max_acc.is_none_or(|m| a as f64 <= m);
        match kind {
            Kind::Enter | Kind::Exit => {
                let k = facts.map_or(1, |f| match kind {
                    Kind::Enter => f.enter_confirm,
                    _ => f.exit_confirm,
                }) as usize;
                let recent = self.recent(dev);
                let i = recent.iter().position(|&(ts, _, _)| ts == at)?;
                // The k-th counting fix from `at` on completed the run.
                let (_, batch, _) = recent[i..]
                    .iter()
                    .filter(|&&(_, _, a)| counts(a))
                    .nth(k.max(1) - 1)?;
                self.send_us(*batch)
            }
            Kind::Dwell => {
                let recent = self.recent(dev);
                if let Some(stale) = facts.and_then(|f| f.stale_after_ms) {
                    // Unless a remembered fix shows the device fresh at the deadline, the DWELL
                    // may have been held STALE and released by a later fix: unattributable.
                    let fresh = recent
                        .iter()
                        .any(|&(ts, _, _)| ts <= at && at - ts <= stale);
                    if !fresh {
                        return None;
                    }
                }
                let by_watermark = self.watermark_passes_us(at)?;
                // The first counting fix of the device after the deadline, sent after the
                // watermark passed it: a pending EXIT run (docs/semantics.md section 5.13) may
                // have held the DWELL until that fix or a later one decided the run. Which one
                // is unknowable here.
                let by_fix = recent
                    .iter()
                    .find(|&&(ts, _, a)| ts > at && counts(a))
                    .and_then(|&(_, batch, _)| self.send_us(batch));
                if matches!(by_fix, Some(f) if f > by_watermark) {
                    return None;
                }
                // The device's latest counting fix at or before the deadline may have been
                // outside, a vote of an EXIT run still pending at the deadline; such a run holds
                // the DWELL until a fix breaks it (the check above) or it expires,
                // `confirm_within` after its latest vote (sections 5.11, 5.13; a later vote only
                // moves the expiry later, so this one is the earliest it can be). If the
                // watermark passed that expiry before the event arrived, in a later batch than
                // the deadline's, either the deadline or the expiry released it (one batch
                // passing both is the cause either way).
                if let Some(f) = facts
                    && f.exit_confirm > 1
                {
                    let last = recent
                        .iter()
                        .filter(|&&(ts, _, a)| ts <= at && counts(a))
                        .map(|&(ts, _, _)| ts)
                        .max()?;
                    let expiry = last + f.confirm_within_ms;
                    if expiry >= at
                        && self
                            .watermark_passes_us(expiry)
                            .is_some_and(|e| e > by_watermark && e <= arrived_us)
                    {
                        return None;
                    }
                }
                Some(by_watermark)
            }
        }
    }

    /// Subscriber side: an event arrived now.
    pub fn record(&self, kind: Kind, device: &str, fence: &str, at: i64) {
        let now = self.now_us();
        let cause = self.cause_us(kind, device, fence, at, now);
        let mut h = self.hist.lock().unwrap_or_else(|e| e.into_inner());
        match cause {
            Some(c) => {
                let lat = now.saturating_sub(c).max(1);
                let _ = h.by_type[kind as usize].record(lat.min(600_000_000));
                let _ = h.all.record(lat.min(600_000_000));
            }
            None => h.unmatched[kind as usize] += 1,
        }
    }

    /// Percentiles per type (enter, exit, dwell) and over all.
    pub fn summaries(&self) -> ([LatencySummary; 3], LatencySummary) {
        let h = self.hist.lock().unwrap_or_else(|e| e.into_inner());
        let sum = |x: &Histogram<u64>, unmatched: u64| LatencySummary {
            count: x.len(),
            unmatched,
            p50_us: x.value_at_quantile(0.50),
            p99_us: x.value_at_quantile(0.99),
            p999_us: x.value_at_quantile(0.999),
            max_us: x.max(),
        };
        (
            std::array::from_fn(|k| sum(&h.by_type[k], h.unmatched[k])),
            sum(&h.all, h.unmatched.iter().sum()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(enter: u8, exit: u8) -> HashMap<String, FenceFacts> {
        HashMap::from([(
            "f".to_string(),
            FenceFacts {
                enter_confirm: enter,
                exit_confirm: exit,
                stale_after_ms: Some(900_000),
                max_accuracy_m: Some(50.0),
                confirm_within_ms: 300_000,
            },
        )])
    }

    #[test]
    fn enter_is_attributed_to_the_confirming_fix_batch() {
        let t = Tracker::new(
            4,
            1_000,
            WatermarkModel::Event { lateness_ms: 0 },
            facts(2, 1),
            "d".into(),
        );
        t.note_fix(1, 2_000, 7, 5.0);
        t.note_fix(1, 3_000, 8, 5.0);
        assert_eq!(
            t.cause_us(Kind::Enter, "d1", "f", 2_000, u64::MAX),
            None,
            "batch 8 not sent yet"
        );
        let sent = t.note_send(8, 3_000);
        assert_eq!(
            t.cause_us(Kind::Enter, "d1", "f", 2_000, u64::MAX),
            Some(sent)
        );
        // Exit confirm 1: the fix at `at` itself.
        let s7 = t.note_send(7, 2_000);
        assert_eq!(t.cause_us(Kind::Exit, "d1", "f", 2_000, u64::MAX), Some(s7));
        // An inaccurate fix does not count towards the fence's confirmation.
        t.note_fix(2, 2_000, 9, 5.0);
        t.note_fix(2, 3_000, 10, 90.0);
        t.note_fix(2, 4_000, 11, 5.0);
        t.note_send(10, 3_000);
        let s11 = t.note_send(11, 4_000);
        assert_eq!(
            t.cause_us(Kind::Enter, "d2", "f", 2_000, u64::MAX),
            Some(s11)
        );
        // Unknown device / prefix / ts.
        assert_eq!(t.cause_us(Kind::Enter, "x1", "f", 2_000, u64::MAX), None);
        assert_eq!(t.cause_us(Kind::Exit, "d1", "f", 2_500, u64::MAX), None);
    }

    #[test]
    fn ring_overwrite_makes_old_fixes_unmatched() {
        let t = Tracker::new(
            1,
            0,
            WatermarkModel::Event { lateness_ms: 0 },
            facts(1, 1),
            "d".into(),
        );
        for n in 0..(RING as u64 + 1) {
            t.note_fix(0, 1_000 * (n as i64 + 1), n, 5.0);
            t.note_send(n, 1_000 * (n as i64 + 1));
        }
        assert_eq!(t.cause_us(Kind::Enter, "d0", "f", 1_000, u64::MAX), None);
        assert!(
            t.cause_us(Kind::Enter, "d0", "f", 2_000, u64::MAX)
                .is_some()
        );
    }

    #[test]
    fn dwell_is_measured_from_the_batch_passing_its_deadline_and_held_ones_are_unmatched() {
        let t = Tracker::new(
            1,
            0,
            WatermarkModel::Event { lateness_ms: 500 },
            facts(1, 1),
            "d".into(),
        );
        // Nothing known about the device at the deadline: unknown.
        assert_eq!(t.cause_us(Kind::Dwell, "d0", "f", 19_000, u64::MAX), None);
        // A fix shortly before the deadline shows the device fresh: the watermark decides.
        t.note_fix(0, 18_000, 0, 5.0);
        let a = t.note_send(1, 10_000);
        let b = t.note_send(2, 20_000);
        let _ = a;
        // Deadline 19_000 + lateness 500 is first reached by batch 2.
        assert_eq!(
            t.cause_us(Kind::Dwell, "d0", "f", 19_000, u64::MAX),
            Some(b)
        );
        assert_eq!(t.cause_us(Kind::Dwell, "d0", "f", 30_000, u64::MAX), None);
        // A fix after the deadline, sent after the watermark's batch: a pending EXIT vote may have
        // held the DWELL until it or a later fix; the cause is unknowable.
        t.note_fix(0, 19_200, 5, 5.0);
        let d = t.note_send(5, 19_200);
        assert!(d > b);
        assert_eq!(t.cause_us(Kind::Dwell, "d0", "f", 19_000, u64::MAX), None);
        // A silence of more than stale_after spanning the deadline: held STALE, released by some
        // later fix: unknowable too.
        t.note_fix(0, 100_000, 3, 5.0);
        t.note_fix(0, 1_100_000, 4, 5.0);
        let _c = t.note_send(4, 1_100_000);
        assert_eq!(
            t.cause_us(Kind::Dwell, "d0", "f", 1_050_000, u64::MAX),
            None
        );
    }

    /// One device "d0" on an event clock with lateness 0, fence "f" with `exit_confirm`.
    fn one_device(exit_confirm: u8) -> Tracker {
        Tracker::new(
            1,
            0,
            WatermarkModel::Event { lateness_ms: 0 },
            facts(1, exit_confirm),
            "d".into(),
        )
    }

    #[test]
    fn dwell_after_a_possible_exit_run_expiry_is_unmatched() {
        let gap = || std::thread::sleep(std::time::Duration::from_millis(2));
        let t = one_device(2);
        // The device's last counting fix is 1 s before the deadline, then it goes quiet. If
        // that fix was outside, the EXIT run it started expires at 318_000 (confirm_within 5
        // min) and holds the DWELL of 19_000 until then; an inaccurate fix after it neither
        // counts as a vote nor moves the expiry.
        t.note_fix(0, 18_000, 0, 5.0);
        t.note_fix(0, 18_500, 0, 90.0);
        t.note_send(0, 18_500);
        gap();
        let b = t.note_send(1, 20_000);
        gap();
        // Arrived before the watermark passed the expiry: the deadline released it.
        assert_eq!(t.cause_us(Kind::Dwell, "d0", "f", 19_000, b + 1), Some(b));
        let e = t.note_send(2, 318_200);
        assert!(e > b);
        assert_eq!(
            t.cause_us(Kind::Dwell, "d0", "f", 19_000, e - 1),
            Some(b),
            "before the expiry's batch went out"
        );
        // Arrived after it: the deadline or the expiry; unknowable.
        assert_eq!(t.cause_us(Kind::Dwell, "d0", "f", 19_000, e), None);
        // One batch moving the watermark past both the deadline and the expiry is the cause
        // either way.
        let t2 = one_device(2);
        t2.note_fix(0, 18_000, 0, 5.0);
        t2.note_send(0, 18_000);
        gap();
        let both = t2.note_send(1, 400_000);
        assert_eq!(
            t2.cause_us(Kind::Dwell, "d0", "f", 19_000, u64::MAX),
            Some(both)
        );
        // An inaccurate fix after the deadline in the deadline's batch neither breaks nor
        // extends a run; the counting fix after it, sent later, may have released the DWELL.
        let t3 = one_device(2);
        t3.note_fix(0, 18_000, 0, 5.0);
        t3.note_send(0, 18_000);
        t3.note_fix(0, 19_100, 1, 90.0);
        gap();
        let b3 = t3.note_send(1, 20_000);
        assert_eq!(
            t3.cause_us(Kind::Dwell, "d0", "f", 19_000, u64::MAX),
            Some(b3),
            "nothing counting after the deadline yet"
        );
        t3.note_fix(0, 19_300, 2, 5.0);
        gap();
        t3.note_send(2, 20_500);
        assert_eq!(t3.cause_us(Kind::Dwell, "d0", "f", 19_000, u64::MAX), None);
        // With exit_confirm 1 an outside fix exits at once: no run can hold the DWELL.
        let t1 = one_device(1);
        t1.note_fix(0, 18_000, 0, 5.0);
        t1.note_send(0, 18_000);
        gap();
        let b1 = t1.note_send(1, 20_000);
        gap();
        t1.note_send(2, 400_000);
        assert_eq!(
            t1.cause_us(Kind::Dwell, "d0", "f", 19_000, u64::MAX),
            Some(b1)
        );
    }

    #[test]
    fn live_dwell_is_due_at_the_wall_instant() {
        let model = WatermarkModel::Live {
            lateness_ms: 1_000,
            wall_ms_at_t0: 50_000,
        };
        let t = Tracker::new(1, 0, model, facts(1, 1), "d".into());
        t.note_fix(0, 50_500, 0, 5.0);
        assert_eq!(
            t.cause_us(Kind::Dwell, "d0", "f", 51_000, u64::MAX),
            Some(2_000_000)
        );
    }
}
