//! A cluster node: membership, partition ownership, and the handle the service's ingest and
//! device queries route through ([`ClusterPartitions`], the cluster's [`Partitions`]).
//!
//! One membership task runs rounds, every `min(lease_ttl / 3, 1 s)` and whenever a lease is
//! released anywhere:
//! 1. write this node's heartbeat (its entry in the nodes bucket, with its partitions' status);
//! 2. reap the partitions that ended (a lease found taken made its partition stand down);
//! 3. read the live nodes and the lease holders, and assign every partition an owner
//!    (rendezvous hashing with bounded loads, [`super::assign::owners`]: no node owns more than
//!    `ceil(P / N)`);
//! 4. take each free partition assigned to this node at once, and one it ranks `r`-th once the
//!    partition has been free for `r + 1` lease lifetimes (so a free partition never stays free
//!    because its assigned owner is stuck);
//! 5. hand over (final checkpoint, then release) each partition it holds that is assigned to
//!    another live node, once the live set this node sees has not changed for a lease lifetime
//!    (nodes starting one after the other get their share in one move each, and nothing moves
//!    back and forth while membership settles);
//! 6. as owner of partition 0, compact the fence stream when every partition's checkpoint
//!    allows it.
//!
//! The leases the node holds are renewed by a task of their own at the same pace, not by the
//! rounds: a round can wait seconds on a bucket whose leader is being elected, and renewals
//! waiting behind it would let every lease of the node expire.
//!
//! A graceful stop removes the node's heartbeat first (the others stop ranking it), then stops
//! its partitions with a final checkpoint each and releases their leases: the others take them
//! over at once, replaying nothing.
//!
//! Why this file is long: membership (heartbeats, renewals, assignment, handover), the cluster
//! watermark and the `Partitions` implementation share the node's runtime.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use metrics::gauge;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::assign::{owners, partition_key, rank};
use super::checkpoint;
use super::fences::FenceLog;
use super::hedge;
use super::ingest::ClusterIngest;
use super::lease::{Lease, Leases, Renewed};
use super::nats::{Nats, NatsError, query_subject};
use super::partition::{self, Control, Ended};
use super::query;
use super::shared::Shared;
use super::status::{Board, Heartbeat};
use crate::events::publisher::{LogError, StepReply};
use crate::shard::{
    BoxFuture, DevicePage, OccupantPage, Partitions, QueryError, SendError, StampedFix,
};
use crate::telemetry as t;
use geodwell_core::engine::DeviceView;
use geodwell_core::partition::{Input, Removal, record};
use geodwell_core::time::Ts;

/// How long a device query waits for a partition's owner.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(3);

/// A partition task this node runs.
#[derive(Debug)]
struct Running {
    lease: Arc<Lease>,
    control: mpsc::Sender<Control>,
    task: JoinHandle<Ended>,
    stopping: bool,
}

/// This node's partitions and their leases.
#[derive(Debug)]
pub struct Runtime {
    shared: Arc<Shared>,
    leases: Leases,
    parts: Mutex<BTreeMap<u16, Running>>,
    kick: Notify,
    /// The node is leaving: the renewer keeps what it holds and rounds take nothing.
    leaving: std::sync::atomic::AtomicBool,
    /// Leases of partitions stopping for good (renewed until they are released).
    holding: Mutex<Vec<Arc<Lease>>>,
    /// Partitions whose task failed here, and when: not taken again by this node for
    /// [`RETAKE_AFTER_FAILURE`] (a restore that fails while NATS is unavailable would otherwise
    /// be retried at every round a release starts, many times a second).
    failed: Mutex<HashMap<u16, Instant>>,
}

/// How long a node leaves alone a partition whose task failed on it.
const RETAKE_AFTER_FAILURE: Duration = Duration::from_secs(1);

impl Runtime {
    /// The runtime of a node sharing `shared`, taking leases through `leases`.
    pub fn new(shared: Arc<Shared>, leases: Leases) -> Arc<Runtime> {
        Arc::new(Runtime {
            shared,
            leases,
            parts: Mutex::new(BTreeMap::new()),
            kick: Notify::new(),
            leaving: std::sync::atomic::AtomicBool::new(false),
            holding: Mutex::new(Vec::new()),
            failed: Mutex::new(HashMap::new()),
        })
    }

