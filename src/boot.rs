//! Warm start: everything the service holds in memory, rebuilt from the store (or from the
//! configured preload on a fresh start), before any task runs. The service and the benchmarks
//! call the same [`boot`].
//!
//! Invariants:
//! - Nothing is created or written before every input is known to be good: the preload is read
//!   and validated first, and only then is the data directory created or the store opened.
//! - The store is authoritative: a store with fences ignores the preload; a store without them is
//!   seeded with it ([`Booted::seed`]).
//! - The restored event log continues the stored `seq` range exactly (a gap or a mismatch is
//!   refused as corruption).
//! - The shards' restore watermark: live mode, the stored watermark; event mode, the stored
//!   `max_seen - lateness` (the watermark the last committed fix implies).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::config::{ClockMode, Config, Durability, FencePreload, SAMPLE_FENCES};
use crate::events::{CompactEvent, EventLog, Interner, JSON_CACHE, LoggedEvent};
use crate::shard::shard_of;
use crate::store::{Store, StoreError};
use geodwell_core::engine::{DeviceState, Engine, EngineConfig, Restored};
use geodwell_core::fences::{Fence, FenceErrors, FenceLimits, parse_fences_str};
use geodwell_core::time::Ts;

/// Why the service could not start.
#[derive(Debug, Error)]
pub enum BootError {
    /// The fences file could not be read.
    #[error(
        "cannot read the fences file {path} (relative paths in a config file resolve against \
         the file's directory; set [fences] fences_file = \"\" to start without fences)"
    )]
    FencesRead {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The fences file is not valid.
    #[error("fences file {path} is invalid: {errors}")]
    FencesInvalid {
        /// The file.
        path: PathBuf,
        /// Every problem.
        errors: FenceErrors,
    },
    /// Too many fences in the preload.
    #[error("{source_name} holds {count} fences, more than max_fences = {max}")]
    TooManyFences {
        /// The file, or the built-in samples.
        source_name: String,
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The state store cannot be opened or read.
    #[error("state store")]
    Store(#[from] StoreError),
    /// The stored state is inconsistent.
    #[error("state store is inconsistent: {0}")]
    Corrupt(String),
}

/// Fence validation limits derived from the configuration.
pub fn fence_limits(cfg: &Config) -> FenceLimits {
    FenceLimits {
        max_vertices: cfg.max_vertices,
        max_tags_bytes: cfg.max_tags_bytes,
        ..FenceLimits::default()
    }
}

/// Reads and validates the configured preload (`[fences] fences_file`); no preload: none.
pub fn load_preload(cfg: &Config) -> Result<Vec<Fence>, BootError> {
    let (source_name, text, path) = match &cfg.fences_file {
        FencePreload::None => return Ok(Vec::new()),
        FencePreload::Samples => (
            "the built-in sample fences".to_string(),
            SAMPLE_FENCES.to_string(),
            PathBuf::from(crate::config::BUILTIN_SAMPLES),
        ),
        FencePreload::File(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| BootError::FencesRead {
                path: path.clone(),
                source,
            })?;
            (path.display().to_string(), text, path.clone())
        }
    };
    let fences = parse_fences_str(&text, &fence_limits(cfg))
        .map_err(|errors| BootError::FencesInvalid { path, errors })?;
    if fences.len() > cfg.max_fences {
        return Err(BootError::TooManyFences {
            source_name,
            count: fences.len(),
            max: cfg.max_fences,
        });
    }
    Ok(fences)
}

/// What a warm start rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BootSummary {
    /// Devices, pairs, buffered fixes and dropped pairs, over all shards.
    pub restored: Restored,
    /// Live wheel timers over all shards.
    pub timers: u64,
    /// Events restored into the in-memory log.
    pub events: usize,
    /// The `seq` the next event gets.
    pub next_seq: u64,
}

