//! Webhook sinks on NATS: definitions, cursors and dead letters in the key/value bucket
//! [`SINKS`], and one lease per sink (`s.<id>` in the lease bucket) so that each sink is
//! delivered by one node at a time.
//!
//! Keys of [`SINKS`]: `def.<id>` (an API sink's stored definition), `cur.<id>` (the next seq,
//! decimal), `dl.<id>.<seq>` (one dead letter, JSON).
//!
//! Who delivers a sink: the live node that ranks first for it (rendezvous hashing over the
//! heartbeats, like partitions); a node ranked `r` takes a sink whose lease has been free for
//! `r` lease lifetimes, so a sink whose first choice is gone moves after about one lifetime.
//! A held lease is renewed every third of its lifetime by a task of its own; a renewal that
//! finds it taken marks it lost, which stops the sink's task on this node.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use bytes::Bytes;

use super::assign::position;
use super::lease::{Lease, Leases, Renewed, kv_entries_under};
use super::nats::{Nats, NatsError};
use super::node::live_nodes;
use crate::webhooks::DeadLetter;
use crate::webhooks::shared::{BoxFuture, SharedSinks, SharedState, Tenure};

pub use super::nats::SINKS;

/// How long the list of live nodes is reused between reads.
const NODES_FRESH: Duration = Duration::from_secs(1);

/// The NATS implementation of [`SharedSinks`].
#[derive(Debug, Clone)]
pub struct NatsSinks {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    nats: Nats,
    bucket: kv::Store,
    leases: Leases,
    node: String,
    st: Mutex<St>,
}

#[derive(Debug, Default)]
struct St {
    held: HashMap<String, Arc<Lease>>,
    free_since: HashMap<String, Instant>,
    nodes: Option<(Instant, Vec<String>)>,
}

fn lease_key(id: &str) -> String {
    format!("s.{id}")
}

fn req(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

impl NatsSinks {
    /// The sinks of the cluster behind `nats`, for node `node`.
    pub fn new(nats: Nats, bucket: kv::Store, node: &str) -> NatsSinks {
        let leases = Leases::new(nats.leases.clone(), node, nats.lease_ttl);
        NatsSinks {
            inner: Arc::new(Inner {
                nats,
                bucket,
                leases,
                node: node.to_string(),
                st: Mutex::new(St::default()),
            }),
        }
    }

    /// The sinks this node delivers now.
    pub fn delivering(&self) -> Vec<String> {
        let st = self.inner.lock();
        let mut v: Vec<String> = st
            .held
            .iter()
            .filter(|(_, l)| !l.is_lost())
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn nodes(&self) -> Result<Vec<String>, NatsError> {
        if let Some((at, n)) = &self.lock().nodes
            && at.elapsed() < NODES_FRESH
        {
            return Ok(n.clone());
        }
        let mut nodes: Vec<String> = live_nodes(&self.nats).await?.into_keys().collect();
        if !nodes.contains(&self.node) {
            nodes.push(self.node.clone());
        }
        self.lock().nodes = Some((Instant::now(), nodes.clone()));
        Ok(nodes)
    }

    async fn entries(&self, prefix: &str) -> Result<Vec<(String, Bytes)>, String> {
        kv_entries_under(&self.bucket, prefix)
            .await
            .map(|v| v.into_iter().map(|(k, b, _)| (k, b)).collect())
            .map_err(|e| e.to_string())
    }

    async fn acquire(&self, id: &str) -> Option<Tenure> {
        let key = lease_key(id);
        let nodes = self.nodes().await.ok()?;
        let r = position(format!("sink:{id}").as_bytes(), &nodes, &self.node)?;
        if r > 0 {
            // Not first: only a lease that stayed free for r lifetimes.
            let holders = self.leases.holders().await.ok()?;
            let mut st = self.lock();
            if holders.contains_key(&key) {
                st.free_since.remove(id);
                return None;
            }
            let since = *st
                .free_since
                .entry(id.to_string())
                .or_insert_with(Instant::now);
            if since.elapsed() < self.nats.lease_ttl * r as u32 {
                return None;
            }
        }
        let lease = Arc::new(self.leases.take(&key).await.ok()??);
        {
            let mut st = self.lock();
            st.free_since.remove(id);
            st.held.insert(id.to_string(), lease.clone());
        }
        // Renewal, until lost or released.
        let leases = self.leases.clone();
        let l = lease.clone();
        let every = (self.nats.lease_ttl / 3).min(Duration::from_secs(1));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = l.lost().cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let renewed = leases.renew(&l).await;
                if renewed == Renewed::Expired {
                    // Another node may already be taking the free sink: stand down (its
                    // deliveries resume from the shared cursor).
                    l.mark_lost();
                }
                if matches!(renewed, Renewed::Lost | Renewed::Expired) {
                    tracing::warn!(key = %l.key(), "webhook lease lost (taken by another node, or expired while the lease bucket could not be written)");
                    return;
                }
            }
        });
        let valid = lease.clone();
        Some(Tenure {
            lost: lease.lost().clone(),
            valid: Arc::new(move || valid.valid()),
        })
    }
}

