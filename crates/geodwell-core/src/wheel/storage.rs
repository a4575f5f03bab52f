//! The storage under the wheel's levels: 12-byte entries in 64-entry chunks from one shared
//! pool, chained per bucket, with an occupancy bitmap per level.
//!
//! Owns the memory layout and nothing of the timing: which bucket an entry belongs in, and when
//! it fires, is decided in the parent module. Invariants: a bucket's chain holds exactly `len`
//! entries in `len.div_ceil(CHUNK)` chunks, all full except the tail; a bucket has a chain
//! (`head != NIL`) exactly when its occupancy bit is set; every chunk is in exactly one bucket's
//! chain or on the pool's free list.

use std::mem;

use super::TimerKey;

/// A level entry: 12 bytes. Only the low 32 bits of the due tick are kept; the full value is
/// recovered from the wheel's current tick because level entries are less than 2^24 ticks ahead.
#[derive(Clone, Copy)]
pub(super) struct Entry {
    pub(super) slot: u32,
    pub(super) generation: u32,
    pub(super) due_lo: u32,
}

impl Entry {
    #[inline]
    pub(super) fn new(key: TimerKey, due: u64) -> Entry {
        Entry {
            slot: key.slot,
            generation: key.generation,
            // Truncation is the point: see `unpack`.
            due_lo: due as u32,
        }
    }

    #[inline]
    pub(super) fn key(self) -> TimerKey {
        TimerKey {
            slot: self.slot,
            generation: self.generation,
        }
    }
}

/// Recovers a level entry's full due tick from `base`, a tick less than 2^32 ticks before it.
#[inline]
pub(super) fn unpack(base: u64, due_lo: u32) -> u64 {
    base + u64::from(due_lo.wrapping_sub(base as u32))
}

/// An overflow entry, beyond the coarse level's span: full-width due tick (16 bytes).
#[derive(Clone, Copy)]
pub(super) struct FarEntry {
    pub(super) key: TimerKey,
    pub(super) due: u64,
}

/// Occupancy bitmap of one level: a bit per bucket plus a summary bit per 64-bucket word, so the
/// next occupied bucket is found in at most three word reads whatever the gap.
pub(super) struct Occupancy {
    words: Box<[u64]>,
    summary: u64,
}

impl Occupancy {
    fn new(buckets: usize) -> Occupancy {
        debug_assert!(buckets <= 64 * 64);
        Occupancy {
            words: vec![0; buckets.div_ceil(64)].into_boxed_slice(),
            summary: 0,
        }
    }

    #[inline]
    fn set(&mut self, i: usize) {
        let w = i >> 6;
        self.words[w] |= 1 << (i & 63);
        self.summary |= 1 << w;
    }

    #[inline]
    pub(super) fn clear(&mut self, i: usize) {
        let w = i >> 6;
        self.words[w] &= !(1 << (i & 63));
        if self.words[w] == 0 {
            self.summary &= !(1 << w);
        }
    }

    /// The first occupied bucket at or after `start`, wrapping around the level.
    #[inline]
    pub(super) fn next_from(&self, start: usize) -> Option<usize> {
        let w = start >> 6;
        let here = self.words[w] & (u64::MAX << (start & 63));
        if here != 0 {
            return Some((w << 6) | here.trailing_zeros() as usize);
        }
        let later = self.summary & (u64::MAX << w) & !(1u64 << w);
        // Nothing at or after `start`: the lowest occupied bucket is the next one circularly.
        let pick = if later != 0 { later } else { self.summary };
        if pick == 0 {
            return None;
        }
        let w2 = pick.trailing_zeros() as usize;
        debug_assert!(self.words[w2] != 0);
        Some((w2 << 6) | self.words[w2].trailing_zeros() as usize)
    }
}

/// Entries per storage chunk. Small enough that a sparse wheel (one entry in each of many
/// buckets) stays small, large enough that the link overhead is negligible.
pub(super) const CHUNK: usize = 64;
/// "No chunk".
pub(super) const NIL: u32 = u32::MAX;
/// How many chunks ahead of the one being processed a bucket visit prefetches.
pub(super) const PREFETCH_CHUNKS: usize = 2;

/// A fixed block of entries, linked into one bucket's chain through [`Pool::next`]. Aligned to
/// a cache line, so that its 768 bytes are exactly 12 lines.
#[repr(C, align(64))]
pub(super) struct Chunk {
    pub(super) entries: [Entry; CHUNK],
}

