//! Configuration: raw TOML, environment and command-line overrides -> a validated [`Config`].
//!
//! - `load.rs`: the loader (every layer merged key by key, every problem reported at once).
//! - `values.rs`: the schema and the typed reading of each value.
//! - `webhooks.rs`: the `[[webhooks]]` array, validated by the sink definitions' own validator.
//!
//! This file holds the types: what the loader takes ([`Sources`]) and builds ([`Config`],
//! [`ConfigError`]). The submodules build them and this file uses nothing of theirs, so each of
//! them depends on it and none the other way round.
//!
//! Invariants of a [`Config`]: every value is in range; `shards` is resolved (never 0);
//! relative paths that came from a configuration file are resolved against that file's
//! directory (paths from the environment, the command line or the embedded defaults are relative
//! to the working directory); nothing was created or opened while loading.
//!
//! The embedded default is `config/geodwell.toml` itself (compiled in), so the documented file and
//! the defaults cannot drift. Precedence: command-line flags > `GEODWELL_<KEY>` environment
//! variables > the file > embedded defaults.

mod load;
mod mqtt;
#[cfg(test)]
mod tests;
mod values;
mod webhooks;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::auth::ApiKey;
use geodwell_core::time::Dur;

/// The documented default configuration, compiled in.
pub const DEFAULT_TOML: &str = include_str!("../../config/geodwell.toml");

/// The sample fences compiled into the binary (`fences_file = "builtin:samples"`, the embedded
/// default), so that the embedded defaults run from any directory.
pub const SAMPLE_FENCES: &str = include_str!("../../config/fences.geojson");

/// The `fences_file` value that names [`SAMPLE_FENCES`].
pub const BUILTIN_SAMPLES: &str = "builtin:samples";

/// Which fences seed an empty store at start (`[fences] fences_file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FencePreload {
    /// None: the service starts without fences.
    None,
    /// The sample fences compiled into the binary ([`SAMPLE_FENCES`]).
    Samples,
    /// A GeoJSON FeatureCollection file.
    File(PathBuf),
}

pub use crate::clock::ClockMode;

/// Where a configuration comes from, besides the embedded defaults.
#[derive(Debug, Clone, Default)]
pub struct Sources<'a> {
    /// The configuration file: its name (for messages), its text, and the directory its relative
    /// paths resolve against (`None`: the working directory).
    pub file: Option<(&'a str, &'a str, Option<&'a Path>)>,
    /// `GEODWELL_*` environment variables (see [`Config::env_overrides`]).
    pub env: BTreeMap<String, String>,
    /// Command-line overrides by key (e.g. `listen`), with the flag that set them.
    pub cli: Vec<(&'static str, &'static str, String)>,
    /// CPU cores, which `shards = 0` resolves to.
    pub cores: usize,
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Address to bind.
    pub listen: SocketAddr,
    /// Engine shards (resolved: never 0).
    pub shards: usize,
    /// Persistent state directory.
    pub data_dir: PathBuf,
    /// Graceful shutdown budget.
    pub shutdown_grace: Dur,
    /// Most open connections; 0 = derived from the open-files limit at start
    /// ([`crate::machine`]).
    pub max_connections: usize,
    /// Longest wait for a request head (also bounds an idle keep-alive connection).
    pub header_timeout: Dur,
    /// Longest time a request body may take from its first byte to its last.
    pub body_timeout: Dur,
    /// Longest time one write to a client may stay blocked.
    pub write_timeout: Dur,
    /// Browser origins allowed besides the server's own (`["*"]`: any); empty = none.
    pub cors_origins: Vec<String>,
    /// Whether webhook targets may be loopback, private, link-local or otherwise non-public
    /// addresses.
    pub allow_private_targets: bool,
    /// TLS certificate chain (PEM); with `tls_key`, the server speaks HTTPS only.
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// Watermark mode.
    pub clock: ClockMode,
    /// Allowed arrival disorder.
    pub lateness: Dur,
    /// Largest accepted lead of a fix's `ts` over the wall clock.
    pub max_future: Dur,
    /// How far behind the watermark a fix may be and still be applied in its device's own
    /// event time (`0`: none may).
    pub max_delay: Dur,
    /// How long a device whose fix arrived behind the watermark keeps its steps at its latest
    /// fix, waiting for the rest of its queue (at least the lateness: [`Config::delay_hold`]).
    pub delay_hold: Dur,
    /// Wheel tick.
    pub tick: Dur,
    /// Per-tick fire cap per shard.
    pub max_fires_per_tick: usize,
    /// Fences that seed an empty store at start.
    pub fences_file: FencePreload,
    /// Most fences.
    pub max_fences: usize,
    /// Most positions per fence.
    pub max_vertices: usize,
    /// Largest fence `tags` value, in bytes of compact JSON.
    pub max_tags_bytes: usize,
    /// Most polygon edges one containment test of a new fence may examine.
    pub max_test_edges: usize,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Most fixes per request / frame.
    pub max_batch: usize,
    /// Longest device id.
    pub max_device_len: usize,
    /// Reorder buffer bound per device.
    pub max_buffered_per_device: usize,
    /// Memory budget for queued input, bytes; 0 = derived from the machine's memory at start
    /// ([`crate::machine`]).
    pub max_queued_bytes: usize,
    /// Most devices held (each shard holds at most its share, rounded up).
    pub max_devices: usize,
    /// Forget devices idle this long in event time (nothing open, no fix waiting); zero = never.
    pub idle_ttl: Dur,
    /// Most open ingest WebSockets.
    pub max_ws_connections: usize,
    /// Queued batches per shard.
    pub shard_queue: usize,
    /// Event log length bound.
    pub log_capacity: usize,
    /// Event log age bound.
    pub log_max_age: Dur,
    /// Subscriber lag bound.
    pub subscriber_queue: usize,
    /// Largest poll `limit`.
    pub max_poll_limit: usize,
    /// Most event subscribers (WebSockets) at once.
    pub max_subscribers: usize,
    /// How state is persisted.
    pub durability: Durability,
    /// async durability: longest time between commits.
    pub commit_interval: Dur,
    /// How often the engines' state is checkpointed (the input log before it is then deleted).
    pub checkpoint_interval: Dur,
    /// Webhook sinks from `[[webhooks]]` entries (see `docs/webhooks.md`).
    pub webhooks: Vec<crate::webhooks::SinkSpec>,
    /// Map page: raster tile URL template (`{z}`, `{x}`, `{y}`); `None` = plain background.
    pub map_tile_url: Option<String>,
    /// Map page: attribution shown with those tiles (plain text).
    pub map_tile_attribution: Option<String>,
    /// API keys; empty = authentication off.
    pub api_keys: Vec<ApiKey>,
    /// Whether `/metrics` is served without a key (`/healthz` and `/readyz` always are).
    pub open_metrics: bool,
    /// `[cluster]`: run as a node of a cluster on NATS JetStream (`None`: one process on its
    /// embedded store, the default).
    pub cluster: Option<ClusterConfig>,
    /// `[mqtt]`: fixes from an MQTT broker (`None`: off, the default).
    pub mqtt: Option<MqttConfig>,
}

