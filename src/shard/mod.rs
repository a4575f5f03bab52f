//! The engine partitions of this process, and the handle callers reach any deployment's
//! partitions through.
//!
//! - `local.rs`: a partition of this process: the runtime's task ([`crate::runtime::run`]) with
//!   the single-process backend.
//! - [`Shards`]: the handle. Callers route a validated, stamped batch by device, ask a device's
//!   state, page through devices; they never see channels, subjects or messages. It reaches the
//!   partitions through [`Partitions`], implemented here by [`LocalShards`] (this process's
//!   tasks over bounded channels) and by a cluster node (`crate::cluster`).
//!
//! Invariants:
//! - A device always maps to the same partition (`xxh3(device) % partitions`, [`shard_of`]).
//! - A batch is sent all or nothing: nothing unless every partition it needs has room, so a
//!   refusal never means "partly applied"; batches sent one after another reach every
//!   partition in that order (pipelining keeps order).
//! - Fence changes are sent to every local partition in the order they are made (the caller
//!   serializes them, see `crate::fences`), so all partitions hold the same fences.

mod checkpoints;
mod cursor;
mod local;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use geodwell_core::engine::{DeviceSummary, DeviceView, Engine, Occupant};
use geodwell_core::fences::Fence;
use geodwell_core::fix::Fix;
use geodwell_core::time::Ts;
use tokio::sync::{mpsc, oneshot};

pub use crate::events::publisher::{FixOutcome, StepReply};

pub use cursor::{BadCursor, DeviceCursor};
pub use local::{Rebuild, RebuildError, ShardCtx, ShardStart, Ticket, spawn};

/// A fix bound for a partition, with its index in the request and the watermark it arrived
/// under.
#[derive(Debug, Clone)]
pub struct StampedFix {
    /// Position in the request.
    pub index: usize,
    /// The fix.
    pub fix: Fix,
    /// Watermark at arrival.
    pub w: Ts,
}

/// What a local partition task is sent.
enum ShardMsg {
    /// Apply fixes (in order); answer with one outcome per fix once the step is durable.
    Fixes {
        /// The fixes.
        fixes: Vec<StampedFix>,
        /// When the batch arrived (for the ingest-to-event latency).
        arrived: Instant,
        /// The request this is part of: (request id, number of parts). The publisher commits
        /// all parts of a request together, so a crash keeps all of it or none.
        request: (u64, u32),
        /// Where to answer (after the step is durable).
        reply: oneshot::Sender<StepReply>,
    },
    /// Insert or replace a fence: fence change number `.1`.
    UpsertFence(Arc<Fence>, u64),
    /// Remove a fence: fence change number `.1`.
    RemoveFence(Arc<str>, u64),
    /// Freeze the engine's state for checkpoint `round` and hand it to the checkpoint writer.
    Checkpoint {
        /// The checkpoint's round.
        round: u64,
        /// Hand out every device, not only those changed since the last checkpoint (the last
        /// round failed).
        full: bool,
    },
    /// Advance the engine to watermark `to` (an explicit advance, event mode) and commit
    /// `max_seen` with the step; `ack` answers once the step is durable.
    Advance {
        /// The new watermark.
        to: Ts,
        /// The fix time that watermark stands for (`to + lateness`), persisted so that a
        /// restart resumes from it.
        max_seen: Ts,
        /// Answered once the step (and the events it fired) is durable.
        ack: oneshot::Sender<Result<(), crate::events::publisher::PublishError>>,
    },
    /// Remove a device (`DELETE /v1/devices/{id}`).
    RemoveDevice {
        /// Device id.
        id: String,
        /// Whether the device existed.
        reply: oneshot::Sender<bool>,
        /// Answered once the removal is durable.
        ack: oneshot::Sender<Result<(), crate::events::publisher::PublishError>>,
    },
    /// A read of the engine (it answers its asker).
    Query(crate::runtime::Query),
}

impl fmt::Debug for ShardMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShardMsg::Fixes { .. } => "Fixes",
            ShardMsg::UpsertFence(..) => "UpsertFence",
            ShardMsg::RemoveFence(..) => "RemoveFence",
            ShardMsg::Checkpoint { .. } => "Checkpoint",
            ShardMsg::Advance { .. } => "Advance",
            ShardMsg::RemoveDevice { .. } => "RemoveDevice",
            ShardMsg::Query(_) => "Query",
        })
    }
}

