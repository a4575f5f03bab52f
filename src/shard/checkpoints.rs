//! A shard's checkpoint storage in one process ([`crate::runtime::CheckpointStorage`]): the
//! chunks of its freezes go to the checkpoint writer (`crate::checkpoint`), which writes every
//! shard's chunks of a round into one transaction of `checkpoint.redb`.
//!
//! Invariants: a chunk is sent only with room reserved in the writer's queue (a shard never
//! blocks on a slow disk while it has input to apply); a freeze given up (the shard rebuilt
//! after a failed commit) drops its round at the writer.

use geodwell_core::engine::DeviceState;
use geodwell_core::partition::{Driver, Frozen};
use tokio::sync::mpsc;

use crate::checkpoint::CkMsg;
use crate::runtime::{CHECKPOINT_CHUNK, CheckpointStorage};

/// One shard's checkpoint storage.
pub(super) struct WriterCheckpoints {
    shard: usize,
    /// The writer's queue (`None` without a store: nothing is checkpointed).
    tx: Option<mpsc::Sender<CkMsg>>,
    /// The round of the running freeze.
    round: u64,
    /// Room in the writer's queue for the next chunk.
    permit: Option<mpsc::OwnedPermit<CkMsg>>,
}

impl WriterCheckpoints {
    /// Shard `shard`'s storage, writing through `tx` (`None`: no store).
    pub(super) fn new(shard: usize, tx: Option<mpsc::Sender<CkMsg>>) -> WriterCheckpoints {
        WriterCheckpoints {
            shard,
            tx,
            round: 0,
            permit: None,
        }
    }

    /// Whether checkpoints are written at all (a store is configured).
    pub(super) fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Round `round` asks this shard to freeze.
    pub(super) fn begin(&mut self, round: u64) {
        self.round = round;
    }

    /// The writer's queue, when the running freeze waits for room in it.
    pub(super) fn wants_room(&self, driver: &Driver) -> Option<mpsc::Sender<CkMsg>> {
        self.tx
            .clone()
            .filter(|_| driver.frozen().is_some() && self.permit.is_none())
    }

    /// Room was reserved for the next chunk.
    pub(super) fn room(&mut self, permit: Option<mpsc::OwnedPermit<CkMsg>>) {
        self.permit = permit;
    }

    /// The running freeze is given up (the shard is rebuilt): its round is dropped.
    pub(super) async fn abort(&mut self, driver: &Driver) {
        if driver.frozen().is_some()
            && let Some(tx) = &self.tx
        {
            let _ = tx.send(CkMsg::Abort { round: self.round }).await;
        }
        self.permit = None;
    }

    /// Hands out what is left of a freeze asked for at shutdown, whole: no input comes any more.
    pub(super) async fn finish(&mut self, driver: &mut Driver) {
        let (Some(f), Some(tx)) = (driver.frozen().cloned(), self.tx.clone()) else {
            return;
        };
        loop {
            let mut devices = Vec::with_capacity(CHECKPOINT_CHUNK);
            let done = driver.checkpoint_chunk(CHECKPOINT_CHUNK, &mut devices);
            let msg = self.chunk_msg(f.clone(), devices, done);
            if tx.send(msg).await.is_err() || done {
                return;
            }
        }
    }

    fn chunk_msg(&self, f: Frozen, devices: Vec<DeviceState>, done: bool) -> CkMsg {
        CkMsg::Devices {
            shard: self.shard,
            round: self.round,
            seq: f.position,
            watermark: f.watermark,
            recent: f.recent,
            devices,
            done,
        }
    }
}

impl CheckpointStorage for WriterCheckpoints {
    fn frozen(&mut self, _at: Frozen) {}

    fn chunk(&mut self, at: Frozen, devices: Vec<DeviceState>, done: bool) {
        let msg = self.chunk_msg(at, devices, done);
        if let Some(permit) = self.permit.take() {
            permit.send(msg);
        }
    }
}
