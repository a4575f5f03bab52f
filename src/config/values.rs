//! The configuration schema and the typed reading of each value: which keys exist, what kind of
//! value each takes, and how a raw TOML or environment value becomes a typed one (every problem
//! recorded, never the first one only).
//!
//! Why this file is long: it is the table of every configuration key and the reader of each
//! kind of value; splitting the table would scatter the one list a reader looks for.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use geodwell_core::time::Dur;

use super::{BUILTIN_SAMPLES, ClockMode, ConfigIssue, Durability, FencePreload};
use crate::auth::ApiKey;

#[derive(Clone, Copy)]
pub(super) enum Kind {
    Addr,
    Count {
        min: usize,
        max: usize,
    },
    Duration {
        zero_ok: bool,
    },
    Clock,
    Durability,
    Path,
    /// `""`, `builtin:samples` or a path.
    Preload,
    /// Optional http(s) tile URL template; "" = none.
    TileUrl,
    /// Optional free text; "" = none.
    OptText,
    /// `true` / `false`.
    Bool,
    /// Browser origins: an array of `scheme://host[:port]` strings (or one comma-separated
    /// string, as the environment gives it); `*` alone allows every origin.
    Origins,
    /// API keys: an array of `{name, scopes, key | key_sha256}` tables in the file, or
    /// `name:scope+scope:key,...` in the environment.
    Keys,
    /// NATS server URLs: an array of `nats://host:port` strings (or one comma-separated string).
    NatsUrls,
    /// A list of strings: an array in the file, comma-separated in the environment.
    TextList,
}

/// (section, key, kind): the schema. Keys are unique across sections so that `GEODWELL_<KEY>`
/// names one key.
pub(super) const SCHEMA: &[(&str, &str, Kind)] = &[
    ("server", "listen", Kind::Addr),
    ("server", "shards", Kind::Count { min: 0, max: 1024 }),
    ("server", "data_dir", Kind::Path),
    ("server", "shutdown_grace", Kind::Duration { zero_ok: true }),
    (
        "server",
        "max_connections",
        Kind::Count {
            min: 0,
            max: 10_000_000,
        },
    ),
    (
        "server",
        "header_timeout",
        Kind::Duration { zero_ok: false },
    ),
    ("server", "body_timeout", Kind::Duration { zero_ok: false }),
    ("server", "write_timeout", Kind::Duration { zero_ok: false }),
    ("server", "cors_origins", Kind::Origins),
    ("server", "allow_private_targets", Kind::Bool),
    ("server", "tls_cert", Kind::OptText),
    ("server", "tls_key", Kind::OptText),
    ("devices", "idle_ttl", Kind::Duration { zero_ok: true }),
    ("time", "clock", Kind::Clock),
    ("time", "lateness", Kind::Duration { zero_ok: true }),
    ("time", "max_future", Kind::Duration { zero_ok: true }),
    ("time", "max_delay", Kind::Duration { zero_ok: true }),
    ("time", "delay_hold", Kind::Duration { zero_ok: true }),
    ("time", "tick", Kind::Duration { zero_ok: false }),
    (
        "time",
        "max_fires_per_tick",
        Kind::Count {
            min: 1,
            max: usize::MAX,
        },
    ),
    ("fences", "fences_file", Kind::Preload),
    (
        "fences",
        "max_fences",
        Kind::Count {
            min: 1,
            max: usize::MAX,
        },
    ),
    (
        "fences",
        "max_vertices",
        Kind::Count {
            min: 4,
            max: 10_000_000,
        },
    ),
    (
        "fences",
        "max_tags_bytes",
        Kind::Count {
            min: 2,
            max: 1 << 24,
        },
    ),
    (
        "fences",
        "max_test_edges",
        Kind::Count {
            min: 256,
            max: 100_000_000,
        },
    ),
    (
        "ingest",
        "max_body_bytes",
        Kind::Count {
            min: 1024,
            max: 1 << 30,
        },
    ),
    (
        "ingest",
        "max_batch",
        Kind::Count {
            min: 1,
            max: 10_000_000,
        },
    ),
    (
        "ingest",
        "max_device_len",
        Kind::Count { min: 1, max: 4096 },
    ),
    (
        "ingest",
        "max_buffered_per_device",
        Kind::Count {
            min: 1,
            max: 1_000_000,
        },
    ),
    (
        "ingest",
        "max_queued_bytes",
        Kind::Count {
            min: 0,
            max: 1 << 40,
        },
    ),
    (
        "ingest",
        "max_devices",
        Kind::Count {
            min: 1,
            max: 1 << 31,
        },
    ),
    (
        "ingest",
        "max_ws_connections",
        Kind::Count {
            min: 1,
            max: 1_000_000,
        },
    ),
    (
        "ingest",
        "shard_queue",
        Kind::Count {
            min: 1,
            max: 1_000_000,
        },
    ),
    ("store", "durability", Kind::Durability),
    (
        "store",
        "commit_interval",
        Kind::Duration { zero_ok: false },
    ),
    (
        "store",
        "checkpoint_interval",
        Kind::Duration { zero_ok: false },
    ),
    (
        "events",
        "log_capacity",
        Kind::Count {
            min: 1,
            max: usize::MAX,
        },
    ),
    ("events", "log_max_age", Kind::Duration { zero_ok: false }),
    (
        "events",
        "subscriber_queue",
        Kind::Count {
            min: 1,
            max: 10_000_000,
        },
    ),
    (
        "events",
        "max_poll_limit",
        Kind::Count {
            min: 1,
            max: 10_000_000,
        },
    ),
    (
        "events",
        "max_subscribers",
        Kind::Count {
            min: 1,
            max: 1_000_000,
        },
    ),
    ("ui", "map_tile_url", Kind::TileUrl),
    ("ui", "map_tile_attribution", Kind::OptText),
    ("auth", "api_keys", Kind::Keys),
    ("auth", "open_metrics", Kind::Bool),
    ("mqtt", "mqtt_url", Kind::OptText),
    ("mqtt", "mqtt_topics", Kind::TextList),
    ("mqtt", "mqtt_client_id", Kind::OptText),
    ("cluster", "nats_urls", Kind::NatsUrls),
    ("cluster", "node_id", Kind::OptText),
    ("cluster", "partitions", Kind::Count { min: 1, max: 4096 }),
    ("cluster", "replicas", Kind::Count { min: 0, max: 5 }),
    ("cluster", "lease_ttl", Kind::Duration { zero_ok: false }),
    // In the file `[cluster] checkpoint_interval`; its own id (and environment variable) because
    // `[store]` has a key of that name.
    (
        "cluster",
        "cluster_checkpoint_interval",
        Kind::Duration { zero_ok: false },
    ),
];