/// Pair slots one occupancy message looks at, at most: bounds the shard's pause (about a
/// millisecond) however few devices the fence holds.
pub const OCCUPANCY_SCAN: usize = 65_536;

/// The shard a device belongs to, of `shards`.
pub fn shard_of(device: &str, shards: usize) -> usize {
    (xxhash_rust::xxh3::xxh3_64(device.as_bytes()) % shards.max(1) as u64) as usize
}

/// Why a batch was not sent.
#[derive(Debug, Clone)]
pub enum SendError {
    /// A shard's queue is full: retry later.
    Full,
    /// The shards are stopping.
    Closed,
    /// The state store does not take commits (or partitions are rebuilding after it failed):
    /// nothing is queued; retry later.
    Unavailable(crate::events::publisher::LogError),
}

/// The shards are gone (shutdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the shards are shutting down")]
pub struct Closed;

/// Why a device query got no answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The service is shutting down.
    #[error("the service is shutting down")]
    Closed,
    /// The durable log did not take the request (a removal); nothing changed.
    #[error(transparent)]
    Log(#[from] crate::events::publisher::LogError),
    /// A cluster's partition has no reachable owner right now (it is being taken over); retry
    /// shortly.
    #[error("partition {partition} has no reachable owner right now ({source}); retry shortly")]
    NoOwner {
        /// The partition.
        partition: u16,
        /// Why the request got no answer.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A cluster's partition owner answered something that does not decode.
    #[error("a partition owner's answer does not decode: {0}")]
    BadAnswer(#[source] serde_json::Error),
    /// A cluster has not taken a new watermark yet (NATS unreachable?); retry shortly.
    #[error("the cluster has not taken the new watermark yet (NATS unreachable?); retry shortly")]
    WatermarkPending,
}

impl From<Closed> for QueryError {
    fn from(_: Closed) -> QueryError {
        QueryError::Closed
    }
}

/// A boxed future, as [`Partitions`]' async methods return them.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A page of devices and the slot after it.
pub type DevicePage = (Vec<DeviceSummary>, Option<u32>);

/// A page of a fence's occupants and the pair slot after it.
pub type OccupantPage = (Vec<Occupant>, Option<u32>);

/// Partitions owned by the nodes of a cluster (implemented by `crate::cluster`): the seam a
/// cluster node's [`Shards`] handle routes through. Batches go into the partitions' input,
/// queries to their owners.
pub trait Partitions: Send + Sync + fmt::Debug {
    /// How many partitions there are.
    fn len(&self) -> usize;

    /// Whether there are none (never, for a cluster).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the node can take input (connected, its ingest running).
    fn running(&self) -> bool;

    /// Queues each partition's part (`parts[p]`; empty parts skipped), all or nothing; `stamp`
    /// runs once every part has room, before anything is queued. Each reply arrives once the
    /// part is durable in its partition's input, with the owner's outcomes when it gave them.
    fn send_parts(
        &self,
        parts: Vec<Vec<StampedFix>>,
        arrived: Instant,
        stamp: &mut dyn FnMut(&mut [Vec<StampedFix>]),
    ) -> Result<Vec<PartReply>, SendError>;

    /// Device `id`'s state, from its partition's owner.
    fn device(&self, id: String) -> BoxFuture<'_, Result<Option<DeviceView>, QueryError>>;

    /// Up to `limit` devices of partition `p` from slot `from`, and the slot after them.
    fn device_page(
        &self,
        p: usize,
        from: u32,
        limit: usize,
    ) -> BoxFuture<'_, Result<DevicePage, QueryError>>;

    /// Up to `limit` devices inside fence `fence` in partition `p`, looking at pair slots from
    /// `from` on (at most [`OCCUPANCY_SCAN`] of them), and the slot after them.
    fn occupants(
        &self,
        p: usize,
        fence: Arc<str>,
        from: u32,
        limit: usize,
    ) -> BoxFuture<'_, Result<OccupantPage, QueryError>>;

    /// How many devices of partition `p` are inside fence `fence`.
    fn inside(&self, p: usize, fence: Arc<str>) -> BoxFuture<'_, Result<u64, QueryError>>;

    /// Removes device `id` through its partition's input, durably; whether it existed.
    fn remove_device(&self, id: String) -> BoxFuture<'_, Result<bool, QueryError>>;

    /// event mode: makes the cluster's watermark `to` (fix time `max_seen` = `to + lateness`),
    /// durably, and returns once this node's watermark has reached it.
    fn advance(&self, to: Ts, max_seen: Ts) -> BoxFuture<'_, Result<(), QueryError>>;
}

/// The answer of one shard to its part of a batch, once that part's step is durable.
pub type PartReply = oneshot::Receiver<StepReply>;

/// The handle to the partitions (cheap to clone): this process's, or a cluster's.
#[derive(Debug, Clone)]
pub struct Shards {
    inner: Arc<dyn Partitions>,
}

/// Request ids: the publisher groups the parts of one request by it.
static REQUESTS: AtomicU64 = AtomicU64::new(1);

impl Shards {
    /// The handle to `partitions`.
    pub fn new(partitions: Arc<dyn Partitions>) -> Shards {
        Shards { inner: partitions }
    }

    /// How many partitions there are.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether there are none (never, for a running service).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The partition `device` belongs to.
    pub fn of(&self, device: &str) -> usize {
        shard_of(device, self.len())
    }

    /// Whether the partitions can take input.
    pub fn running(&self) -> bool {
        self.inner.running()
    }

    /// Sends each partition its part of a batch (`parts[k]` for partition `k`; empty parts are
    /// skipped), all or nothing. `stamp` runs once every partition the batch needs has room and
    /// before anything is sent (so a refused batch is never stamped); what it returns is handed
    /// back. The replies arrive once each part is durable.
    pub fn send_batch_with<T>(
        &self,
        parts: Vec<Vec<StampedFix>>,
        arrived: Instant,
        stamp: impl FnOnce(&mut [Vec<StampedFix>]) -> T,
    ) -> Result<(Vec<PartReply>, T), SendError> {
        let mut stamp = Some(stamp);
        let mut stamped = None;
        let replies = self.inner.send_parts(parts, arrived, &mut |parts| {
            if let Some(f) = stamp.take() {
                stamped = Some(f(parts));
            }
        })?;
        match stamped {
            Some(t) => Ok((replies, t)),
            None => Err(SendError::Closed),
        }
    }

    /// The state of device `id`, asked of its partition; `None` for an unknown device.
    pub async fn device(&self, id: &str) -> Result<Option<DeviceView>, QueryError> {
        self.inner.device(id.to_string()).await
    }

    /// Up to `limit` devices from `after` on, and where the next page starts (`None`: done).
    /// A page costs O(limit) on each partition it touches, not a sort of every device.
    pub async fn device_page(
        &self,
        after: DeviceCursor,
        limit: usize,
    ) -> Result<(Vec<DeviceSummary>, Option<DeviceCursor>), QueryError> {
        self.walk(after, limit, usize::MAX, |p, from, want| {
            self.inner.device_page(p, from, want)
        })
        .await
    }

    /// Up to `limit` devices inside fence `fence` from `after` on, and where the next page starts
    /// (`None`: done). Each partition is walked in pair slot order a bounded slice at a time, so
    /// a page may come back shorter than `limit` with a cursor to go on from.
    pub async fn occupants(
        &self,
        fence: &str,
        after: DeviceCursor,
        limit: usize,
    ) -> Result<(Vec<Occupant>, Option<DeviceCursor>), QueryError> {
        let fence: Arc<str> = Arc::from(fence);
        // Bounded work per page: a rare fence over many partitions answers with a cursor, not a
        // walk of every pair.
        self.walk(after, limit, 16, |p, from, want| {
            self.inner.occupants(p, fence.clone(), from, want)
        })
        .await
    }

    /// Walks the partitions in order from `after`, asking `step(p, from_slot, want)` for at
    /// most `want` items and the slot to go on from (`None`: that partition is done), until
    /// `limit` items or `max_steps` asks; returns the items and where the next page starts
    /// (`None`: done).
    async fn walk<'a, T>(
        &'a self,
        after: DeviceCursor,
        limit: usize,
        max_steps: usize,
        mut step: impl FnMut(usize, u32, usize) -> Page<'a, T>,
    ) -> Result<(Vec<T>, Option<DeviceCursor>), QueryError> {
        let DeviceCursor {
            mut shard,
            mut slot,
        } = after;
        let mut out = Vec::new();
        let n = self.len();
        let mut steps = 0;
        while shard < n && out.len() < limit && steps < max_steps {
            steps += 1;
            let (page, next) = step(shard, slot, limit - out.len()).await?;
            out.extend(page);
            match next {
                Some(n) => slot = n,
                None => {
                    shard += 1;
                    slot = 0;
                }
            }
        }
        let next = (shard < n).then_some(DeviceCursor { shard, slot });
        Ok((out, next))
    }

    /// Removes device `id` (its pairs, timers and buffered fixes; no event) and returns once
    /// the removal is durable; false for an unknown device.
    pub async fn remove_device(&self, id: &str) -> Result<bool, QueryError> {
        self.inner.remove_device(id.to_string()).await
    }

    /// event mode: advances every partition to watermark `to` (which stands for fix time
    /// `max_seen`) and returns once each has made that step durable, with the events it fired
    /// (all of them unless the fire cap carried some to the next steps).
    pub async fn advance(&self, to: Ts, max_seen: Ts) -> Result<(), QueryError> {
        self.inner.advance(to, max_seen).await
    }

    /// How many devices are inside fence `fence`, over every partition.
    pub async fn inside(&self, fence: &str) -> Result<u64, QueryError> {
        let fence: Arc<str> = Arc::from(fence);
        let mut total = 0;
        for k in 0..self.len() {
            total += self.inner.inside(k, fence.clone()).await?;
        }
        Ok(total)
    }
}

/// This process's partitions: one task each, reached over bounded channels (cheap to clone).
#[derive(Debug, Clone)]
pub struct LocalShards {
    senders: Arc<[mpsc::Sender<ShardMsg>]>,
    /// Whether the store takes commits: input is refused at once while it does not.
    health: Arc<crate::events::health::StoreHealth>,
}

impl LocalShards {
    /// Sends `msg` to partition `k` (waits for room); `Closed` once its task is gone.
    async fn send(&self, k: usize, msg: ShardMsg) -> Result<(), Closed> {
        self.senders
            .get(k)
            .ok_or(Closed)?
            .send(msg)
            .await
            .map_err(|_| Closed)
    }

    /// Asks partition `k` a read of its engine.
    async fn query<T: Send + 'static>(
        &self,
        k: usize,
        read: impl FnOnce(&Engine) -> T + Send + 'static,
    ) -> Result<T, QueryError> {
        let (tx, rx) = oneshot::channel();
        let q: crate::runtime::Query = Box::new(move |e| {
            let _ = tx.send(read(e));
        });
        self.send(k, ShardMsg::Query(q)).await?;
        rx.await.map_err(|_| QueryError::Closed)
    }

    /// Sends a message to every partition, in order.
    async fn broadcast(&self, msg: impl Fn() -> ShardMsg) -> Result<(), Closed> {
        for k in 0..self.senders.len() {
            self.send(k, msg()).await?;
        }
        Ok(())
    }

    /// Inserts or replaces `fence` on every partition, as fence change number `change`.
    pub async fn upsert_fence(&self, fence: Arc<Fence>, change: u64) -> Result<(), Closed> {
        self.broadcast(|| ShardMsg::UpsertFence(fence.clone(), change))
            .await
    }

    /// Removes fence `id` from every partition, as fence change number `change`.
    pub async fn remove_fence(&self, id: Arc<str>, change: u64) -> Result<(), Closed> {
        self.broadcast(|| ShardMsg::RemoveFence(id.clone(), change))
            .await
    }

    /// Sends partition `k` one fence change it missed: `fence` as it is now (`None`: deleted
    /// `id`).
    pub async fn fence_to(
        &self,
        k: usize,
        fence: Option<Arc<Fence>>,
        id: &str,
        change: u64,
    ) -> Result<(), Closed> {
        let msg = match fence {
            Some(f) => ShardMsg::UpsertFence(f, change),
            None => ShardMsg::RemoveFence(Arc::from(id), change),
        };
        self.send(k, msg).await
    }

    /// Asks every partition to freeze its state for checkpoint `round`, after what is queued.
    pub async fn checkpoint(&self, round: u64, full: bool) -> Result<(), Closed> {
        self.broadcast(|| ShardMsg::Checkpoint { round, full })
            .await
    }

    /// Waits for an acknowledgement of a durable step.
    async fn acked(
        rx: oneshot::Receiver<Result<(), crate::events::publisher::PublishError>>,
    ) -> Result<(), QueryError> {
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(crate::events::publisher::PublishError::Store(e))) => Err(QueryError::Log(e)),
            Ok(Err(crate::events::publisher::PublishError::Closed)) => Err(QueryError::Closed),
            Err(_) => Err(QueryError::Closed),
        }
    }
}

