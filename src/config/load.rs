//! The configuration loader: layers (embedded defaults, the file, the environment, the command
//! line) merged key by key, then every value validated, every problem collected.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use geodwell_core::time::Dur;

use super::values::{Builder, SCHEMA, Setting, Val, env_var, file_key};
use super::{Config, ConfigError, ConfigIssue, DEFAULT_TOML, Sources};

impl Config {
    /// The engine's rules for delayed data: `time.max_delay`, and `time.delay_hold` but never
    /// less than the lateness (a device's own queue arrives at least as spread as the disorder
    /// the watermark absorbs).
    pub fn delay_rules(&self) -> (geodwell_core::time::Dur, geodwell_core::time::Dur) {
        let hold = if self.delay_hold > geodwell_core::time::Dur::ZERO {
            self.delay_hold.max(self.lateness)
        } else {
            self.delay_hold
        };
        (self.max_delay, hold)
    }

    /// Each partition engine's configuration, of `partitions`: each its share of
    /// `max_devices` (deterministic: the same input gives the same refusals whatever else the
    /// other partitions hold, at the price of refusing a little early when devices spread
    /// unevenly); `track_dirty` where checkpoints are written.
    pub fn engine_config(
        &self,
        partitions: usize,
        track_dirty: bool,
    ) -> geodwell_core::engine::EngineConfig {
        let (max_delay, delay_hold) = self.delay_rules();
        geodwell_core::engine::EngineConfig {
            tick: self.tick,
            max_fires_per_advance: self.max_fires_per_tick,
            max_buffered_per_device: self.max_buffered_per_device,
            max_devices: self.max_devices.div_ceil(partitions.max(1)),
            track_dirty,
            max_delay,
            delay_hold,
        }
    }

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
                    let Some(&(_, k, _)) = SCHEMA
                        .iter()
                        .find(|(s, k, _)| s == section && file_key(k) == key)
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
                        // `server.cors_origins`, `cluster.nats_urls`: arrays of strings, read as
                        // the environment's comma-separated form.
                        toml::Value::Array(a)
                            if matches!(k, "cors_origins" | "nats_urls" | "mqtt_topics")
                                && a.iter().all(toml::Value::is_str) =>
                        {
                            Val::Str(
                                a.iter()
                                    .filter_map(toml::Value::as_str)
                                    .collect::<Vec<_>>()
                                    .join(","),
                            )
                        }
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
                            name: format!("{section}.{}", file_key(k)),
                            val,
                            base: base.clone(),
                        },
                    );
                }
            }
        }
        for (section, key, _) in SCHEMA {
            let var = env_var(key);
            if let Some(v) = env.get(&var) {
                values.insert(
                    key,
                    Setting {
                        name: format!("{section}.{} (from {var})", file_key(key)),
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
                    name: format!("{section}.{} (from {flag})", file_key(k)),
                    val: Val::Str(v.clone()),
                    base: None,
                },
            );
        }
        for var in env.keys() {
            let known = SCHEMA.iter().any(|(_, k, _)| *var == env_var(k));
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
            max_connections: b.count("max_connections"),
            header_timeout: b.dur("header_timeout"),
            body_timeout: b.dur("body_timeout"),
            write_timeout: b.dur("write_timeout"),
            cors_origins: b.origins("cors_origins"),
            allow_private_targets: b.bool("allow_private_targets"),
            tls_cert: b.opt_path("tls_cert"),
            tls_key: b.opt_path("tls_key"),
            clock: b.clock("clock"),
            lateness: b.dur("lateness"),
            max_future: b.dur("max_future"),
            max_delay: b.dur("max_delay"),
            delay_hold: b.dur("delay_hold"),
            tick: b.dur("tick"),
            max_fires_per_tick: b.count("max_fires_per_tick"),
            fences_file: b.preload("fences_file"),
            max_fences: b.count("max_fences"),
            max_vertices: b.count("max_vertices"),
            max_tags_bytes: b.count("max_tags_bytes"),
            max_test_edges: b.count("max_test_edges"),
            max_body_bytes: b.count("max_body_bytes"),
            max_batch: b.count("max_batch"),
            max_device_len: b.count("max_device_len"),
            max_buffered_per_device: b.count("max_buffered_per_device"),
            max_queued_bytes: b.count("max_queued_bytes"),
            max_devices: b.count("max_devices"),
            idle_ttl: b.dur("idle_ttl"),
            max_ws_connections: b.count("max_ws_connections"),
            shard_queue: b.count("shard_queue"),
            log_capacity: b.count("log_capacity"),
            log_max_age: b.dur("log_max_age"),
            subscriber_queue: b.count("subscriber_queue"),
            max_poll_limit: b.count("max_poll_limit"),
            max_subscribers: b.count("max_subscribers"),
            durability: b.durability("durability"),
            commit_interval: b.dur("commit_interval"),
            checkpoint_interval: b.dur("checkpoint_interval"),
            webhooks: Vec::new(),
            map_tile_url: b.tile_url("map_tile_url"),
            map_tile_attribution: b.opt_text("map_tile_attribution"),
            api_keys,
            open_metrics: b.bool("open_metrics"),
            cluster: None,
            mqtt: None,
        };
        let mut cfg = cfg;
        // The one place `shards = 0` is resolved.
        if cfg.shards == 0 {
            cfg.shards = b.cores.max(1);
        }
        if cfg.tick > Dur::from_mins(1) {
            b.issues.push(issue("time.tick", "must be at most 60s"));
        }
        if cfg.tls_cert.is_some() != cfg.tls_key.is_some() {
            b.issues.push(issue(
                "server.tls_cert",
                "server.tls_cert and server.tls_key go together: set both (TLS) or neither",
            ));
        }
        cfg.cluster = cluster(&mut b);
        cfg.mqtt = mqtt(&mut b);
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

pub(super) fn issue(key: &str, message: &str) -> ConfigIssue {
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

/// `[cluster]`: a cluster node when NATS URLs are given, else `None` (the embedded store).
fn cluster(b: &mut Builder<'_>) -> Option<super::ClusterConfig> {
    let nats_urls = b.nats_urls("nats_urls");
    let node_id = b.node_id("node_id");
    let partitions = b.count("partitions");
    let replicas = b.count("replicas");
    let lease_ttl = b.dur("lease_ttl");
    let checkpoint_interval = b.dur("cluster_checkpoint_interval");
    if lease_ttl < Dur::from_secs(1) || lease_ttl > Dur::from_mins(10) {
        b.issues
            .push(issue("cluster.lease_ttl", "must be between 1s and 10m"));
    }
    if nats_urls.is_empty() {
        return None;
    }
    let node_id = node_id.unwrap_or_else(super::default_node_id);
    Some(super::ClusterConfig {
        nats_urls,
        node_id,
        partitions: partitions as u16,
        replicas,
        lease_ttl,
        checkpoint_interval,
    })
}

/// `[mqtt]`: on when `url` is set; every topic filter and the URL checked.
fn mqtt(b: &mut Builder<'_>) -> Option<super::MqttConfig> {
    let url = b.opt_text("mqtt_url");
    let topics = b.text_list("mqtt_topics");
    let client_id = b.opt_text("mqtt_client_id");
    for t in &topics {
        if let Err(e) = super::mqtt::check_filter(t) {
            b.issues
                .push(issue("mqtt.topics", &format!("{e}, got {t:?}")));
        }
    }
    let url = url?;
    if topics.is_empty() {
        b.issues
            .push(issue("mqtt.topics", "must name at least one topic filter"));
    }
    if let Err(e) = super::mqtt::check_broker_url(&url) {
        b.issues.push(issue("mqtt.url", &e));
    }
    if let Some(id) = &client_id
        && (id.len() > 128 || id.chars().any(|c| c.is_control()))
    {
        b.issues.push(issue(
            "mqtt.client_id",
            "must be at most 128 characters, none of them control characters",
        ));
    }
    Some(super::MqttConfig {
        url,
        topics,
        client_id: client_id.unwrap_or_else(|| format!("geodwell-{}", super::default_node_id())),
    })
}

fn keys_of(section: &str) -> String {
    SCHEMA
        .iter()
        .filter(|(s, _, _)| *s == section)
        .map(|(_, k, _)| file_key(k))
        .collect::<Vec<_>>()
        .join(", ")
}
