//! Whether the store takes commits, as the publisher found it, shared with ingest, readiness and
//! the local partitions.
//!
//! A partition applies a step before its commit (one `fdatasync` per step, not two); when the
//! commit fails, the partitions whose steps were not committed hold state the log does not.
//! So a failed commit moves the store to [`StoreState::Failing`]: those partitions are marked
//! for a rebuild, ingest refuses new input at once (nothing more is applied), `/readyz` answers
//! not ready, and the publisher probes the store every second. Once a probe commits, the store
//! is [`StoreState::Recovering`]: each marked partition rebuilds itself from the durable log
//! (checkpoint and records, the runtime's one restore path) and says so through the publisher;
//! once the last has, the store is [`StoreState::Healthy`] again and input is taken.
//!
//! Invariants: a step of a marked partition is never committed until that partition's rebuild
//! (its marker comes through the publisher's queue after every step it sent before); nothing a
//! refused request carried is ever applied to the state that is committed or published.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::store::StoreError;

/// Where the store stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreState {
    /// Commits succeed.
    Healthy,
    /// A commit failed; the store is probed every second.
    Failing,
    /// A probe committed; partitions marked for a rebuild are rebuilding.
    Recovering,
}

/// The store's health (one per service).
#[derive(Debug)]
pub struct StoreHealth {
    state: AtomicU8,
    /// Partitions to rebuild before their steps are committed again.
    dirty: Mutex<BTreeSet<u16>>,
    /// Bumped when the store takes commits again (rebuilds start then).
    recovered: watch::Sender<u64>,
    /// Bumped at every failure: a checkpoint round spanning one is dropped.
    failures: AtomicU64,
    /// Why the last commit failed, for the 503s.
    reason: Mutex<Option<Arc<StoreError>>>,
}

impl Default for StoreHealth {
    fn default() -> StoreHealth {
        StoreHealth {
            state: AtomicU8::new(0),
            dirty: Mutex::new(BTreeSet::new()),
            recovered: watch::Sender::new(0),
            failures: AtomicU64::new(0),
            reason: Mutex::new(None),
        }
    }
}

impl StoreHealth {
    /// Where the store stands.
    pub fn state(&self) -> StoreState {
        match self.state.load(Ordering::Acquire) {
            0 => StoreState::Healthy,
            1 => StoreState::Failing,
            _ => StoreState::Recovering,
        }
    }

    /// Whether new input may be taken.
    pub fn healthy(&self) -> bool {
        self.state() == StoreState::Healthy
    }

    /// Why the store does not take input (the last commit error).
    pub fn reason(&self) -> Option<Arc<StoreError>> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Failures so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Acquire)
    }

    /// A commit failed because of `why`.
    pub fn failed(&self, why: Arc<StoreError>) {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.failures.fetch_add(1, Ordering::AcqRel);
        self.state.store(1, Ordering::Release);
    }

    /// Marks partition `p` for a rebuild (a step of it was not committed).
    pub fn mark(&self, p: u16) {
        self.dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(p);
    }

    /// Whether partition `p` must rebuild before its steps are committed.
    pub fn is_marked(&self, p: u16) -> bool {
        self.dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&p)
    }

    /// A probe committed: marked partitions rebuild now (healthy at once if there are none).
    pub fn probe_committed(&self) {
        self.state.store(2, Ordering::Release);
        self.recovered.send_modify(|g| *g += 1);
        self.settle();
    }

    /// Partition `p` rebuilt (its marker came through the publisher's queue).
    pub fn rebuilt(&self, p: u16) {
        self.dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&p);
        self.settle();
    }

    /// Recovering with nothing left to rebuild: healthy.
    fn settle(&self) {
        let clean = self
            .dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if clean && self.state() == StoreState::Recovering {
            self.state.store(0, Ordering::Release);
            tracing::info!("the state store takes commits again; input is taken");
        }
    }

    /// A receiver that sees the store take commits again.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.recovered.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_heals_once_every_marked_partition_rebuilt() {
        let h = StoreHealth::default();
        assert!(h.healthy());
        h.failed(Arc::new(StoreError::Applying {
            behind: crate::store::Behind::Backlog { bytes: 1 },
            failing: Some("no space".into()),
        }));
        h.mark(1);
        h.mark(3);
        assert_eq!(h.state(), StoreState::Failing);
        h.probe_committed();
        assert_eq!(h.state(), StoreState::Recovering);
        h.rebuilt(1);
        assert!(!h.healthy() && h.is_marked(3) && !h.is_marked(1));
        h.rebuilt(3);
        assert!(h.healthy());
        assert_eq!(h.failures(), 1);
        h.failed(Arc::new(StoreError::Applying {
            behind: crate::store::Behind::Backlog { bytes: 2 },
            failing: Some("again".into()),
        }));
        h.probe_committed();
        assert!(h.healthy(), "nothing to rebuild: healthy at once");
    }
}
