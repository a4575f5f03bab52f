//! Hashed hierarchical timer wheel: the dwell deadlines, vote expiries and reorder flushes of one
//! engine shard.
//!
//! # What it owns
//! Small entries `(slot, generation, due)` that *reference* owner records kept elsewhere (the
//! engine's pair records and reorder blocks). It owns no payload and never reads the owners
//! itself: [`Wheel::advance`] asks the caller, through `is_live`, whether an entry's generation
//! is still the record's current one.
//!
//! # Cancel is a tombstone
//! Cancelling is the owner bumping its record's generation; the wheel is only told through
//! [`Wheel::cancelled`] (a counter, O(1), no wheel access). The stale entry stays where it is
//! until its bucket is visited, is then found dead and dropped. Every bucket is visited at least
//! once per turn of its level (and no later than the due tick of the entries it holds), and the
//! overflow list at every coarse bucket crossing, so a tombstone never outlives one turn of the
//! level it sits in, nor its own due tick. Tombstones cost 12 bytes each until then, and a check
//! of the owner's record when met. [`Wheel::sweep`] lets the driver pay those checks earlier,
//! between ticks and in budgeted slices, for the fine buckets about to be visited, so that the
//! tick itself mostly meets live entries.
//!
//! # Invariants (checked with `debug_assert!` where cheap)
//! - Every entry stored in a level or the overflow list has `now < due`; entries with
//!   `due <= now` exist only in the carry queue (they were due but not yet handed out).
//! - A fine-level entry sits in bucket `due % FINE`, a coarse-level entry in bucket
//!   `(due / FINE) % COARSE`, where `FINE` and `COARSE` are the bucket counts of the levels.
//! - Level entries have `due - now < FINE * COARSE <= 2^24`, which is what lets them keep only
//!   the low 32 bits of `due` (12-byte entries).
//! - `len` counts every stored entry (levels, overflow, carry); the caller's `cancelled()` calls
//!   make `tombstones` the number of dead ones among them.
//! - A timer is never handed out before its due tick; without a per-call cap it is handed out by
//!   the first `advance` whose `to` reaches its due tick.
//!
//! # Layout
//! This module decides where an entry goes and when it fires ([`Wheel::schedule`],
//! [`Wheel::advance`], [`Wheel::next_due`]); `storage` holds the entry, chunk, pool, bucket and
//! level types the levels are made of; `sweep` holds [`Wheel::sweep`] and its resumable cursor.

use std::collections::VecDeque;
use std::fmt;
use std::mem;

use crate::time::Tick;

mod storage;
mod sweep;
#[cfg(test)]
mod tests;

use storage::{Bucket, CHUNK, Chunk, Entry, FarEntry, Level, NIL, PREFETCH_CHUNKS, Pool, unpack};
use sweep::SweepCursor;

/// Default `log2` of the fine level's bucket count: 4096 buckets of one tick each (68 min at 1 s).
pub const DEFAULT_FINE_BITS: u32 = 12;
/// Default `log2` of the coarse level's bucket count: 4096 buckets of 4096 ticks (194 days at 1 s).
pub const DEFAULT_COARSE_BITS: u32 = 12;
/// Largest accepted `log2` bucket count of a level: the two-word occupancy bitmap covers 4096.
pub const MAX_LEVEL_BITS: u32 = 12;

/// Identifies the record a timer belongs to: the wheel treats it as opaque. A timer is live while
/// the owner's record still carries the same `gen`; cancel is the owner bumping its generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerKey {
    /// Slot of the owning record.
    pub slot: u32,
    /// Generation of the owning record when the timer was scheduled.
    pub generation: u32,
}

/// One timer handed back by [`Wheel::advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fired {
    /// The timer's key.
    pub key: TimerKey,
    /// The tick it was scheduled for (never later than the tick it fired in).
    pub due: Tick,
}

/// Counters describing the wheel's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WheelStats {
    /// Entries stored anywhere in the wheel (live and dead, carry included).
    pub entries: u64,
    /// Entries known to be dead (cancelled) but not yet dropped.
    pub tombstones: u64,
    /// Due entries waiting to be handed out: held back by a per-call fire cap, or scheduled at a
    /// tick `<= now()`. The next [`Wheel::advance`] drains them first.
    pub carry: u64,
}