impl SharedSinks for NatsSinks {
    fn definitions(&self) -> BoxFuture<'_, Result<BTreeMap<String, String>, String>> {
        Box::pin(async move {
            let mut out = BTreeMap::new();
            for (k, v) in self.inner.entries("def.").await? {
                if let (Some(id), Ok(json)) =
                    (k.strip_prefix("def."), String::from_utf8(v.to_vec()))
                {
                    out.insert(id.to_string(), json);
                }
            }
            Ok(out)
        })
    }

    fn create(&self, id: &str, json: String, cursor: u64) -> BoxFuture<'_, Result<bool, String>> {
        let id = id.to_string();
        Box::pin(async move {
            let b = &self.inner.bucket;
            // The cursor first: a definition is never seen without one.
            b.put(format!("cur.{id}"), cursor.to_string().into())
                .await
                .map_err(|e| req("write a webhook cursor", e))?;
            match b.create(format!("def.{id}"), json.into()).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(req("write a webhook definition", e)),
            }
        })
    }

    fn remove(&self, id: &str) -> BoxFuture<'_, Result<(), String>> {
        let id = id.to_string();
        Box::pin(async move {
            let b = &self.inner.bucket;
            b.purge(format!("def.{id}"))
                .await
                .map_err(|e| req("delete a webhook definition", e))?;
            let _ = b.purge(format!("cur.{id}")).await;
            for (k, _) in self.inner.entries(&format!("dl.{id}.")).await? {
                let _ = b.purge(k).await;
            }
            Ok(())
        })
    }

    fn state(&self, id: &str) -> BoxFuture<'_, Result<SharedState, String>> {
        let id = id.to_string();
        Box::pin(async move {
            let cursor = match Nats::kv_read(&self.inner.bucket, &format!("cur.{id}")).await {
                Ok(v) => v.and_then(|(b, _)| std::str::from_utf8(&b).ok()?.parse::<u64>().ok()),
                Err(e) => return Err(e.to_string()),
            };
            let prefix = format!("dl.{id}.");
            let mut dead: Vec<DeadLetter> = Vec::new();
            for (k, v) in self.inner.entries(&prefix).await? {
                // `dl.<id>.<seq>`: another sink's id may extend this one's with a dot.
                let is_ours = k
                    .strip_prefix(&prefix)
                    .is_some_and(|s| s.bytes().all(|c| c.is_ascii_digit()));
                if is_ours && let Ok(d) = serde_json::from_slice::<DeadLetter>(&v) {
                    dead.push(d);
                }
            }
            dead.sort_by_key(|d| d.seq);
            Ok(SharedState { cursor, dead })
        })
    }

    fn save(
        &self,
        id: &str,
        cursor: Option<u64>,
        dead: Vec<(u64, Option<DeadLetter>)>,
    ) -> BoxFuture<'_, Result<(), String>> {
        let id = id.to_string();
        Box::pin(async move {
            let b = &self.inner.bucket;
            // Dead letters before the cursor that moved past them.
            for (seq, op) in dead {
                let key = format!("dl.{id}.{seq}");
                match op {
                    Some(d) => b
                        .put(key, serde_json::to_vec(&d).unwrap_or_default().into())
                        .await
                        .map(drop)
                        .map_err(|e| req("write a dead letter", e))?,
                    None => b
                        .purge(key)
                        .await
                        .map_err(|e| req("delete a dead letter", e))?,
                }
            }
            if let Some(c) = cursor {
                b.put(format!("cur.{id}"), c.to_string().into())
                    .await
                    .map_err(|e| req("write a webhook cursor", e))?;
            }
            Ok(())
        })
    }

    fn acquire(&self, id: &str) -> BoxFuture<'_, Option<Tenure>> {
        let id = id.to_string();
        Box::pin(async move { self.inner.acquire(&id).await })
    }

    fn release(&self, id: &str) -> BoxFuture<'_, ()> {
        let id = id.to_string();
        Box::pin(async move {
            let lease = self.inner.lock().held.remove(&id);
            if let Some(l) = lease {
                self.inner.leases.release(&l).await;
            }
        })
    }
}