/// Asks the CPU to start loading chunk `c` into cache. A bucket visit walks chunks written one
/// dwell earlier, cold by then: prefetching the chain ahead of the visit overlaps those misses
/// with the work on the current chunk instead of stalling on each one in turn.
#[inline(always)]
fn prefetch_chunk(c: &Chunk) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let p = std::ptr::from_ref(c).cast::<i8>();
        for line in 0..mem::size_of::<Chunk>() / 64 {
            // SAFETY: `_mm_prefetch` only needs SSE, part of the x86_64 baseline, so the target
            // feature is always present; a prefetch is a hint that never dereferences its
            // address (nor faults), and the address lies inside `c` anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line * 64)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = c;
}

/// All buckets of both levels store their entries in chunks from this one pool. A bucket drained
/// by a visit hands its chunks back for the buckets being filled, so the steady state allocates
/// nothing and memory follows the number of stored entries, not the number of buckets times the
/// largest bucket ever seen. Chunks are kept once allocated: the pool is bounded by the peak
/// number of stored entries (rounded up to a chunk per occupied bucket).
pub(super) struct Pool {
    /// Boxed one by one so that growing the pool never copies or over-reserves chunks.
    #[expect(
        clippy::vec_box,
        reason = "a Vec<Chunk> would double (and copy) 768-byte chunks when it grows"
    )]
    pub(super) chunks: Vec<Box<Chunk>>,
    /// Chain links, `next[c]` following chunk `c` (or [`NIL`]). Kept apart from the chunks (4
    /// bytes per 768-byte chunk) so that a visit can find the chunks ahead, and prefetch them,
    /// without touching their cold memory first.
    pub(super) next: Vec<u32>,
    pub(super) free: Vec<u32>,
}

impl Pool {
    #[inline]
    fn alloc(&mut self) -> u32 {
        let c = match self.free.pop() {
            Some(c) => c,
            None => {
                self.chunks.push(Box::new(Chunk {
                    entries: [Entry {
                        slot: 0,
                        generation: 0,
                        due_lo: 0,
                    }; CHUNK],
                }));
                self.next.push(NIL);
                (self.chunks.len() - 1) as u32
            }
        };
        self.next[c as usize] = NIL;
        c
    }

    /// Returns the chain starting at `c` to the free list.
    #[inline]
    pub(super) fn release_chain(&mut self, mut c: u32) {
        while c != NIL {
            let next = self.next[c as usize];
            self.free.push(c);
            c = next;
        }
    }

    /// The chunk after `c` in its chain ([`NIL`] after the last one, or for `c == NIL`).
    #[inline]
    pub(super) fn after(&self, c: u32) -> u32 {
        self.next.get(c as usize).copied().unwrap_or(NIL)
    }

    /// Starts loading chunk `c` (nothing for [`NIL`]).
    #[inline]
    pub(super) fn prefetch(&self, c: u32) {
        if let Some(chunk) = self.chunks.get(c as usize) {
            prefetch_chunk(chunk);
        }
    }
}

/// One bucket: a chain of chunks, all full except the tail.
#[derive(Clone, Copy)]
pub(super) struct Bucket {
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) len: u32,
}

impl Bucket {
    pub(super) const EMPTY: Bucket = Bucket {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// One level: `2^bits` buckets plus their occupancy bitmap.
pub(super) struct Level {
    pub(super) buckets: Box<[Bucket]>,
    pub(super) occ: Occupancy,
    pub(super) mask: u64,
}

impl Level {
    pub(super) fn new(bits: u32) -> Level {
        let n = 1usize << bits;
        Level {
            buckets: vec![Bucket::EMPTY; n].into_boxed_slice(),
            occ: Occupancy::new(n),
            mask: (n - 1) as u64,
        }
    }

    #[inline]
    pub(super) fn push(&mut self, pool: &mut Pool, idx: usize, e: Entry) {
        let b = &mut self.buckets[idx];
        let off = b.len as usize % CHUNK;
        if b.len == 0 {
            let c = pool.alloc();
            b.head = c;
            b.tail = c;
            self.occ.set(idx);
        } else if off == 0 {
            let c = pool.alloc();
            pool.next[b.tail as usize] = c;
            b.tail = c;
        }
        pool.chunks[b.tail as usize].entries[off] = e;
        b.len += 1;
    }

    /// Among the `count` bucket positions starting at bucket `start` (circularly), the first
    /// occupied one at position `>= skip`: returns its bucket index and position.
    #[inline]
    pub(super) fn next_in_range(&self, start: u64, skip: u64, count: u64) -> Option<(usize, u64)> {
        if skip >= count {
            return None;
        }
        let pos = (start + skip) & self.mask;
        let idx = self.occ.next_from(pos as usize)? as u64;
        let d = skip + (idx.wrapping_sub(pos) & self.mask);
        (d < count).then_some((idx as usize, d))
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.buckets.len() * mem::size_of::<Bucket>() + self.occ.words.len() * 8
    }
}