/// How long each phase of a warm start took (the benchmarks report them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BootTimings {
    /// Reading and validating the preload.
    pub preload: Duration,
    /// Opening (or creating) the store.
    pub open: Duration,
    /// Reading the store's snapshot.
    pub load: Duration,
    /// Parsing the stored fences.
    pub fences: Duration,
    /// Rebuilding the in-memory event log.
    pub events: Duration,
    /// Rebuilding the engines (wall time; they are rebuilt in parallel).
    pub engines: Duration,
    /// Rebuilding each shard's engine.
    pub per_shard: Vec<Duration>,
}

/// Everything the service needs from its past, rebuilt.
#[derive(Debug)]
pub struct Booted {
    /// The store (`None` with `durability = "none"`).
    pub store: Option<Arc<Store>>,
    /// The event log with the stored tail restored.
    pub log: Arc<EventLog>,
    /// The fences every engine holds.
    pub fences: Vec<Arc<Fence>>,
    /// Whether `fences` came from the preload into an empty store and must be persisted.
    pub seed: bool,
    /// One engine per shard, with its fences and restored devices.
    pub engines: Vec<Engine>,
    /// The watermark the engines were restored at.
    pub watermark: Option<Ts>,
    /// The largest fix time the store had committed (event clock mode), Unix ms.
    pub max_seen: Option<i64>,
    /// Counts, for the start-up log line.
    pub summary: BootSummary,
    /// How long the warm start took, in all.
    pub took: Duration,
    /// And phase by phase.
    pub timings: BootTimings,
}

/// Rebuilds the service's state from `cfg`'s store (or preload). Blocking and CPU-bound:
/// engines are rebuilt in parallel, one thread per shard.
pub fn boot(cfg: &Config) -> Result<Booted, BootError> {
    let started = Instant::now();
    let mut timings = BootTimings::default();
    let mut lap = {
        let mut last = Instant::now();
        move || {
            let now = Instant::now();
            let d = now - last;
            last = now;
            d
        }
    };
    // Validate the preload before touching the data directory: a failed start creates nothing.
    let preload = load_preload(cfg)?;
    timings.preload = lap();
    let store = match cfg.durability {
        Durability::None => None,
        _ => Some(Arc::new(Store::open(&cfg.data_dir)?)),
    };
    timings.open = lap();
    let snapshot = match &store {
        Some(s) => Some(s.load(cfg.log_capacity)?),
        None => None,
    };
    timings.load = lap();
    let (fences, seed) = match &snapshot {
        Some(snap) if !snap.fences.is_empty() => {
            let limits = fence_limits(cfg);
            let mut fences = Vec::with_capacity(snap.fences.len());
            for text in &snap.fences {
                let parsed =
                    parse_fences_str(text, &limits).map_err(|errors| BootError::FencesInvalid {
                        path: cfg.data_dir.clone(),
                        errors,
                    })?;
                fences.extend(parsed.into_iter().map(Arc::new));
            }
            (fences, false)
        }
        _ => (
            preload.into_iter().map(Arc::new).collect::<Vec<_>>(),
            store.is_some(),
        ),
    };
    timings.fences = lap();
    let next_seq = snapshot.as_ref().map_or(1, |s| s.next_seq.max(1));
    let (log, events) = restore_log(cfg, snapshot.as_ref().map(|s| &s.events[..]), next_seq)?;
    timings.events = lap();
    let max_seen = snapshot.as_ref().and_then(|s| s.max_seen);
    let watermark = match cfg.clock {
        ClockMode::Live => snapshot.as_ref().and_then(|s| s.watermark).map(Ts),
        ClockMode::Event => max_seen.map(|m| Ts(m).minus(cfg.lateness)),
    };
    let mut per_shard: Vec<Vec<DeviceState>> = (0..cfg.shards).map(|_| Vec::new()).collect();
    if let Some(snap) = snapshot {
        for d in snap.devices {
            per_shard[shard_of(&d.id, cfg.shards)].push(d);
        }
    }
    let engine_cfg = EngineConfig {
        tick: cfg.tick,
        max_fires_per_advance: cfg.max_fires_per_tick,
        max_buffered_per_device: cfg.max_buffered_per_device,
        // Each shard its share: deterministic (the same input gives the same refusals whatever
        // else the other shards hold), at the price of refusing a little early when the devices
        // spread unevenly.
        max_devices: cfg.max_devices.div_ceil(cfg.shards.max(1)),
        track_dirty: store.is_some(),
    };
    let (engines, restored, timers, per_shard) =
        build_engines(&engine_cfg, &fences, per_shard, watermark)?;
    timings.engines = lap();
    timings.per_shard = per_shard;
    Ok(Booted {
        store,
        log,
        fences,
        seed,
        engines,
        watermark,
        max_seen,
        summary: BootSummary {
            restored,
            timers,
            events,
            next_seq,
        },
        took: started.elapsed(),
        timings,
    })
}