/// The key as the file spells it in its section (ids are unique across sections; a file key may
/// repeat one of another section).
pub(super) fn file_key(id: &str) -> &str {
    match id {
        "cluster_checkpoint_interval" => "checkpoint_interval",
        "mqtt_url" => "url",
        "mqtt_topics" => "topics",
        "mqtt_client_id" => "client_id",
        k => k,
    }
}

/// The environment variable overriding key `id`.
pub(super) fn env_var(id: &str) -> String {
    format!("GEODWELL_{}", id.to_ascii_uppercase())
}

#[derive(Debug, Clone)]
pub(super) enum Val {
    Str(String),
    Int(i64),
}

/// One key's winning value: where it came from (for messages), the value, and the directory a
/// relative path in it resolves against.
#[derive(Debug, Clone)]
pub(super) struct Setting {
    pub(super) name: String,
    pub(super) val: Val,
    pub(super) base: Option<PathBuf>,
}

/// Checks a raster tile URL template such as `https://tile.example.org/{z}/{x}/{y}.png`.
fn check_tile_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("must start with http:// or https://")?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err("must name a host after the scheme".into());
    }
    if url
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '<' | '>' | '\\'))
    {
        return Err(
            "must not contain whitespace, control characters, quotes or angle brackets".into(),
        );
    }
    let missing: Vec<&str> = ["{z}", "{x}", "{y}"]
        .into_iter()
        .filter(|p| !url.contains(p))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "must contain the placeholders {}",
            missing.join(", ")
        ));
    }
    Ok(())
}

/// A NATS server URL: `nats://`, `tls://` or no scheme, then `host[:port]`, nothing after.
fn check_nats_url(u: &str) -> Result<String, String> {
    let rest = u
        .strip_prefix("nats://")
        .or_else(|| u.strip_prefix("tls://"))
        .unwrap_or(u);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    if rest.is_empty()
        || rest.contains(['/', '?', '#'])
        || rest.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err("a NATS URL is nats://host:port".into());
    }
    if let Some((_, port)) = rest.rsplit_once(':')
        && !rest.ends_with(']')
        && port.parse::<u16>().is_err()
    {
        return Err("the port must be a number up to 65535".into());
    }
    Ok(u.to_string())
}

