//! The parts a partition applied lately, to recognize one its log holds twice.
//!
//! A log may store one part of a batch twice although it was sent with the same id: JetStream
//! drops a re-sent message by its `Nats-Msg-Id` only while the leader that stores it has seen the
//! first copy, and a leader elected while the first copy was in flight may store both (servers
//! released before early 2025 de-duplicated on the leader only). A client that re-sends a batch to the
//! embedded log stores it twice too. Applying the second copy changes no state (each of its fixes
//! is the device's latest, buffered, or behind its frontier) but would answer most of its fixes
//! `late`. So the driver answers a part it applied lately as a whole `duplicate`.
//!
//! Invariants:
//! - A part is known by a hash of its fixes (device, `ts`, position, accuracy), not of their
//!   stamps: a copy stamped later is the same part.
//! - Only parts none of whose fixes was rejected are remembered: a part refused in part
//!   (`buffer_full`, `too_many_devices`) may be sent again and must be judged again.
//! - The memory is the last [`RECENT_PARTS`] parts remembered, in log order. A checkpoint holds
//!   it as of its position, so a restored partition answers a copy as the partition that wrote
//!   the checkpoint would have.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::fix::Fix;

/// How many parts a partition remembers (8 bytes each, twice).
pub const RECENT_PARTS: usize = 1024;

/// The hash a part is known by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartHash(pub u64);

impl PartHash {
    /// The hash of a part's fixes, in order.
    pub fn of<'a>(fixes: impl Iterator<Item = &'a Fix>) -> PartHash {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        feed_fixes(&mut h, fixes);
        PartHash(h.digest())
    }
}

/// Feeds what identifies a part's fixes (device, `ts`, position, accuracy; not their stamps)
/// into `h`: the part memory's hash here, and a cluster part's `Nats-Msg-Id`.
pub fn feed_fixes<'a>(h: &mut xxhash_rust::xxh3::Xxh3, fixes: impl Iterator<Item = &'a Fix>) {
    for f in fixes {
        h.update(&(f.device.len() as u64).to_le_bytes());
        h.update(f.device.as_bytes());
        h.update(&f.ts.0.to_le_bytes());
        h.update(&f.lat.to_bits().to_le_bytes());
        h.update(&f.lon.to_bits().to_le_bytes());
        h.update(&f.accuracy.map_or(u64::MAX, f64::to_bits).to_le_bytes());
    }
}

/// The last [`RECENT_PARTS`] parts applied without a rejection.
#[derive(Debug, Default)]
pub struct RecentParts {
    order: VecDeque<PartHash>,
    known: hashbrown::HashSet<PartHash, foldhash::fast::RandomState>,
}

impl RecentParts {
    /// Whether `part` is among the parts remembered.
    pub fn contains(&self, part: PartHash) -> bool {
        self.known.contains(&part)
    }

    /// Remembers `part`, forgetting the oldest beyond [`RECENT_PARTS`].
    pub fn remember(&mut self, part: PartHash) {
        if !self.known.insert(part) {
            return;
        }
        self.order.push_back(part);
        if self.order.len() > RECENT_PARTS
            && let Some(old) = self.order.pop_front()
        {
            self.known.remove(&old);
        }
    }

    /// The parts remembered, oldest first (what a checkpoint keeps).
    pub fn snapshot(&self) -> Arc<[u64]> {
        self.order.iter().map(|h| h.0).collect()
    }

    /// The memory a checkpoint kept ([`RecentParts::snapshot`]).
    pub fn from_snapshot(hashes: &[u64]) -> RecentParts {
        let mut r = RecentParts::default();
        for &h in hashes {
            r.remember(PartHash(h));
        }
        r
    }

    /// How many parts are remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Ts;

    fn part(ts: i64) -> Vec<Fix> {
        vec![Fix::new("truck", Ts(ts), 1.0, 2.0, None, 64).unwrap()]
    }

    #[test]
    fn a_part_is_known_by_its_fixes_and_forgotten_after_the_bound() {
        let mut r = RecentParts::default();
        let first = PartHash::of(part(1).iter());
        r.remember(first);
        assert!(r.contains(PartHash::of(part(1).iter())));
        assert!(!r.contains(PartHash::of(part(2).iter())));
        r.remember(first);
        assert_eq!(r.len(), 1, "a part remembered twice is held once");
        for ts in 2..=RECENT_PARTS as i64 {
            r.remember(PartHash::of(part(ts).iter()));
        }
        assert!(r.contains(first), "the bound is not reached yet");
        r.remember(PartHash::of(part(0).iter()));
        assert!(!r.contains(first), "the oldest is forgotten first");
        assert_eq!(r.len(), RECENT_PARTS);
        let again = RecentParts::from_snapshot(&r.snapshot());
        assert_eq!(
            again.snapshot(),
            r.snapshot(),
            "a snapshot restores the same memory"
        );
        assert!(again.contains(PartHash::of(part(0).iter())));
    }
}