/// The in-memory event log, continuing at `next_seq` with the stored tail `events` (already
/// rendered JSON, kept as the newest events' cached text).
fn restore_log(
    cfg: &Config,
    events: Option<&[(u64, String)]>,
    next_seq: u64,
) -> Result<(Arc<EventLog>, usize), BootError> {
    let tail = events.unwrap_or_default();
    let log = Arc::new(EventLog::new(
        cfg.log_capacity,
        cfg.log_max_age,
        tail.first().map_or(next_seq, |(seq, _)| *seq),
    ));
    // Decoded into the compact form the log holds, with fence ids and tags shared as in a live
    // log; the stored text is what the log rendered, so it is kept as the newest events' JSON.
    let mut interner = Interner::default();
    let mut restored = Vec::with_capacity(tail.len());
    let cached_from = tail.len().saturating_sub(JSON_CACHE);
    for (i, (_, json)) in tail.iter().enumerate() {
        let (seq, event) = CompactEvent::from_json(json, &mut interner)
            .map_err(|e| BootError::Corrupt(e.to_string()))?;
        let text = (i >= cached_from).then(|| Arc::<str>::from(json.as_str()));
        restored.push(LoggedEvent::new(seq, event, text));
    }
    let n = restored.len();
    log.append_stamped(restored)
        .map_err(|e| BootError::Corrupt(format!("stored events: {e}")))?;
    if log.next_seq() != next_seq {
        return Err(BootError::Corrupt(format!(
            "stored events end at seq {} but the store says next_seq = {next_seq}",
            log.next_seq()
        )));
    }
    Ok((log, n))
}

/// Engines, what they restored, their live timers, and how long each shard took.
type Built = (Vec<Engine>, Restored, u64, Vec<Duration>);

/// One engine per shard with `fences` and its restored devices, rebuilt in parallel (warm start
/// is CPU-bound).
fn build_engines(
    engine_cfg: &EngineConfig,
    fences: &[Arc<Fence>],
    per_shard: Vec<Vec<DeviceState>>,
    watermark: Option<Ts>,
) -> Result<Built, BootError> {
    let built: Vec<Result<(Engine, Restored, Duration), BootError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = per_shard
            .into_iter()
            .map(|devices| {
                scope.spawn(move || {
                    let t = Instant::now();
                    let mut engine = Engine::new(engine_cfg.clone());
                    let mut sink = Vec::new();
                    for f in fences {
                        engine.upsert_fence(f.clone(), &mut sink);
                    }
                    let r = engine
                        .restore(devices, watermark)
                        .map_err(|e| BootError::Corrupt(e.to_string()))?;
                    Ok((engine, r, t.elapsed()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(BootError::Corrupt("restoring a shard panicked".into()))
                })
            })
            .collect()
    });
    let mut engines = Vec::with_capacity(built.len());
    let mut restored = Restored::default();
    let mut timers = 0;
    let mut took = Vec::with_capacity(built.len());
    for b in built {
        let (engine, r, t) = b?;
        took.push(t);
        restored.devices += r.devices;
        restored.pairs += r.pairs;
        restored.dropped_pairs += r.dropped_pairs;
        restored.buffered += r.buffered;
        let ws = engine.stats().wheel;
        timers += ws.entries - ws.tombstones;
        engines.push(engine);
    }
    Ok((engines, restored, timers, took))
}
