//! The API's read copy of the fences ([`FenceMap`]): by id for listings and gets, and in a
//! spatial index for point and window queries.
//!
//! Invariants: the map by id and the index hold the same fences; every write changes both under
//! one write lock, so a reader never sees one without the other. A filtered page
//! ([`FenceMap::filtered_page`]) examines at most [`PAGE_SCAN`] fences, however many fences
//! there are and however many match, and says where the next page starts.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::telemetry as t;
use geodwell_core::fences::{Fence, FenceIndex, Rect};

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

/// Fences examined at most for one page of a filtered listing (`contains`, `bbox`).
pub const PAGE_SCAN: usize = 10_000;

/// One page of a filtered listing.
#[derive(Debug, Default)]
pub struct FilteredPage {
    /// The matching fences, in id order.
    pub fences: Vec<Stored>,
    /// Where the next page starts (`after`); `None` when no fence after this page matches.
    pub resume: Option<String>,
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
}

impl Inner {
    /// The first `limit` of `ids` (in id order) whose fence passes `test`, looking at no more
    /// than `examine` of them; `resume` is the last id looked at when ids were left.
    fn page_of<'a>(
        &self,
        ids: impl Iterator<Item = &'a str>,
        limit: usize,
        examine: usize,
        test: &impl Fn(&Fence) -> bool,
    ) -> FilteredPage {
        let mut page = FilteredPage::default();
        let mut ids = ids.peekable();
        let mut looked = 0usize;
        while let Some(id) = ids.next() {
            looked += 1;
            if let Some(s) = self.by_id.get(id)
                && test(&s.fence)
            {
                page.fences.push(s.clone());
            }
            let full = page.fences.len() == limit || looked == examine;
            if full && ids.peek().is_some() {
                page.resume = Some(id.to_string());
                break;
            }
        }
        page
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

    /// Up to `limit` fences after `after`, in id order, that have an envelope meeting one of
    /// `windows` and pass `test`, examining at most [`PAGE_SCAN`] fences. The windows' candidates
    /// come from the spatial index and are tested in id order; a window meeting more envelopes
    /// than that is read in id order from `after` instead, so a page's work stays bounded either
    /// way (a page may then hold fewer than `limit`, even none, with `resume` set).
    pub fn filtered_page(
        &self,
        windows: &[Rect],
        after: Option<&str>,
        limit: usize,
        test: impl Fn(&Fence) -> bool,
    ) -> FilteredPage {
        let r = self.read();
        let mut idx = Vec::new();
        let complete = windows
            .iter()
            .all(|w| r.index.envelope_hits(w, PAGE_SCAN, &mut idx) && idx.len() <= PAGE_SCAN);
        if complete {
            let mut ids: Vec<&str> = idx
                .into_iter()
                .filter_map(|i| r.index.get(i))
                .map(|f| &*f.id)
                .filter(|id| after.is_none_or(|a| *id > a))
                .collect();
            ids.sort_unstable();
            ids.dedup();
            r.page_of(ids.into_iter(), limit, usize::MAX, &test)
        } else {
            use std::ops::Bound;
            let from = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.to_string()));
            let ids = r
                .by_id
                .range::<String, _>((from, Bound::Unbounded))
                .map(|(id, _)| id.as_str());
            r.page_of(ids, limit, PAGE_SCAN, &test)
        }
    }
}