    /// Marks the node as leaving (see [`Runtime::stop_all`]).
    pub fn leave(&self) {
        self.leaving
            .store(true, std::sync::atomic::Ordering::Release);
        self.kick.notify_one();
    }

    fn is_leaving(&self) -> bool {
        self.leaving.load(std::sync::atomic::Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, Running>> {
        self.parts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The status board.
    pub fn board(&self) -> &Arc<Board> {
        &self.shared.board
    }

    /// The control channel of partition `p` when this node runs it.
    fn control(&self, p: u16) -> Option<mpsc::Sender<Control>> {
        self.lock()
            .get(&p)
            .filter(|r| !r.stopping && r.lease.valid())
            .map(|r| r.control.clone())
    }

    /// Whether this node may take partition `p` now (its task did not fail here lately).
    fn may_take(&self, p: u16) -> bool {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        failed.retain(|_, at| at.elapsed() < RETAKE_AFTER_FAILURE);
        !failed.contains_key(&p)
    }

    /// Partitions this node runs.
    pub fn owned(&self) -> Vec<u16> {
        self.lock().keys().copied().collect()
    }

    fn spawn(&self, p: u16, lease: Lease) {
        let lease = Arc::new(lease);
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(partition::run(p, lease.clone(), self.shared.clone(), rx));
        self.lock().insert(
            p,
            Running {
                lease,
                control: tx,
                task,
                stopping: false,
            },
        );
    }

    /// Asks partition `p` to stop (a handover): it checkpoints, then the round releases it.
    fn hand_over(&self, p: u16, to: &str) {
        if let Some(r) = self.lock().get_mut(&p)
            && !r.stopping
        {
            tracing::info!(
                partition = p,
                to,
                "handing the partition over to its assigned owner"
            );
            r.stopping = true;
            let _ = r.control.try_send(Control::Stop);
        }
    }

    /// Collects ended partition tasks; releases the lease of those that stopped or failed.
    async fn reap(&self) {
        let done: Vec<(u16, Running)> = {
            let mut g = self.lock();
            let ps: Vec<u16> = g
                .iter()
                .filter(|(_, r)| r.task.is_finished())
                .map(|(p, _)| *p)
                .collect();
            ps.into_iter()
                .filter_map(|p| g.remove(&p).map(|r| (p, r)))
                .collect()
        };
        for (p, r) in done {
            match r.task.await {
                Ok(Ended::LeaseLost) => {
                    tracing::warn!(partition = p, "partition lease lost; stood down");
                    metrics::counter!(t::CLUSTER_LEASES_LOST).increment(1);
                }
                Ok(Ended::Stopped { checkpointed }) => {
                    tracing::info!(partition = p, checkpointed, "partition handed over");
                    self.leases.release(&r.lease).await;
                }
                Ok(Ended::Failed(e)) => {
                    let cause = std::error::Error::source(&e).map(ToString::to_string);
                    tracing::error!(partition = p, error = %e, cause = cause.as_deref().unwrap_or(""), "partition failed; releasing it");
                    self.failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(p, Instant::now());
                    metrics::counter!(t::CLUSTER_PARTITION_FAILURES).increment(1);
                    self.leases.release(&r.lease).await;
                }
                Err(e) => {
                    tracing::error!(partition = p, error = %e, "partition task panicked; releasing it");
                    self.leases.release(&r.lease).await;
                }
            }
        }
    }

    /// Stops every partition (final checkpoints) and releases its lease, within `deadline`.
    pub async fn stop_all(&self, deadline: tokio::time::Instant) {
        // The tasks stay listed (their leases renewed by the rounds) until they end.
        let all: Vec<(u16, Arc<Lease>, mpsc::Sender<Control>)> = self
            .lock()
            .iter_mut()
            .map(|(p, r)| {
                r.stopping = true;
                (*p, r.lease.clone(), r.control.clone())
            })
            .collect();
        for (_, _, c) in &all {
            let _ = c.try_send(Control::Stop);
        }
        let all: Vec<(u16, Running)> = {
            let mut g = self.lock();
            all.iter()
                .filter_map(|(p, _, _)| g.remove(p).map(|r| (*p, r)))
                .collect()
        };
        // Renewals go on for what is stopping: the renewer renews the leases of `holding`.
        *self.holding.lock().unwrap_or_else(|p| p.into_inner()) =
            all.iter().map(|(_, r)| r.lease.clone()).collect();
        let mut waits = Vec::new();
        for (p, r) in all {
            let leases = self.leases.clone();
            waits.push(tokio::spawn(async move {
                let mut task = r.task;
                match tokio::time::timeout_at(deadline, &mut task).await {
                    Ok(ended) => {
                        leases.release(&r.lease).await;
                        tracing::info!(partition = p, ended = ?ended.ok(), "partition released");
                    }
                    Err(_) => {
                        task.abort();
                        tracing::warn!(
                            partition = p,
                            "partition did not stop in time; its lease expires on its own"
                        );
                    }
                }
            }));
        }
        for w in waits {
            let _ = w.await;
        }
    }
}

/// The cluster behind a node's [`crate::shard::Shards`] handle.
#[derive(Debug)]
pub struct ClusterPartitions {
    nats: Nats,
    ingest: ClusterIngest,
    runtime: Arc<Runtime>,
}

impl ClusterPartitions {
    /// Routes ingest through `ingest` and queries to the owners (this node's own directly).
    pub fn new(nats: Nats, ingest: ClusterIngest, runtime: Arc<Runtime>) -> ClusterPartitions {
        ClusterPartitions {
            nats,
            ingest,
            runtime,
        }
    }

    /// Asks partition `p`'s owner `req`: this node's own partition task when it owns it
    /// (`None` when it does not, or its task is gone), the answer encoded as for another node.
    async fn ask_own(&self, p: u16, req: &query::Request) -> Option<Vec<u8>> {
        let c = self.runtime.control(p)?;
        let (tx, rx) = oneshot::channel();
        let req = req.clone();
        let q: crate::runtime::Query = Box::new(move |engine| {
            let _ = tx.send(query::answer(engine, &req));
        });
        c.send(Control::Query(q)).await.ok()?;
        rx.await.ok()
    }

    /// Asks partition `p`'s owner `req`: this node's own partition task when it owns it, else
    /// the owner over NATS; the answer is encoded the same either way.
    async fn ask_any(&self, p: u16, req: query::Request) -> Result<Vec<u8>, QueryError> {
        if let Some(v) = self.ask_own(p, &req).await {
            return Ok(v);
        }
        self.ask(p, req).await
    }

    async fn ask(&self, p: u16, req: query::Request) -> Result<Vec<u8>, QueryError> {
        let unavailable = |e: Box<dyn std::error::Error + Send + Sync>| QueryError::NoOwner {
            partition: p,
            source: e,
        };
        let ask = self
            .nats
            .client
            .request(query_subject(p), req.encode().into());
        match tokio::time::timeout(QUERY_TIMEOUT, ask).await {
            Ok(Ok(m)) => Ok(m.payload.to_vec()),
            Ok(Err(e)) => Err(unavailable(Box::new(e))),
            Err(_) => Err(unavailable("no answer".into())),
        }
    }
}

impl Partitions for ClusterPartitions {
    fn len(&self) -> usize {
        self.ingest.partitions()
    }

    fn running(&self) -> bool {
        self.ingest.running()
            && self.nats.client.connection_state() == async_nats::connection::State::Connected
    }

    fn send_parts(
        &self,
        parts: Vec<Vec<StampedFix>>,
        _arrived: std::time::Instant,
        stamp: &mut dyn FnMut(&mut [Vec<StampedFix>]),
    ) -> Result<Vec<oneshot::Receiver<StepReply>>, SendError> {
        self.ingest
            .send_batch_with(parts, |p| stamp(p))
            .map(|(r, ())| r)
    }

    fn device(&self, id: String) -> BoxFuture<'_, Result<Option<DeviceView>, QueryError>> {
        Box::pin(async move {
            let p = crate::shard::shard_of(&id, self.len()) as u16;
            let body = self.ask_any(p, query::Request::Device { id }).await?;
            query::decode_device(&body).map_err(QueryError::BadAnswer)
        })
    }

    fn device_page(
        &self,
        p: usize,
        from: u32,
        limit: usize,
    ) -> BoxFuture<'_, Result<DevicePage, QueryError>> {
        Box::pin(async move {
            let limit = limit.min(query::MAX_PAGE);
            let body = self
                .ask_any(p as u16, query::Request::Page { from, limit })
                .await?;
            query::decode_page(&body).map_err(QueryError::BadAnswer)
        })
    }

    fn occupants(
        &self,
        p: usize,
        fence: Arc<str>,
        from: u32,
        limit: usize,
    ) -> BoxFuture<'_, Result<OccupantPage, QueryError>> {
        Box::pin(async move {
            let req = query::Request::Occupants {
                fence: fence.to_string(),
                from,
                limit: limit.min(query::MAX_PAGE),
            };
            let body = self.ask_any(p as u16, req).await?;
            query::decode_occupants(&body).map_err(QueryError::BadAnswer)
        })
    }

