//! Ingest on a cluster node: a validated, stamped batch split by partition goes into each
//! partition's input subject; the answer waits for every part's PubAck and then, briefly, for the
//! owners' outcomes (accepted, late, duplicate, refused), so a node answers like one process.
//!
//! - One task publishes every part in the order the batches were dispatched (a connection that
//!   pipelines batches keeps their order within each partition); acknowledgements are awaited
//!   concurrently.
//! - Each part carries `Nats-Msg-Id` = a hash of its partition and its fixes (not their stamps):
//!   a batch sent again within the stream's duplicate window is dropped by the stream, and its
//!   fixes are answered `duplicate`, which is what the engine would answer too.
//! - Each part names this node and a request number in [`REPLY_HEADER`]; the owner, once it has
//!   applied the part, sends the outcomes to `geodwell.out.<node>`. Ingest never waits on an
//!   absent owner: a part whose owner does not answer within [`OUTCOME_WAIT`] is answered
//!   `accepted` (unconfirmed: it is durable and will be applied; the engine's verdict shows
//!   only in the metrics), and from then on the partition is **silent** ([`Owners`]): its parts
//!   are answered as soon as the stream holds them, while their outcomes are still listened
//!   for; the first outcome that comes back makes it answering again. So the loss of a node
//!   costs a survivor's clients at most one [`OUTCOME_WAIT`] per partition, not the failure
//!   detection.
//!
//! - The cluster's watermark (event mode) moves only with batches whose every part is in the
//!   stream ([`BatchAck`]): a half-stored batch, answered 503 and sent again, is judged like
//!   one process would judge it, against the watermark from before it.
//!
//! Bounds: the dispatch queue (`shard_queue` parts per partition; full: 503 `overloaded`), each
//! partition's lag ([`Lags`]: over `shard_queue` records, 503 `overloaded`), and at most
//! [`MAX_IN_FLIGHT`] parts waiting for acknowledgements and outcomes.

use compact_str::CompactString;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::{
    PublishAckFuture, PublishError as JsPublishError, PublishErrorKind,
};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use futures_util::StreamExt;
use metrics::counter;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::nats::{Nats, REQUEST_TIMEOUT, in_subject, outcome_subject};
use super::outcome::{Outcome, decode_outcomes};
use crate::events::publisher::{FixOutcome, LogError, PublishError, StepReply};
use crate::shard::{SendError, StampedFix};
use crate::telemetry as t;
use geodwell_core::engine::Ingested;
use geodwell_core::partition::record::encode_fixes;

/// The header naming who waits for a part's outcomes: `<node>.<request>`.
pub const REPLY_HEADER: &str = "Geodwell-Reply";

/// How long a part's answer waits for its owner's outcomes after its PubAck (a live owner
/// answers within milliseconds; one that is being replaced does not answer at all).
pub const OUTCOME_WAIT: Duration = Duration::from_millis(500);

/// Per partition, whether its owner answers outcomes (see the module's notes). All answer at
/// first.
#[derive(Debug)]
pub struct Owners(Vec<std::sync::atomic::AtomicBool>);

impl Owners {
    fn new(partitions: u16) -> Owners {
        Owners(
            (0..partitions)
                .map(|_| std::sync::atomic::AtomicBool::new(true))
                .collect(),
        )
    }

    /// Whether partition `p`'s owner answers outcomes.
    fn answers(&self, p: u16) -> bool {
        self.0
            .get(usize::from(p))
            .is_some_and(|a| a.load(Ordering::Acquire))
    }

    /// Partition `p`'s owner answered (`true`) or did not within [`OUTCOME_WAIT`].
    fn set(&self, p: u16, answers: bool) {
        if let Some(a) = self.0.get(usize::from(p))
            && a.swap(answers, Ordering::AcqRel) != answers
        {
            if answers {
                tracing::info!(
                    partition = p,
                    "the partition's owner answers outcomes again"
                );
            } else {
                tracing::info!(
                    partition = p,
                    "the partition's owner did not answer outcomes; its fixes are answered accepted once stored, until it does"
                );
            }
        }
    }
}