const FINE: usize = 0;
const COARSE: usize = 1;

/// Hands fired timers out up to the per-call cap and carries the rest.
struct Emit<'a> {
    out: &'a mut Vec<Fired>,
    fired: usize,
    max: usize,
}

impl Emit<'_> {
    /// Returns whether the timer left the wheel (false: it went to the carry queue).
    #[inline]
    fn emit(&mut self, f: Fired, carry: &mut VecDeque<Fired>) -> bool {
        if self.fired < self.max {
            self.out.push(f);
            self.fired += 1;
            true
        } else {
            carry.push_back(f);
            false
        }
    }
}

/// The timer wheel.
///
/// # Geometry
/// Ticks are abstract (1 s in the service). With `F = 2^fine_bits` and `C = 2^coarse_bits`
/// (defaults 4096 and 4096):
///
/// | part | buckets | one bucket covers | holds deadlines `due - now` in | entry |
/// | --- | --- | --- | --- | --- |
/// | fine level | `F` | 1 tick: bucket `due % F` | `[1, F)` | 12 B |
/// | coarse level | `C` | `F` ticks: bucket `(due / F) % C` | `[F, F*C)` | 12 B |
/// | overflow list | 1 | anything | `[F*C, ∞)` | 16 B |
/// | carry queue | 1 | due entries not yet handed out | `<= 0` | 16 B |
///
/// Entries keep their absolute due tick (the low 32 bits, recovered from `now`), so a bucket
/// visit fires exactly the entries with `due <= to` and keeps the others: correctness never rests
/// on a bucket holding a single turn, and no rotation counts are needed. Placement files each
/// deadline in the finest part whose span covers it, so in practice a visit fires, promotes or
/// drops everything it meets; the keep path is what makes that an optimisation, not a premise. A
/// coarse bucket is visited when the wheel crosses the start of the `F`-tick window it stands
/// for; its entries of that window are then fired or moved once to the fine level. The overflow
/// list is swept at every coarse window crossing (at most one sweep per [`Wheel::advance`]): it
/// moves entries that came within `F*C` ticks into a level and drops dead ones. Occupancy bitmaps
/// let `advance` skip empty buckets, and a jump of many turns visits each bucket at most once.
///
/// # Storage
/// Level buckets are chains of 64-entry chunks from one pool shared by both levels; the chain
/// links live apart from the chunks, so that a visit can prefetch the chunks ahead of the one it
/// works on (they were written one dwell earlier and are cold). A visit compacts the kept
/// entries in place and returns the emptied chunks to the pool, where the buckets being filled
/// pick them up: no allocation once the pool has reached the working set, and memory tracks the
/// stored entries (12 B each, tombstones included, plus at most one partly filled chunk per
/// occupied bucket) rather than buckets times their largest size.
pub struct Wheel {
    now: u64,
    fine_bits: u32,
    /// `[fine, coarse]`, indexed by `FINE` and `COARSE`.
    levels: [Level; 2],
    pool: Pool,
    /// `F * C`: deadlines this far ahead or more go to the overflow list.
    span: u64,
    far: Vec<FarEntry>,
    /// Lower bound of the overflow list's due ticks (`u64::MAX` when empty).
    far_min: u64,
    carry: VecDeque<Fired>,
    len: u64,
    tombstones: u64,
    /// Where [`Wheel::sweep`] resumes.
    sweep: SweepCursor,
}