    fn remove_device(&self, id: String) -> BoxFuture<'_, Result<bool, QueryError>> {
        Box::pin(async move {
            if self.device(id.clone()).await?.is_none() {
                return Ok(false);
            }
            let p = crate::shard::shard_of(&id, self.len()) as u16;
            let rec = record::to_bytes(&Input::Removed(Removal {
                w_before: None,
                idle: None,
                ids: vec![id],
            }));
            // Stored (replicated) before the answer; the owner applies it when it reads it.
            let not_taken = |e| {
                QueryError::Log(LogError::stream(
                    "the partition's input did not take the removal",
                    e,
                ))
            };
            let ack = self
                .nats
                .js
                .publish(super::nats::in_subject(p), rec.into())
                .await
                .map_err(not_taken)?;
            tokio::time::timeout(QUERY_TIMEOUT * 4, ack)
                .await
                .map_err(|_| {
                    not_taken(async_nats::jetstream::context::PublishError::new(
                        async_nats::jetstream::context::PublishErrorKind::TimedOut,
                    ))
                })?
                .map_err(not_taken)?;
            Ok(true)
        })
    }

    fn advance(&self, to: Ts, max_seen: Ts) -> BoxFuture<'_, Result<(), QueryError>> {
        Box::pin(async move {
            // Shared like an acknowledged batch's fix time (the META bucket, `wm.<node>`): every
            // node's watermark follows it, and partition owners write ticks into their inputs.
            self.ingest.raise_acked_max(max_seen.0);
            let deadline = tokio::time::Instant::now() + QUERY_TIMEOUT * 4;
            loop {
                if self
                    .runtime
                    .shared
                    .watermark
                    .current()
                    .is_some_and(|w| w >= to)
                {
                    return Ok(());
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(QueryError::WatermarkPending);
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
    }

    fn inside(&self, p: usize, fence: Arc<str>) -> BoxFuture<'_, Result<u64, QueryError>> {
        Box::pin(async move {
            let req = query::Request::Inside {
                fence: fence.to_string(),
            };
            let body = self.ask_any(p as u16, req).await?;
            query::decode_inside(&body).map_err(QueryError::BadAnswer)
        })
    }
}

/// What the membership loop needs.
#[derive(Debug, Clone)]
pub struct Membership {
    /// NATS.
    pub nats: Nats,
    /// This node.
    pub node: String,
    /// Where it serves HTTP (for the heartbeat).
    pub http: String,
    /// When it started (Unix ms).
    pub started_ms: i64,
    /// The partitions.
    pub runtime: Arc<Runtime>,
    /// Every partition's lag, refreshed from the heartbeats each round.
    pub lags: Arc<super::ingest::Lags>,
    /// The fence log (compaction, as owner of partition 0).
    pub fences: Arc<FenceLog>,
    /// The webhook sinks this node delivers (for the heartbeat).
    pub sinks: SinkNames,
}

/// Lists the webhook sinks a node delivers.
#[derive(Clone)]
pub struct SinkNames(pub Arc<dyn Fn() -> Vec<String> + Send + Sync>);

impl std::fmt::Debug for SinkNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SinkNames")
    }
}

