//! The cluster's fences: one change stream ([`FENCES_STREAM`]) that every node follows, and the
//! markers that say where each partition applies a change.
//!
//! A write (one PUT, POST or DELETE) is one message on the stream, published with the stream's
//! last sequence as the expected one: writes are serialized cluster-wide by compare-and-set,
//! and each is checked (`max_fences`, "no such fence") against the fences as of the sequence it
//! follows. Its sequence `c` is its change number. Then a `Fences(c)` record goes into every
//! partition's input ([`crate::cluster::record`]): the partition applies every change up to `c`
//! there, at a definite point of its input, the same way on every replay. The answer comes after
//! every marker's PubAck and after this node's follower applied `c`, so a fix sent after it
//! meets the new fences and a read on this node sees them.
//!
//! Every node's follower ([`FenceLog`]) keeps the fences as of a base position (a snapshot in
//! the object store, or none) plus every change after it, parsed once and shared with the
//! partitions: a partition restored from a checkpoint at fence position `c` gets the fences as
//! of `c`, and a marker gets the changes since the partition's last one. The follower also keeps
//! the API's read copy ([`FenceMap`]).
//!
//! Bounds: the stream is compacted by the owner of partition 0 ([`FenceLog::compact`]) once every
//! partition's checkpoint is past a position: the fences as of it become a snapshot object, the
//! stream is purged below it, and followers fold their history into the new base. A write
//! larger than the server's message limit is stored as an object and the message names it.
//!
//! Invariants: a follower applies messages in stream order with no gap (a gap means the stream
//! was compacted past it: it reloads the newest snapshot); `applied` only grows; a change is in
//! the read copy once `applied` reached it.
//!
//! Why this file is long: the fence stream's writer (CAS, markers, large changes as objects),
//! its follower (read copy, snapshots) and its compaction share one log position.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::hedge;
use super::nats::{FENCES_STREAM, FENCES_SUBJECT, Nats, NatsError, in_subject};
use crate::fences::{
    FenceCheck, FenceMap, FenceWrite, FenceWriteError, FenceWriter, Stored, Written,
};
use crate::telemetry as t;
use geodwell_core::codec::{DecodeError, Reader, put_uv};
use geodwell_core::fences::{Fence, FenceLimits, parse_fences_str};
use geodwell_core::partition::record::{
    self, FenceChange, Input, decode_fence_change, encode_fence_change,
};
use geodwell_core::partition::{FenceSource, FenceUpdate as Change, MissingFences};

/// The header naming the object that holds a large write.
const BLOB_HEADER: &str = "Geodwell-Blob";
/// The META key of the fence snapshot pointer.
const BASE_KEY: &str = "fences.base";
/// Changes foldable into a snapshot before the owner of partition 0 compacts.
const COMPACT_AFTER: usize = 256;

/// Where the fence snapshot stands ([`BASE_KEY`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct BasePointer {
    /// The fences as of this stream sequence.
    pos: u64,
    /// The snapshot object.
    object: String,
}

/// A write as the follower keeps it.
#[derive(Debug, Clone)]
struct Entry {
    changes: Arc<[Change]>,
    /// The object holding it, when it was too large for a message.
    blob: Option<String>,
}

#[derive(Debug, Default)]
struct Catalog {
    /// The fences as of `base_pos`.
    base_pos: u64,
    base: BTreeMap<Arc<str>, Arc<Fence>>,
    base_object: Option<String>,
    /// Every write after `base_pos`, by sequence.
    history: BTreeMap<u64, Entry>,
}

impl Catalog {
    fn fold(set: &mut BTreeMap<Arc<str>, Arc<Fence>>, changes: &[Change]) {
        for c in changes {
            match c {
                Change::Put(f) => {
                    set.insert(f.id.clone(), f.clone());
                }
                Change::Delete(id) => {
                    set.remove(id);
                }
            }
        }
    }
}

/// Why the fences as of a position cannot be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AtError {
    /// The position lies before the snapshot the history starts from.
    #[error("fence position {asked} is before the fence snapshot at {base}")]
    Compacted {
        /// Asked.
        asked: u64,
        /// The snapshot's position.
        base: u64,
    },
    /// The follower has not reached the position yet.
    #[error("fence position {asked} is not applied yet (at {applied})")]
    Ahead {
        /// Asked.
        asked: u64,
        /// Applied so far.
        applied: u64,
    },
}

