//! The packed fields of a [`Pair`] record: event times in 48 bits ([`Ts48`]) and the record's
//! outstanding wheel entry in 32 ([`Pair::timer_is`], [`Pair::set_timer`]), so that a record is
//! 40 bytes.
//!
//! Invariant: a [`Ts48`] round-trips every valid [`Ts`]; the timer bits identify the entry's due
//! tick exactly within 2^23 ticks of the wheel's, and outside that can only mistake an earlier
//! entry for the one asked about, never a later one (so nothing acts late).

use super::Pair;
use crate::time::Ts;

/// A valid [`Ts`] (0 ..= year 9999, under 2^48 ms) in 6 bytes with 2-byte alignment, so that
/// three of them and the record's other fields pack into 40 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ts48([u16; 3]);

impl Ts48 {
    pub(super) fn new(t: Ts) -> Ts48 {
        debug_assert!((Ts::MIN..=Ts::MAX).contains(&t), "{t:?} is not a valid Ts");
        let v = t.0.clamp(Ts::MIN.0, Ts::MAX.0) as u64;
        Ts48([v as u16, (v >> 16) as u16, (v >> 32) as u16])
    }

    pub(super) fn get(self) -> Ts {
        let [a, b, c] = self.0;
        Ts((u64::from(a) | u64::from(b) << 16 | u64::from(c) << 32) as i64)
    }
}

/// What a pair record knows of its outstanding wheel entry (stored above the low 24 bits of
/// `Pair::timer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum TimerState {
    /// No entry is outstanding.
    None,
    /// An entry is outstanding, due less than 2^23 ticks after the wheel's tick when it was
    /// scheduled: the low bits identify it (see [`Pair::timer_is`]).
    Near,
    /// An entry is outstanding, further ahead than that: its tick is not remembered, and a
    /// reschedule always replaces it (rare: 2^23 ticks are 97 days at the default 1 s tick).
    Far,
}

/// Bits of the due tick kept in `Pair::timer`.
const LOW_BITS: u32 = 24;
const LOW_MASK: u32 = (1 << LOW_BITS) - 1;
/// Half the range of the stored low bits: a due tick within this distance of the wheel's tick
/// is recovered exactly from its low bits.
const NEAR: u64 = 1 << (LOW_BITS - 1);

impl Pair {
    fn timer_state(&self) -> TimerState {
        match self.timer >> LOW_BITS {
            0 => TimerState::None,
            1 => TimerState::Near,
            _ => TimerState::Far,
        }
    }

    /// Whether a wheel entry is outstanding for this record.
    pub fn has_timer(&self) -> bool {
        self.timer_state() != TimerState::None
    }

    /// Whether the outstanding entry is provably due at `due`, the wheel's tick being `now`
    /// (`None`: whether no entry is outstanding). A `Near` entry was due less than 2^23 ticks
    /// after the tick it was scheduled at, so it is due before `now + 2^23`; and it is due after
    /// `now - 2^23` unless the wheel carried it for 2^23 ticks. Within that window of 2^24 ticks
    /// the low 24 bits name one tick, so equal low bits mean the same tick. Should the window be
    /// exceeded, the answer can only be a wrong "yes" for an entry due *earlier* than `due`, which
    /// fires early and makes the engine re-check and reschedule: never a late event.
    pub fn timer_is(&self, due: Option<u64>, now: u64) -> bool {
        match (self.timer_state(), due) {
            (TimerState::None, None) => true,
            (TimerState::Near, Some(due)) => {
                due.wrapping_sub(now) < NEAR && (due as u32 & LOW_MASK) == (self.timer & LOW_MASK)
            }
            _ => false,
        }
    }

    /// Records the entry just scheduled at `due` (`None`: no entry), the wheel's tick being `now`.
    pub fn set_timer(&mut self, due: Option<u64>, now: u64) {
        self.timer = match due {
            None => (TimerState::None as u32) << LOW_BITS,
            // Truncation is the point: see `timer_is`.
            Some(due) if due.wrapping_sub(now) < NEAR => {
                (TimerState::Near as u32) << LOW_BITS | (due as u32 & LOW_MASK)
            }
            Some(_) => (TimerState::Far as u32) << LOW_BITS,
        };
    }
}
