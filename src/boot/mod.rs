//! Warm start: everything the service holds in memory, rebuilt from the store (or from the
//! configured preload on a fresh start), before any task runs. The service and the benchmarks
//! call the same [`boot`].
//!
//! A warm start is the latest checkpoint, restored, plus a replay of every shard's input log
//! after it through the same engine: the same records in the same order give the same state and
//! the same events, ids included. Events the replay produces that the store already holds keep
//! their `seq` and are not published again; the others (never published: their step was not
//! committed, or they come from a time step that left no record) are published as new.
//!
//! Invariants:
//! - Nothing is created or written before every input is known to be good: the preload is read
//!   and validated first, and only then is the data directory created or the store opened.
//! - The store is authoritative: a store with fences ignores the preload; an empty store is
//!   seeded with it, as its first checkpoint, before anything is served.
//! - The restored event log continues the stored `seq` range exactly (a gap or a mismatch is
//!   refused as corruption).
//! - Each shard resumes at its checkpointed watermark, moved by the replay; the service then
//!   advances it to the current watermark (live: the wall clock; event: `max_seen - lateness`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;

mod rebuild;

use std::collections::{BTreeMap, HashSet};

use rebuild::{Parsed, ShardPlan, rebuild};

use crate::config::{ClockMode, Config, Durability, FencePreload, SAMPLE_FENCES};
use crate::events::{CompactEvent, EventLog, Interner, JSON_CACHE, LoggedEvent};
use crate::shard::{ShardStart, shard_of};
use crate::store::input::{FenceChange, decode_fence_change};
use crate::store::{CheckpointMeta, Store, StoreError};
use geodwell_core::engine::{EngineConfig, Restored};
use geodwell_core::event::{Event, EventId};
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
    /// The shard count differs from the checkpoint's while the input log after it still holds
    /// records of the old layout.
    #[error(
        "the store was last written with {stored} shards and has input after its latest checkpoint; \
         start once with server.shards = {stored} (a clean stop writes a checkpoint covering \
         everything), then change the shard count"
    )]
    ShardsChanged {
        /// The stored layout's shard count.
        stored: u32,
    },
}

/// Fence validation limits derived from the configuration.
pub fn fence_limits(cfg: &Config) -> FenceLimits {
    FenceLimits {
        max_vertices: cfg.max_vertices,
        max_tags_bytes: cfg.max_tags_bytes,
        max_test_edges: cfg.max_test_edges,
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
    /// Devices, pairs, buffered fixes and dropped pairs restored from the checkpoint, over all
    /// shards.
    pub restored: Restored,
    /// Live wheel timers over all shards, after the replay.
    pub timers: u64,
    /// Events restored into the in-memory log.
    pub events: usize,
    /// The `seq` the next event gets.
    pub next_seq: u64,
    /// The checkpoint's round.
    pub checkpoint_round: u64,
    /// Input records replayed, and the fixes in them.
    pub replayed_records: u64,
    /// Fixes replayed.
    pub replayed_fixes: u64,
    /// Events the replay produced again (already stored, kept with their `seq`).
    pub replayed_known: u64,
    /// Events the replay produced that were never published (published now).
    pub replayed_new: u64,
}

/// How long each phase of a warm start took (the benchmarks report them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BootTimings {
    /// Reading and validating the preload.
    pub preload: Duration,
    /// Opening (or creating) the store.
    pub open: Duration,
    /// Reading the checkpoint and the log.
    pub load: Duration,
    /// Parsing the stored fences and fence changes.
    pub fences: Duration,
    /// Rebuilding the in-memory event log (on its own thread, beside the shards).
    pub events: Duration,
    /// Restoring the engines from the checkpoint (wall time; shards in parallel).
    pub restore: Duration,
    /// Replaying the log after the checkpoint (wall time; shards in parallel).
    pub replay: Duration,
    /// Restoring and replaying, per shard.
    pub per_shard: Vec<Duration>,
}