/// Parts waiting for acknowledgements and outcomes at most.
pub const MAX_IN_FLIGHT: usize = 8192;

/// One part of a batch, bound for a partition.
#[derive(Debug)]
struct Job {
    p: u16,
    record: Vec<u8>,
    msg_id: String,
    /// Per fix: its index in the request and its device.
    fixes: Vec<(usize, CompactString)>,
    /// The batch it belongs to.
    batch: Arc<BatchAck>,
    reply: oneshot::Sender<StepReply>,
}

/// A batch's parts still waiting for their acknowledgement. Only a batch whose every part is
/// in the stream moves the cluster's watermark: a batch that failed halfway (some parts stored,
/// then a 503) is sent again by its client, and the parts not stored the first time must not be
/// judged against a watermark their own batch moved (they would be late, which one process,
/// applying nothing of a refused batch, would never find).
#[derive(Debug)]
struct BatchAck {
    remaining: std::sync::atomic::AtomicUsize,
    failed: std::sync::atomic::AtomicBool,
    max_ts: i64,
}

impl BatchAck {
    /// One part's answer; the batch's largest fix time once every part is in.
    fn part_done(&self, ok: bool) -> Option<i64> {
        if !ok {
            self.failed.store(true, Ordering::Release);
        }
        let last = self.remaining.fetch_sub(1, Ordering::AcqRel) == 1;
        (last && !self.failed.load(Ordering::Acquire)).then_some(self.max_ts)
    }
}

/// Every partition's input records not yet applied by its owner, as the owners last reported
/// them (heartbeats, about every second). Ingest refuses a batch bound for a partition whose
/// lag is over the bound: the input stream would otherwise take input faster than the owner
/// applies it, without limit, and events would be late by the backlog.
#[derive(Debug)]
pub struct Lags {
    lag: Vec<AtomicU64>,
    /// The bound (`ingest.shard_queue`, records).
    pub max: u64,
}

impl Lags {
    /// `partitions` partitions, none lagging, bounded at `max` records.
    pub fn new(partitions: u16, max: u64) -> Lags {
        Lags {
            lag: (0..partitions).map(|_| AtomicU64::new(0)).collect(),
            max,
        }
    }

    /// Replaces every partition's lag (those not listed: 0, their owner is gone or new).
    pub fn set_all(&self, reported: impl IntoIterator<Item = (u16, u64)>) {
        let mut fresh = vec![0u64; self.lag.len()];
        for (p, l) in reported {
            if let Some(f) = fresh.get_mut(p as usize) {
                *f = (*f).max(l);
            }
        }
        for (a, f) in self.lag.iter().zip(fresh) {
            a.store(f, Ordering::Relaxed);
        }
    }

    /// Whether partition `p` is over the bound.
    pub fn over(&self, p: usize) -> bool {
        self.lag
            .get(p)
            .is_some_and(|l| l.load(Ordering::Relaxed) > self.max)
    }
}

