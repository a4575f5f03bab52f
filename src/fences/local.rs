//! The single-process fence writer ([`FenceWriter`]): changes numbered in order, persisted in
//! the input log through the publisher, then sent to every local partition.
//!
//! Invariants: one write at a time (the lock), so every partition receives the changes in
//! number order; a change is durable before the read copy or any partition sees it, and a write
//! that fails to persist changes nothing; a checkpoint round starts under the same lock
//! ([`LocalFences::checkpoint`]), so every partition freezes with the same fences.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::map::FenceMap;
use super::writer::{FenceCheck, FenceWrite, FenceWriteError, FenceWriter, Written};
use crate::events::publisher::{PublishError, Publisher, Step};
use crate::shard::{LocalShards, Partitions};
use geodwell_core::partition::record::{FenceChange, encode_fence_change};
use geodwell_core::partition::{ChangeLog, FenceUpdate};

/// What the write lock guards besides the order of writes.
#[derive(Debug, Default)]
struct Changes {
    /// The number the next fence change gets.
    next: u64,
    /// Fences changed since the last checkpoint, with the number of their latest change.
    since_checkpoint: BTreeMap<String, u64>,
}

/// The fence log of one process.
#[derive(Debug)]
pub struct LocalFences {
    map: Arc<FenceMap>,
    write: tokio::sync::Mutex<Changes>,
    publisher: Publisher,
    shards: LocalShards,
}

impl LocalFences {
    /// A writer whose read copy is `map` (the fences the partitions already hold), persisting
    /// through `publisher` and sending to `shards`; its next change is number `next_change`,
    /// and `since_checkpoint` are the fences changed (with their latest change number) since the
    /// latest checkpoint.
    pub fn new(
        map: Arc<FenceMap>,
        publisher: Publisher,
        shards: LocalShards,
        next_change: u64,
        since_checkpoint: Vec<(String, u64)>,
    ) -> LocalFences {
        LocalFences {
            map,
            write: tokio::sync::Mutex::new(Changes {
                next: next_change.max(1),
                since_checkpoint: since_checkpoint.into_iter().collect(),
            }),
            publisher,
            shards,
        }
    }

    async fn write_inner(
        &self,
        writes: Vec<FenceWrite>,
        check: FenceCheck<'_>,
    ) -> Result<Written, FenceWriteError> {
        let mut changes = self.write.lock().await;
        let written = check(&self.map)?;
        let first = changes.next;
        let step = Step {
            fence_changes: writes
                .iter()
                .zip(first..)
                .map(|(w, n)| (n, encode(w)))
                .collect(),
            ..Step::default()
        };
        persist(&self.publisher, step).await?;
        changes.next = first + writes.len() as u64;
        for (w, n) in writes.into_iter().zip(first..) {
            let sent = match w {
                FenceWrite::Put(s) => {
                    let f = s.fence.clone();
                    changes.since_checkpoint.insert(f.id.to_string(), n);
                    self.map.insert(s);
                    self.shards.upsert_fence(f, n).await
                }
                FenceWrite::Delete(id) => {
                    changes.since_checkpoint.insert(id.clone(), n);
                    self.map.remove(&id);
                    self.shards.remove_fence(Arc::from(id.as_str()), n).await
                }
            };
            sent.map_err(|_| FenceWriteError::ShuttingDown)?;
        }
        Ok(written)
    }

    /// Sends partition `k` the fence changes it missed, in order: after a crash, a change whose
    /// record was durable may not have reached every partition's log. `changes` is the fence
    /// log after the checkpoint; `from` the first change the partition lacks.
    pub async fn catch_up_shard(
        &self,
        k: usize,
        from: u64,
        changes: &ChangeLog,
    ) -> Result<(), FenceWriteError> {
        let _order = self.write.lock().await;
        for (&n, change) in changes.0.range(from..) {
            let (fence, id): (_, &str) = match change {
                FenceUpdate::Put(f) => (Some(f.clone()), &f.id),
                FenceUpdate::Delete(id) => (None, id),
            };
            self.shards
                .fence_to(k, fence, id, n)
                .await
                .map_err(|_| FenceWriteError::ShuttingDown)?;
        }
        Ok(())
    }

    /// Starts checkpoint `round` (see `crate::checkpoint`): under the write lock, so that no
    /// fence change is in flight, the writer is sent the fences changed since the last
    /// checkpoint, then every partition is asked to freeze after what is queued on it.
    /// With `full`, every device is written (the previous round failed). Returns the last fence
    /// change the checkpoint covers.
    pub async fn checkpoint(
        &self,
        round: u64,
        writer: &crate::checkpoint::Checkpointer,
        full: bool,
    ) -> Result<u64, FenceWriteError> {
        let changes = self.write.lock().await;
        let fences = changes
            .since_checkpoint
            .keys()
            .map(|id| (id.clone(), self.map.get(id).map(|s| s.json.to_string())))
            .collect();
        writer
            .tx
            .send(crate::checkpoint::CkMsg::Round {
                round,
                shards: self.shards.len(),
                fences,
                fence_change: changes.next - 1,
                event_floor: self.publisher.durable().next_seq(),
                began: crate::checkpoint::Began::now(self.publisher.health()),
            })
            .await
            .map_err(|_| FenceWriteError::ShuttingDown)?;
        self.shards
            .checkpoint(round, full)
            .await
            .map_err(|_| FenceWriteError::ShuttingDown)?;
        Ok(changes.next - 1)
    }

    /// A checkpoint covering fence changes up to `fence_change` has committed: those changes
    /// need not be written again.
    pub async fn checkpointed(&self, fence_change: u64) {
        self.write
            .lock()
            .await
            .since_checkpoint
            .retain(|_, n| *n > fence_change);
    }
}

impl FenceWriter for LocalFences {
    fn write<'a>(
        &'a self,
        changes: Vec<FenceWrite>,
        check: FenceCheck<'a>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Written, FenceWriteError>> + Send + 'a>> {
        Box::pin(self.write_inner(changes, check))
    }
}

/// Makes a fence change durable before it is applied or acknowledged.
async fn persist(publisher: &Publisher, mut step: Step) -> Result<(), FenceWriteError> {
    let (tx, rx) = oneshot::channel();
    step.ack = Some(tx);
    publisher
        .send(step)
        .await
        .map_err(|_| FenceWriteError::ShuttingDown)?;
    match rx.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(PublishError::Store(e))) => Err(FenceWriteError::Store(e)),
        Ok(Err(PublishError::Closed)) | Err(_) => Err(FenceWriteError::ShuttingDown),
    }
}

/// A fence change as the input log holds it.
fn encode(w: &FenceWrite) -> Vec<u8> {
    let c = match w {
        FenceWrite::Put(s) => FenceChange::Put(s.json.clone()),
        FenceWrite::Delete(id) => FenceChange::Delete(id.clone()),
    };
    let mut out = Vec::new();
    encode_fence_change(&c, &mut out);
    out
}
