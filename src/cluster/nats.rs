//! NATS JetStream as a cluster node sees it: the connection, the name of everything the cluster
//! keeps there, and creating it all (idempotent: every node does it at start; the first one
//! creates, the others find it).
//!
//! What lives in NATS (docs/cluster.md draws it):
//! - stream [`IN_STREAM`]: each partition's input log, subject `geodwell.in.<p>`;
//! - stream [`EVENTS_STREAM`]: every event, subject `geodwell.ev.<p>` (its stream sequence is
//!   the public `seq`);
//! - stream [`FENCES_STREAM`]: the cluster's fence changes, subject [`FENCES_SUBJECT`];
//! - key/value buckets [`LEASES`] and [`NODES`] (entries live `lease_ttl` without renewal) and
//!   [`META`] (checkpoint pointers, the fence snapshot pointer, watermark sources, webhooks);
//! - the object store [`OBJECTS`]: partition checkpoints, fence snapshots, large fence changes.
//!
//! Invariant: nothing here depends on the server being newer than 2.9: key/value buckets are
//! created as their backing streams (the client's own bucket creation asks the server for
//! account fields 2.9 does not send), and no 2.10+ stream field is set.

use std::time::Duration;

use async_nats::jetstream::{self, kv, object_store, stream};
use thiserror::Error;

use super::elections::{self, Elections};
use super::hedge::Hedged;
use crate::config::ClusterConfig;

/// The input stream.
pub const IN_STREAM: &str = "GEODWELL_IN";
/// The events stream.
pub const EVENTS_STREAM: &str = "GEODWELL_EVENTS";
/// The fence change stream.
pub const FENCES_STREAM: &str = "GEODWELL_FENCES";
/// The one subject of [`FENCES_STREAM`].
pub const FENCES_SUBJECT: &str = "geodwell.fences";
/// Partition leases (`p.<p>`) and webhook sink leases (`wh.<id>`); entries expire `lease_ttl`
/// after their last write.
pub const LEASES: &str = "geodwell_leases";
/// Live nodes (`<node id>`), renewed like leases.
pub const NODES: &str = "geodwell_nodes";
/// Cluster metadata without expiry.
pub const META: &str = "geodwell_meta";
/// Checkpoints, fence snapshots and large fence changes.
pub const OBJECTS: &str = "geodwell_objects";
/// The key/value bucket of the cluster's webhook sinks.
pub const SINKS: &str = "geodwell_sinks";

/// How long the streams remember a `Nats-Msg-Id` to drop a re-sent copy.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Partition `p`'s input subject.
pub fn in_subject(p: u16) -> String {
    format!("geodwell.in.{p}")
}

/// Partition `p`'s events subject.
pub fn ev_subject(p: u16) -> String {
    format!("geodwell.ev.{p}")
}

/// Where the owner of partition `p` answers queries.
pub fn query_subject(p: u16) -> String {
    format!("geodwell.q.{p}")
}

/// Where a partition owner sends the outcomes of fixes that node `node` ingested.
pub fn outcome_subject(node: &str) -> String {
    format!("geodwell.out.{node}")
}

/// The error a NATS client (or a decoder) gave.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why talking to NATS failed.
#[derive(Debug, Error)]
pub enum NatsError {
    /// No server could be reached.
    #[error("cannot connect to NATS at {urls}: {source}")]
    Connect {
        /// The URLs tried.
        urls: String,
        /// The client's error.
        #[source]
        source: Cause,
    },
    /// The server has no JetStream.
    #[error("the NATS server at {0} does not run JetStream (start it with -js)")]
    NoJetStream(String),
    /// Creating or opening a stream, bucket or object store failed.
    #[error("cannot set up {what} in JetStream: {source}")]
    Setup {
        /// Which one.
        what: String,
        /// The server's or client's error.
        #[source]
        source: Cause,
    },
    /// A request failed.
    #[error("{what}: {source}")]
    Request {
        /// What was asked.
        what: String,
        /// The error.
        #[source]
        source: Cause,
    },
    /// A stored value does not decode.
    #[error("{what} does not decode: {source}")]
    Corrupt {
        /// What.
        what: String,
        /// Why.
        #[source]
        source: Cause,
    },
}

impl NatsError {
    /// A request error from any client error.
    pub fn request(what: impl Into<String>, e: impl Into<Cause>) -> NatsError {
        NatsError::Request {
            what: what.into(),
            source: e.into(),
        }
    }