/// The node's ingest into the partitions' input (cheap to clone).
#[derive(Debug, Clone)]
pub struct ClusterIngest {
    tx: mpsc::Sender<Job>,
    partitions: u16,
    /// The largest fix time of any part acknowledged by the stream (event mode's source).
    acked_max: Arc<AtomicI64>,
    /// The partitions' lag, and its bound.
    lags: Arc<Lags>,
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Vec<Outcome>>>>>;

impl ClusterIngest {
    /// Starts the publisher and the outcome listener of node `node`.
    pub async fn start(
        nats: Nats,
        node: &str,
        queue: usize,
        lags: Arc<Lags>,
        stop: CancellationToken,
    ) -> Result<ClusterIngest, super::nats::NatsError> {
        // `queue` parts per partition, as one process queues `queue` batches per shard: a batch
        // needs a slot for each partition it touches at once.
        let (tx, rx) = mpsc::channel(queue.max(1) * usize::from(nats.partitions.max(1)));
        let nats_partitions = nats.partitions;
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let mut sub = nats
            .client
            .subscribe(outcome_subject(node))
            .await
            .map_err(|e| super::nats::NatsError::request("subscribe to outcomes", e))?;
        let listener_pending = pending.clone();
        let listen_stop = stop.clone();
        tokio::spawn(async move {
            loop {
                let m = tokio::select! {
                    _ = listen_stop.cancelled() => return,
                    m = sub.next() => m,
                };
                let Some(m) = m else { return };
                if let Ok((req, outcomes)) = decode_outcomes(&m.payload) {
                    let waiter = listener_pending
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&req);
                    if let Some(w) = waiter {
                        let _ = w.send(outcomes);
                    }
                }
            }
        });
        let acked_max = Arc::new(AtomicI64::new(i64::MIN));
        let waits = Waits {
            pending,
            acked_max: acked_max.clone(),
            owners: Arc::new(Owners::new(nats_partitions)),
        };
        tokio::spawn(publish(nats, node.to_string(), rx, waits, stop));
        Ok(ClusterIngest {
            tx,
            partitions: nats_partitions,
            acked_max,
            lags,
        })
    }

    /// Partitions.
    pub fn partitions(&self) -> usize {
        self.partitions as usize
    }

    /// Whether the publisher runs.
    pub fn running(&self) -> bool {
        !self.tx.is_closed()
    }

    /// The largest fix time acknowledged so far (`i64::MIN`: none).
    pub fn acked_max(&self) -> i64 {
        self.acked_max.load(Ordering::Acquire)
    }

    /// Raises the shared fix time by hand (`POST /v1/watermark`): shared with the cluster like
    /// an acknowledged batch's.
    pub fn raise_acked_max(&self, max_seen: i64) {
        self.acked_max.fetch_max(max_seen, Ordering::AcqRel);
    }

    /// Queues each partition's part of a batch, all or nothing (see `Shards::send_batch_with`).
    pub fn send_batch_with<T>(
        &self,
        mut parts: Vec<Vec<StampedFix>>,
        stamp: impl FnOnce(&mut [Vec<StampedFix>]) -> T,
    ) -> Result<(Vec<oneshot::Receiver<StepReply>>, T), SendError> {
        let n = parts.iter().filter(|p| !p.is_empty()).count();
        if parts
            .iter()
            .enumerate()
            .any(|(p, part)| !part.is_empty() && self.lags.over(p))
        {
            counter!(t::CLUSTER_LAG_REFUSED).increment(1);
            return Err(SendError::Full);
        }
        let permits = match self.tx.try_reserve_many(n) {
            Ok(p) => p,
            Err(mpsc::error::TrySendError::Full(_)) => return Err(SendError::Full),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(SendError::Closed),
        };
        let stamped = stamp(&mut parts);
        let batch = Arc::new(BatchAck {
            remaining: std::sync::atomic::AtomicUsize::new(n),
            failed: std::sync::atomic::AtomicBool::new(false),
            max_ts: parts
                .iter()
                .flatten()
                .map(|s| s.fix.ts.0)
                .max()
                .unwrap_or(i64::MIN),
        });
        let mut replies = Vec::with_capacity(n);
        let mut permits = permits.into_iter();
        for (p, fixes) in parts.into_iter().enumerate() {
            if fixes.is_empty() {
                continue;
            }
            let Some(permit) = permits.next() else { break };
            let mut record = Vec::with_capacity(16 + fixes.len() * 48);
            encode_fixes(
                None,
                fixes.len(),
                fixes.iter().map(|s| (&s.fix, s.w)),
                &mut record,
            );
            let (tx, rx) = oneshot::channel();
            permit.send(Job {
                p: p as u16,
                msg_id: part_id(p as u16, &fixes),
                batch: batch.clone(),
                fixes: fixes
                    .iter()
                    .map(|s| (s.index, s.fix.device.clone()))
                    .collect(),
                record,
                reply: tx,
            });
            replies.push(rx);
        }
        Ok((replies, stamped))
    }
}