/// A node's follower of the cluster's fence log, and the writer of fence changes.
#[derive(Debug)]
pub struct FenceLog {
    nats: Nats,
    map: Arc<FenceMap>,
    catalog: Mutex<Catalog>,
    applied: watch::Sender<u64>,
    parse: FenceLimits,
}

impl FenceLog {
    /// Loads the newest fence snapshot, follows the stream until caught up with it, seeds an
    /// empty cluster with `preload`, and keeps following until `stop`.
    pub async fn start(
        nats: Nats,
        map: Arc<FenceMap>,
        preload: Vec<Fence>,
        stop: CancellationToken,
    ) -> Result<Arc<FenceLog>, NatsError> {
        let log = Arc::new(FenceLog {
            nats,
            map,
            catalog: Mutex::new(Catalog::default()),
            applied: watch::channel(0).0,
            // Stored changes were validated by their writer; a node with tighter limits must
            // still apply them.
            parse: FenceLimits::stored(),
        });
        log.load_base().await?;
        let last = stream_last(&log.nats).await?;
        tokio::spawn(follow(log.clone(), stop.clone()));
        if !log.wait_applied(last, Duration::from_secs(60)).await {
            return Err(NatsError::request(
                "follow the fence stream",
                format!("not caught up with sequence {last} within 60s"),
            ));
        }
        if last == 0 && log.base_pos() == 0 && !preload.is_empty() {
            let changes: Vec<FenceChange> = preload
                .into_iter()
                .map(|f| FenceChange::Put(Stored::new(Arc::new(f)).json))
                .collect();
            // Only the first node seeds: a write that meets another's first write is dropped.
            match log.write_at(changes, 0, &|_: &FenceMap| Ok(())).await {
                Ok(()) => tracing::info!("seeded the cluster's fences from fences_file"),
                Err(FenceWriteError::Conflict) => {}
                Err(e) => tracing::warn!(error = %e, "seeding the cluster's fences failed"),
            }
        }
        Ok(log)
    }

    /// The read copy the follower keeps.
    pub fn map(&self) -> &Arc<FenceMap> {
        &self.map
    }

    /// The last fence stream sequence applied.
    pub fn applied(&self) -> u64 {
        *self.applied.borrow()
    }

