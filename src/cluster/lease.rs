//! Leases in a key/value bucket: who owns a partition (or delivers a webhook sink), for how long.
//!
//! A lease is a key of [`LEASES`](super::nats::LEASES) whose entries expire `lease_ttl` after
//! their last write (the bucket's `max_age`: NATS 2.9 has no per-key TTL). Taking it is a
//! `create` (it fails while another holder's entry lives); renewing it is an `update` at the
//! revision last written (compare-and-set: it fails once anyone else wrote the key); the revision
//! at which it was taken is its **epoch**. Releasing it deletes the key at its revision.
//!
//! Invariants:
//! - A holder acts on a lease only while [`Lease::valid`]: its last successful renewal was
//!   *sent* less than `ttl - margin` ago by the local monotonic clock. The server expires the
//!   entry no earlier than `ttl` after it *received* that write, so a holder whose process was
//!   paused (SIGSTOP, a long GC-like stall) finds its lease invalid on waking before it can do
//!   anything, even if no renewal has failed yet.
//! - A renewal that fails because another holder wrote the key marks the lease lost for good:
//!   the holder stands down. A renewal that fails because NATS did not answer leaves the lease
//!   to expire on its own unless a later renewal succeeds in time.
//! - A renewal that finds the key gone ([`Renewed::Expired`]: it expired while the bucket could
//!   not be written, e.g. during its leader election, or a later holder released it) leaves the
//!   decision to the caller, who knows whether anyone else can have acted on the partition since:
//!   [`Leases::reclaim`] takes the key back under the lease's own epoch (a `create`, so it fails
//!   if anyone took it meanwhile), or [`Lease::mark_lost`] stands down.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::kv;
use async_nats::jetstream::stream::Stream;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::nats::NatsError;

/// What a lease entry holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Holder {
    /// The node holding it.
    pub node: String,
    /// The revision at which it was taken.
    pub epoch: u64,
}

/// A lease this node holds.
#[derive(Debug)]
pub struct Lease {
    key: String,
    node: String,
    epoch: u64,
    rev: AtomicU64,
    ttl: Duration,
    /// When the last successful write was sent.
    renewed: Mutex<Instant>,
    lost: CancellationToken,
}

/// How much earlier than the server a holder gives up a lease it could not renew.
fn margin(ttl: Duration) -> Duration {
    (ttl / 5).max(Duration::from_millis(200))
}

impl Lease {
    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The revision at which the lease was taken.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the holder may act: not lost, and renewed recently enough.
    pub fn valid(&self) -> bool {
        !self.lost.is_cancelled() && self.renewed_at().elapsed() + margin(self.ttl) < self.ttl
    }

    /// The key's value while this holder has it: its node and epoch.
    fn value(&self) -> Bytes {
        let h = Holder {
            node: self.node.clone(),
            epoch: self.epoch,
        };
        Bytes::from(serde_json::to_vec(&h).unwrap_or_default())
    }

    /// A write sent at `sent` landed at revision `rev`: the lease lives from then on.
    fn written(&self, rev: u64, sent: Instant) {
        self.rev.store(rev, Ordering::Release);
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = sent;
    }