/// The nodes bucket as it is now: the live heartbeats by node, and the nodes whose heartbeat
/// was deleted (a graceful stop).
async fn read_nodes(nats: &Nats) -> Result<(BTreeMap<String, Heartbeat>, Vec<String>), NatsError> {
    let prefix = format!("$KV.{}.", nats.nodes.name);
    let msgs = super::lease::read_stream(
        &nats.nodes.stream,
        &format!("{prefix}>"),
        async_nats::jetstream::consumer::DeliverPolicy::LastPerSubject,
    )
    .await?;
    let (mut live, mut departed) = (BTreeMap::new(), Vec::new());
    for m in msgs {
        let Some(key) = m.subject.strip_prefix(&prefix).map(str::to_string) else {
            continue;
        };
        if m.is_delete_marker() {
            departed.push(key);
        } else if let Ok(h) = serde_json::from_slice::<Heartbeat>(&m.payload) {
            live.insert(key, h);
        }
    }
    Ok((live, departed))
}

/// This node's view of the live set: a node found in the last two reads of the nodes bucket,
/// or in one of them, unless its heartbeat was deleted (a graceful stop). A read goes through a
/// consumer on one replica's copy of the bucket, which may miss a heartbeat being rewritten or
/// lag behind the leader (for a while after NATS lost its quorum); a view that followed each
/// read would flicker, and a partition freed meanwhile would go to the wrong node. So a node is
/// dropped only when two reads in a row missed it and the bucket's leader has no heartbeat of
/// it either ([`View::leaving_after`] names whom to look up). A node that died is out of the
/// view one round after its heartbeat expired (about when its leases do).
///
/// After a round failed (the nodes bucket did not answer, as while NATS has no quorum), every
/// heartbeat may have expired meanwhile, and the other nodes rewrite theirs only as their own
/// rounds succeed again: for one lease lifetime after the last failure, the view keeps every
/// node it holds (a live node has rewritten its heartbeat by then). Without this, a node would
/// drop the others and take their partitions, whose leases had expired in the same outage, from
/// under their running owners.
#[derive(Debug)]
struct View {
    /// Per node: when this node first saw it, and how many reads in a row missed it.
    seen: HashMap<String, (Instant, u32)>,
    /// The lease lifetime: how long the view holds on after a failed round, and how long the
    /// live set must stay unchanged to count as settled.
    ttl: Duration,
    /// When a round last failed.
    failed_at: Option<Instant>,
}