impl Partitions for LocalShards {
    fn len(&self) -> usize {
        self.senders.len()
    }

    fn running(&self) -> bool {
        self.health.healthy() && self.senders.iter().all(|s| !s.is_closed())
    }

    fn send_parts(
        &self,
        mut parts: Vec<Vec<StampedFix>>,
        arrived: Instant,
        stamp: &mut dyn FnMut(&mut [Vec<StampedFix>]),
    ) -> Result<Vec<PartReply>, SendError> {
        if !self.health.healthy() {
            return Err(SendError::Unavailable(
                crate::events::publisher::LogError::Failing(self.health.reason()),
            ));
        }
        let mut permits = Vec::new();
        for (k, fixes) in parts.iter().enumerate() {
            if fixes.is_empty() {
                continue;
            }
            match self.senders[k].try_reserve() {
                Ok(p) => permits.push((k, p)),
                Err(mpsc::error::TrySendError::Full(_)) => return Err(SendError::Full),
                Err(mpsc::error::TrySendError::Closed(_)) => return Err(SendError::Closed),
            }
        }
        stamp(&mut parts);
        let request = (
            REQUESTS.fetch_add(1, Ordering::Relaxed),
            permits.len() as u32,
        );
        let mut replies = Vec::with_capacity(permits.len());
        for (k, permit) in permits {
            let (tx, rx) = oneshot::channel();
            permit.send(ShardMsg::Fixes {
                fixes: std::mem::take(&mut parts[k]),
                arrived,
                reply: tx,
                request,
            });
            replies.push(rx);
        }
        Ok(replies)
    }