    /// A receiver of [`FenceLog::applied`].
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    fn base_pos(&self) -> u64 {
        self.lock().base_pos
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Catalog> {
        self.catalog.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until the follower applied `c` (false after `timeout`).
    pub async fn wait_applied(&self, c: u64, timeout: Duration) -> bool {
        let mut rx = self.applied.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|&a| a >= c))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The fences as of position `c`.
    pub fn set_at(&self, c: u64) -> Result<Vec<Arc<Fence>>, AtError> {
        let applied = self.applied();
        let cat = self.lock();
        if c < cat.base_pos {
            return Err(AtError::Compacted {
                asked: c,
                base: cat.base_pos,
            });
        }
        if c > applied {
            return Err(AtError::Ahead { asked: c, applied });
        }
        let mut set = cat.base.clone();
        for (_, e) in cat.history.range(..=c) {
            Catalog::fold(&mut set, &e.changes);
        }
        Ok(set.into_values().collect())
    }

    /// The changes after position `from` up to `to`, in order.
    pub fn changes_between(&self, from: u64, to: u64) -> Result<Vec<Change>, AtError> {
        let applied = self.applied();
        let cat = self.lock();
        if from < cat.base_pos {
            return Err(AtError::Compacted {
                asked: from,
                base: cat.base_pos,
            });
        }
        if to > applied {
            return Err(AtError::Ahead { asked: to, applied });
        }
        Ok(cat
            .history
            .range(from + 1..=to)
            .flat_map(|(_, e)| e.changes.iter().cloned())
            .collect())
    }

    /// Writes `changes` as one change, checked by `check` against the fences as of the position
    /// it follows; returns what `check` returned once every partition has its marker and this
    /// node applied the change.
    pub async fn write<T>(
        &self,
        changes: Vec<FenceChange>,
        check: impl Fn(&FenceMap) -> Result<T, FenceWriteError>,
    ) -> Result<T, FenceWriteError> {
        // Another node's write between the check and the publish makes the publish fail; the
        // check is then repeated against the fences with that write applied.
        for _ in 0..64 {
            let pos = self.applied();
            match self.write_at(changes.clone(), pos, &check).await {
                Err(FenceWriteError::Conflict) => {
                    self.wait_applied(pos + 1, Duration::from_secs(5)).await;
                }
                done => return done,
            }
        }
        Err(FenceWriteError::Contended)
    }

    /// One attempt: publish `changes` expecting the stream's last sequence to be `pos`.
    async fn write_at<T>(
        &self,
        changes: Vec<FenceChange>,
        pos: u64,
        check: &impl Fn(&FenceMap) -> Result<T, FenceWriteError>,
    ) -> Result<T, FenceWriteError> {
        let checked = check(&self.map)?;
        fn store<E: std::error::Error + Send + Sync + 'static>(
            what: &'static str,
        ) -> impl Fn(E) -> FenceWriteError {
            move |e| FenceWriteError::Store(crate::events::publisher::LogError::stream(what, e))
        }
        let payload = encode_fence_write(&changes);
        let mut msg = PublishMessage::build().expected_last_sequence(pos);
        if payload.len() + 4096 > self.nats.max_payload {
            // Too large for one message: the object first, then a message naming it.
            let name = format!("fence-write-{:032x}", xxhash_rust::xxh3::xxh3_128(&payload));
            self.nats
                .objects
                .put(name.as_str(), &mut payload.as_slice())
                .await
                .map_err(store("store a large fence change"))?;
            let mut h = HeaderMap::new();
            h.insert(BLOB_HEADER, name.as_str());
            msg = msg.headers(h).payload(Bytes::new());
        } else {
            msg = msg.payload(payload.into());
        }
        let ack = self
            .nats
            .js
            .send_publish(FENCES_SUBJECT, msg)
            .await
            .map_err(store("publish the fence change"))?
            .await;
        let c = match ack {
            Ok(a) => a.sequence,
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                return Err(FenceWriteError::Conflict);
            }
            Err(e) => return Err(store("publish the fence change")(e)),
        };
        self.publish_markers(c)
            .await
            .map_err(store("mark the fence change in every partition"))?;
        if !self.wait_applied(c, Duration::from_secs(30)).await {
            return Err(FenceWriteError::NotApplied(c));
        }
        metrics::counter!(t::CLUSTER_FENCE_WRITES).increment(1);
        Ok(checked)
    }

    /// Puts a `Fences(c)` marker into every partition's input (a re-sent marker is dropped by
    /// its message id).
    pub async fn publish_markers(&self, c: u64) -> Result<(), NatsError> {
        let mut acks = Vec::with_capacity(self.nats.partitions as usize);
        for p in 0..self.nats.partitions {
            acks.push(self.publish_marker(p, c).await?);
        }
        for a in acks {
            a.await
                .map_err(|e| NatsError::request("fence marker ack", e))?;
        }
        Ok(())
    }

    /// Queues partition `p`'s `Fences(c)` marker; the returned future is its PubAck.
    pub async fn publish_marker(
        &self,
        p: u16,
        c: u64,
    ) -> Result<async_nats::jetstream::context::PublishAckFuture, NatsError> {
        let msg = PublishMessage::build()
            .message_id(format!("fm-{p}-{c}"))
            .payload(record::to_bytes(&Input::Fences(c)).into());
        self.nats
            .js
            .send_publish(in_subject(p), msg)
            .await
            .map_err(|e| NatsError::request("fence marker", e))
    }

    /// Reads the snapshot pointer and, when it moved past what this follower holds, loads that
    /// snapshot (dropping the history it covers).
    async fn load_base(&self) -> Result<(), NatsError> {
        let Some((v, _)) = Nats::kv_read(&self.nats.meta, BASE_KEY).await? else {
            return Ok(());
        };
        let ptr: BasePointer = serde_json::from_slice(&v).map_err(|e| NatsError::Corrupt {
            what: "the fence snapshot pointer".into(),
            source: e.into(),
        })?;
        if ptr.pos <= self.base_pos() {
            return Ok(());
        }
        let applied = self.applied();
        if applied >= ptr.pos {
            // Everything the snapshot holds is applied here: fold instead of downloading.
            self.rebase(ptr.pos, Some(ptr.object));
            return Ok(());
        }
        let bytes = read_object(&self.nats, &ptr.object).await?;
        let changes = decode_fence_write(&bytes).map_err(|e| NatsError::Corrupt {
            what: format!("fence snapshot {}", ptr.object),
            source: e.into(),
        })?;
        let parsed = self
            .parse_changes(&changes)
            .map_err(|e| NatsError::Corrupt {
                what: format!("fence snapshot {}", ptr.object),
                source: e.into(),
            })?;
        let mut set = BTreeMap::new();
        Catalog::fold(&mut set, &parsed);
        {
            let mut cat = self.lock();
            cat.base_pos = ptr.pos;
            cat.base = set;
            cat.base_object = Some(ptr.object);
            let keep = cat.history.split_off(&(ptr.pos + 1));
            cat.history = keep;
            let current = fold_all(&cat);
            self.map.replace_all(current.into_values());
        }
        self.applied.send_if_modified(|a| {
            if *a < ptr.pos {
                *a = ptr.pos;
                true
            } else {
                false
            }
        });
        Ok(())
    }

    /// Folds the history up to `pos` into the base.
    fn rebase(&self, pos: u64, object: Option<String>) {
        let mut cat = self.lock();
        if pos <= cat.base_pos {
            return;
        }
        let keep = cat.history.split_off(&(pos + 1));
        let folded = std::mem::replace(&mut cat.history, keep);
        for (_, e) in folded {
            Catalog::fold(&mut cat.base, &e.changes);
        }
        cat.base_pos = pos;
        cat.base_object = object;
    }

    fn parse_changes(&self, changes: &[FenceChange]) -> Result<Vec<Change>, String> {
        changes
            .iter()
            .map(|c| match c {
                FenceChange::Put(text) => {
                    let mut fs = parse_fences_str(text, &self.parse)
                        .map_err(|e| format!("a stored fence does not parse: {e}"))?;
                    match (fs.pop(), fs.is_empty()) {
                        (Some(f), true) => Ok(Change::Put(Arc::new(f))),
                        _ => Err("a stored fence is not exactly one Feature".into()),
                    }
                }
                FenceChange::Delete(id) => Ok(Change::Delete(Arc::from(id.as_str()))),
            })
            .collect()
    }

    /// Applies write `seq` (the follower, in stream order).
    fn apply(&self, seq: u64, changes: Vec<Change>, blob: Option<String>) {
        for c in &changes {
            match c {
                Change::Put(f) => self.map.insert(Stored::new(f.clone())),
                Change::Delete(id) => self.map.remove(id),
            }
        }
        self.lock().history.insert(
            seq,
            Entry {
                changes: changes.into(),
                blob,
            },
        );
        self.applied.send_replace(seq);
    }

    /// Compacts the stream up to `upto` (every partition's checkpoint is at or past it) when
    /// enough changes can be folded: the fences as of it become a snapshot object, the pointer
    /// moves (compare-and-set), the stream is purged below it, and what it replaced is deleted.
    /// Called by the owner of partition 0.
    pub async fn compact(&self, upto: u64) -> Result<bool, NatsError> {
        let (foldable, base_pos, old_object, blobs) = {
            let cat = self.lock();
            let foldable = cat.history.range(..=upto).count();
            let blobs: Vec<String> = cat
                .history
                .range(..=upto)
                .filter_map(|(_, e)| e.blob.clone())
                .collect();
            (foldable, cat.base_pos, cat.base_object.clone(), blobs)
        };
        if foldable < COMPACT_AFTER || upto <= base_pos {
            return Ok(false);
        }
        let set = self
            .set_at(upto)
            .map_err(|e| NatsError::request("fence snapshot", e))?;
        let snapshot: Vec<FenceChange> = set
            .into_iter()
            .map(|f| FenceChange::Put(Stored::new(f).json))
            .collect();
        let bytes = encode_fence_write(&snapshot);
        let object = format!("fences-{upto}");
        self.nats
            .objects
            .put(object.as_str(), &mut bytes.as_slice())
            .await
            .map_err(|e| NatsError::request("write the fence snapshot", e))?;
        let ptr = serde_json::to_vec(&BasePointer {
            pos: upto,
            object: object.clone(),
        })
        .unwrap_or_default();
        match Nats::kv_read_rev(&self.nats.meta, BASE_KEY).await? {
            Some(rev) => self
                .nats
                .meta
                .update(BASE_KEY, ptr.into(), rev)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            None => self
                .nats
                .meta
                .create(BASE_KEY, ptr.into())
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
        }
        .map_err(|e| NatsError::request("move the fence snapshot pointer", e))?;
        self.nats
            .fences
            .purge()
            .sequence(upto + 1)
            .await
            .map_err(|e| NatsError::request("purge the fence stream", e))?;
        self.rebase(upto, Some(object));
        for name in old_object.into_iter().chain(blobs) {
            let _ = self.nats.objects.delete(name.as_str()).await;
        }
        metrics::counter!(t::CLUSTER_FENCE_COMPACTIONS).increment(1);
        tracing::info!(upto, folded = foldable, "fence stream compacted");
        Ok(true)
    }
}

