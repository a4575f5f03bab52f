//! The tallies a run keeps while it runs: what the server answered, events seen, timing marks,
//! and the refusal that stops the run.
//!
//! Owns: [`Counters`], shared by the senders, the subscriber, the progress line and the report,
//! and the server's per-batch [`Answer`].
//!
//! Invariants:
//! - A batch's fixes are counted once, where the batch ended: in an answer's counts
//!   (`accepted`, `late`, `duplicate`, `rejected`) or in `errors` under the status / code that
//!   lost it; a retried batch counts once in `sent` and each retry in `retries`.
//! - Counters are relaxed atomics: the report reads them after every task writing them has
//!   finished (or been aborted), so no ordering beyond that join is needed.
//! - The first refusal recorded by [`Counters::fail`] wins and cancels the run; later ones are
//!   dropped (they say the same thing).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::error::SimError;

/// Shared tallies of one run.
#[derive(Default, Debug)]
pub(super) struct Counters {
    /// Fixes sent (a retried batch once).
    pub(super) sent: AtomicU64,
    /// Fixes the server accepted.
    pub(super) accepted: AtomicU64,
    /// Fixes it called late.
    pub(super) late: AtomicU64,
    /// Fixes it called duplicates.
    pub(super) duplicate: AtomicU64,
    /// Fixes it rejected item by item.
    pub(super) rejected: AtomicU64,
    /// Batches re-sent after 429 / 503.
    pub(super) retries: AtomicU64,
    /// Events received, indexed by [`crate::track::Kind`].
    pub(super) events: [AtomicU64; 3],
    /// Subscriber `lagged` frames.
    pub(super) lagged: AtomicU64,
    /// Subscriber `gap` frames.
    pub(super) gaps: AtomicU64,
    /// Latest answer, µs on the tracker's clock.
    pub(super) last_answer_us: AtomicU64,
    /// First send, µs on the tracker's clock (0 = none yet).
    pub(super) first_send_us: AtomicU64,
    /// Largest delay of a batch behind its release time, µs.
    pub(super) max_slip_us: AtomicU64,
    /// Fixes lost to whole-batch errors, by status or code.
    errors: std::sync::Mutex<BTreeMap<String, u64>>,
    /// The refusal that stopped the run, if any.
    failure: std::sync::Mutex<Option<SimError>>,
}

impl Counters {
    /// Counts `n` fixes lost under `key` (a status, `ws:<code>`, `connect`, ...).
    pub(super) fn error(&self, key: String, n: u64) {
        *self
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default() += n;
    }

    /// A copy of the lost fixes by key.
    pub(super) fn errors(&self) -> BTreeMap<String, u64> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Adds an answer's counts; `now_us` is when it arrived.
    pub(super) fn answer(&self, r: &Answer, now_us: u64) {
        self.accepted.fetch_add(r.accepted, Relaxed);
        self.late.fetch_add(r.late, Relaxed);
        self.duplicate.fetch_add(r.duplicate, Relaxed);
        self.rejected.fetch_add(r.rejected, Relaxed);
        self.last_answer_us.fetch_max(now_us, Relaxed);
    }

    /// Records the refusal that ends the run (the first one wins) and stops it.
    pub(super) fn fail(&self, e: SimError, stop: &CancellationToken) {
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(e);
        }
        stop.cancel();
    }

    /// Whether [`Counters::fail`] was called.
    pub(super) fn has_failed(&self) -> bool {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// The refusal that ended the run, if any.
    pub(super) fn take_failure(&self) -> Option<SimError> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// The server's per-batch answer (the fields the report uses).
#[derive(Debug, Default, Deserialize)]
pub(super) struct Answer {
    /// Fixes accepted.
    #[serde(default)]
    pub(super) accepted: u64,
    /// Fixes late.
    #[serde(default)]
    pub(super) late: u64,
    /// Fixes that were duplicates.
    #[serde(default)]
    pub(super) duplicate: u64,
    /// Fixes rejected item by item.
    #[serde(default)]
    pub(super) rejected: u64,
    /// A whole-frame error (WebSocket ingest).
    #[serde(default)]
    pub(super) error: Option<ErrorBody>,
}

/// The `error` of an error frame.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ErrorBody {
    /// The error code, e.g. `overloaded`.
    #[serde(default)]
    pub(super) code: String,
}
