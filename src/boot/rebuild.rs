//! The engines rebuilt for a warm start: each shard's checkpointed devices restored, then its
//! input records after the checkpoint replayed, on a thread per shard.
//!
//! Invariant: a record is applied exactly as the shard applied it when it arrived: the engine is
//! first advanced to the watermark it had then, each fix is ingested with the watermark it
//! arrived under, and fence changes are applied where the shard applied them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::BootError;
use crate::store::RawDevice;
use crate::store::input::{ShardInput, decode_shard_input};
use geodwell_core::engine::{DeviceState, Engine, EngineConfig, Restored};
use geodwell_core::event::Event;
use geodwell_core::fences::Fence;
use geodwell_core::time::Ts;

/// What one shard starts from: its checkpointed devices, position and watermark, and its input
/// records after the checkpoint (in `seq` order).
#[derive(Debug)]
pub(super) struct ShardPlan {
    pub(super) devices: Vec<RawDevice>,
    pub(super) seq: u64,
    pub(super) watermark: Option<Ts>,
    pub(super) inputs: Vec<Vec<u8>>,
}

/// One shard rebuilt.
pub(super) struct RebuiltShard {
    pub(super) engine: Engine,
    pub(super) seq: u64,
    pub(super) fence_change: u64,
    pub(super) records: u64,
    pub(super) fixes: u64,
    pub(super) events: Vec<Event>,
    pub(super) restored: Restored,
}

/// Every shard rebuilt, and how long it took.
pub(super) struct Rebuilt {
    pub(super) shards: Vec<RebuiltShard>,
    pub(super) restored: Restored,
    pub(super) restore: Duration,
    pub(super) replay: Duration,
    pub(super) per_shard: Vec<Duration>,
}

/// Restores every shard from its checkpointed devices and replays its records, in parallel.
pub(super) fn rebuild(
    engine_cfg: &EngineConfig,
    fences: &[Arc<Fence>],
    changes: &BTreeMap<u64, Parsed>,
    fence_change: u64,
    plans: Vec<ShardPlan>,
    max_device_len: usize,
    data_dir: &std::path::Path,
) -> Result<Rebuilt, BootError> {
    let t0 = Instant::now();
    let restore_took = std::sync::Mutex::new(Duration::ZERO);
    type ShardResult = Result<(RebuiltShard, Duration), BootError>;
    let built: Vec<ShardResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = plans
            .into_iter()
            .map(|plan| {
                let restore_took = &restore_took;
                scope.spawn(move || -> ShardResult {
                    let t = Instant::now();
                    let mut engine = Engine::new(engine_cfg.clone());
                    let mut events = Vec::new();
                    for f in fences {
                        engine.upsert_fence(f.clone(), &mut events);
                    }
                    events.clear();
                    let devices: Vec<DeviceState> = plan
                        .devices
                        .iter()
                        .map(|d| {
                            d.decode().map_err(|e| {
                                BootError::Store(crate::store::StoreError::Decode {
                                    path: data_dir.join(crate::store::checkpoint::CHECKPOINT_FILE),
                                    table: "devices",
                                    key: d.id.clone(),
                                    detail: e.0,
                                })
                            })
                        })
                        .collect::<Result<_, _>>()?;
                    drop(plan.devices);
                    let restored = engine
                        .restore(devices, plan.watermark)
                        .map_err(|e| BootError::Corrupt(e.to_string()))?;
                    {
                        let mut r = restore_took.lock().unwrap_or_else(|p| p.into_inner());
                        *r = (*r).max(t.elapsed());
                    }
                    let mut shard = RebuiltShard {
                        engine,
                        seq: plan.seq,
                        fence_change,
                        records: 0,
                        fixes: 0,
                        events,
                        restored,
                    };
                    for rec in &plan.inputs {
                        replay(&mut shard, rec, changes, max_device_len)?;
                    }
                    Ok((shard, t.elapsed()))
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
    let restore = *restore_took.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Rebuilt {
        shards: Vec::with_capacity(built.len()),
        restored: Restored::default(),
        restore,
        replay: t0.elapsed().saturating_sub(restore),
        per_shard: Vec::with_capacity(built.len()),
    };
    for b in built {
        let (shard, took) = b?;
        out.per_shard.push(took);
        let r = shard.restored;
        out.restored.devices += r.devices;
        out.restored.pairs += r.pairs;
        out.restored.dropped_pairs += r.dropped_pairs;
        out.restored.buffered += r.buffered;
        out.shards.push(shard);
    }
    Ok(out)
}

/// Applies one input record to a shard's engine, exactly as the shard applied it.
fn replay(
    shard: &mut RebuiltShard,
    rec: &[u8],
    changes: &BTreeMap<u64, Parsed>,
    max_device_len: usize,
) -> Result<(), BootError> {
    let input = decode_shard_input(rec, max_device_len).map_err(|e| {
        BootError::Corrupt(format!(
            "input record {} after seq {}: {}",
            shard.records + 1,
            shard.seq,
            e.0
        ))
    })?;
    let engine = &mut shard.engine;
    match input {
        ShardInput::Fixes { w_before, fixes } => {
            if let Some(w) = w_before {
                engine.advance(w, &mut shard.events);
            }
            shard.fixes += fixes.len() as u64;
            for (fix, stamp) in &fixes {
                // The outcome (accepted, late, ...) was answered when the fix arrived.
                let _ = engine.ingest(fix, *stamp, &mut shard.events);
            }
        }
        ShardInput::Removed(r) => {
            crate::shard::apply_removal(engine, &r, &mut shard.events);
        }
        ShardInput::Fence(n) => {
            let change = changes.get(&n).ok_or_else(|| {
                BootError::Corrupt(format!(
                    "an input record applies fence change {n}, which the log does not hold"
                ))
            })?;
            match change {
                Parsed::Put(f) => {
                    engine.upsert_fence(f.clone(), &mut shard.events);
                }
                Parsed::Delete(id) => {
                    engine.remove_fence(id);
                }
            }
            shard.fence_change = n;
        }
    }
    shard.seq += 1;
    shard.records += 1;
    Ok(())
}

/// A fence change of the log, parsed.
#[derive(Debug)]
pub(super) enum Parsed {
    /// Insert or replace.
    Put(Arc<Fence>),
    /// Delete the fence with this id.
    Delete(String),
}