    /// A hedged request's failure: the last answer's error, or `what` unanswered.
    pub fn hedged(what: &str, e: Hedged<NatsError>) -> NatsError {
        match e {
            Hedged::Failed(e) => e,
            unanswered => NatsError::request(what, unanswered),
        }
    }
}

/// The cluster's fixed parameters, stored once in [`META`] under [`CLUSTER_KEY`] by the node that
/// created the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterMeta {
    /// Partitions.
    pub partitions: u16,
    /// The format of records and checkpoints.
    pub format: u32,
}

/// The key of [`ClusterMeta`].
pub const CLUSTER_KEY: &str = "cluster";

/// The record and checkpoint format this build writes and reads.
pub const FORMAT: u32 = 1;

/// A node's connection to NATS and the cluster's streams, buckets and object store.
#[derive(Clone)]
pub struct Nats {
    /// The core client (requests, subscriptions).
    pub client: async_nats::Client,
    /// JetStream.
    pub js: jetstream::Context,
    /// [`IN_STREAM`].
    pub input: stream::Stream,
    /// [`EVENTS_STREAM`].
    pub events: stream::Stream,
    /// [`FENCES_STREAM`].
    pub fences: stream::Stream,
    /// [`LEASES`].
    pub leases: kv::Store,
    /// [`NODES`].
    pub nodes: kv::Store,
    /// [`META`].
    pub meta: kv::Store,
    /// [`SINKS`].
    pub sinks: kv::Store,
    /// [`OBJECTS`].
    pub objects: object_store::ObjectStore,
    /// The cluster's partitions (from [`ClusterMeta`]).
    pub partitions: u16,
    /// The lease bucket's time to live.
    pub lease_ttl: Duration,
    /// Replicas used for what this node created.
    pub replicas: usize,
    /// The largest message the server takes.
    pub max_payload: usize,
    /// Leader elections of the input and events streams.
    pub elections: Elections,
}

impl std::fmt::Debug for Nats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nats")
            .field("partitions", &self.partitions)
            .field("lease_ttl", &self.lease_ttl)
            .field("replicas", &self.replicas)
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

/// How long a JetStream API request or a publish acknowledgement may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