/// An origin as browsers send it: `http(s)://host[:port]`, lower-cased, without a trailing
/// slash or path.
fn check_origin(o: &str) -> Result<String, String> {
    if o == "*" {
        return Ok(o.to_string());
    }
    let lower = o.trim_end_matches('/').to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))
        .ok_or("an origin starts with http:// or https://")?;
    if rest.is_empty()
        || rest.contains(['/', '?', '#', '@'])
        || rest.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err("an origin is scheme://host[:port], with no path, query or user".into());
    }
    Ok(lower)
}

pub(super) struct Builder<'a> {
    pub(super) values: BTreeMap<&'a str, Setting>,
    pub(super) issues: Vec<ConfigIssue>,
    pub(super) cores: usize,
}

impl Builder<'_> {
    pub(super) fn get(&mut self, key: &str) -> Option<(String, Val, Kind)> {
        let kind = SCHEMA
            .iter()
            .find(|(_, k, _)| *k == key)
            .map(|(_, _, k)| *k)?;
        let s = self.values.get(key)?.clone();
        Some((s.name, s.val, kind))
    }

    /// A relative `path` from a file layer, resolved against that file's directory.
    fn resolve(&self, key: &str, path: PathBuf) -> PathBuf {
        match self.values.get(key).and_then(|s| s.base.as_ref()) {
            Some(base) if path.is_relative() && !base.as_os_str().is_empty() => base.join(path),
            _ => path,
        }
    }

    fn fail(&mut self, name: String, message: String) {
        self.issues.push(ConfigIssue { key: name, message });
    }

    pub(super) fn addr(&mut self, key: &str) -> SocketAddr {
        let fallback = SocketAddr::from(([127, 0, 0, 1], 7878));
        let Some((name, v, _)) = self.get(key) else {
            return fallback;
        };
        match v {
            Val::Str(s) => s.parse().unwrap_or_else(|e| {
                self.fail(
                    name,
                    format!("expected host:port such as 127.0.0.1:7878 ({e}), got {s:?}"),
                );
                fallback
            }),
            Val::Int(i) => {
                self.fail(name, format!("expected a \"host:port\" string, got {i}"));
                fallback
            }
        }
    }

    pub(super) fn count(&mut self, key: &str) -> usize {
        let Some((name, v, kind)) = self.get(key) else {
            return 1;
        };
        let Kind::Count { min, max } = kind else {
            return 1;
        };
        let n = match v {
            Val::Int(i) => Ok(i),
            Val::Str(s) => s.trim().parse::<i64>().map_err(|_| s),
        };
        match n {
            Ok(i) if i >= 0 && (i as u64) >= min as u64 && (i as u64) <= max as u64 => i as usize,
            Ok(i) => {
                self.fail(
                    name,
                    format!("must be an integer in {min}..={max}, got {i}"),
                );
                min.max(1)
            }
            Err(s) => {
                self.fail(name, format!("expected an integer, got {s:?}"));
                min.max(1)
            }
        }
    }

    pub(super) fn dur(&mut self, key: &str) -> Dur {
        let Some((name, v, kind)) = self.get(key) else {
            return Dur::from_secs(1);
        };
        let zero_ok = matches!(kind, Kind::Duration { zero_ok: true });
        let text = match v {
            Val::Int(i) => i.to_string(),
            Val::Str(s) => s,
        };
        match Dur::parse(&text) {
            Ok(d) if d == Dur::ZERO && !zero_ok => {
                self.fail(name, "must be greater than zero".into());
                Dur::from_secs(1)
            }
            Ok(d) => d,
            Err(e) => {
                self.fail(name, e.to_string());
                Dur::from_secs(1)
            }
        }
    }

    pub(super) fn clock(&mut self, key: &str) -> ClockMode {
        let Some((name, v, _)) = self.get(key) else {
            return ClockMode::Live;
        };
        let text = match v {
            Val::Int(i) => i.to_string(),
            Val::Str(s) => s,
        };
        text.parse().unwrap_or_else(|e| {
            self.fail(name, e);
            ClockMode::Live
        })
    }

    pub(super) fn durability(&mut self, key: &str) -> Durability {
        let Some((name, v, _)) = self.get(key) else {
            return Durability::Sync;
        };
        let text = match v {
            Val::Int(i) => i.to_string(),
            Val::Str(s) => s,
        };
        text.parse().unwrap_or_else(|e| {
            self.fail(name, e);
            Durability::Sync
        })
    }

    pub(super) fn bool(&mut self, key: &str) -> bool {
        let Some((name, v, _)) = self.get(key) else {
            return false;
        };
        match v {
            Val::Str(s) if s == "true" => true,
            Val::Str(s) if s == "false" => false,
            other => {
                let got = match other {
                    Val::Str(s) => format!("{s:?}"),
                    Val::Int(i) => i.to_string(),
                };
                self.fail(name, format!("expected true or false, got {got}"));
                false
            }
        }
    }

    /// Keys from the environment (a string) win over keys from the file (an array of tables).
    /// Every bad entry is reported, each under its own index.
    pub(super) fn api_keys(&mut self, raw: Option<(String, Vec<toml::Value>)>) -> Vec<ApiKey> {
        if let Some((name, v, _)) = self.get("api_keys") {
            let spec = match v {
                Val::Str(s) => s,
                Val::Int(i) => i.to_string(),
            };
            return match crate::auth::parse_env_keys(&spec) {
                Ok(k) => self.unique_names(&name, k),
                Err(errors) => {
                    for e in errors {
                        self.fail(name.clone(), e);
                    }
                    Vec::new()
                }
            };
        }
        let Some((name, entries)) = raw else {
            return Vec::new();
        };
        let mut keys = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("{name}[{i}]");
            let Some(t) = entry.as_table() else {
                self.fail(at, "expected a { name, scopes, key } table".into());
                continue;
            };
            let mut errors = Vec::new();
            for k in t.keys() {
                if !matches!(k.as_str(), "name" | "scopes" | "key" | "key_sha256") {
                    errors.push(format!(
                        "unknown field {k:?}; known: name, scopes, key, key_sha256"
                    ));
                }
            }
            let text = |f: &str, errors: &mut Vec<String>| match t.get(f) {
                None => None,
                Some(toml::Value::String(s)) => Some(s.clone()),
                Some(other) => {
                    errors.push(format!("{f} must be a string, got {}", other.type_str()));
                    None
                }
            };
            let key_name = text("name", &mut errors).unwrap_or_default();
            let secret = text("key", &mut errors);
            let secret_sha = text("key_sha256", &mut errors);
            let scopes: Vec<String> = match t.get("scopes") {
                Some(toml::Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                    .collect(),
                Some(other) => {
                    errors.push(format!(
                        "scopes must be an array such as [\"read\"], got {}",
                        other.type_str()
                    ));
                    Vec::new()
                }
                None => Vec::new(),
            };
            match crate::auth::build_key(
                &key_name,
                scopes.iter().map(String::as_str),
                secret.as_deref(),
                secret_sha.as_deref(),
            ) {
                Ok(k) if errors.is_empty() => keys.push(k),
                Ok(_) => {}
                Err(e) => errors.extend(e),
            }
            for e in errors {
                self.fail(at.clone(), e);
            }
        }
        self.unique_names(&name, keys)
    }

    fn unique_names(&mut self, name: &str, keys: Vec<ApiKey>) -> Vec<ApiKey> {
        let mut seen = std::collections::BTreeSet::new();
        for k in &keys {
            if !seen.insert(k.name.clone()) {
                self.fail(
                    name.to_string(),
                    format!("key name {:?} is used twice", k.name),
                );
            }
        }
        let digests: std::collections::BTreeSet<_> = keys.iter().map(|k| k.digest).collect();
        if digests.len() != keys.len() {
            self.fail(name.to_string(), "two keys have the same secret".into());
        }
        keys
    }

    /// Browser origins (`scheme://host[:port]`, no path), or `["*"]` for every origin.
    pub(super) fn origins(&mut self, key: &str) -> Vec<String> {
        let Some((name, v, _)) = self.get(key) else {
            return Vec::new();
        };
        let text = match v {
            Val::Str(s) => s,
            Val::Int(i) => i.to_string(),
        };
        let mut out = Vec::new();
        for o in text.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            match check_origin(o) {
                Ok(o) => out.push(o),
                Err(why) => self.fail(name.clone(), format!("{why}, got {o:?}")),
            }
        }
        if out.len() > 1 && out.iter().any(|o| o == "*") {
            self.fail(name, "\"*\" allows every origin and stands alone".into());
        }
        out
    }

    /// A list of strings (comma-separated; empty items dropped).
    pub(super) fn text_list(&mut self, key: &str) -> Vec<String> {
        let Some((_, v, _)) = self.get(key) else {
            return Vec::new();
        };
        let text = match v {
            Val::Str(s) => s,
            Val::Int(i) => i.to_string(),
        };
        text.split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// NATS server URLs (`nats://host:port`, `tls://`, or a bare `host:port`), in order.
    pub(super) fn nats_urls(&mut self, key: &str) -> Vec<String> {
        let Some((name, v, _)) = self.get(key) else {
            return Vec::new();
        };
        let text = match v {
            Val::Str(s) => s,
            Val::Int(i) => i.to_string(),
        };
        let mut out = Vec::new();
        for u in text.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            match check_nats_url(u) {
                Ok(u) => out.push(u),
                Err(why) => self.fail(name.clone(), format!("{why}, got {u:?}")),
            }
        }
        out
    }

    /// A node id: it names the node's keys and subjects in NATS, so only `[A-Za-z0-9_-]`, 1 to
    /// 64 of them.
    pub(super) fn node_id(&mut self, key: &str) -> Option<String> {
        let id = self.opt_text(key)?;
        let (name, _, _) = self.get(key)?;
        if id.len() > 64
            || !id
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        {
            self.fail(
                name,
                format!("a node id is 1 to 64 of A-Z a-z 0-9 _ -, got {id:?}"),
            );
            return None;
        }
        Some(id)
    }

    pub(super) fn opt_text(&mut self, key: &str) -> Option<String> {
        let (name, v, _) = self.get(key)?;
        match v {
            Val::Str(s) if s.trim().is_empty() => None,
            Val::Str(s) => Some(s),
            Val::Int(i) => {
                self.fail(name, format!("expected a string, got {i}"));
                None
            }
        }
    }

    /// A tile URL template is handed to every browser that opens the map page, so only an
    /// absolute http(s) URL with the `{z}`/`{x}`/`{y}` placeholders is accepted.
    pub(super) fn tile_url(&mut self, key: &str) -> Option<String> {
        let url = self.opt_text(key)?;
        let (name, _, _) = self.get(key)?;
        match check_tile_url(&url) {
            Ok(()) => Some(url),
            Err(why) => {
                self.fail(name, format!("{why}, got {url:?}"));
                None
            }
        }
    }

    pub(super) fn path(&mut self, key: &str) -> Option<PathBuf> {
        let (name, v, _) = self.get(key)?;
        match v {
            Val::Str(s) if s.is_empty() => {
                self.fail(name, "must not be empty".into());
                None
            }
            Val::Str(s) => Some(self.resolve(key, PathBuf::from(s))),
            Val::Int(i) => {
                self.fail(name, format!("expected a path string, got {i}"));
                None
            }
        }
    }

    /// An optional file: `""` = none; a relative path resolves like every other path.
    pub(super) fn opt_path(&mut self, key: &str) -> Option<PathBuf> {
        let (name, v, _) = self.get(key)?;
        match v {
            Val::Str(s) if s.is_empty() => None,
            Val::Str(s) => Some(self.resolve(key, PathBuf::from(s))),
            Val::Int(i) => {
                self.fail(name, format!("expected a path string, got {i}"));
                None
            }
        }
    }

    pub(super) fn preload(&mut self, key: &str) -> FencePreload {
        let Some((name, v, _)) = self.get(key) else {
            return FencePreload::None;
        };
        match v {
            Val::Str(s) if s.is_empty() => FencePreload::None,
            Val::Str(s) if s == BUILTIN_SAMPLES => FencePreload::Samples,
            Val::Str(s) => FencePreload::File(self.resolve(key, PathBuf::from(s))),
            Val::Int(i) => {
                self.fail(
                    name,
                    format!("expected a path, \"{BUILTIN_SAMPLES}\" or \"\", got {i}"),
                );
                FencePreload::None
            }
        }
    }
}
