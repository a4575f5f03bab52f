//! Fence model, validation, R-tree index and exact tests (API skeleton; implementation lands with
//! the fence work).

use std::sync::Arc;

use crate::core::time::Dur;

/// Dense index of a fence inside one [`FenceIndex`]; stable while the fence exists (a replace with
/// the same id keeps it), reusable after removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FenceIdx(pub u32);

/// Per-fence tuning of the pair state machine (DESIGN section 3).
#[derive(Debug, Clone, PartialEq)]
pub struct FenceSettings {
    /// Dwell thresholds, ascending, distinct, at most [`MAX_THRESHOLDS`].
    pub dwell: Vec<Dur>,
    /// Hysteresis: metres outside the fence before a fix counts as outside for an INSIDE pair.
    pub exit_buffer_m: f64,
    /// Consecutive inside fixes needed for ENTER (>= 1).
    pub enter_confirm: u8,
    /// Consecutive outside fixes needed for EXIT (>= 1).
    pub exit_confirm: u8,
    /// Largest event-time gap between two fixes of one confirmation run.
    pub confirm_within: Dur,
    /// A device whose latest fix at a deadline is older than this is STALE; `None` = off.
    pub stale_after: Option<Dur>,
    /// Fixes less accurate than this (metres) are ignored for this fence; `None` = off.
    pub max_accuracy_m: Option<f64>,
    /// Free-form tags copied onto every event of this fence (JSON object or array).
    pub tags: serde_json::Value,
}

/// Most dwell thresholds one fence may carry.
pub const MAX_THRESHOLDS: usize = 16;

/// One validated fence.
#[derive(Debug)]
pub struct Fence {
    /// The fence id.
    pub id: Arc<str>,
    /// Its tuning.
    pub settings: FenceSettings,
}

impl Fence {
    /// Boundary-inclusive containment of (lon, lat).
    pub fn contains(&self, lon: f64, lat: f64) -> bool {
        let _ = (lon, lat);
        todo!()
    }
    /// Metres from (lon, lat) to the fence; 0 inside.
    pub fn distance_m(&self, lon: f64, lat: f64) -> f64 {
        let _ = (lon, lat);
        todo!()
    }
}

/// The set of fences with an R-tree over their envelopes.
#[derive(Debug, Clone, Default)]
pub struct FenceIndex {}

impl FenceIndex {
    /// An empty index.
    pub fn new() -> FenceIndex {
        FenceIndex {}
    }
    /// Inserts or replaces (same id keeps its idx); returns the idx and the replaced fence.
    pub fn upsert(&mut self, fence: Arc<Fence>) -> (FenceIdx, Option<Arc<Fence>>) {
        let _ = fence;
        todo!()
    }
    /// Removes a fence by id.
    pub fn remove(&mut self, id: &str) -> Option<(FenceIdx, Arc<Fence>)> {
        let _ = id;
        todo!()
    }
    /// The fence at `idx`.
    pub fn get(&self, idx: FenceIdx) -> Option<&Arc<Fence>> {
        let _ = idx;
        todo!()
    }
    /// The idx of fence `id`.
    pub fn idx_of(&self, id: &str) -> Option<FenceIdx> {
        let _ = id;
        todo!()
    }
    /// Appends fences whose envelope contains (lon, lat); no exact test.
    pub fn candidates(&self, lon: f64, lat: f64, out: &mut Vec<FenceIdx>) {
        let _ = (lon, lat, out);
        todo!()
    }
}
