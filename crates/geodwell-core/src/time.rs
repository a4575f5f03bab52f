//! Event time, durations and ticks.
//!
//! Owns the numeric model of time that the whole core shares:
//! - [`Ts`] is event time: milliseconds since the Unix epoch, never negative, never after
//!   [`Ts::MAX`] (year 9999), so arithmetic on it cannot overflow.
//! - [`Dur`] is a non-negative span of milliseconds, parsed from `"90s"`, `"10m"`, `"1h"`, `"2d"`,
//!   `"250ms"` or a bare number of seconds.
//! - [`Tick`] is a timer-wheel slot index; [`TickClock`] converts between the two and is the
//!   only place that decides rounding: an instant maps **down** to the last tick it completes,
//!   so a tick is only complete once the watermark has passed its end.
//!
//! Nothing here reads a clock: wall time, where needed, is an argument.

use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// Event time: milliseconds since the Unix epoch (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Ts(pub i64);

impl Ts {
    /// The epoch; also the smallest accepted event time.
    pub const MIN: Ts = Ts(0);
    /// 9999-12-31T23:59:59.999Z, the largest accepted event time.
    pub const MAX: Ts = Ts(253_402_300_799_999);

    /// Milliseconds since the epoch.
    pub fn millis(self) -> i64 {
        self.0
    }

    /// `self + d`, saturating at [`Ts::MAX`].
    pub fn plus(self, d: Dur) -> Ts {
        Ts(self.0.saturating_add(d.0).min(Ts::MAX.0))
    }

    /// `self - d`, saturating at [`Ts::MIN`].
    pub fn minus(self, d: Dur) -> Ts {
        Ts(self.0.saturating_sub(d.0).max(Ts::MIN.0))
    }

    /// The span from `earlier` to `self` (zero if `earlier` is later).
    pub fn since(self, earlier: Ts) -> Dur {
        Dur((self.0 - earlier.0).max(0))
    }

    /// Builds a checked event time from Unix milliseconds.
    pub fn from_millis(ms: i64) -> Result<Ts, TimeError> {
        if (Ts::MIN.0..=Ts::MAX.0).contains(&ms) {
            Ok(Ts(ms))
        } else {
            Err(TimeError::OutOfRange(ms))
        }
    }

    /// Parses RFC 3339 (any offset; converted to UTC).
    pub fn parse_rfc3339(s: &str) -> Result<Ts, TimeError> {
        let dt = DateTime::parse_from_rfc3339(s)
            .map_err(|e| TimeError::BadTimestamp(format!("{s:?}: {e}")))?;
        Ts::from_millis(dt.timestamp_millis())
    }

    /// Formats as RFC 3339 UTC with millisecond precision, e.g. `2026-01-02T03:04:05.678Z`.
    pub fn to_rfc3339(self) -> String {
        match DateTime::<Utc>::from_timestamp_millis(self.0) {
            Some(dt) => dt.to_rfc3339_opts(SecondsFormat::Millis, true),
            // Unreachable for a checked Ts; keep the raw number rather than panic.
            None => self.0.to_string(),
        }
    }
}

impl fmt::Display for Ts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl Serialize for Ts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Ts {
    /// Accepts an RFC 3339 string or an integer of Unix milliseconds.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ts, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(ms) => Ts::from_millis(ms).map_err(serde::de::Error::custom),
            Raw::Str(s) => Ts::parse_rfc3339(&s).map_err(serde::de::Error::custom),
        }
    }
}

/// A non-negative span of time in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Dur(pub i64);

impl Dur {
    /// Zero length.
    pub const ZERO: Dur = Dur(0);

    /// From whole milliseconds.
    pub const fn from_millis(ms: i64) -> Dur {
        Dur(ms)
    }

    /// From whole seconds.
    pub const fn from_secs(s: i64) -> Dur {
        Dur(s * 1000)
    }

    /// From whole minutes.
    pub const fn from_mins(m: i64) -> Dur {
        Dur(m * 60_000)
    }

    /// Length in milliseconds.
    pub fn millis(self) -> i64 {
        self.0
    }

    /// Length in (possibly fractional) seconds.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// Parses `"250ms"`, `"90s"`, `"10m"`, `"1h"`, `"2d"`, or a bare (possibly fractional)
    /// number of seconds such as `"600"` or `"1.5"`.
    pub fn parse(s: &str) -> Result<Dur, TimeError> {
        let t = s.trim();
        let bad = || TimeError::BadDuration(s.to_string());
        if t.is_empty() {
            return Err(bad());
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let unit_ms: f64 = match unit.trim() {
            "" | "s" => 1000.0,
            "ms" => 1.0,
            "m" | "min" => 60_000.0,
            "h" => 3_600_000.0,
            "d" => 86_400_000.0,
            _ => return Err(bad()),
        };
        let n: f64 = num.parse().map_err(|_| bad())?;
        let ms = (n * unit_ms).round();
        // Ten thousand years is far past any meaningful span and keeps Ts arithmetic in range.
        if !ms.is_finite() || !(0.0..=Ts::MAX.0 as f64).contains(&ms) {
            return Err(bad());
        }
        Ok(Dur(ms as i64))
    }

    /// The shortest of `"250ms"`, `"90s"`, `"10m"`, `"1h"`, `"2d"` that is exact.
    pub fn to_human(self) -> String {
        let ms = self.0;
        for (unit, size) in [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1000),
        ] {
            if ms != 0 && ms % size == 0 {
                return format!("{}{unit}", ms / size);
            }
        }
        if ms == 0 {
            "0s".to_string()
        } else {
            format!("{ms}ms")
        }
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_human())
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_human())
    }
}

