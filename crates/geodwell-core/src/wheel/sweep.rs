//! [`Wheel::sweep`]: dropping the tombstones of the fine buckets ahead of the wheel's tick,
//! between ticks and in budgeted slices, so that `advance` mostly meets live entries.
//!
//! Owns the sweep's resumable position ([`SweepCursor`]). Invariant: a bucket the sweep is
//! partway through stays a valid bucket, a permutation of its entries with the examined live
//! ones first in their original order, so that `advance` can visit it at any moment and the
//! sweep never changes what fires or when.

use std::mem;

use super::storage::{Bucket, CHUNK, NIL, Pool};
use super::{FINE, TimerKey, Wheel};

/// A position in a bucket's chain: entry `off` of `chunk`, where `off == CHUNK` stands for the
/// first entry of the chunk after it (resolved when used, so that a chunk appended meanwhile is
/// found) and `chunk == NIL` for the bucket's first entry.
#[derive(Clone, Copy, Debug)]
struct ChainPos {
    chunk: u32,
    off: u32,
}

impl ChainPos {
    const START: ChainPos = ChainPos { chunk: NIL, off: 0 };

    /// The chunk and offset of this position in the chain starting at `head`.
    #[inline]
    fn resolve(&mut self, pool: &Pool, head: u32) -> (u32, usize) {
        if self.chunk == NIL {
            *self = ChainPos {
                chunk: head,
                off: 0,
            };
        } else if self.off as usize == CHUNK {
            *self = ChainPos {
                chunk: pool.next[self.chunk as usize],
                off: 0,
            };
        }
        (self.chunk, self.off as usize)
    }
}

/// Progress of [`Wheel::sweep`] through the fine bucket of tick `at`. The first `r` entries of
/// that bucket have been examined since the sweep reached it: its first `w` entries are the live
/// ones among them, in their original order, and entries `w..r` the dead ones, dropped when the
/// sweep finishes the bucket. Entries from `r` on are unexamined (appended ones included). The
/// bucket stays a valid bucket throughout (a permutation of its entries, dead ones only moved),
/// so an `advance` that reaches it before the sweep is done just visits it as usual.
#[derive(Clone, Copy, Debug)]
pub(super) struct SweepCursor {
    at: u64,
    w: u32,
    r: u32,
    wpos: ChainPos,
    rpos: ChainPos,
}

impl SweepCursor {
    pub(super) fn at(at: u64) -> SweepCursor {
        SweepCursor {
            at,
            w: 0,
            r: 0,
            wpos: ChainPos::START,
            rpos: ChainPos::START,
        }
    }
}