/// A part's message id: its partition and its fixes, not their stamps (a re-sent batch is
/// stamped anew and must still be recognized).
fn part_id(p: u16, fixes: &[StampedFix]) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&p.to_le_bytes());
    geodwell_core::partition::recent::feed_fixes(&mut h, fixes.iter().map(|s| &s.fix));
    format!("fx-{p}-{:032x}", h.digest128())
}

/// What the parts' waiting tasks share.
#[derive(Clone)]
struct Waits {
    pending: Pending,
    acked_max: Arc<AtomicI64>,
    owners: Arc<Owners>,
}

impl Waits {
    fn forget(&self, req: u64) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&req);
    }
}

/// Publishes parts in order; each part's acknowledgement and outcomes are awaited in a task of
/// its own.
async fn publish(
    nats: Nats,
    node: String,
    mut rx: mpsc::Receiver<Job>,
    waits: Waits,
    stop: CancellationToken,
) {
    static REQUESTS: AtomicU64 = AtomicU64::new(1);
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let job = tokio::select! {
            biased;
            j = rx.recv() => j,
            _ = stop.cancelled() => {
                rx.close();
                rx.recv().await
            }
        };
        let Some(mut job) = job else { return };
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let req = REQUESTS.fetch_add(1, Ordering::Relaxed);
        let (otx, orx) = oneshot::channel();
        waits
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(req, otx);
        let mut headers = HeaderMap::new();
        headers.insert(REPLY_HEADER, format!("{node}.{req}").as_str());
        let payload = bytes::Bytes::from(std::mem::take(&mut job.record));
        let msg = PublishMessage::build()
            .message_id(&job.msg_id)
            .headers(headers)
            .payload(payload);
        let published = std::time::Instant::now();
        let elected = nats.elections.input();
        let sent = nats.js.send_publish(in_subject(job.p), msg.clone()).await;
        let (waits, nats) = (waits.clone(), nats.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let ack = acknowledged(&nats, job.p, msg, sent, elected).await;
            answer(job, req, ack, orx, published, &waits).await;
        });
    }
}

/// A part's acknowledgement within [`REQUEST_TIMEOUT`] of its publish. When the input stream
/// elects a leader meanwhile ([`super::elections`]), the part is published again at once with the
/// same id, not after the timeout: the old leader's acknowledgement will not come, and a copy
/// it stored is dropped by the stream or, failing that, answered as a duplicate by the owner.
/// A copy found in the stream by such a re-publish is this part's own first one: it is
/// answered as stored, not as a duplicate (the owner answers its fixes, named by the same reply
/// header).
async fn acknowledged(
    nats: &Nats,
    p: u16,
    msg: PublishMessage,
    sent: Result<PublishAckFuture, JsPublishError>,
    mut elected: tokio::sync::watch::Receiver<u64>,
) -> Result<PublishAck, JsPublishError> {
    let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
    let mut pending = sent?;
    let mut again = false;
    loop {
        tokio::select! {
            ack = tokio::time::timeout_at(deadline, pending.into_future()) => {
                let mut ack = ack.unwrap_or_else(|_| Err(JsPublishError::new(PublishErrorKind::TimedOut)))?;
                ack.duplicate &= !again;
                return Ok(ack);
            }
            Ok(()) = elected.changed() => {
                pending = nats.js.send_publish(in_subject(p), msg.clone()).await?;
                again = true;
            }
        }
    }
}