impl Nats {
    /// Connects to `cfg.nats_urls` and creates (or finds) everything the cluster keeps in NATS.
    /// `events_max_age` and `events_max_msgs` bound the events stream.
    pub async fn connect(
        cfg: &ClusterConfig,
        events_max_age: Duration,
        events_max_msgs: usize,
    ) -> Result<Nats, NatsError> {
        let urls = cfg.nats_urls.join(",");
        let (announcer, elections) = elections::channels();
        let on_event = announcer.clone();
        let client = async_nats::ConnectOptions::new()
            .event_callback(move |event| {
                let on_event = on_event.clone();
                async move {
                    if matches!(event, async_nats::Event::Connected) {
                        on_event.reconnected();
                    }
                }
            })
            .name(format!("geodwell {}", cfg.node_id))
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(5))
            .request_timeout(Some(REQUEST_TIMEOUT))
            .retain_servers_order()
            .connect(cfg.nats_urls.clone())
            .await
            .map_err(|e| NatsError::Connect {
                urls: urls.clone(),
                source: e.into(),
            })?;
        let info = client.server_info();
        if !info.jetstream {
            return Err(NatsError::NoJetStream(urls));
        }
        let replicas = match cfg.replicas {
            0 if info.cluster.as_deref().is_some_and(|c| !c.is_empty()) => 3,
            0 => 1,
            n => n,
        };
        let js = jetstream::ContextBuilder::new()
            .timeout(REQUEST_TIMEOUT)
            .build(client.clone());
        let meta = kv_bucket(&js, META, replicas, Duration::ZERO, 1).await?;
        // The first node to get here fixes the partition count.
        let want = ClusterMeta {
            partitions: cfg.partitions,
            format: FORMAT,
        };
        let body = serde_json::to_vec(&want).unwrap_or_default();
        let stored = match meta.create(CLUSTER_KEY, body.into()).await {
            Ok(_) => want,
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                let v = meta
                    .get(CLUSTER_KEY)
                    .await
                    .map_err(|e| setup("the cluster metadata", e))?
                    .ok_or_else(|| NatsError::Corrupt {
                        what: "the cluster metadata".into(),
                        source: "missing right after it existed".into(),
                    })?;
                serde_json::from_slice::<ClusterMeta>(&v).map_err(|e| NatsError::Corrupt {
                    what: "the cluster metadata".into(),
                    source: e.into(),
                })?
            }
            Err(e) => return Err(setup("the cluster metadata", e)),
        };
        if stored.format != FORMAT {
            return Err(NatsError::Corrupt {
                what: "the cluster metadata".into(),
                source: format!(
                    "the cluster was created with format {}, this build reads format {FORMAT}",
                    stored.format
                )
                .into(),
            });
        }
        if stored.partitions != cfg.partitions {
            tracing::warn!(
                configured = cfg.partitions,
                cluster = stored.partitions,
                "cluster.partitions differs from the cluster's, which is fixed when it is first created; using the cluster's"
            );
        }
        let sinks = kv_bucket(&js, SINKS, replicas, Duration::ZERO, 1).await?;
        let leases = kv_bucket(&js, LEASES, replicas, lease_max_age(cfg.lease_ttl), 1).await?;
        let nodes = kv_bucket(&js, NODES, replicas, lease_max_age(cfg.lease_ttl), 1).await?;
        let lease_ttl = leases
            .stream
            .get_info()
            .await
            .map(|i| i.config.max_age)
            .unwrap_or(cfg.lease_ttl_duration());
        if lease_ttl != cfg.lease_ttl_duration() {
            tracing::warn!(
                configured_ms = cfg.lease_ttl_duration().as_millis() as u64,
                cluster_ms = lease_ttl.as_millis() as u64,
                "cluster.lease_ttl differs from the lease bucket's, which is fixed when it is first created; using the bucket's"
            );
        }
        let input = js
            .get_or_create_stream(stream::Config {
                name: IN_STREAM.into(),
                description: Some("geodwell: each partition's input log".into()),
                subjects: vec!["geodwell.in.*".into()],
                num_replicas: replicas,
                storage: stream::StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                allow_direct: false,
                discard: stream::DiscardPolicy::New,
                ..Default::default()
            })
            .await
            .map_err(|e| setup(IN_STREAM, e))?;
        let max_age = events_max_age.max(DUPLICATE_WINDOW);
        let events = js
            .get_or_create_stream(stream::Config {
                name: EVENTS_STREAM.into(),
                description: Some("geodwell: every event; the stream sequence is its seq".into()),
                subjects: vec!["geodwell.ev.*".into()],
                num_replicas: replicas,
                storage: stream::StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                max_age,
                max_messages: i64::try_from(events_max_msgs).unwrap_or(i64::MAX),
                discard: stream::DiscardPolicy::Old,
                deny_delete: true,
                allow_direct: false,
                ..Default::default()
            })
            .await
            .map_err(|e| setup(EVENTS_STREAM, e))?;
        let fences = js
            .get_or_create_stream(stream::Config {
                name: FENCES_STREAM.into(),
                description: Some("geodwell: the cluster's fence changes".into()),
                subjects: vec![FENCES_SUBJECT.into()],
                num_replicas: replicas,
                storage: stream::StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                discard: stream::DiscardPolicy::New,
                allow_direct: false,
                ..Default::default()
            })
            .await
            .map_err(|e| setup(FENCES_STREAM, e))?;
        let objects = object_bucket(&js, replicas).await?;
        announcer
            .follow(&client, IN_STREAM, EVENTS_STREAM)
            .await
            .map_err(|e| setup("the stream leader advisories", e))?;
        Ok(Nats {
            elections,
            max_payload: info.max_payload.max(64 * 1024),
            client,
            js,
            input,
            events,
            fences,
            leases,
            nodes,
            meta,
            sinks,
            objects,
            partitions: stored.partitions,
            lease_ttl,
            replicas,
        })
    }

    /// Reads `key` of `bucket` from its stream leader (never a lagging replica): `None` when the
    /// key has no value (absent, deleted, expired), else the value and its revision.
    pub async fn kv_read(
        bucket: &kv::Store,
        key: &str,
    ) -> Result<Option<(bytes::Bytes, u64)>, NatsError> {
        // A bucket created here has no direct get, so the entry is read from the leader.
        match bucket.entry(key).await {
            Ok(Some(e)) if e.operation == kv::Operation::Put => Ok(Some((e.value, e.revision))),
            Ok(_) => Ok(None),
            Err(e) => Err(NatsError::request(format!("read {key}"), e)),
        }
    }
}

