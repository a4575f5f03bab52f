//! What of a sink the store keeps: the changes not yet written ([`Unflushed`]), and the
//! counters and last success / failure times ([`Stats`]), which outlive a restart (persisted
//! with the cursor, same flush, same transaction, and restored at start).
//!
//! Invariants: a stored time of 0 means none, so the epoch itself survives a round trip; a
//! field name this build does not know (written by a later one) is ignored, never an error.
//! When these are taken and given back is the sink's business (`sink.rs`), under its lock.

use std::collections::BTreeMap;

use geodwell_core::time::Ts;

use super::status::DeadLetter;

/// The persisted part of a sink's status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Events delivered.
    pub sent: u64,
    /// Failed attempts.
    pub failed: u64,
    /// Attempts after an event's first.
    pub retried: u64,
    /// Events dead-lettered.
    pub dead_lettered: u64,
    /// Events lost to retention.
    pub dropped: u64,
    /// When the last delivery succeeded.
    pub last_success_at: Option<Ts>,
    /// When the last attempt failed.
    pub last_failure_at: Option<Ts>,
}

/// The stored fields, by name (the store keeps one `u64` per field).
const FIELDS: [&str; 7] = [
    "sent",
    "failed",
    "retried",
    "dead_lettered",
    "dropped",
    "last_success_at",
    "last_failure_at",
];

/// A time as stored: 0 for none, else milliseconds + 1 (so the epoch itself stays a time).
fn time_in(t: Option<Ts>) -> u64 {
    t.map_or(0, |t| (t.0.max(0) as u64).saturating_add(1))
}

fn time_out(v: u64) -> Option<Ts> {
    (v > 0).then(|| Ts((v - 1).min(i64::MAX as u64) as i64))
}

impl Stats {
    /// The fields as (name, value) pairs for the store.
    pub fn to_fields(&self) -> Vec<(&'static str, u64)> {
        let v = [
            self.sent,
            self.failed,
            self.retried,
            self.dead_lettered,
            self.dropped,
            time_in(self.last_success_at),
            time_in(self.last_failure_at),
        ];
        FIELDS.iter().copied().zip(v).collect()
    }

    /// Sets one stored field (an unknown name, from a later build, is ignored).
    pub fn set_field(&mut self, name: &str, v: u64) {
        match name {
            "sent" => self.sent = v,
            "failed" => self.failed = v,
            "retried" => self.retried = v,
            "dead_lettered" => self.dead_lettered = v,
            "dropped" => self.dropped = v,
            "last_success_at" => self.last_success_at = time_out(v),
            "last_failure_at" => self.last_failure_at = time_out(v),
            _ => {}
        }
    }
}

/// Changes the store has not seen yet.
#[derive(Debug, Default)]
pub(crate) struct Unflushed {
    /// The cursor to write, if it moved.
    pub(crate) cursor: Option<u64>,
    /// Dead letters by seq: `Some` = put, `None` = delete (the latest change wins).
    pub(crate) dead: BTreeMap<u64, Option<DeadLetter>>,
    /// The counters and times to write, if they changed.
    pub(crate) stats: Option<Stats>,
}

impl Unflushed {
    /// Whether there is nothing to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.cursor.is_none() && self.dead.is_empty() && self.stats.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let s = Stats {
            sent: 5,
            failed: 2,
            retried: 1,
            dead_lettered: 1,
            dropped: 0,
            last_success_at: Some(Ts(0)),
            last_failure_at: None,
        };
        let mut back = Stats::default();
        for (k, v) in s.to_fields() {
            back.set_field(k, v);
        }
        assert_eq!(back, s);
    }
}