fn fold_all(cat: &Catalog) -> BTreeMap<Arc<str>, Arc<Fence>> {
    let mut set = cat.base.clone();
    for e in cat.history.values() {
        Catalog::fold(&mut set, &e.changes);
    }
    set
}

/// The fence stream's last sequence.
async fn stream_last(nats: &Nats) -> Result<u64, NatsError> {
    nats.fences
        .get_info()
        .await
        .map(|i| i.state.last_sequence)
        .map_err(|e| NatsError::request("fence stream info", e))
}

/// Reads a whole object.
pub async fn read_object(nats: &Nats, name: &str) -> Result<Vec<u8>, NatsError> {
    let mut obj = nats
        .objects
        .get(name)
        .await
        .map_err(|e| NatsError::request(format!("read object {name}"), e))?;
    let mut buf = Vec::new();
    obj.read_to_end(&mut buf)
        .await
        .map_err(|e| NatsError::request(format!("read object {name}"), e))?;
    Ok(buf)
}

/// Follows the fence stream from the follower's position until `stop`.
async fn follow(log: Arc<FenceLog>, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    while !stop.is_cancelled() {
        match follow_once(&log, &stop).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "following the fence stream; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The fence stream from sequence `from`, through an ordered consumer.
async fn consumer(log: &FenceLog, from: u64) -> Result<pull::Ordered, NatsError> {
    let consumer = log
        .nats
        .fences
        .create_consumer(pull::OrderedConfig {
            filter_subject: FENCES_SUBJECT.into(),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from,
            },
            ..Default::default()
        })
        .await
        .map_err(|e| NatsError::request("fence stream consumer", e))?;
    consumer
        .messages()
        .await
        .map_err(|e| NatsError::request("fence stream consumer", e))
}

async fn follow_once(log: &FenceLog, stop: &CancellationToken) -> Result<(), NatsError> {
    let from = log.applied() + 1;
    let mut messages = hedge::hedged(hedge::IN_FLIGHT, || consumer(log, from))
        .await
        .map_err(|e| NatsError::hedged("fence stream consumer", e))?;
    let mut pointer_check = tokio::time::interval(Duration::from_secs(10));
    loop {
        let msg = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = pointer_check.tick() => {
                // Another node compacted: fold what the new snapshot covers.
                if let Err(e) = log.load_base().await {
                    tracing::warn!(error = %e, "reading the fence snapshot pointer");
                }
                continue;
            }
            m = messages.next() => m,
        };
        let msg = match msg {
            Some(Ok(m)) => m,
            Some(Err(e)) => return Err(NatsError::request("fence stream", e)),
            None => return Err(NatsError::request("fence stream", "consumer ended")),
        };
        let seq = msg
            .info()
            .map_err(|e| NatsError::request("fence stream message", e))?
            .stream_sequence;
        let applied = log.applied();
        if seq <= applied {
            continue;
        }
        if seq > applied + 1 {
            // Compacted past this follower: the newest snapshot covers the gap.
            log.load_base().await?;
            if log.applied() + 1 < seq {
                return Err(NatsError::Corrupt {
                    what: FENCES_STREAM.into(),
                    source: format!(
                        "fence changes {}..{seq} are gone and no snapshot covers them",
                        log.applied() + 1
                    )
                    .into(),
                });
            }
            if seq <= log.applied() {
                continue;
            }
        }
        let blob = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(BLOB_HEADER))
            .map(|v| v.as_str().to_string());
        let bytes = match &blob {
            Some(name) => read_object(&log.nats, name).await?,
            None => msg.payload.to_vec(),
        };
        let changes = decode_fence_write(&bytes).map_err(|e| NatsError::Corrupt {
            what: format!("fence change {seq}"),
            source: e.into(),
        })?;
        let parsed = log
            .parse_changes(&changes)
            .map_err(|e| NatsError::Corrupt {
                what: format!("fence change {seq}"),
                source: e.into(),
            })?;
        log.apply(seq, parsed, blob);
    }
}

