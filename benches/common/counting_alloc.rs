//! A counting global allocator for measurements that must be deterministic: it forwards every
//! call to the system allocator and keeps the live heap in bytes requested and in blocks. Used by
//! `benches/wheel.rs` (bytes per timer) and `tests/log_memory.rs` (bytes per logged event), each
//! of which installs it with `#[global_allocator]`.
//!
//! The counters are process-wide: a measurement is a difference of two readings with nothing
//! else allocating in between.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Passes every call to [`System`] and counts the live bytes and blocks.
pub struct Counting;

static BYTES: AtomicIsize = AtomicIsize::new(0);
static BLOCKS: AtomicIsize = AtomicIsize::new(0);

/// Live heap bytes (as requested, so every `Vec`'s slack is included).
pub fn live_bytes() -> isize {
    BYTES.load(Ordering::SeqCst)
}

/// Live heap blocks.
#[allow(dead_code)] // The wheel bench counts bytes only.
pub fn live_blocks() -> isize {
    BLOCKS.load(Ordering::SeqCst)
}

fn added(bytes: usize) {
    BYTES.fetch_add(bytes as isize, Ordering::Relaxed);
    BLOCKS.fetch_add(1, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees carry over; the counters are bookkeeping only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            added(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            added(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
        BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}
