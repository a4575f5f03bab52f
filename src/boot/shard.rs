//! One partition of this process rebuilt alone from the store, while the others run: after a
//! failed commit, the partition's engine holds steps the log does not, and it starts again from
//! what is durable (its checkpointed devices and its records after the checkpoint), on the same
//! restore path as a warm start.

use std::collections::HashSet;
use std::sync::Arc;

use super::error::BootError;
use super::fences;
use super::rebuild::{Common, ShardPlan, rebuild};
use crate::config::{ClockMode, Config};
use crate::shard::{ShardStart, shard_of};
use crate::store::Store;
use geodwell_core::event::Event;
use geodwell_core::fences::Fence;
use geodwell_core::partition::ChangeLog;
use geodwell_core::time::Ts;

/// Rebuilds partition `k` (of `cfg.shards`) from `store`, with the events its replay made that
/// the store does not hold (published first).
pub fn restore_shard(cfg: &Config, store: &Store, k: usize) -> Result<ShardStart, BootError> {
    let snap = store.load(cfg.log_capacity)?;
    let ck = snap.checkpoint;
    let meta = ck.meta;
    let base: Vec<Arc<Fence>> = ck
        .fences
        .iter()
        .map(|t| fences::parse_one(t, &cfg.data_dir).map(Arc::new))
        .collect::<Result<_, _>>()?;
    let stored = fences::parse(base, &snap.fence_changes, meta.fence_change, &cfg.data_dir)?;
    let at = meta.shard(k);
    let plan = ShardPlan {
        devices: ck
            .devices
            .into_iter()
            .filter(|d| shard_of(&d.id, cfg.shards) == k)
            .collect(),
        seq: at.seq,
        watermark: at.watermark.map(Ts),
        recent: at.recent,
        inputs: snap
            .inputs
            .into_iter()
            .filter(|(shard, _, _)| usize::from(*shard) == k)
            .map(|(_, _, rec)| rec)
            .collect(),
    };
    let engine_cfg = cfg.engine_config(cfg.shards, true);
    let committed_w = match cfg.clock {
        ClockMode::Live => snap.watermark.map(Ts),
        ClockMode::Event => snap.max_seen.map(|m| Ts(m).minus(cfg.lateness)),
    };
    let common = Common {
        engine_cfg: &engine_cfg,
        fences: &stored.base,
        changes: &stored.changes,
        fence_change: meta.fence_change,
        committed_w,
        max_device_len: cfg.max_device_len,
        data_dir: &cfg.data_dir,
    };
    let mut rebuilt = rebuild(&common, vec![plan])?;
    let mut shard = rebuilt
        .shards
        .pop()
        .ok_or_else(|| BootError::Corrupt("no partition rebuilt".into()))?;
    let mut known = HashSet::new();
    for (seq, json) in snap.events.iter().filter(|(s, _)| *s >= meta.event_floor) {
        let e: Event = serde_json::from_str(json)
            .map_err(|e| BootError::Corrupt(format!("stored event {seq}: {e}")))?;
        known.insert(e.id);
    }
    let pending = shard
        .driver
        .take_events()
        .into_iter()
        .filter(|e| !known.contains(&e.id))
        .collect();
    let after = shard.driver.fence_pos() + 1;
    let fences = ChangeLog(
        stored
            .changes
            .0
            .range(after..)
            .map(|(&n, u)| (n, u.clone()))
            .collect(),
    );
    Ok(ShardStart {
        driver: shard.driver,
        pending,
        fences,
    })
}