impl FenceWriter for FenceLog {
    fn write<'a>(
        &'a self,
        writes: Vec<FenceWrite>,
        check: FenceCheck<'a>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Written, FenceWriteError>> + Send + 'a>> {
        let changes = writes
            .into_iter()
            .map(|w| match w {
                FenceWrite::Put(s) => FenceChange::Put(s.json),
                FenceWrite::Delete(id) => FenceChange::Delete(id),
            })
            .collect();
        Box::pin(FenceLog::write(self, changes, check))
    }
}

impl FenceSource for FenceLog {
    fn changes(&self, from: u64, to: u64) -> Result<Vec<Change>, MissingFences> {
        self.changes_between(from, to)
            .map_err(|_| MissingFences { from, to })
    }
}

/// Encodes one fence write (its changes, in order).
pub fn encode_fence_write(changes: &[FenceChange]) -> Vec<u8> {
    let mut out = Vec::new();
    put_uv(&mut out, changes.len() as u64);
    let mut one = Vec::new();
    for c in changes {
        one.clear();
        encode_fence_change(c, &mut one);
        put_uv(&mut out, one.len() as u64);
        out.extend_from_slice(&one);
    }
    out
}

/// Decodes one fence write.
pub fn decode_fence_write(bytes: &[u8]) -> Result<Vec<FenceChange>, DecodeError> {
    let mut r = Reader { b: bytes, at: 0 };
    let n = r.count()?;
    let mut out = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let len = r.count()?;
        let end =
            r.at.checked_add(len)
                .filter(|&e| e <= bytes.len())
                .ok_or_else(|| r.err("truncated fence change"))?;
        out.push(decode_fence_change(&bytes[r.at..end])?);
        r.at = end;
    }
    if r.at != bytes.len() {
        return Err(r.err("trailing bytes"));
    }
    Ok(out)
}

impl Nats {
    /// The revision of `key` in `bucket` (read from the leader), `None` when it has no value.
    pub async fn kv_read_rev(
        bucket: &async_nats::jetstream::kv::Store,
        key: &str,
    ) -> Result<Option<u64>, NatsError> {
        Ok(Nats::kv_read(bucket, key).await?.map(|(_, rev)| rev))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fence_writes_round_trip_and_damage_is_refused() {
        let changes = vec![
            FenceChange::Put(Arc::from("{\"type\":\"Feature\"}")),
            FenceChange::Delete("depot-3".into()),
            FenceChange::Delete(String::new()),
        ];
        let bytes = encode_fence_write(&changes);
        assert_eq!(decode_fence_write(&bytes).unwrap(), changes);
        for cut in 0..bytes.len() {
            assert!(decode_fence_write(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(1);
        assert!(decode_fence_write(&longer).is_err());
        assert_eq!(
            decode_fence_write(&encode_fence_write(&[])).unwrap(),
            vec![]
        );
    }
}