/// Everything the service needs from its past, rebuilt.
#[derive(Debug)]
pub struct Booted {
    /// The store (`None` with `durability = "none"`).
    pub store: Option<Arc<Store>>,
    /// The event log with the stored tail restored.
    pub log: Arc<EventLog>,
    /// The fences as of now (the checkpoint's, with the log's changes applied), for the
    /// registry.
    pub fences: Vec<Arc<Fence>>,
    /// One start per shard: its engine (restored and replayed), its last input `seq`, the new
    /// events the replay produced.
    pub shards: Vec<ShardStart>,
    /// The number of the next fence change.
    pub next_fence_change: u64,
    /// Fences changed since the checkpoint, with the number of their latest change.
    pub fences_since_checkpoint: Vec<(String, u64)>,
    /// Per shard, the first fence change it has not applied (a change whose record was durable
    /// while the shard's record of applying it was not).
    pub fence_catch_up: Vec<u64>,
    /// Per shard, the last input `seq` the store already holds.
    pub committed: Vec<u64>,
    /// The watermark the store recorded.
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

/// A lap timer.
fn laps() -> impl FnMut() -> Duration {
    let mut last = Instant::now();
    move || {
        let now = Instant::now();
        let d = now - last;
        last = now;
        d
    }
}

/// Rebuilds the service's state from `cfg`'s store (or preload). Blocking and CPU-bound:
/// engines are restored and replayed in parallel, one thread per shard.
pub fn boot(cfg: &Config) -> Result<Booted, BootError> {
    let started = Instant::now();
    let mut timings = BootTimings::default();
    let mut lap = laps();
    // Validate the preload before touching the data directory: a failed start creates nothing.
    let preload = load_preload(cfg)?;
    timings.preload = lap();
    let store = match cfg.durability {
        Durability::None => None,
        _ => Some(Arc::new(Store::open(&cfg.data_dir)?)),
    };
    timings.open = lap();
    let mut snap = match &store {
        Some(s) => s.load(cfg.log_capacity)?,
        None => Default::default(),
    };
    timings.load = lap();
    // Stored fences were validated when they were accepted: a limit lowered since (or added by
    // a newer build) must not refuse them, nor make a replay differ.
    let limits = FenceLimits::stored();
    let parse_one = |text: &str| -> Result<Fence, BootError> {
        let mut parsed =
            parse_fences_str(text, &limits).map_err(|errors| BootError::FencesInvalid {
                path: cfg.data_dir.clone(),
                errors,
            })?;
        match parsed.pop() {
            Some(f) if parsed.is_empty() => Ok(f),
            _ => Err(BootError::Corrupt(
                "a stored fence is not exactly one Feature".into(),
            )),
        }
    };
    // An empty store is seeded with the preload, as its first checkpoint.
    let ck = &mut snap.checkpoint;
    if let Some(s) = &store
        && ck.meta.round == 0
        && ck.fences.is_empty()
        && snap.fence_changes.is_empty()
        && snap.inputs.is_empty()
        && !preload.is_empty()
    {
        let texts: Vec<(String, Option<String>)> = preload
            .iter()
            .map(|f| {
                (
                    f.id.to_string(),
                    Some(serde_json::to_string(&f.to_feature()).unwrap_or_default()),
                )
            })
            .collect();
        let mut w = s.checkpoints().writer()?;
        w.fences(&texts)?;
        let meta = CheckpointMeta {
            round: 1,
            shards: cfg.shards as u32,
            fence_change: 0,
            event_floor: snap.next_seq.max(1),
            positions: vec![(0, None); cfg.shards],
        };
        w.commit(&meta)?;
        ck.meta = meta;
        ck.fences = texts.into_iter().filter_map(|(_, t)| t).collect();
    }
    let meta = ck.meta.clone();
    let same_layout = meta.shards == 0 || meta.shards as usize == cfg.shards;
    if !same_layout && !snap.inputs.is_empty() {
        return Err(BootError::ShardsChanged {
            stored: meta.shards,
        });
    }
    let base: Vec<Arc<Fence>> = if store.is_some() {
        ck.fences
            .iter()
            .map(|t| parse_one(t).map(Arc::new))
            .collect::<Result<_, _>>()?
    } else {
        preload.into_iter().map(Arc::new).collect()
    };
    // The fence changes after the checkpoint, and the registry's view: the checkpoint's fences
    // with every change applied in order.
    let mut changes: BTreeMap<u64, FenceChange> = BTreeMap::new();
    for (n, bytes) in &snap.fence_changes {
        let c = decode_fence_change(bytes)
            .map_err(|e| BootError::Corrupt(format!("fence change {n}: {}", e.0)))?;
        changes.insert(*n, c);
    }
    let mut parsed_changes: BTreeMap<u64, Parsed> = BTreeMap::new();
    let mut current: BTreeMap<String, Arc<Fence>> =
        base.iter().map(|f| (f.id.to_string(), f.clone())).collect();
    let mut since_checkpoint: BTreeMap<String, u64> = BTreeMap::new();
    for (&n, c) in &changes {
        match c {
            FenceChange::Put(text) => {
                let f = Arc::new(parse_one(text)?);
                current.insert(f.id.to_string(), f.clone());
                since_checkpoint.insert(f.id.to_string(), n);
                parsed_changes.insert(n, Parsed::Put(f));
            }
            FenceChange::Delete(id) => {
                current.remove(id);
                since_checkpoint.insert(id.clone(), n);
                parsed_changes.insert(n, Parsed::Delete(id.clone()));
            }
        }
    }
    let next_fence_change = changes
        .keys()
        .next_back()
        .copied()
        .unwrap_or(meta.fence_change)
        .max(meta.fence_change)
        + 1;
    timings.fences = lap();
    let next_seq = snap.next_seq.max(1);
    let max_seen = snap.max_seen;
    let stored_w = match cfg.clock {
        ClockMode::Live => snap.watermark.map(Ts),
        ClockMode::Event => max_seen.map(|m| Ts(m).minus(cfg.lateness)),
    };
    // Per shard: the devices, the checkpoint position and watermark, the records after it.
    let mut per_shard: Vec<ShardPlan> = (0..cfg.shards)
        .map(|k| {
            let pos = if same_layout {
                meta.positions.get(k).copied().unwrap_or((0, None))
            } else {
                (0, None)
            };
            ShardPlan {
                devices: Vec::new(),
                seq: pos.0,
                watermark: pos.1.map(Ts).or(if same_layout { None } else { stored_w }),
                inputs: Vec::new(),
            }
        })
        .collect();
    for d in std::mem::take(&mut ck.devices) {
        per_shard[shard_of(&d.id, cfg.shards)].devices.push(d);
    }
    let data_dir = cfg.data_dir.clone();
    for (shard, seq, rec) in std::mem::take(&mut snap.inputs) {
        let plan = per_shard.get_mut(shard as usize).ok_or_else(|| {
            BootError::Corrupt(format!(
                "an input record of shard {shard}, beyond the layout"
            ))
        })?;
        if seq != plan.seq + plan.inputs.len() as u64 + 1 {
            return Err(BootError::Corrupt(format!(
                "shard {shard}'s input log resumes at seq {seq}, not right after {}",
                plan.seq + plan.inputs.len() as u64
            )));
        }
        plan.inputs.push(rec);
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
        max_delay: cfg.delay_rules().0,
        delay_hold: cfg.delay_rules().1,
    };
    // The event log's tail is rebuilt on a thread of its own while the shards restore and
    // replay: the two do not depend on each other until the replay's events are matched.
    let stored_events = std::mem::take(&mut snap.events);
    let (rebuilt, restored_log) = std::thread::scope(|scope| {
        let events = scope.spawn(|| {
            let t = Instant::now();
            let r = restore_log(cfg, &stored_events, next_seq, meta.event_floor);
            (r, t.elapsed())
        });
        let rebuilt = rebuild(
            &engine_cfg,
            &base,
            &parsed_changes,
            meta.fence_change,
            per_shard,
            cfg.max_device_len,
            &data_dir,
        );
        let restored_log = events.join().unwrap_or_else(|_| {
            (
                Err(BootError::Corrupt(
                    "restoring the event log panicked".into(),
                )),
                Duration::ZERO,
            )
        });
        (rebuilt, restored_log)
    });
    let (log, events, known) = restored_log.0?;
    timings.events = restored_log.1;
    let rebuilt = rebuilt?;
    timings.restore = rebuilt.restore;
    timings.replay = rebuilt.replay;
    timings.per_shard = rebuilt.per_shard;
    let mut summary = BootSummary {
        restored: rebuilt.restored,
        events,
        next_seq,
        checkpoint_round: meta.round,
        ..BootSummary::default()
    };
    let mut shards = Vec::with_capacity(cfg.shards);
    let mut fence_catch_up = Vec::with_capacity(cfg.shards);
    let mut committed = Vec::with_capacity(cfg.shards);
    for r in rebuilt.shards {
        summary.replayed_records += r.records;
        summary.replayed_fixes += r.fixes;
        let ws = r.engine.stats().wheel;
        summary.timers += ws.entries - ws.tombstones;
        let mut pending = Vec::new();
        for e in r.events {
            if known.contains(&e.id) {
                summary.replayed_known += 1;
            } else {
                summary.replayed_new += 1;
                pending.push(e);
            }
        }
        fence_catch_up.push(r.fence_change + 1);
        committed.push(r.seq);
        shards.push(ShardStart {
            engine: r.engine,
            seq: r.seq,
            pending,
        });
    }
    if let Some(s) = &store {
        s.hold_replay_events_from(meta.event_floor);
    }
    Ok(Booted {
        store,
        log,
        fences: current.into_values().collect(),
        shards,
        next_fence_change,
        fences_since_checkpoint: since_checkpoint.into_iter().collect(),
        fence_catch_up,
        committed,
        watermark: stored_w,
        max_seen,
        summary,
        took: started.elapsed(),
        timings,
    })
}

/// The in-memory event log, continuing at `next_seq` with the stored `events` (already rendered
/// JSON, the newest kept as the cached text), and the ids of those at `floor` or above (which a
/// replay may produce again).
fn restore_log(
    cfg: &Config,
    events: &[(u64, String)],
    next_seq: u64,
    floor: u64,
) -> Result<(Arc<EventLog>, usize, HashSet<EventId>), BootError> {
    let tail = &events[events.len().saturating_sub(cfg.log_capacity)..];
    let log = Arc::new(EventLog::new(
        cfg.log_capacity,
        cfg.log_max_age,
        tail.first().map_or(next_seq, |(seq, _)| *seq),
    ));
    // Decoded into the compact form the log holds, with fence ids and tags shared as in a live
    // log; the stored text is what the log rendered, so it is kept as the newest events' JSON.
    let mut interner = Interner::default();
    let mut known = HashSet::new();
    for (seq, json) in events.iter().filter(|(seq, _)| *seq >= floor) {
        let e: Event = serde_json::from_str(json)
            .map_err(|e| BootError::Corrupt(format!("stored event {seq}: {e}")))?;
        known.insert(e.id);
    }
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
    Ok((log, n, known))
}
