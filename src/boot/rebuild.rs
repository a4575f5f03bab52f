//! The partitions rebuilt for a warm start, on the runtime's one restore path
//! ([`Driver::restore`], then [`Driver::apply`] for each record after the checkpoint, as a
//! cluster's takeover does), on a thread per partition.
//!
//! Invariant: a record is applied exactly as the partition applied it when it arrived: the
//! engine is first advanced to the watermark it had then, each fix is ingested with the
//! watermark it arrived under, and fence changes are applied where the partition applied them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::BootError;
use crate::store::RawDevice;
use geodwell_core::engine::{DeviceState, EngineConfig, Restored};
use geodwell_core::fences::Fence;
use geodwell_core::partition::{ChangeLog, Driver, Frozen, Input, record};
use geodwell_core::time::Ts;

/// What one partition starts from: its checkpointed devices, position and watermark, and its
/// input records after the checkpoint (in position order).
#[derive(Debug)]
pub(super) struct ShardPlan {
    pub(super) devices: Vec<RawDevice>,
    pub(super) seq: u64,
    pub(super) watermark: Option<Ts>,
    /// The parts the partition applied lately, at the checkpoint.
    pub(super) recent: Arc<[u64]>,
    pub(super) inputs: Vec<Vec<u8>>,
}

/// One partition rebuilt.
pub(super) struct RebuiltShard {
    pub(super) driver: Driver,
    pub(super) records: u64,
    pub(super) fixes: u64,
    pub(super) restored: Restored,
}

/// Every partition rebuilt, and how long it took.
pub(super) struct Rebuilt {
    pub(super) shards: Vec<RebuiltShard>,
    pub(super) restored: Restored,
    pub(super) restore: Duration,
    pub(super) replay: Duration,
    pub(super) per_shard: Vec<Duration>,
}

/// What every partition is rebuilt from besides its own plan.
pub(super) struct Common<'a> {
    pub(super) engine_cfg: &'a EngineConfig,
    /// The fence set at the checkpoint's fence position `fence_change`.
    pub(super) fences: &'a [Arc<Fence>],
    /// The fence log after it.
    pub(super) changes: &'a ChangeLog,
    pub(super) fence_change: u64,
    /// The watermark the store committed: a partition is advanced to it after its records,
    /// so that the events of the advances between and after records (which are not records of
    /// their own) come out of the rebuild too, and those already stored are known as such.
    pub(super) committed_w: Option<Ts>,
    pub(super) max_device_len: usize,
    pub(super) data_dir: &'a std::path::Path,
}

/// Restores every partition from its checkpointed devices and replays its records, in
/// parallel.
pub(super) fn rebuild(c: &Common<'_>, plans: Vec<ShardPlan>) -> Result<Rebuilt, BootError> {
    let Common {
        engine_cfg,
        fences,
        changes,
        fence_change,
        committed_w,
        max_device_len,
        data_dir,
    } = *c;
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
                    let devices = decode(&plan.devices, data_dir)?;
                    let at = Frozen {
                        position: plan.seq,
                        fence_pos: fence_change,
                        watermark: plan.watermark,
                        recent: plan.recent.clone(),
                    };
                    let (driver, restored) =
                        Driver::restore(engine_cfg.clone(), fences.iter().cloned(), devices, at)
                            .map_err(|e| BootError::Corrupt(e.to_string()))?;
                    {
                        let mut r = restore_took.lock().unwrap_or_else(|p| p.into_inner());
                        *r = (*r).max(t.elapsed());
                    }
                    let mut shard = RebuiltShard {
                        driver,
                        records: 0,
                        fixes: 0,
                        restored,
                    };
                    for rec in &plan.inputs {
                        replay(&mut shard, rec, changes, max_device_len)?;
                    }
                    if let Some(w) = committed_w {
                        let mut carried = shard.driver.advance(w);
                        while carried {
                            carried = shard.driver.work_off();
                        }
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

/// The checkpoint's device records, decoded.
fn decode(raw: &[RawDevice], data_dir: &std::path::Path) -> Result<Vec<DeviceState>, BootError> {
    raw.iter()
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
        .collect()
}

/// Applies one input record to a partition, exactly as it was applied when it arrived.
fn replay(
    shard: &mut RebuiltShard,
    rec: &[u8],
    changes: &ChangeLog,
    max_device_len: usize,
) -> Result<(), BootError> {
    let pos = shard.driver.applied() + 1;
    let input = record::decode(rec, max_device_len)
        .map_err(|e| BootError::Corrupt(format!("input record {pos}: {e}")))?;
    if let Input::Fixes { fixes, .. } = &input {
        shard.fixes += fixes.len() as u64;
    }
    // The outcomes (accepted, late, ...) were answered when the record arrived.
    shard
        .driver
        .apply(pos, &input, 0, changes)
        .map_err(|e| BootError::Corrupt(format!("input record {pos}: {e}")))?;
    shard.records += 1;
    Ok(())
}