impl ClusterConfig {
    /// `lease_ttl` as a std duration.
    pub fn lease_ttl_duration(&self) -> Duration {
        lease_max_age(self.lease_ttl)
    }
}

fn lease_max_age(d: geodwell_core::time::Dur) -> Duration {
    Duration::from_millis(d.millis().max(1000) as u64)
}

fn setup(what: &str, e: impl Into<Cause>) -> NatsError {
    NatsError::Setup {
        what: what.to_string(),
        source: e.into(),
    }
}

/// Opens the object store, creating its backing stream the way the client library lays it out
/// but without direct get: the library's own bucket lets any replica answer an object's
/// metadata, and a replica that lags (one restarted a moment ago) answers "not found" for a
/// checkpoint written a moment before.
async fn object_bucket(
    js: &jetstream::Context,
    replicas: usize,
) -> Result<object_store::ObjectStore, NatsError> {
    let name = format!("OBJ_{OBJECTS}");
    let config = stream::Config {
        name: name.clone(),
        description: Some("geodwell: checkpoints, fence snapshots, large fence changes".into()),
        subjects: vec![format!("$O.{OBJECTS}.C.>"), format!("$O.{OBJECTS}.M.>")],
        num_replicas: replicas.max(1),
        storage: stream::StorageType::File,
        discard: stream::DiscardPolicy::New,
        allow_rollup: true,
        allow_direct: false,
        ..Default::default()
    };
    match js.get_stream(&name).await {
        Ok(mut s) => {
            // A bucket made by another tool (or an older geodwell) is switched to leader reads.
            let cfg = s.info().await.map(|i| i.config.clone());
            if let Ok(mut cfg) = cfg
                && cfg.allow_direct
            {
                cfg.allow_direct = false;
                js.update_stream(&cfg)
                    .await
                    .map_err(|e| setup(OBJECTS, e))?;
            }
        }
        Err(_) => {
            if let Err(e) = js.create_stream(config).await
                && js.get_stream(&name).await.is_err()
            {
                return Err(setup(OBJECTS, e));
            }
        }
    }
    js.get_object_store(OBJECTS)
        .await
        .map_err(|e| setup(OBJECTS, e))
}

/// Opens key/value bucket `name`, creating its backing stream the way the client library lays
/// it out when it does not exist. `max_age` zero: entries do not expire.
async fn kv_bucket(
    js: &jetstream::Context,
    name: &str,
    replicas: usize,
    max_age: Duration,
    history: i64,
) -> Result<kv::Store, NatsError> {
    if let Ok(store) = js.get_key_value(name).await {
        return Ok(store);
    }
    let created = js
        .create_stream(stream::Config {
            name: format!("KV_{name}"),
            description: Some(format!("geodwell: key/value bucket {name}")),
            subjects: vec![format!("$KV.{name}.>")],
            max_messages_per_subject: history.max(1),
            max_age,
            num_replicas: replicas.max(1),
            storage: stream::StorageType::File,
            allow_rollup: true,
            deny_delete: true,
            // Reads go to the stream leader: a lease or a pointer read from a lagging replica
            // would be stale.
            allow_direct: false,
            discard: stream::DiscardPolicy::New,
            ..Default::default()
        })
        .await;
    if let Err(e) = created {
        // Another node may have created it between the two calls.
        if js.get_key_value(name).await.is_err() {
            return Err(NatsError::Setup {
                what: format!("key/value bucket {name}"),
                source: e.into(),
            });
        }
    }
    js.get_key_value(name).await.map_err(|e| NatsError::Setup {
        what: format!("key/value bucket {name}"),
        source: e.into(),
    })
}

/// The JetStream error code somewhere in `e`'s source chain (e.g. 10071: a compare-and-set
/// found another last sequence).
pub fn js_code(e: &(dyn std::error::Error + 'static)) -> Option<u64> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(js) = err.downcast_ref::<jetstream::Error>() {
            return Some(js.error_code().0);
        }
        cur = err.source();
    }
    None
}

/// A compare-and-set lost: the subject's last sequence was not the one expected.
pub const WRONG_LAST_SEQUENCE: u64 = 10071;