    fn renewed_at(&self) -> Instant {
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether it was found taken by someone else (or released).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Cancelled once the lease is lost.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Marks the lease lost (the holder stands down).
    pub fn mark_lost(&self) {
        self.lost.cancel();
    }

    /// Waits until the lease is valid (true) or lost (false), checking every 50 ms.
    pub async fn wait_valid(&self) -> bool {
        loop {
            if self.is_lost() {
                return false;
            }
            if self.valid() {
                return true;
            }
            tokio::select! {
                _ = self.lost.cancelled() => return false,
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    }
}

/// Leases of one bucket, for one node.
#[derive(Debug, Clone)]
pub struct Leases {
    bucket: kv::Store,
    node: String,
    ttl: Duration,
}

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewed {
    /// Renewed.
    Yes,
    /// Someone else wrote the key, or it is gone: lost.
    Lost,
    /// NATS did not answer; try again.
    Unknown,
    /// The key is gone (expired, or released by a later holder): nobody holds it. The caller
    /// reclaims it ([`Leases::reclaim`]) when nobody can have acted on the lease's object since,
    /// or marks the lease lost.
    Expired,
}

impl Leases {
    /// Leases in `bucket` for node `node`, living `ttl` without renewal.
    pub fn new(bucket: kv::Store, node: &str, ttl: Duration) -> Leases {
        Leases {
            bucket,
            node: node.to_string(),
            ttl,
        }
    }

    /// The time to live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Takes `key` if nobody holds it: `None` when somebody does.
    pub async fn take(&self, key: &str) -> Result<Option<Lease>, NatsError> {
        let sent = Instant::now();
        // The epoch is the revision of this write, known only after it: the value says
        // "taken by this node", renewals then name the epoch.
        let first = serde_json::to_vec(&Holder {
            node: self.node.clone(),
            epoch: 0,
        })
        .unwrap_or_default();
        let rev = match self.bucket.create(key, first.into()).await {
            Ok(rev) => rev,
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => return Ok(None),
            Err(e) => return Err(NatsError::request(format!("take lease {key}"), e)),
        };
        let lease = Lease {
            key: key.to_string(),
            node: self.node.clone(),
            epoch: rev,
            rev: AtomicU64::new(rev),
            ttl: self.ttl,
            renewed: Mutex::new(sent),
            lost: CancellationToken::new(),
        };
        // Write the epoch into the value at once (a renewal), so readers see it.
        if matches!(self.renew(&lease).await, Renewed::Lost | Renewed::Expired) {
            return Ok(None);
        }
        Ok(Some(lease))
    }

    /// Renews `lease` (compare-and-set at its last revision).
    pub async fn renew(&self, lease: &Lease) -> Renewed {
        if lease.is_lost() {
            return Renewed::Lost;
        }
        let sent = Instant::now();
        let value = lease.value();
        let rev = lease.rev.load(Ordering::Acquire);
        match tokio::time::timeout(self.ttl / 2, self.bucket.update(&lease.key, value, rev)).await {
            Ok(Ok(new)) => {
                lease.written(new, sent);
                Renewed::Yes
            }
            Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                // An earlier renewal that timed out here may still have landed: the key then
                // holds this holder's own value at a newer revision. Anything else is lost.
                match self.bucket.entry(&lease.key).await {
                    Ok(Some(e))
                        if e.operation == kv::Operation::Put
                            && serde_json::from_slice::<Holder>(&e.value)
                                .is_ok_and(|h| h.node == lease.node && h.epoch == lease.epoch) =>
                    {
                        lease.rev.store(e.revision, Ordering::Release);
                        Renewed::Unknown
                    }
                    Ok(Some(e)) if e.operation == kv::Operation::Put => {
                        lease.mark_lost();
                        Renewed::Lost
                    }
                    Ok(_) => Renewed::Expired,
                    Err(_) => Renewed::Unknown,
                }
            }
            Ok(Err(_)) | Err(_) => {
                if !lease.valid() {
                    // Too long without renewal: the entry may have expired and been taken.
                    tracing::debug!(key = %lease.key, "lease renewal failing; acting on it paused");
                }
                Renewed::Unknown
            }
        }
    }

    /// Takes back `lease`, whose key was found gone ([`Renewed::Expired`]), under its own epoch:
    /// [`Renewed::Yes`] when the key was free and is this holder's again, [`Renewed::Lost`] (and
    /// the lease marked lost) when someone took it meanwhile, [`Renewed::Unknown`] when NATS did
    /// not answer.
    pub async fn reclaim(&self, lease: &Lease) -> Renewed {
        if lease.is_lost() {
            return Renewed::Lost;
        }
        let sent = Instant::now();
        let value = lease.value();
        match tokio::time::timeout(self.ttl / 2, self.bucket.create(&lease.key, value)).await {
            Ok(Ok(rev)) => {
                lease.written(rev, sent);
                Renewed::Yes
            }
            Ok(Err(e)) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                lease.mark_lost();
                Renewed::Lost
            }
            Ok(Err(_)) | Err(_) => Renewed::Unknown,
        }
    }

    /// Releases `lease` (deletes the key at its revision, while it is still this holder's), so
    /// the next holder need not wait for it to expire. A renewal still in flight may move the
    /// revision under the delete: the key is then read again.
    pub async fn release(&self, lease: &Lease) {
        lease.mark_lost();
        for _ in 0..4 {
            let rev = match self.bucket.entry(&lease.key).await {
                Ok(Some(e)) if e.operation == kv::Operation::Put => {
                    match serde_json::from_slice::<Holder>(&e.value) {
                        Ok(h) if h.node == lease.node && h.epoch == lease.epoch => e.revision,
                        _ => return,
                    }
                }
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(key = %lease.key, error = %e, "releasing a lease (it expires on its own)");
                    return;
                }
            };
            match self
                .bucket
                .delete_expect_revision(&lease.key, Some(rev))
                .await
            {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(key = %lease.key, error = %e, "releasing a lease; reading it again");
                }
            }
        }
    }

    /// Every live lease: key -> holder.
    pub async fn holders(&self) -> Result<BTreeMap<String, Holder>, NatsError> {
        let mut out = BTreeMap::new();
        for (key, value, _) in kv_entries(&self.bucket).await? {
            if let Ok(h) = serde_json::from_slice::<Holder>(&value) {
                out.insert(key, h);
            }
        }
        Ok(out)
    }
}

