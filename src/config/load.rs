//! The configuration schema and its loader: layers (embedded defaults, the file, the environment,
//! the command line) merged key by key, then every value validated, every problem collected.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use geodwell_core::time::Dur;

use super::{
    BUILTIN_SAMPLES, ClockMode, Config, ConfigError, ConfigIssue, DEFAULT_TOML, Durability,
    FencePreload,
};
use crate::auth::ApiKey;

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

#[derive(Clone, Copy)]
enum Kind {
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
    /// API keys: an array of `{name, scopes, key | key_sha256}` tables in the file, or
    /// `name:scope+scope:key,...` in the environment.
    Keys,
}

/// (section, key, kind): the schema. Keys are unique across sections so that `GEODWELL_<KEY>`
/// names one key.
const SCHEMA: &[(&str, &str, Kind)] = &[
    ("server", "listen", Kind::Addr),
    ("server", "shards", Kind::Count { min: 0, max: 1024 }),
    ("server", "data_dir", Kind::Path),
    ("server", "shutdown_grace", Kind::Duration { zero_ok: true }),
    ("time", "clock", Kind::Clock),
    ("time", "lateness", Kind::Duration { zero_ok: true }),
    ("time", "max_future", Kind::Duration { zero_ok: true }),
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
    ("ui", "map_tile_url", Kind::TileUrl),
    ("ui", "map_tile_attribution", Kind::OptText),
    ("auth", "api_keys", Kind::Keys),
    ("auth", "open_metrics", Kind::Bool),
];

#[derive(Debug, Clone)]
enum Val {
    Str(String),
    Int(i64),
}

/// One key's winning value: where it came from (for messages), the value, and the directory a
/// relative path in it resolves against.
#[derive(Debug, Clone)]
struct Setting {
    name: String,
    val: Val,
    base: Option<PathBuf>,
}

impl Config {
    /// The embedded defaults (with `cores` shards when `shards = 0`).
    pub fn defaults(cores: usize) -> Config {
        Config::load(None, &BTreeMap::new(), cores).expect("the embedded default config is valid")
    }

    /// Loads `file` (name, text) over the embedded defaults, then applies `env` (already filtered
    /// to `GEODWELL_*` variables, or empty). `cores` resolves `shards = 0`. Relative paths resolve
    /// against the working directory; [`Config::load_sources`] takes the file's directory.
    pub fn load(
        file: Option<(&str, &str)>,
        env: &BTreeMap<String, String>,
        cores: usize,
    ) -> Result<Config, ConfigError> {
        Config::load_sources(&Sources {
            file: file.map(|(name, text)| (name, text, None)),
            env: env.clone(),
            cli: Vec::new(),
            cores,
        })
    }