impl View {
    /// An empty view, holding on for `ttl` after a failed round.
    fn new(ttl: Duration) -> View {
        View {
            seen: HashMap::new(),
            ttl,
            failed_at: None,
        }
    }

    /// A round failed: hold on to every node for a lease lifetime from now.
    fn failed(&mut self) {
        self.failed_at = Some(Instant::now());
    }

    /// Takes a read (`read`: the heartbeats found, `departed`: those deleted); returns the live
    /// set, logging joins and departures.
    fn update(&mut self, me: &str, read: &[String], departed: &[String]) -> Vec<String> {
        let now = Instant::now();
        for (_, missed) in self.seen.values_mut() {
            *missed += 1;
        }
        for n in read.iter().map(String::as_str).chain(std::iter::once(me)) {
            let e = self.seen.entry(n.to_string()).or_insert_with(|| {
                if n != me {
                    tracing::info!(node = %n, "a node joined the cluster");
                }
                (now, 0)
            });
            e.1 = 0;
        }
        let holding_on = self.failed_at.is_some_and(|t| t.elapsed() < self.ttl);
        self.seen.retain(|n, (_, missed)| {
            let gone = n != me && (departed.contains(n) || (*missed >= 2 && !holding_on));
            if gone {
                tracing::warn!(node = %n, "a node left the cluster (its heartbeat expired or it stopped); its partitions are taken over once their leases expire");
            }
            !gone
        });
        self.seen.keys().cloned().collect()
    }

    /// The nodes a read of `read` (with `departed`) would drop from the view: missed by the
    /// read before too, not deleted.
    fn leaving_after<T>(
        &self,
        me: &str,
        read: &BTreeMap<String, T>,
        departed: &[String],
    ) -> Vec<String> {
        self.seen
            .iter()
            .filter(|(n, (_, missed))| {
                n.as_str() != me && *missed >= 1 && !read.contains_key(*n) && !departed.contains(n)
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Whether the live set has not changed for a lease lifetime.
    fn settled(&self) -> bool {
        self.seen
            .values()
            .all(|(first, _)| first.elapsed() >= self.ttl)
    }
}

/// The nodes live now (their heartbeats), by id.
pub async fn live_nodes(nats: &Nats) -> Result<BTreeMap<String, Heartbeat>, NatsError> {
    Ok(read_nodes(nats).await?.0)
}

/// The lease key of partition `p`.
pub fn partition_lease(p: u16) -> String {
    format!("p.{p}")
}

/// Runs membership rounds until `stop`; `ready` turns true after the first full round.
pub async fn run_membership(m: Membership, ready: watch::Sender<bool>, stop: CancellationToken) {
    let ttl = m.nats.lease_ttl;
    let every = (ttl / 3).min(Duration::from_secs(1));
    let mut free_since: HashMap<u16, Instant> = HashMap::new();
    let mut view = View::new(ttl);
    let mut round: u64 = 0;
    // A lease released anywhere starts a round at once (expiry is seen by the rounds).
    let kick_watch = {
        let leases = m.nats.leases.clone();
        let runtime = m.runtime.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let Ok(mut w) = leases.watch_all().await else {
                return;
            };
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    e = w.next() => match e {
                        Some(Ok(e)) if e.operation != async_nats::jetstream::kv::Operation::Put => {
                            runtime.kick.notify_one();
                        }
                        Some(Ok(_)) => {}
                        _ => return,
                    }
                }
            }
        })
    };
    let renewer = tokio::spawn(renew_loop(m.runtime.clone(), every, stop.clone()));
    loop {
        round += 1;
        if let Err(e) = membership_round(&m, &mut free_since, &mut view, round).await {
            view.failed();
            tracing::warn!(error = %e, "cluster membership round failed");
        } else {
            ready.send_if_modified(|r| !std::mem::replace(r, true));
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
            _ = m.runtime.kick.notified() => {}
        }
    }
    kick_watch.abort();
    let _ = renewer.await;
}

