//! The memory budget for queued input: every request body, WebSocket frame and batch waiting
//! for the shards holds a [`Reservation`] of bytes from one [`MemoryBudget`] from the moment it
//! is read until its answer is sent. A reservation that does not fit is refused at once (the
//! caller answers 503 with `Retry-After`), never waited for, so an overload costs memory only up
//! to the budget and is answered fast.
//!
//! Invariants: the bytes reserved never exceed the budget; a reservation gives its bytes back
//! when dropped, whatever path the request took. When the budget empties after at least
//! [`TRIM_AFTER`] bytes were held, the allocator is asked to hand its free memory back to the
//! system ([`trim`]): glibc keeps freed memory in its arenas, so without it an overload's peak
//! would stay the process's size for good. Metrics: `geodwell_ingest_queued_bytes` (held
//! now), `geodwell_ingest_queued_bytes_max` (the budget), `geodwell_ingest_budget_refused_total`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use metrics::{counter, gauge};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::telemetry as t;

/// The shared budget (cheap to clone).
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    sem: Arc<Semaphore>,
    total: usize,
    /// The most bytes held since the budget last emptied.
    high_water: Arc<AtomicUsize>,
}

/// Budget bytes per byte of a JSON text that is parsed whole into a `serde_json::Value` tree (the
/// tree and the text side by side). Measured on 64-bit Linux: a tree takes 8 times its text
/// for a fence polygon, 10 for an array of fixes, 12 for OwnTracks locations and 30 for arrays of
/// two small numbers; this is the largest, rounded up.
pub const TREE_HOLD_FACTOR: usize = 32;

/// Held bytes after which an empty budget trims the allocator.
pub const TRIM_AFTER: usize = 32 << 20;

/// Bytes held from a [`MemoryBudget`] until dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: MemoryBudget,
    permit: Option<OwnedSemaphorePermit>,
}

/// The budget has no room for a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the ingest memory budget of {total} bytes is in use")]
pub struct Exhausted {
    /// The budget.
    pub total: usize,
}

impl MemoryBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> MemoryBudget {
        let total = total.min(Semaphore::MAX_PERMITS);
        gauge!(t::INGEST_QUEUED_BYTES_MAX).set(total as f64);
        gauge!(t::INGEST_QUEUED_BYTES).set(0.0);
        MemoryBudget {
            sem: Arc::new(Semaphore::new(total)),
            total,
            high_water: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The budget in bytes.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Bytes reserved now.
    pub fn in_use(&self) -> usize {
        self.total - self.sem.available_permits()
    }

    /// An empty reservation, to grow as input arrives.
    pub fn empty(&self) -> Reservation {
        Reservation {
            budget: self.clone(),
            permit: None,
        }
    }

    /// Reserves `bytes`, or refuses at once when they do not fit.
    pub fn try_reserve(&self, bytes: usize) -> Result<Reservation, Exhausted> {
        let mut r = self.empty();
        r.grow(bytes)?;
        Ok(r)
    }

    fn publish(&self) {
        let held = self.in_use();
        gauge!(t::INGEST_QUEUED_BYTES).set(held as f64);
        if held > 0 {
            self.high_water.fetch_max(held, Ordering::Relaxed);
        } else if self.high_water.swap(0, Ordering::Relaxed) >= TRIM_AFTER {
            trim();
        }
    }
}

/// Asks the allocator to return free memory to the system, off the async workers (glibc's
/// `malloc_trim`; elsewhere nothing).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let run = || {
            // The request that emptied the budget, and those finishing beside it, are still
            // freeing what they held: trim once they are done.
            std::thread::sleep(std::time::Duration::from_millis(300));
            // SAFETY: malloc_trim only walks glibc's own arenas; it takes no pointer of ours
            // and is safe to call from any thread at any time.
            unsafe {
                libc::malloc_trim(0);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(run);
            }
            Err(_) => run(),
        }
    }
}

impl Reservation {
    /// The whole budget it draws on.
    pub fn budget_total(&self) -> usize {
        self.budget.total
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.permit.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Holds `more` bytes as well, or refuses at once (keeping what it held).
    pub fn grow(&mut self, more: usize) -> Result<(), Exhausted> {
        if more == 0 {
            return Ok(());
        }
        let exhausted = Exhausted {
            total: self.budget.total,
        };
        let n = u32::try_from(more).map_err(|_| exhausted)?;
        let permit = match self.budget.sem.clone().try_acquire_many_owned(n) {
            Ok(p) => p,
            Err(_) => {
                counter!(t::INGEST_BUDGET_REFUSED).increment(1);
                return Err(exhausted);
            }
        };
        match &mut self.permit {
            Some(held) => held.merge(permit),
            None => self.permit = Some(permit),
        }
        self.budget.publish();
        Ok(())
    }
}

impl Reservation {
    /// Gives back `bytes` of what it holds (all of it when it holds less), as soon as the
    /// memory they stood for is freed: a request's body once its fixes are read.
    pub fn release(&mut self, bytes: usize) {
        let Some(held) = &mut self.permit else { return };
        if bytes >= held.num_permits() {
            self.permit = None;
        } else {
            drop(held.split(bytes));
        }
        self.budget.publish();
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.permit.take().is_some() {
            self.budget.publish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_never_exceed_the_budget_and_give_their_bytes_back() {
        let b = MemoryBudget::new(1000);
        let mut a = b.try_reserve(600).unwrap();
        assert_eq!(b.in_use(), 600);
        assert!(b.try_reserve(500).is_err(), "600 + 500 > 1000");
        assert!(a.grow(500).is_err());
        assert_eq!(a.bytes(), 600, "a refused growth keeps what was held");
        a.grow(400).unwrap();
        assert_eq!(b.in_use(), 1000);
        a.release(300);
        assert_eq!((a.bytes(), b.in_use()), (700, 700));
        a.release(10_000);
        assert_eq!((a.bytes(), b.in_use()), (0, 0));
        a.grow(1000).unwrap();
        drop(a);
        assert_eq!(b.in_use(), 0);
        let e = b.empty();
        assert_eq!(e.bytes(), 0);
        assert!(b.try_reserve(usize::MAX).is_err());
    }
}