impl fmt::Debug for Wheel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wheel")
            .field("now", &self.now)
            .field("fine_buckets", &self.levels[FINE].buckets.len())
            .field("coarse_buckets", &self.levels[COARSE].buckets.len())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Wheel {
    /// A wheel whose current tick is `start`, with the default geometry
    /// ([`DEFAULT_FINE_BITS`], [`DEFAULT_COARSE_BITS`]).
    pub fn new(start: Tick) -> Wheel {
        Wheel::with_geometry(start, DEFAULT_FINE_BITS, DEFAULT_COARSE_BITS)
    }

    /// A wheel with `2^fine_bits` fine buckets of one tick and `2^coarse_bits` coarse buckets of
    /// `2^fine_bits` ticks. Small geometries exist for tests that must reach the coarse level and
    /// the overflow list quickly.
    ///
    /// # Panics
    /// If either value is outside `1..=MAX_LEVEL_BITS`.
    pub fn with_geometry(start: Tick, fine_bits: u32, coarse_bits: u32) -> Wheel {
        assert!(
            (1..=MAX_LEVEL_BITS).contains(&fine_bits)
                && (1..=MAX_LEVEL_BITS).contains(&coarse_bits),
            "wheel level bits must be in 1..={MAX_LEVEL_BITS}"
        );
        Wheel {
            now: start.0,
            fine_bits,
            levels: [Level::new(fine_bits), Level::new(coarse_bits)],
            pool: Pool {
                chunks: Vec::new(),
                next: Vec::new(),
                free: Vec::new(),
            },
            span: 1 << (fine_bits + coarse_bits),
            far: Vec::new(),
            far_min: u64::MAX,
            carry: VecDeque::new(),
            len: 0,
            tombstones: 0,
            sweep: SweepCursor::at(start.0 + 1),
        }
    }

    /// The last tick fully processed.
    pub fn now(&self) -> Tick {
        Tick(self.now)
    }

    /// Schedules `key` at `due`; a due tick `<= now()` fires on the next advance.
    ///
    /// O(1), and allocation-free once the chunk pool has reached its working size.
    #[inline]
    pub fn schedule(&mut self, key: TimerKey, due: Tick) {
        self.len += 1;
        if due.0 <= self.now {
            self.carry.push_back(Fired { key, due });
        } else {
            self.place(key, due.0, self.now);
        }
    }

    /// Files a not-yet-due entry relative to `now` (which may run ahead of `self.now` while an
    /// `advance` is in progress; the caller makes sure such buckets are not visited again in it).
    #[inline]
    fn place(&mut self, key: TimerKey, due: u64, now: u64) {
        debug_assert!(due > now);
        let delta = due - now;
        if delta <= self.levels[FINE].mask {
            let idx = (due & self.levels[FINE].mask) as usize;
            self.levels[FINE].push(&mut self.pool, idx, Entry::new(key, due));
        } else if delta < self.span {
            let idx = ((due >> self.fine_bits) & self.levels[COARSE].mask) as usize;
            self.levels[COARSE].push(&mut self.pool, idx, Entry::new(key, due));
        } else {
            self.far.push(FarEntry { key, due });
            self.far_min = self.far_min.min(due);
        }
    }

    /// Notes that the owner of one scheduled entry bumped its generation.
    ///
    /// Call it exactly once per outstanding entry made dead, so that [`WheelStats::tombstones`]
    /// stays exact; the wheel itself does not need it to be right.
    #[inline]
    pub fn cancelled(&mut self) {
        self.tombstones += 1;
    }

    /// Fires due entries up to `to`, at most `max_fires`, carrying the rest.
    ///
    /// First drains the carry queue, then visits each fine bucket for the ticks in
    /// `(now(), to]`, each coarse bucket whose window starts in that range, and sweeps the
    /// overflow list if a coarse window was crossed; every bucket at most once per call, whatever
    /// the distance. Every entry met is checked with `is_live`; dead ones are dropped (and the
    /// tombstone count decremented) and never count toward `max_fires`. Live entries with
    /// `due <= to` are pushed to `out` until `max_fires` is reached, then kept in the carry queue.
    /// Returns how many were pushed. A `to` at or before `now()` only drains the carry queue.
    pub fn advance<F: FnMut(TimerKey) -> bool>(
        &mut self,
        to: Tick,
        max_fires: usize,
        mut is_live: F,
        out: &mut Vec<Fired>,
    ) -> usize {
        let mut emit = Emit {
            out,
            fired: 0,
            max: max_fires,
        };
        let mut dead = 0u64;
        let mut gone = 0u64;

        // Carry first: its entries were due in an earlier call, so they are the most overdue.
        while let Some(&f) = self.carry.front() {
            if !is_live(f.key) {
                self.carry.pop_front();
                dead += 1;
            } else if emit.fired < emit.max {
                self.carry.pop_front();
                emit.out.push(f);
                emit.fired += 1;
                gone += 1;
            } else {
                break;
            }
        }

        let base = self.now;
        let to = to.0;
        if to > base {
            let fine_mask = self.levels[FINE].mask;
            // Fine level: the buckets of ticks base+1 ..= to (all of them after a full turn).
            let count = (to - base).min(fine_mask + 1);
            let start = (base + 1) & fine_mask;
            let mut skip = 0;
            while let Some((idx, d)) = self.levels[FINE].next_in_range(start, skip, count) {
                skip = d + 1;
                dead += self.visit(FINE, idx, &mut is_live, |w, e| {
                    let key = e.key();
                    let due = unpack(base, e.due_lo);
                    debug_assert!(due > base && (due & fine_mask) as usize == idx);
                    if due > to {
                        // A later turn of this bucket.
                        return true;
                    }
                    gone += u64::from(emit.emit(
                        Fired {
                            key,
                            due: Tick(due),
                        },
                        &mut w.carry,
                    ));
                    false
                });
            }

            // Coarse level: the buckets whose F-tick window starts in base+1 ..= to.
            let (w0, w1) = (base >> self.fine_bits, to >> self.fine_bits);
            if w1 > w0 {
                let coarse_mask = self.levels[COARSE].mask;
                let count = (w1 - w0).min(coarse_mask + 1);
                let start = (w0 + 1) & coarse_mask;
                let mut skip = 0;
                while let Some((idx, d)) = self.levels[COARSE].next_in_range(start, skip, count) {
                    skip = d + 1;
                    dead += self.visit(COARSE, idx, &mut is_live, |w, e| {
                        let key = e.key();
                        let due = unpack(base, e.due_lo);
                        debug_assert!(due > base);
                        if due <= to {
                            gone += u64::from(emit.emit(
                                Fired {
                                    key,
                                    due: Tick(due),
                                },
                                &mut w.carry,
                            ));
                            false
                        } else if due - to <= fine_mask {
                            // Promoted once; its fine bucket lies past `to`, so this call does
                            // not meet it again.
                            w.levels[FINE].push(&mut w.pool, (due & fine_mask) as usize, e);
                            false
                        } else {
                            // Its window starts after `to`: a later turn of this bucket.
                            true
                        }
                    });
                }

                if !self.far.is_empty() {
                    let mut far = mem::take(&mut self.far);
                    let mut far_min = u64::MAX;
                    far.retain(|f| {
                        if !is_live(f.key) {
                            dead += 1;
                            false
                        } else if f.due <= to {
                            let fired = Fired {
                                key: f.key,
                                due: Tick(f.due),
                            };
                            gone += u64::from(emit.emit(fired, &mut self.carry));
                            false
                        } else if f.due - to < self.span {
                            // Placed relative to `to`: its bucket is past every bucket this
                            // call has visited.
                            self.place(f.key, f.due, to);
                            false
                        } else {
                            far_min = far_min.min(f.due);
                            true
                        }
                    });
                    debug_assert!(self.far.is_empty());
                    self.far = far;
                    self.far_min = far_min;
                }
            }
            self.now = to;
        }

        debug_assert!(self.len >= dead + gone);
        self.len -= dead + gone;
        // The counter is only as exact as the caller's `cancelled()` calls; never underflow.
        self.tombstones = self.tombstones.saturating_sub(dead);
        emit.fired
    }

    /// Visits bucket `idx` of level `lvl` and returns how many dead entries it dropped. Each live
    /// entry, in order, goes to `keep(wheel, entry)`, which decides whether it stays; kept
    /// entries are compacted to the front of the bucket's own chain and the chunks left over go
    /// back to the pool. `keep` may push to other buckets, never to this one.
    fn visit<L, K>(&mut self, lvl: usize, idx: usize, is_live: &mut L, mut keep: K) -> u64
    where
        L: FnMut(TimerKey) -> bool,
        K: FnMut(&mut Wheel, Entry) -> bool,
    {
        // Detached while visited, so that a push into it by `keep` would be caught below.
        let b = mem::replace(&mut self.levels[lvl].buckets[idx], Bucket::EMPTY);
        let (mut read, mut remaining) = (b.head, b.len as usize);
        let (mut write, mut wi, mut kept, mut last) = (b.head, 0usize, 0u32, NIL);
        let mut dead = 0u64;
        // The chunks of this chain were written long ago and are cold: keep the next
        // `PREFETCH_CHUNKS` of them on their way while the current one is processed.
        let mut ahead = read;
        for _ in 0..PREFETCH_CHUNKS {
            self.pool.prefetch(ahead);
            ahead = self.pool.after(ahead);
        }
        while remaining > 0 {
            let n = remaining.min(CHUNK);
            let next = self.pool.next[read as usize];
            self.pool.prefetch(ahead);
            ahead = self.pool.after(ahead);
            let entries = self.pool.chunks[read as usize].entries;
            // Liveness of the whole chunk first, in a loop without data-dependent branches: the
            // owner-record reads are cache misses at scale (most entries are tombstones), and
            // this lets the CPU overlap them instead of stalling behind each live/dead branch.
            let mut live = [false; CHUNK];
            for (l, e) in live.iter_mut().zip(&entries[..n]) {
                *l = is_live(e.key());
            }
            for (e, &alive) in entries[..n].iter().zip(&live) {
                if !alive {
                    dead += 1;
                } else if keep(self, *e) {
                    // The write cursor never passes the read cursor, so this slot was read.
                    self.pool.chunks[write as usize].entries[wi] = *e;
                    last = write;
                    kept += 1;
                    wi += 1;
                    if wi == CHUNK {
                        write = self.pool.next[write as usize];
                        wi = 0;
                    }
                }
            }
            remaining -= n;
            read = next;
        }
        debug_assert_eq!(read, NIL);
        debug_assert_eq!(
            self.levels[lvl].buckets[idx].len, 0,
            "keep pushed into its bucket"
        );
        if kept == 0 {
            self.pool.release_chain(b.head);
            self.levels[lvl].occ.clear(idx);
        } else {
            let rest = mem::replace(&mut self.pool.next[last as usize], NIL);
            self.pool.release_chain(rest);
            self.levels[lvl].buckets[idx] = Bucket {
                head: b.head,
                tail: last,
                len: kept,
            };
        }
        dead
    }

    /// The earliest tick at which `advance` may fire something: `Some(now())` if entries are
    /// waiting in the carry queue, otherwise a lower bound that is never later than the earliest
    /// live due tick (it may be earlier: a coarse bucket answers with its window start, and dead
    /// entries are not excluded). `None` if the wheel holds no entry at all.
    pub fn next_due(&self) -> Option<Tick> {
        if !self.carry.is_empty() {
            return Some(Tick(self.now));
        }
        if self.len == 0 {
            return None;
        }
        let mut best = self.far_min;
        let fine_start = self.now + 1;
        let [fine, coarse] = &self.levels;
        if let Some(idx) = fine.occ.next_from((fine_start & fine.mask) as usize) {
            best = best.min(fine_start + ((idx as u64).wrapping_sub(fine_start) & fine.mask));
        }
        let window = (self.now >> self.fine_bits) + 1;
        if let Some(idx) = coarse.occ.next_from((window & coarse.mask) as usize) {
            let w = window + ((idx as u64).wrapping_sub(window) & coarse.mask);
            best = best.min(w << self.fine_bits);
        }
        debug_assert!(best != u64::MAX);
        Some(Tick(best))
    }

    /// Current counters.
    pub fn stats(&self) -> WheelStats {
        WheelStats {
            entries: self.len,
            tombstones: self.tombstones,
            carry: self.carry.len() as u64,
        }
    }

    /// Entries stored, live and dead.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries stored minus known tombstones.
    pub fn live(&self) -> u64 {
        self.len.saturating_sub(self.tombstones)
    }

    /// Heap bytes held by the wheel (pooled chunks and spare capacity included), from its own
    /// bookkeeping.
    pub fn heap_bytes(&self) -> usize {
        self.levels.iter().map(Level::heap_bytes).sum::<usize>()
            + self.pool.chunks.len() * mem::size_of::<Chunk>()
            + self.pool.chunks.capacity() * mem::size_of::<Box<Chunk>>()
            + self.pool.next.capacity() * mem::size_of::<u32>()
            + self.pool.free.capacity() * mem::size_of::<u32>()
            + self.far.capacity() * mem::size_of::<FarEntry>()
            + self.carry.capacity() * mem::size_of::<Fired>()
    }
}