impl<'de> Deserialize<'de> for Dur {
    /// Accepts a duration string (see [`Dur::parse`]) or a number of seconds.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(f64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(n) => Dur::parse(&n.to_string()).map_err(serde::de::Error::custom),
            Raw::Str(s) => Dur::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

/// Errors from parsing or range-checking times.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TimeError {
    /// A timestamp outside 1970-01-01 ..= 9999-12-31.
    #[error("timestamp {0} ms is outside 1970-01-01..9999-12-31")]
    OutOfRange(i64),
    /// Not RFC 3339.
    #[error("not an RFC 3339 timestamp: {0}")]
    BadTimestamp(String),
    /// Not a duration such as `90s`, `10m`, `1h`, `2d` or a number of seconds.
    #[error("not a duration (expected e.g. \"90s\", \"10m\", \"1h\", \"2d\" or seconds): {0:?}")]
    BadDuration(String),
}

/// A timer-wheel slot index. With tick length `T`, tick `k` is complete once the watermark
/// reaches `k * T` ([`TickClock::tick_end`]); [`TickClock::completed_tick`] rounds down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Tick(pub u64);

/// Converts between event time and ticks of a fixed length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickClock {
    tick_ms: i64,
}

impl TickClock {
    /// A clock with ticks of `tick` (must be at least 1 ms; smaller values are raised to 1 ms).
    pub fn new(tick: Dur) -> TickClock {
        TickClock {
            tick_ms: tick.0.max(1),
        }
    }

    /// The last tick completed by watermark `w`: `floor(w / T)`.
    pub fn completed_tick(&self, w: Ts) -> Tick {
        Tick((w.0.max(0) / self.tick_ms) as u64)
    }

    /// The event time at which tick `k` completes (`k * T`).
    pub fn tick_end(&self, k: Tick) -> Ts {
        Ts((k.0 as i64).saturating_mul(self.tick_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_every_unit() {
        assert_eq!(Dur::parse("90s").unwrap(), Dur::from_secs(90));
        assert_eq!(Dur::parse("10m").unwrap(), Dur::from_mins(10));
        assert_eq!(Dur::parse("1h").unwrap(), Dur::from_secs(3600));
        assert_eq!(Dur::parse("2d").unwrap(), Dur::from_secs(2 * 86_400));
        assert_eq!(Dur::parse("250ms").unwrap(), Dur(250));
        assert_eq!(Dur::parse("600").unwrap(), Dur::from_secs(600));
        assert_eq!(Dur::parse("1.5").unwrap(), Dur(1500));
        for bad in ["", "10x", "-5s", "m", "1e400", "NaN"] {
            assert!(Dur::parse(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn durations_print_in_their_shortest_exact_unit() {
        assert_eq!(Dur::from_mins(10).to_human(), "10m");
        assert_eq!(Dur::from_secs(90).to_human(), "90s");
        assert_eq!(Dur(1500).to_human(), "1500ms");
        assert_eq!(
            Dur::parse(&Dur(86_400_000).to_human()).unwrap(),
            Dur(86_400_000)
        );
    }

    #[test]
    fn timestamps_round_trip_rfc3339_and_millis() {
        let t = Ts::parse_rfc3339("2026-01-02T03:04:05.678+01:00").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-01-02T02:04:05.678Z");
        let j: Ts = serde_json::from_str("1767322800000").unwrap();
        assert_eq!(j, Ts(1_767_322_800_000));
        assert!(serde_json::from_str::<Ts>("-1").is_err());
        assert!(serde_json::from_str::<Ts>("\"yesterday\"").is_err());
    }

    #[test]
    fn watermarks_round_down_to_the_last_completed_tick() {
        let c = TickClock::new(Dur::from_secs(1));
        assert_eq!(c.completed_tick(Ts(1999)), Tick(1));
        // A tick is complete exactly from its end on.
        for k in [0, 1, 2, 123] {
            assert_eq!(c.completed_tick(c.tick_end(Tick(k))), Tick(k));
            assert_eq!(c.completed_tick(Ts(c.tick_end(Tick(k + 1)).0 - 1)), Tick(k));
        }
    }
}