    fn device(&self, id: String) -> BoxFuture<'_, Result<Option<DeviceView>, QueryError>> {
        let k = shard_of(&id, self.len());
        Box::pin(self.query(k, move |e| e.device(&id)))
    }

    fn device_page(
        &self,
        p: usize,
        from: u32,
        limit: usize,
    ) -> BoxFuture<'_, Result<DevicePage, QueryError>> {
        Box::pin(self.query(p, move |e| e.device_page(from, limit)))
    }

    fn occupants(
        &self,
        p: usize,
        fence: Arc<str>,
        from: u32,
        limit: usize,
    ) -> BoxFuture<'_, Result<OccupantPage, QueryError>> {
        Box::pin(self.query(p, move |e| {
            e.fence_occupants(&fence, from, limit, OCCUPANCY_SCAN)
        }))
    }

    fn inside(&self, p: usize, fence: Arc<str>) -> BoxFuture<'_, Result<u64, QueryError>> {
        Box::pin(self.query(p, move |e| e.fence_inside(&fence)))
    }

    fn remove_device(&self, id: String) -> BoxFuture<'_, Result<bool, QueryError>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            let (ack_tx, ack_rx) = oneshot::channel();
            let k = shard_of(&id, self.len());
            let msg = ShardMsg::RemoveDevice {
                id,
                reply: tx,
                ack: ack_tx,
            };
            self.send(k, msg).await?;
            let existed = rx.await.map_err(|_| QueryError::Closed)?;
            LocalShards::acked(ack_rx).await?;
            Ok(existed)
        })
    }

    fn advance(&self, to: Ts, max_seen: Ts) -> BoxFuture<'_, Result<(), QueryError>> {
        Box::pin(async move {
            let mut acks = Vec::with_capacity(self.senders.len());
            for k in 0..self.senders.len() {
                let (tx, rx) = oneshot::channel();
                let msg = ShardMsg::Advance {
                    to,
                    max_seen,
                    ack: tx,
                };
                self.send(k, msg).await?;
                acks.push(rx);
            }
            for rx in acks {
                LocalShards::acked(rx).await?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_always_maps_to_the_same_shard() {
        assert_eq!(shard_of("truck-17", 4), shard_of("truck-17", 4));
        assert!(shard_of("truck-17", 4) < 4);
        assert_eq!(
            shard_of("x", 0),
            0,
            "no shards: shard 0, no division by zero"
        );
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use geodwell_core::fix::DEFAULT_MAX_DEVICE_LEN;

    fn shards(queue: usize) -> (Shards, LocalShards, Vec<mpsc::Receiver<ShardMsg>>) {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..2).map(|_| mpsc::channel(queue)).unzip();
        let local = LocalShards {
            senders: senders.into(),
            health: Arc::default(),
        };
        (Shards::new(Arc::new(local.clone())), local, receivers)
    }

    fn parts(s: &Shards, n: usize) -> Vec<Vec<StampedFix>> {
        let mut parts = vec![Vec::new(); s.len()];
        for i in 0..n {
            let device = format!("d{i}");
            let fix = Fix::new(
                &device,
                Ts(1000 + i as i64),
                1.0,
                1.0,
                None,
                DEFAULT_MAX_DEVICE_LEN,
            )
            .unwrap();
            parts[s.of(&device)].push(StampedFix {
                index: i,
                fix,
                w: Ts(0),
            });
        }
        parts
    }

    #[tokio::test]
    async fn a_full_shard_queue_refuses_the_whole_batch_before_stamping_or_sending_anything() {
        let (s, local, mut rx) = shards(1);
        // Fill the shard queues: the shards are stalled (nobody reads the receivers).
        for tx in local.senders.iter() {
            tx.try_send(ShardMsg::RemoveFence(Arc::from("x"), 1))
                .unwrap();
        }
        let mut stamped = false;
        let r = s.send_batch_with(parts(&s, 20), Instant::now(), |_| stamped = true);
        assert!(matches!(r, Err(SendError::Full)));
        assert!(!stamped, "a refused batch is not stamped");
        // Nothing of the batch reached any shard: each queue still holds only the filler.
        for r in &mut rx {
            assert!(matches!(r.try_recv(), Ok(ShardMsg::RemoveFence(..))));
            assert!(r.try_recv().is_err());
        }
    }

    #[tokio::test]
    async fn a_batch_reaches_every_shard_it_needs_once_stamped() {
        let (s, _local, mut rx) = shards(4);
        let (replies, stamped) = s
            .send_batch_with(parts(&s, 20), Instant::now(), |parts| {
                for p in parts.iter_mut() {
                    for f in p {
                        f.w = Ts(7);
                    }
                }
                "stamped"
            })
            .unwrap();
        assert_eq!(stamped, "stamped");
        assert_eq!(replies.len(), 2, "both shards have a part");
        let mut seen = 0;
        for r in &mut rx {
            match r.try_recv() {
                Ok(ShardMsg::Fixes { fixes, request, .. }) => {
                    assert_eq!(request.1, 2, "the request has two parts");
                    assert!(fixes.iter().all(|f| f.w == Ts(7)));
                    seen += fixes.len();
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(seen, 20);
        drop(rx);
        let (s, local, rx) = shards(1);
        drop((rx, local));
        assert!(matches!(
            s.send_batch_with(parts(&s, 3), Instant::now(), |_| ()),
            Err(SendError::Closed)
        ));
    }
}

/// One shard's part of a page walk ([`Shards::walk`]): items and the slot to go on from.
type Page<'a, T> = futures_util::future::BoxFuture<'a, Result<(Vec<T>, Option<u32>), QueryError>>;