/// `[mqtt]` (docs/integrations.md): the broker fixes are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttConfig {
    /// `mqtt://[user:password@]host[:port]` or `mqtts://` (TLS, the system's roots).
    pub url: String,
    /// Topic filters subscribed to with QoS 1.
    pub topics: Vec<String>,
    /// The client id: the broker keeps this session (and the messages not yet acknowledged)
    /// while geodwell is away, so it must be stable and unique to this service.
    pub client_id: String,
}

/// `[cluster]` (docs/cluster.md): what a node needs to join a cluster on NATS JetStream.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// NATS server URLs (any one will do; the client learns the rest from the server).
    pub nats_urls: Vec<String>,
    /// This node's id: unique in the cluster, stable across restarts.
    pub node_id: String,
    /// Partitions (device hash), fixed when the cluster's streams are first created.
    pub partitions: u16,
    /// Replicas of the streams, buckets and object store; 0 = 3 when the NATS server is part of a
    /// cluster, else 1.
    pub replicas: usize,
    /// How long a lease lives without renewal: a stopped node's partitions move after it.
    pub lease_ttl: Dur,
    /// How often a partition's owner checkpoints its engine (only when input arrived since).
    pub checkpoint_interval: Dur,
}

/// The node id when none is configured: the host name (cleaned to the allowed characters), or
/// `node`.
pub fn default_node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    let id: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if id.is_empty() {
        "node".to_string()
    } else {
        id
    }
}

/// How state is persisted (`[store] durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Commit (fsync) before answering.
    Sync,
    /// Commit every `commit_interval`.
    Async,
    /// In memory only.
    None,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sync" => Ok(Durability::Sync),
            "async" => Ok(Durability::Async),
            "none" => Ok(Durability::None),
            _ => Err(format!(
                "expected \"sync\", \"async\" or \"none\", got {s:?}"
            )),
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Durability::Sync => "sync",
            Durability::Async => "async",
            Durability::None => "none",
        })
    }
}

/// One configuration problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// `section.key`, or the section, or `(file)`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

/// Every problem found while loading a configuration.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub struct ConfigError {
    /// Where the configuration came from.
    pub source_name: String,
    /// The problems, in file order.
    pub issues: Vec<ConfigIssue>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} has {} error(s):",
            self.source_name,
            self.issues.len()
        )?;
        for i in &self.issues {
            writeln!(f, "  - {}: {}", i.key, i.message)?;
        }
        Ok(())
    }
}
