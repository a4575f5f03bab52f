//! A partition's checkpoint storage on a cluster node ([`crate::runtime::CheckpointStorage`]):
//! the chunks of a freeze are encoded into one object ([`Encoder`]); once the last is in, the
//! object is written in the background and the partition's pointer moved to it
//! ([`checkpoint::write`]), once every event produced before the freeze is in the stream.
//!
//! Invariants: one freeze or one write at a time (a freeze is asked for only when neither
//! runs); the pointer this storage knows is the newest that moved; nothing is written while the
//! lease is not valid (the write checks it before the pointer moves).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::checkpoint::{self, Encoder, Pointer};
use super::lease::Lease;
use super::outbox::Outbox;
use super::shared::Shared;
use crate::runtime::{CHECKPOINT_CHUNK, CheckpointStorage};
use geodwell_core::engine::DeviceState;
use geodwell_core::partition::{Driver, Frozen};

/// A checkpoint being frozen into an object.
struct Freeze {
    enc: Encoder,
    produced: u64,
    at: Frozen,
    ev_mark: u64,
    started: Instant,
}

/// One partition's checkpoint storage.
pub(super) struct ObjectCheckpoints {
    sh: Arc<Shared>,
    p: u16,
    lease: Arc<Lease>,
    /// The partition's outbox (a freeze notes how far it got; the pointer waits for it).
    outbox: Outbox,
    /// The newest checkpoint (pointer) this partition knows.
    pointer: Option<Pointer>,
    /// A checkpoint being written in the background.
    writing: Option<JoinHandle<Option<Pointer>>>,
    /// The freeze being encoded.
    freeze: Option<Freeze>,
}

impl ObjectCheckpoints {
    /// Partition `p`'s storage, its newest checkpoint `pointer` (read at takeover).
    pub(super) fn new(
        sh: Arc<Shared>,
        p: u16,
        lease: Arc<Lease>,
        outbox: Outbox,
        pointer: Option<Pointer>,
    ) -> ObjectCheckpoints {
        ObjectCheckpoints {
            sh,
            p,
            lease,
            outbox,
            pointer,
            writing: None,
            freeze: None,
        }
    }

    /// Whether a freeze is being encoded (it takes its chunks between records).
    pub(super) fn freezing(&self) -> bool {
        self.freeze.is_some()
    }

    /// Whether neither a freeze nor a write runs (a new freeze may be asked for).
    pub(super) fn idle(&self) -> bool {
        self.freeze.is_none() && self.writing.is_none()
    }

    /// Whether the driver applied input the newest checkpoint does not cover.
    pub(super) fn behind(&self, driver: &Driver) -> bool {
        driver.applied() > self.covered()
    }

    /// The input position the newest checkpoint covers (0: none).
    fn covered(&self) -> u64 {
        self.pointer.as_ref().map_or(0, |c| c.input_seq)
    }

    /// The newest checkpoint this partition knows.
    pub(super) fn pointer(&self) -> Option<&Pointer> {
        self.pointer.as_ref()
    }

    /// Takes a finished write's pointer; returns it when it moved.
    pub(super) async fn written(&mut self) -> Option<&Pointer> {
        let w = self.writing.take_if(|w| w.is_finished())?;
        let ptr = w.await.ok().flatten()?;
        self.pointer = Some(ptr);
        self.pointer.as_ref()
    }

    /// Waits (at most 10 s) for a write in progress to end.
    pub(super) async fn settle(&mut self) {
        if let Some(w) = self.writing.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
        }
    }

    /// The checkpoint of a graceful stop: everything the engine holds, written whole at once
    /// (no input comes any more); true once its pointer moved, or when nothing is new.
    pub(super) async fn write_final(&mut self, driver: &mut Driver) -> bool {
        if !self.behind(driver) {
            return true;
        }
        // A half-handed-out checkpoint is finished by the new freeze (the engine merges them).
        let at = driver.freeze(true);
        self.frozen(at);
        loop {
            let mut devices = Vec::with_capacity(CHECKPOINT_CHUNK);
            let done = driver.checkpoint_chunk(CHECKPOINT_CHUNK, &mut devices);
            if let Some(f) = self.freeze.as_mut() {
                f.enc.devices(&devices);
            }
            if done {
                break;
            }
        }
        let Some(f) = self.freeze.take() else {
            return false;
        };
        let w = self.write(f);
        matches!(
            tokio::time::timeout(Duration::from_secs(20), w).await,
            Ok(Some(_))
        )
    }

    /// Ends the storage: the write in progress, if any, to wait for (the outbox handle is let
    /// go, so the outbox can end).
    pub(super) fn finish(self) -> Option<JoinHandle<Option<Pointer>>> {
        self.writing
    }

    /// Writes a frozen checkpoint ([`checkpoint::write`]).
    fn write(&self, f: Freeze) -> impl Future<Output = Option<Pointer>> + use<> {
        let w = checkpoint::Write {
            enc: f.enc,
            produced: f.produced,
            input_seq: f.at.position,
            fence_pos: f.at.fence_pos,
            ev_mark: f.ev_mark,
            started: f.started,
        };
        checkpoint::write(
            self.sh.clone(),
            self.p,
            self.lease.clone(),
            self.outbox.clone(),
            w,
            self.pointer.clone(),
        )
    }
}

impl CheckpointStorage for ObjectCheckpoints {
    fn frozen(&mut self, at: Frozen) {
        let acked = self.outbox.acked();
        self.freeze = Some(Freeze {
            enc: Encoder::new(self.p, &at, acked.last, self.sh.checkpoint_version()),
            produced: self.outbox.produced(),
            at,
            ev_mark: acked.last,
            started: Instant::now(),
        });
    }

    fn chunk(&mut self, _at: Frozen, devices: Vec<DeviceState>, done: bool) {
        if let Some(f) = self.freeze.as_mut() {
            f.enc.devices(&devices);
        }
        if done && let Some(f) = self.freeze.take() {
            self.writing = Some(tokio::spawn(self.write(f)));
        }
    }
}
