//! The API's read copy of the fences ([`FenceMap`]): by id for listings and gets, and in a
//! spatial index for point and window queries.
//!
//! Invariant: the map by id and the index hold the same fences; every write changes both under
//! one write lock, so a reader never sees one without the other.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::telemetry as t;
use geodwell_core::fences::{Fence, FenceIdx, FenceIndex, Rect};

/// A fence in the read copy, with its normalized GeoJSON Feature text (rendered once, when it is
/// written: listings copy text instead of rendering every fence again for every reader).
#[derive(Debug, Clone)]
pub struct Stored {
    /// The fence.
    pub fence: Arc<Fence>,
    /// `serde_json::to_string(&fence.to_feature())`.
    pub json: Arc<str>,
}

impl Stored {
    /// A fence and its rendered Feature text.
    pub fn new(fence: Arc<Fence>) -> Stored {
        let json = serde_json::to_string(&fence.to_feature())
            .unwrap_or_default()
            .into();
        Stored { fence, json }
    }
}

/// The read copy of the fences: what the API lists, gets and queries by place. Written only by
/// whoever applies fence changes (the registry for one process; the fence log's follower in a
/// cluster).
#[derive(Debug, Default)]
pub struct FenceMap {
    read: RwLock<Inner>,
}

/// The fences by id, and the same fences in a spatial index (the engine's own [`FenceIndex`],
/// so that a point query answers exactly what the engine's containment test would). Both
/// always hold the same fences: every write changes both under the write lock.
#[derive(Debug, Default)]
struct Inner {
    by_id: BTreeMap<String, Stored>,
    index: FenceIndex,
}

impl Inner {
    fn of(map: BTreeMap<String, Stored>) -> Inner {
        let index = FenceIndex::from_fences(map.values().map(|s| s.fence.clone()));
        Inner { by_id: map, index }
    }

    /// The fences at `idx`, as stored, sorted by id.
    fn stored(&self, mut idx: Vec<FenceIdx>) -> Vec<Stored> {
        idx.sort_unstable();
        idx.dedup();
        let mut out: Vec<Stored> = idx
            .into_iter()
            .filter_map(|i| self.index.get(i))
            .filter_map(|f| self.by_id.get(&*f.id).cloned())
            .collect();
        out.sort_unstable_by(|a, b| a.fence.id.cmp(&b.fence.id));
        out
    }
}

impl FenceMap {
    /// A map holding `fences`.
    pub fn new(fences: &[Arc<Fence>]) -> FenceMap {
        let map = fences
            .iter()
            .map(|f| (f.id.to_string(), Stored::new(f.clone())))
            .collect::<BTreeMap<_, _>>();
        metrics::gauge!(t::FENCES).set(map.len() as f64);
        FenceMap {
            read: RwLock::new(Inner::of(map)),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the map half-written: writers only insert
        // or remove whole entries.
        self.read.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.read.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The fence `id`, with its Feature text.
    pub fn get(&self, id: &str) -> Option<Stored> {
        self.read().by_id.get(id).cloned()
    }

    /// Whether fence `id` exists.
    pub fn contains(&self, id: &str) -> bool {
        self.read().by_id.contains_key(id)
    }

    /// How many fences there are.
    pub fn len(&self) -> usize {
        self.read().by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.read().by_id.is_empty()
    }

    /// How many of `ids` are not held yet.
    pub fn count_new<'a>(&self, ids: impl Iterator<Item = &'a str>) -> usize {
        let map = self.read();
        ids.filter(|id| !map.by_id.contains_key(*id)).count()
    }

    /// Inserts or replaces a fence.
    pub fn insert(&self, s: Stored) {
        let n = {
            let mut w = self.write();
            w.index.upsert(s.fence.clone());
            w.by_id.insert(s.fence.id.to_string(), s);
            w.by_id.len()
        };
        metrics::gauge!(t::FENCES).set(n as f64);
    }

    /// Removes a fence.
    pub fn remove(&self, id: &str) {
        let n = {
            let mut w = self.write();
            w.index.remove(id);
            w.by_id.remove(id);
            w.by_id.len()
        };
        metrics::gauge!(t::FENCES).set(n as f64);
    }

    /// Replaces every fence at once (a cluster node loading a fence snapshot).
    pub fn replace_all(&self, fences: impl Iterator<Item = Arc<Fence>>) {
        let map: BTreeMap<String, Stored> =
            fences.map(|f| (f.id.to_string(), Stored::new(f))).collect();
        let n = map.len();
        *self.write() = Inner::of(map);
        metrics::gauge!(t::FENCES).set(n as f64);
    }

    /// Every fence, sorted by id.
    pub fn list(&self) -> Vec<Arc<Fence>> {
        self.read()
            .by_id
            .values()
            .map(|s| s.fence.clone())
            .collect()
    }

    /// Up to `limit` fences with ids after `after` (from the first without), sorted by id.
    pub fn page(&self, after: Option<&str>, limit: usize) -> Vec<Stored> {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.to_string()));
        self.read()
            .by_id
            .range((from, Bound::Unbounded))
            .take(limit)
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// Every fence that contains (lon, lat) by the engine's own test (boundary inclusive,
    /// circles by haversine distance, ±180 one meridian), sorted by id.
    pub fn containing(&self, lon: f64, lat: f64) -> Vec<Stored> {
        let r = self.read();
        let mut idx = Vec::new();
        r.index.containing(lon, lat, &mut idx);
        r.stored(idx)
    }

    /// Every fence that shares a point with any of `windows` ([`Fence::meets_rect`]), sorted
    /// by id.
    pub fn meeting(&self, windows: &[Rect]) -> Vec<Stored> {
        let r = self.read();
        let mut idx = Vec::new();
        for w in windows {
            r.index.meeting(w, &mut idx);
        }
        r.stored(idx)
    }
}