/// Answers one part once the stream acknowledged it: with its owner's outcomes, or `accepted`
/// when the owner does not answer (see the module's notes).
async fn answer(
    job: Job,
    req: u64,
    ack: Result<PublishAck, JsPublishError>,
    outcomes: oneshot::Receiver<Vec<Outcome>>,
    published: std::time::Instant,
    waits: &Waits,
) {
    if ack.is_ok() {
        metrics::histogram!(t::CLUSTER_INGEST_ACK_SECONDS)
            .record(published.elapsed().as_secs_f64());
    }
    if let Some(max) = job.batch.part_done(ack.is_ok()) {
        waits.acked_max.fetch_max(max, Ordering::AcqRel);
    }
    let same =
        |o: Ingested| -> Vec<FixOutcome> { job.fixes.iter().map(|(i, _)| (*i, Ok(o))).collect() };
    let ack = match ack {
        Err(e) => {
            counter!(t::CLUSTER_INGEST_FAILURES).increment(1);
            waits.forget(req);
            let _ = job.reply.send(Err(PublishError::Store(LogError::stream(
                "the partition's input did not acknowledge",
                e,
            ))));
            return;
        }
        Ok(a) => a,
    };
    if ack.duplicate {
        waits.forget(req);
        let _ = job.reply.send(Ok(same(Ingested::Duplicate)));
        return;
    }
    let silent = !waits.owners.answers(job.p);
    let mut reply = Some(job.reply);
    if silent {
        counter!(t::CLUSTER_OUTCOMES_UNCONFIRMED).increment(job.fixes.len() as u64);
        if let Some(r) = reply.take() {
            let _ = r.send(Ok(same(Ingested::Accepted)));
        }
    }
    let got = tokio::time::timeout(OUTCOME_WAIT, outcomes).await;
    waits.forget(req);
    let confirmed = match got {
        Ok(Ok(o)) if o.len() == job.fixes.len() => Some(o),
        _ => None,
    };
    waits.owners.set(job.p, confirmed.is_some());
    let Some(r) = reply else { return };
    let answer = match confirmed {
        Some(o) => job
            .fixes
            .iter()
            .zip(o)
            .map(|((i, device), o)| (*i, o.into_result(device)))
            .collect(),
        None => {
            counter!(t::CLUSTER_OUTCOMES_UNCONFIRMED).increment(job.fixes.len() as u64);
            same(Ingested::Accepted)
        }
    };
    let _ = r.send(Ok(answer));
}

#[cfg(test)]
mod tests {
    use super::*;
    use geodwell_core::fix::Fix;
    use geodwell_core::time::Ts;

    #[test]
    fn a_partition_over_its_lag_bound_is_refused_and_a_gone_owner_forgotten() {
        let l = Lags::new(4, 100);
        l.set_all([(1, 101), (2, 100), (9, 1_000)]);
        assert!(!l.over(0));
        assert!(l.over(1));
        assert!(!l.over(2), "at the bound is not over it");
        assert!(!l.over(9), "no such partition");
        l.set_all([(2, 5)]);
        assert!(
            !l.over(1),
            "an owner no longer reporting leaves no stale lag"
        );
    }

    #[test]
    fn only_a_batch_stored_whole_moves_the_watermark() {
        let b = BatchAck {
            remaining: std::sync::atomic::AtomicUsize::new(3),
            failed: std::sync::atomic::AtomicBool::new(false),
            max_ts: 42,
        };
        assert_eq!(b.part_done(true), None);
        assert_eq!(b.part_done(true), None);
        assert_eq!(b.part_done(true), Some(42));
        let b = BatchAck {
            remaining: std::sync::atomic::AtomicUsize::new(2),
            failed: std::sync::atomic::AtomicBool::new(false),
            max_ts: 42,
        };
        assert_eq!(b.part_done(false), None);
        assert_eq!(
            b.part_done(true),
            None,
            "a part failed: the batch is sent again"
        );
    }

    #[test]
    fn a_part_is_named_by_its_fixes_not_their_stamps() {
        let fix = |ts| Fix::new("truck", Ts(ts), 1.0, 2.0, None, 128).unwrap();
        let part = |w| {
            vec![StampedFix {
                index: 0,
                fix: fix(5),
                w: Ts(w),
            }]
        };
        assert_eq!(part_id(3, &part(1)), part_id(3, &part(2)));
        assert_ne!(part_id(3, &part(1)), part_id(4, &part(1)));
        let other = vec![StampedFix {
            index: 0,
            fix: fix(6),
            w: Ts(1),
        }];
        assert_ne!(part_id(3, &part(1)), part_id(3, &other));
    }
}