impl Wheel {
    /// Drops dead entries from the buckets `advance` will visit next, ahead of time, checking at
    /// most `budget` entries with `is_live`; returns how many it checked.
    ///
    /// Walks the fine level from tick `now() + 1` forward (empty buckets skipped), resuming where
    /// the previous call stopped, even in the middle of a bucket; once `advance` has reached the
    /// tick it stopped at, it starts over at `now() + 1`. It stops at the end of the fine level
    /// (`now() + F - 1`): the coarse level, the overflow list and the carry queue are left to
    /// `advance`. Live entries stay in their bucket in their order (the bucket is compacted in
    /// place, emptied chunks go back to the pool), so it never changes what fires or when: it
    /// only takes work out of the tick that will visit the bucket. Dead entries found in a bucket
    /// are dropped, and the tombstone count decremented, when the sweep finishes that bucket
    /// (possibly over several calls); if `advance` reaches the bucket first, it checks and drops
    /// them itself. Safe to call at any time, any number of times; `budget == 0` does nothing.
    ///
    /// The work it saves the tick is the work it does: it spreads the tick's tombstone checks
    /// over the time between ticks, it does not remove them. Entries scheduled, and owners
    /// cancelled, after the sweep passed a bucket are left to the tick.
    pub fn sweep<F: FnMut(TimerKey) -> bool>(&mut self, budget: usize, mut is_live: F) -> usize {
        if self.sweep.at <= self.now {
            self.sweep = SweepCursor::at(self.now + 1);
        }
        let fine_mask = self.levels[FINE].mask;
        // The last tick the fine level covers: deltas `1..=mask`.
        let end = self.now + fine_mask;
        let mut examined = 0usize;
        let mut dropped = 0u64;
        while examined < budget {
            let cur = &mut self.sweep;
            if cur.r == 0 {
                // At the start of a bucket: find the next occupied one in `at..=end`.
                if cur.at > end {
                    break;
                }
                let count = end + 1 - cur.at;
                match self.levels[FINE].next_in_range(cur.at & fine_mask, 0, count) {
                    Some((_, d)) => *cur = SweepCursor::at(cur.at + d),
                    None => {
                        *cur = SweepCursor::at(end + 1);
                        break;
                    }
                }
            }
            let idx = (cur.at & fine_mask) as usize;
            let b = self.levels[FINE].buckets[idx];
            let len = b.len as usize;
            debug_assert!(cur.w <= cur.r && cur.r as usize <= len && len > 0);
            // Entries of this bucket, chunk by chunk, within the budget.
            while (cur.r as usize) < len && examined < budget {
                let (rc, roff) = cur.rpos.resolve(&self.pool, b.head);
                let n = (CHUNK - roff)
                    .min(len - cur.r as usize)
                    .min(budget - examined);
                let ahead = self.pool.after(rc);
                self.pool.prefetch(ahead);
                self.pool.prefetch(self.pool.after(ahead));
                // Liveness first, branch-free, as in `visit`: the owner reads overlap.
                let mut live = [false; CHUNK];
                let entries = &self.pool.chunks[rc as usize].entries[roff..roff + n];
                for (l, e) in live.iter_mut().zip(entries) {
                    *l = is_live(e.key());
                }
                for (i, &alive) in live[..n].iter().enumerate() {
                    if alive {
                        if cur.w != cur.r {
                            // Everything in `w..r` is dead: swap the live entry down over the
                            // first of them, so that the bucket stays a permutation.
                            let (wc, woff) = cur.wpos.resolve(&self.pool, b.head);
                            let chunks = &mut self.pool.chunks;
                            let dead = chunks[wc as usize].entries[woff];
                            let e = chunks[rc as usize].entries[roff + i];
                            chunks[wc as usize].entries[woff] = e;
                            chunks[rc as usize].entries[roff + i] = dead;
                        } else {
                            cur.wpos.resolve(&self.pool, b.head);
                        }
                        cur.wpos.off += 1;
                        cur.w += 1;
                    }
                    cur.r += 1;
                }
                cur.rpos.off += n as u32;
                examined += n;
            }
            if (cur.r as usize) < len {
                // Out of budget in the middle of the bucket: the next call resumes here.
                break;
            }
            // Bucket done: cut the dead tail `w..len`.
            let kept = cur.w;
            dropped += u64::from(cur.r - kept);
            if kept == 0 {
                self.pool.release_chain(b.head);
                self.levels[FINE].occ.clear(idx);
                self.levels[FINE].buckets[idx] = Bucket::EMPTY;
            } else if kept != cur.r {
                // `wpos` is just past the last kept entry, inside the chunk that holds it.
                let last = cur.wpos.chunk;
                debug_assert!(last != NIL && cur.wpos.off >= 1);
                let rest = mem::replace(&mut self.pool.next[last as usize], NIL);
                self.pool.release_chain(rest);
                self.levels[FINE].buckets[idx] = Bucket {
                    head: b.head,
                    tail: last,
                    len: kept,
                };
            }
            *cur = SweepCursor::at(cur.at + 1);
        }
        debug_assert!(self.len >= dropped);
        self.len -= dropped;
        self.tombstones = self.tombstones.saturating_sub(dropped);
        examined
    }
}
