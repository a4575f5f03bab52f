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

mod error;
mod fences;
mod rebuild;
mod shard;

use std::collections::HashSet;

pub use error::BootError;
use rebuild::{Common, ShardPlan, rebuild};
pub use shard::restore_shard;

use crate::config::{ClockMode, Config, Durability, FencePreload, SAMPLE_FENCES};
use crate::events::{CompactEvent, EventLog, Interner, JSON_CACHE, LoggedEvent};
use crate::shard::{ShardStart, shard_of};
use crate::store::{CheckpointMeta, ShardPoint, Store};
use geodwell_core::engine::Restored;
use geodwell_core::event::{Event, EventId};
use geodwell_core::fences::{Fence, FenceLimits, parse_fences_str};
use geodwell_core::partition::ChangeLog;
use geodwell_core::time::Ts;

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
    /// The fence changes after the checkpoint, parsed (what a catch-up sends).
    pub fence_log: ChangeLog,
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
            shards_at: vec![ShardPoint::start(); cfg.shards],
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
            .map(|t| fences::parse_one(t, &cfg.data_dir).map(Arc::new))
            .collect::<Result<_, _>>()?
    } else {
        preload.into_iter().map(Arc::new).collect()
    };
    // The fence changes after the checkpoint, and the registry's view: the checkpoint's fences
    // with every change applied in order.
    let stored_fences = fences::parse(base, &snap.fence_changes, meta.fence_change, &cfg.data_dir)?;
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
            // Another shard count: every shard starts its (empty) log at the stored watermark.
            let at = if same_layout {
                meta.shard(k)
            } else {
                ShardPoint {
                    watermark: stored_w.map(|w| w.0),
                    ..ShardPoint::start()
                }
            };
            ShardPlan {
                devices: Vec::new(),
                seq: at.seq,
                watermark: at.watermark.map(Ts),
                recent: at.recent,
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
    let engine_cfg = cfg.engine_config(cfg.shards, store.is_some());
    // The event log's tail is rebuilt on a thread of its own while the shards restore and
    // replay: the two do not depend on each other until the replay's events are matched.
    let stored_events = std::mem::take(&mut snap.events);
    let (rebuilt, restored_log) = std::thread::scope(|scope| {
        let events = scope.spawn(|| {
            let t = Instant::now();
            let r = restore_log(cfg, &stored_events, next_seq, meta.event_floor);
            (r, t.elapsed())
        });
        let common = Common {
            engine_cfg: &engine_cfg,
            fences: &stored_fences.base,
            changes: &stored_fences.changes,
            fence_change: meta.fence_change,
            committed_w: stored_w,
            max_device_len: cfg.max_device_len,
            data_dir: &data_dir,
        };
        let rebuilt = rebuild(&common, per_shard);
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
    for mut r in rebuilt.shards {
        summary.replayed_records += r.records;
        summary.replayed_fixes += r.fixes;
        let ws = r.driver.engine().stats().wheel;
        summary.timers += ws.entries - ws.tombstones;
        // Events the store already holds keep their `seq` and are not published again.
        let replayed = r.driver.take_events();
        let all = replayed.len() as u64;
        let pending: Vec<Event> = replayed
            .into_iter()
            .filter(|e| !known.contains(&e.id))
            .collect();
        summary.replayed_new += pending.len() as u64;
        summary.replayed_known += all - pending.len() as u64;
        fence_catch_up.push(r.driver.fence_pos() + 1);
        committed.push(r.driver.applied());
        shards.push(ShardStart {
            driver: r.driver,
            pending,
            // Sent by the fence log's catch-up once the service runs (`fence_catch_up`).
            fences: ChangeLog::default(),
        });
    }
    if let Some(s) = &store {
        s.hold_replay_events_from(meta.event_floor);
    }
    Ok(Booted {
        store,
        log,
        fences: stored_fences.current.into_values().collect(),
        shards,
        next_fence_change: stored_fences.next_change,
        fences_since_checkpoint: stored_fences.since_checkpoint.into_iter().collect(),
        fence_catch_up,
        fence_log: stored_fences.changes,
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