    /// Loads every layer of `src` over the embedded defaults and validates the result.
    pub fn load_sources(src: &Sources<'_>) -> Result<Config, ConfigError> {
        let (file, env, cores) = (src.file, &src.env, src.cores);
        let source_name = file.map_or("embedded defaults".to_string(), |(n, _, _)| n.to_string());
        let mut issues = Vec::new();
        let mut values: BTreeMap<&str, Setting> = BTreeMap::new();
        // `auth.api_keys` from a file: the only array-valued key, kept raw until the builder.
        let mut raw_keys: Option<(String, Vec<toml::Value>)> = None;
        let mut webhooks_raw: Option<toml::Value> = None;
        // Defaults first, then the file over them.
        let mut layers = vec![("embedded defaults", DEFAULT_TOML, None)];
        if let Some((name, text, dir)) = file {
            layers.push((
                name,
                text,
                Some(dir.map_or_else(PathBuf::new, Path::to_path_buf)),
            ));
        }
        for (layer_name, text, base) in layers {
            let table: toml::Table = match text.parse() {
                Ok(t) => t,
                Err(e) => {
                    issues.push(ConfigIssue {
                        key: "(file)".into(),
                        message: format!("{layer_name} is not valid TOML: {e}"),
                    });
                    continue;
                }
            };
            for (section, body) in &table {
                // `[[webhooks]]` is an array of sink tables, validated on its own below.
                if section == "webhooks" {
                    webhooks_raw = Some(body.clone());
                    continue;
                }
                let Some(body) = body.as_table() else {
                    issues.push(issue(section, "expected a [section] table"));
                    continue;
                };
                if !SCHEMA.iter().any(|(s, _, _)| s == section) {
                    issues.push(issue(
                        section,
                        &format!("unknown section; known: {}", sections()),
                    ));
                    continue;
                }
                for (key, v) in body {
                    let Some(&(_, k, _)) = SCHEMA.iter().find(|(s, k, _)| s == section && k == key)
                    else {
                        issues.push(issue(
                            &format!("{section}.{key}"),
                            &format!("unknown key; known in [{section}]: {}", keys_of(section)),
                        ));
                        continue;
                    };
                    if k == "api_keys" {
                        match v {
                            toml::Value::Array(a) => {
                                raw_keys = Some((format!("{section}.{key}"), a.clone()));
                                values.remove(k);
                            }
                            other => issues.push(issue(
                                &format!("{section}.{key}"),
                                &format!(
                                    "expected an array of {{ name, scopes, key }} tables, got {}",
                                    other.type_str()
                                ),
                            )),
                        }
                        continue;
                    }
                    let val = match v {
                        toml::Value::String(s) => Val::Str(s.clone()),
                        toml::Value::Boolean(b) => Val::Str(b.to_string()),
                        toml::Value::Integer(i) => Val::Int(*i),
                        toml::Value::Float(f) => Val::Str(f.to_string()),
                        other => {
                            issues.push(issue(
                                &format!("{section}.{key}"),
                                &format!("expected a string or number, got {}", other.type_str()),
                            ));
                            continue;
                        }
                    };
                    values.insert(
                        k,
                        Setting {
                            name: format!("{section}.{key}"),
                            val,
                            base: base.clone(),
                        },
                    );
                }
            }
        }
        for (section, key, _) in SCHEMA {
            let var = format!("GEODWELL_{}", key.to_ascii_uppercase());
            if let Some(v) = env.get(&var) {
                values.insert(
                    key,
                    Setting {
                        name: format!("{section}.{key} (from {var})"),
                        val: Val::Str(v.clone()),
                        base: None,
                    },
                );
            }
        }
        for (key, flag, v) in &src.cli {
            let Some(&(section, k, _)) = SCHEMA.iter().find(|(_, k, _)| k == key) else {
                issues.push(issue(flag, "no such configuration key"));
                continue;
            };
            values.insert(
                k,
                Setting {
                    name: format!("{section}.{k} (from {flag})"),
                    val: Val::Str(v.clone()),
                    base: None,
                },
            );
        }
        for var in env.keys() {
            let known = SCHEMA
                .iter()
                .any(|(_, k, _)| *var == format!("GEODWELL_{}", k.to_ascii_uppercase()));
            if !known && var.starts_with("GEODWELL_") && var != "GEODWELL_LOG" {
                issues.push(issue(var, "unknown environment override"));
            }
        }

        let mut b = Builder {
            values,
            issues,
            cores,
        };
        let api_keys = b.api_keys(raw_keys);
        let cfg = Config {
            listen: b.addr("listen"),
            shards: b.count("shards"),
            data_dir: b.path("data_dir").unwrap_or_default(),
            shutdown_grace: b.dur("shutdown_grace"),
            clock: b.clock("clock"),
            lateness: b.dur("lateness"),
            max_future: b.dur("max_future"),
            tick: b.dur("tick"),
            max_fires_per_tick: b.count("max_fires_per_tick"),
            fences_file: b.preload("fences_file"),
            max_fences: b.count("max_fences"),
            max_vertices: b.count("max_vertices"),
            max_body_bytes: b.count("max_body_bytes"),
            max_batch: b.count("max_batch"),
            max_device_len: b.count("max_device_len"),
            max_buffered_per_device: b.count("max_buffered_per_device"),
            shard_queue: b.count("shard_queue"),
            log_capacity: b.count("log_capacity"),
            log_max_age: b.dur("log_max_age"),
            subscriber_queue: b.count("subscriber_queue"),
            max_poll_limit: b.count("max_poll_limit"),
            durability: b.durability("durability"),
            commit_interval: b.dur("commit_interval"),
            webhooks: Vec::new(),
            map_tile_url: b.tile_url("map_tile_url"),
            map_tile_attribution: b.opt_text("map_tile_attribution"),
            api_keys,
            open_metrics: b.bool("open_metrics"),
        };
        let mut cfg = cfg;
        // The one place `shards = 0` is resolved.
        if cfg.shards == 0 {
            cfg.shards = b.cores.max(1);
        }
        if cfg.tick > Dur::from_mins(1) {
            b.issues.push(issue("time.tick", "must be at most 60s"));
        }
        let (webhooks, webhook_issues) = super::webhooks::from_config(webhooks_raw.as_ref());
        cfg.webhooks = webhooks;
        b.issues.extend(webhook_issues);
        if b.issues.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigError {
                source_name,
                issues: b.issues,
            })
        }
    }

    /// Collects `GEODWELL_*` variables from the process environment.
    pub fn env_overrides() -> BTreeMap<String, String> {
        std::env::vars()
            .filter(|(k, _)| k.starts_with("GEODWELL_"))
            .collect()
    }
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

fn issue(key: &str, message: &str) -> ConfigIssue {
    ConfigIssue {
        key: key.to_string(),
        message: message.to_string(),
    }
}

fn sections() -> String {
    let mut s: Vec<&str> = SCHEMA.iter().map(|(s, _, _)| *s).collect();
    s.dedup();
    s.join(", ")
}

fn keys_of(section: &str) -> String {
    SCHEMA
        .iter()
        .filter(|(s, _, _)| *s == section)
        .map(|(_, k, _)| *k)
        .collect::<Vec<_>>()
        .join(", ")
}

struct Builder<'a> {
    values: BTreeMap<&'a str, Setting>,
    issues: Vec<ConfigIssue>,
    cores: usize,
}

impl Builder<'_> {
    fn get(&mut self, key: &str) -> Option<(String, Val, Kind)> {
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

    fn addr(&mut self, key: &str) -> SocketAddr {
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

    fn count(&mut self, key: &str) -> usize {
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

    fn dur(&mut self, key: &str) -> Dur {
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

    fn clock(&mut self, key: &str) -> ClockMode {
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

    fn durability(&mut self, key: &str) -> Durability {
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

    fn bool(&mut self, key: &str) -> bool {
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
    fn api_keys(&mut self, raw: Option<(String, Vec<toml::Value>)>) -> Vec<ApiKey> {
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

    fn opt_text(&mut self, key: &str) -> Option<String> {
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
    fn tile_url(&mut self, key: &str) -> Option<String> {
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

    fn path(&mut self, key: &str) -> Option<PathBuf> {
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

    fn preload(&mut self, key: &str) -> FencePreload {
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