/// Renews the leases this node holds every `every` until `stop`, on a task of its own: a
/// membership round can wait seconds on a bucket whose leader is being elected (the nodes
/// bucket, a read of the lease holders), and renewals waiting behind it let every lease of the
/// node expire, standing all its partitions down.
async fn renew_loop(rt: Arc<Runtime>, every: Duration, stop: CancellationToken) {
    loop {
        renew_held(&rt).await;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Renews every lease of a running partition and, while the node leaves, of those stopping.
async fn renew_held(rt: &Runtime) {
    let mut held: Vec<(Option<u16>, Arc<Lease>)> = rt
        .lock()
        .iter()
        .map(|(p, r)| (Some(*p), r.lease.clone()))
        .collect();
    if rt.is_leaving() {
        let holding = rt.holding.lock().unwrap_or_else(|p| p.into_inner());
        held.extend(
            holding
                .iter()
                .filter(|l| !l.is_lost())
                .map(|l| (None, l.clone())),
        );
    }
    let was_lost: Vec<bool> = held.iter().map(|(_, l)| l.is_lost()).collect();
    let results =
        futures_util::future::join_all(held.iter().map(|(_, l)| rt.leases.renew(l))).await;
    for (((p, lease), r), was_lost) in held.iter().zip(results).zip(was_lost) {
        let r = match (r, p) {
            (Renewed::Expired, Some(p)) => reclaim(rt, *p, lease).await,
            (Renewed::Expired, None) => {
                lease.mark_lost();
                Renewed::Lost
            }
            (r, _) => r,
        };
        // Once, when the loss is found (the partition keeps its lease until it has stopped).
        if r == Renewed::Lost
            && !was_lost
            && let Some(p) = p
        {
            tracing::warn!(
                partition = p,
                "lease lost (taken by another node, or expired and not safe to take back); the partition stands down"
            );
        }
    }
}

/// Reads of the checkpoint pointer one reclaim may try (about 2 s of tries, 250 ms apart).
const RECLAIM_READS: usize = 8;

/// Partition `p`'s lease expired under its running task (the lease bucket could not be
/// written for longer than `lease_ttl`, e.g. during its leader election). The task's state is
/// still right unless another owner moved the partition on meanwhile; the only step of another
/// owner that this task cannot absorb is a checkpoint (its purge may remove input this task has
/// not read), and a checkpoint names its owner's epoch, newer than this lease's. So the lease is
/// taken back when the checkpoint pointer's epoch is not newer than the lease's; events another
/// owner published meanwhile are found by the outbox's expected-sequence check and suppressed.
async fn reclaim(rt: &Runtime, p: u16, lease: &Lease) -> Renewed {
    // Hedged: the pointer's bucket may be electing a leader too, and a read sent meanwhile
    // would hold the reclaim (and the partition's events) for the request's whole timeout.
    let read = hedge::hedged(RECLAIM_READS, || {
        checkpoint::read_pointer(&rt.shared.nats, p)
    })
    .await
    .map_err(|e| NatsError::hedged("read the checkpoint pointer", e));
    match read {
        Ok(ptr)
            if ptr
                .as_ref()
                .is_none_or(|(ptr, _)| ptr.epoch <= lease.epoch()) =>
        {
            let r = rt.leases.reclaim(lease).await;
            if r == Renewed::Yes {
                tracing::info!(
                    partition = p,
                    "lease expired while the lease bucket could not be written; taken back (no other owner checkpointed)"
                );
                metrics::counter!(t::CLUSTER_LEASES_RECLAIMED).increment(1);
            }
            r
        }
        Ok(_) => {
            lease.mark_lost();
            Renewed::Lost
        }
        Err(e) => {
            tracing::debug!(partition = p, error = %e, "reading the checkpoint pointer to take an expired lease back");
            Renewed::Unknown
        }
    }
}

async fn membership_round(
    m: &Membership,
    free_since: &mut HashMap<u16, Instant>,
    view: &mut View,
    round: u64,
) -> Result<(), NatsError> {
    let rt = &m.runtime;
    let ttl = m.nats.lease_ttl;
    if rt.is_leaving() {
        // The renewer keeps what is held alive while it stops; nothing else to do.
        return Ok(());
    }
    // 1. Heartbeat (the leases are renewed by their own task, [`renew_held`]).
    let hb = Heartbeat {
        node: m.node.clone(),
        http: m.http.clone(),
        started_ms: m.started_ms,
        partitions: rt.board().all(),
        sinks: (m.sinks.0)(),
        reads_checkpoint_version: checkpoint::VERSION,
    };
    let beat = m
        .nats
        .nodes
        .put(&m.node, serde_json::to_vec(&hb).unwrap_or_default().into())
        .await;
    rt.reap().await;
    beat.map_err(|e| NatsError::request("heartbeat", e))?;
    // 3. Who is live, who holds what.
    let (mut live, departed) = read_nodes(&m.nats).await?;
    // That read comes from one replica's copy of the bucket, which can lag behind (for a while
    // after NATS lost its quorum): a node this read would drop from the view is looked up at
    // the bucket's leader first.
    for n in view.leaving_after(&m.node, &live, &departed) {
        if let Some((v, _)) = Nats::kv_read(&m.nats.nodes, &n).await?
            && let Ok(h) = serde_json::from_slice::<Heartbeat>(&v)
        {
            live.insert(n, h);
        }
    }
    rt.shared
        .set_checkpoint_version(checkpoint::readable_by_all(
            live.values().map(|h| h.reads_checkpoint_version),
        ));
    m.lags.set_all(
        live.values()
            .flat_map(|h| h.partitions.iter().map(|s| (s.partition, s.lag_records))),
    );
    let read: Vec<String> = live.keys().cloned().collect();
    let nodes = view.update(&m.node, &read, &departed);
    let now = Instant::now();
    let holders = rt.leases.holders().await?;
    tracing::debug!(round, holders = ?holders, nodes = ?nodes, "membership round");
    let mine = rt.owned();
    let assigned = owners(m.nats.partitions, &nodes);
    let settled = view.settled();
    for p in 0..m.nats.partitions {
        let order = rank(&partition_key(p), &nodes);
        let owner = assigned.get(usize::from(p)).copied();
        let key = partition_lease(p);
        match holders.get(&key) {
            None => {
                // Counted from the last failed round at the earliest: a lease that expired in an
                // outage is its owner's to take back first, and its renewals may take a few
                // seconds more than this node's rounds to get through again.
                let free = *free_since.entry(p).or_insert(now);
                let since = view.failed_at.map_or(free, |f| free.max(f));
                let Some(r) = order.iter().position(|n| *n == m.node) else {
                    continue;
                };
                if mine.contains(&p) || !rt.may_take(p) {
                    continue;
                }
                if owner == Some(m.node.as_str()) || since.elapsed() >= ttl * (r as u32 + 1) {
                    match rt.leases.take(&key).await {
                        Ok(Some(lease)) => {
                            free_since.remove(&p);
                            rt.spawn(p, lease);
                        }
                        Ok(None) => {
                            tracing::debug!(partition = p, "partition lease held elsewhere")
                        }
                        Err(e) => tracing::debug!(partition = p, error = %e, "taking a partition"),
                    }
                }
            }
            Some(h) => {
                free_since.remove(&p);
                if h.node == m.node && mine.contains(&p) {
                    // 5. Hand over to its assigned owner once membership has settled.
                    if let Some(o) = owner
                        && o != m.node
                        && settled
                    {
                        rt.hand_over(p, o);
                    }
                }
            }
        }
    }
    gauge!(t::CLUSTER_PARTITIONS_OWNED).set(rt.owned().len() as f64);
    let parts = rt.board().all();
    gauge!(t::CLUSTER_LAG_RECORDS).set(parts.iter().map(|s| s.lag_records).sum::<u64>() as f64);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let oldest = parts
        .iter()
        .filter(|s| s.checkpoint_at_ms > 0)
        .map(|s| (now_ms - s.checkpoint_at_ms).max(0))
        .max()
        .unwrap_or(0);
    gauge!(t::CLUSTER_CHECKPOINT_AGE_MAX_SECONDS).set(oldest as f64 / 1000.0);
    gauge!(t::CLUSTER_NODES).set(nodes.len() as f64);
    // 6. Fence compaction by the owner of partition 0, now and then.
    if round.is_multiple_of(30) && rt.control(0).is_some() {
        let mut min = u64::MAX;
        for p in 0..m.nats.partitions {
            let pos = checkpoint::read_pointer(&m.nats, p)
                .await?
                .map_or(0, |(c, _)| c.fence_pos);
            min = min.min(pos);
        }
        if min > 0
            && let Err(e) = m.fences.compact(min).await
        {
            tracing::warn!(error = %e, "fence stream compaction failed");
        }
    }
    Ok(())
}

/// event mode: shares this node's acknowledged fix times with the cluster (`wm.<node>` in the
/// META bucket) and follows every node's, so every node's watermark is the cluster's.
pub async fn run_watermark(
    nats: Nats,
    node: String,
    ingest: ClusterIngest,
    watermark: Arc<crate::clock::Watermark>,
    stop: CancellationToken,
) {
    let key = format!("wm.{node}");
    let follow = {
        let nats = nats.clone();
        let watermark = watermark.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            loop {
                match nats.meta.watch_with_history("wm.*").await {
                    Ok(mut w) => loop {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            e = w.next() => match e {
                                Some(Ok(e)) => {
                                    if let Some(v) = std::str::from_utf8(&e.value).ok().and_then(|s| s.parse::<i64>().ok()) {
                                        watermark.observe_cluster(v);
                                    }
                                }
                                _ => break,
                            }
                        }
                    },
                    Err(e) => tracing::warn!(error = %e, "watching the cluster watermark"),
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        })
    };
    let mut shared = i64::MIN;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let acked = ingest.acked_max();
        if acked > shared {
            match nats.meta.put(&key, acked.to_string().into()).await {
                Ok(_) => shared = acked,
                Err(e) => tracing::debug!(error = %e, "sharing the watermark"),
            }
        }
    }
    follow.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_node_missing_from_two_reads_leaves_the_view_unless_a_round_failed_lately() {
        let ttl = Duration::from_millis(40);
        let mut view = View::new(ttl);
        assert_eq!(view.update("a", &ids(&["b", "c"]), &[]).len(), 3);
        // One miss is forgiven; two drop the node, so the second is checked first.
        let read = |v: &[&str]| -> BTreeMap<String, ()> {
            v.iter().map(|n| (n.to_string(), ())).collect()
        };
        assert!(view.leaving_after("a", &read(&["b"]), &[]).is_empty());
        assert_eq!(view.update("a", &ids(&["b"]), &[]).len(), 3);
        assert_eq!(view.leaving_after("a", &read(&["b"]), &[]), ids(&["c"]));
        assert!(
            view.leaving_after("a", &read(&["b"]), &ids(&["c"]))
                .is_empty()
        );
        let mut live = view.update("a", &ids(&["b"]), &[]);
        live.sort();
        assert_eq!(live, ids(&["a", "b"]));

        // After a failed round, misses drop nobody for a lease lifetime.
        let mut view = View::new(ttl);
        view.update("a", &ids(&["b", "c"]), &[]);
        view.failed();
        view.update("a", &[], &[]);
        assert_eq!(view.update("a", &[], &[]).len(), 3);
        // A graceful stop (a deleted heartbeat) is taken at once even then.
        assert_eq!(view.update("a", &ids(&["b"]), &ids(&["c"])).len(), 2);
        std::thread::sleep(ttl + Duration::from_millis(10));
        view.update("a", &[], &[]);
        assert_eq!(view.update("a", &[], &[]), ids(&["a"]));
    }
}