/// Every key of `bucket` with a value: (key, value, revision), read from the stream leader.
pub async fn kv_entries(bucket: &kv::Store) -> Result<Vec<(String, Bytes, u64)>, NatsError> {
    kv_entries_under(bucket, "").await
}

/// Every key of `bucket` starting with `under` (empty, or ending in a dot) with a value.
pub async fn kv_entries_under(
    bucket: &kv::Store,
    under: &str,
) -> Result<Vec<(String, Bytes, u64)>, NatsError> {
    let prefix = format!("$KV.{}.", bucket.name);
    let msgs = read_stream(
        &bucket.stream,
        &format!("{prefix}{under}>"),
        DeliverPolicy::LastPerSubject,
    )
    .await?;
    Ok(msgs
        .into_iter()
        .filter(|m| !m.is_delete_marker())
        .filter_map(|m| {
            let key = m.subject.strip_prefix(&prefix)?.to_string();
            Some((key, m.payload, m.seq))
        })
        .collect())
}

/// A message read by [`read_stream`].
#[derive(Debug, Clone)]
pub struct Read {
    /// Its stream sequence.
    pub seq: u64,
    /// Its subject.
    pub subject: String,
    /// Its headers.
    pub headers: Option<async_nats::HeaderMap>,
    /// Its payload.
    pub payload: Bytes,
}

impl Read {
    /// Whether it is a KV bucket's marker of a deleted or purged key (an operation header).
    pub fn is_delete_marker(&self) -> bool {
        self.headers
            .as_ref()
            .and_then(|h| h.get("KV-Operation"))
            .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE")
    }
}

/// Every message of `stream` on `filter` that `policy` selects, as the stream holds them now
/// (an ephemeral consumer, read until what it had pending at its creation is read).
pub async fn read_stream(
    stream: &Stream,
    filter: &str,
    policy: DeliverPolicy,
) -> Result<Vec<Read>, NatsError> {
    let what = format!("read {filter}");
    let consumer = stream
        .create_consumer(pull::Config {
            filter_subject: filter.to_string(),
            deliver_policy: policy,
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(10),
            memory_storage: true,
            num_replicas: 1,
            ..Default::default()
        })
        .await
        .map_err(|e| NatsError::request(&what, e))?;
    let mut left = consumer.cached_info().num_pending as usize;
    let mut out = Vec::with_capacity(left.min(1 << 16));
    let mut empty = 0;
    while left > 0 {
        let mut batch = consumer
            .fetch()
            .max_messages(left.min(1024))
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .map_err(|e| NatsError::request(&what, e))?;
        let before = out.len();
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| NatsError::request(&what, e))?;
            let seq = m
                .info()
                .map_err(|e| NatsError::request(&what, e))?
                .stream_sequence;
            out.push(Read {
                seq,
                subject: m.subject.to_string(),
                headers: m.headers.clone(),
                payload: m.payload.clone(),
            });
        }
        let got = out.len() - before;
        left = left.saturating_sub(got);
        if got == 0 {
            // Messages can be removed (expiry, purge) after the consumer counted them.
            empty += 1;
            if empty >= 2 {
                break;
            }
        }
    }
    let _ = stream.delete_consumer(&consumer.cached_info().name).await;
    Ok(out)
}

/// A partition task's ownership on a cluster node is its lease: gone once the lease is lost.
impl crate::runtime::Ownership for Arc<Lease> {
    async fn gone(&self) {
        Lease::lost(self).cancelled().await;
    }
}
