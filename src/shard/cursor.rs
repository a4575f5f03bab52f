//! Where a listing resumes ([`DeviceCursor`]): a shard and a slot in it, written
//! `<shard>.<slot>` and opaque to clients. Device listings use device slots, occupancy listings
//! pair slots; both walk the shards in order and each in slot order.

use std::fmt;
use std::str::FromStr;

/// Where a device listing resumes: a shard and a slot in it. Opaque to clients (`<shard>.<slot>`);
/// shards are walked in order and each in slot order, which is stable because slots are never
/// reused, so paging never repeats or skips a device that existed when the walk began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceCursor {
    pub(super) shard: usize,
    pub(super) slot: u32,
}

impl fmt::Display for DeviceCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.shard, self.slot)
    }
}

/// A cursor that is not `<shard>.<slot>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a cursor from next_after")]
pub struct BadCursor(String);

impl FromStr for DeviceCursor {
    type Err = BadCursor;
    /// A cursor past the end (a shard or slot that does not exist) is valid and yields an empty
    /// last page, as paging past the end would.
    fn from_str(s: &str) -> Result<DeviceCursor, BadCursor> {
        let bad = || BadCursor(s.to_string());
        let (a, b) = s.split_once('.').ok_or_else(bad)?;
        let digits = |x: &str| !x.is_empty() && x.bytes().all(|c| c.is_ascii_digit());
        if !digits(a) || !digits(b) {
            return Err(bad());
        }
        let shard = a
            .parse::<u64>()
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        let slot = b
            .parse::<u64>()
            .map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX));
        Ok(DeviceCursor { shard, slot })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_bad_ones_are_refused() {
        let c: DeviceCursor = "3.17".parse().unwrap();
        assert_eq!(c.to_string(), "3.17");
        assert_eq!(
            "99999999999999999999.1"
                .parse::<DeviceCursor>()
                .unwrap()
                .shard,
            usize::MAX,
            "past the end is a valid, empty page"
        );
        for bad in ["", "3", "3.", ".1", "a.b", "-1.2", "1.2.3", " 1.2"] {
            assert!(bad.parse::<DeviceCursor>().is_err(), "{bad:?}");
        }
    }
}
