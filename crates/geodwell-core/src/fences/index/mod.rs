//! The fence index: stable [`FenceIdx`] slots by id, an R-tree of fence envelopes (the source
//! of truth, updated in place), and a flat point grid derived from it that answers point queries.
//!
//! Invariants:
//! - `slots[i]` is `Some` exactly for live fences, and `by_id` maps each live id to its slot.
//! - The R-tree holds exactly the entries listed in each live slot (one per polygon part, one or
//!   two per circle), so a replace or remove takes out precisely what the insert put in: no
//!   rebuild, O(log n) per envelope.
//! - Freed slots are reused last-freed-first, so the same sequence of changes gives the same
//!   idx assignment (determinism of the engine).
//! - The point grid, when built, reports for every point exactly the entries the R-tree would
//!   (see [`PointGrid`]): changes are patched into it (killed records, pending records) and after
//!   [`MAX_PENDING`](point_grid::MAX_PENDING) additions or enough kills it is dropped and rebuilt
//!   by the next query.
//!
//! The point grid lives in `point_grid`; this module keeps the ids, the slots and the R-tree.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use rstar::{AABB, RStarInsertionStrategy, RTree, RTreeObject, RTreeParams};

use super::edges::{PolyPart, contains_flat, f32_down, f32_up};
use super::{Fence, FenceIdx, Shape};

mod point_grid;

use point_grid::PointGrid;

/// Node sizes tuned for point queries over ~10^4 envelopes: wider nodes than rstar's default
/// (6) mean a shallower tree and fewer pointer hops per query.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params;

impl RTreeParams for Params {
    const MIN_SIZE: usize = 4;
    const MAX_SIZE: usize = 12;
    const REINSERTION_COUNT: usize = 3;
    type DefaultInsertionStrategy = RStarInsertionStrategy;
}

/// One envelope of one fence in the R-tree. It carries the fence itself so that the hot path
/// (`containing`) runs the exact test straight from the tree visit, without a slot lookup.
#[derive(Debug, Clone)]
struct Entry {
    /// The envelope rounded outward to `f32`: half the bytes per tree node scanned, and still a
    /// superset of the exact envelope for every `f64` point (see [`f32_point`]).
    env: AABB<[f32; 2]>,
    idx: u32,
    /// Polygon part index (0 for circles).
    part: u32,
    /// Whether the fence has several entries (its idx may be hit twice by one query).
    multi: bool,
    geom: Geom,
}

/// The query point in `f32` (round to nearest). If `lo <= x <= hi` in `f64` then
/// `f32_down(lo) <= x as f32 <= f32_up(hi)`, because rounding is monotone and the bounds are
/// representable: the index never misses a fence, and may add one whose envelope is within an
/// `f32` ulp (about a metre at most) of the point, which the exact test then rejects.
#[inline(always)]
fn f32_point(lon: f64, lat: f64) -> [f32; 2] {
    [lon as f32, lat as f32]
}

/// What an entry's exact test runs on.
#[derive(Debug, Clone)]
enum Geom {
    /// A small polygon part's flat buffer (plain scan, one pointer hop).
    Flat(Arc<[f64]>),
    /// A large polygon part (edge grid).
    Part(Arc<PolyPart>),
    /// A circle (any of its envelopes): tested through the fence.
    Circle(Arc<Fence>),
}

impl Geom {
    /// The exact, boundary-inclusive test of the piece this entry bounds.
    #[inline(always)]
    fn contains(&self, lon: f64, lat: f64) -> bool {
        match self {
            Geom::Flat(flat) => contains_flat(flat, lon, lat),
            Geom::Part(p) => p.contains(lon, lat),
            Geom::Circle(f) => f.contains_piece(0, lon, lat),
        }
    }
}

impl PartialEq for Entry {
    /// Identity for removal: the same slot's same envelope.
    fn eq(&self, other: &Entry) -> bool {
        self.idx == other.idx && self.part == other.part && self.env == other.env
    }
}

impl RTreeObject for Entry {
    type Envelope = AABB<[f32; 2]>;
    fn envelope(&self) -> Self::Envelope {
        self.env
    }
}

#[derive(Clone)]
struct Slot {
    fence: Arc<Fence>,
    entries: Vec<Entry>,
}

/// The set of fences with an R-tree over their envelopes.
#[derive(Clone, Default)]
pub struct FenceIndex {
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    by_id: HashMap<Arc<str>, u32>,
    /// Source of truth for the entries (updated in place by upsert / remove).
    tree: RTree<Entry, Params>,
    /// Point-location accelerator derived from the entries: built by `from_fences` or by the
    /// first query, patched by upsert / remove until the patches wear it out, then dropped and
    /// rebuilt by the next query (see [`PointGrid`]).
    grid: OnceLock<PointGrid>,
}

impl fmt::Debug for FenceIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The tree itself would print every envelope; the size says what matters.
        f.debug_struct("FenceIndex")
            .field("fences", &self.by_id.len())
            .field("envelopes", &self.tree.size())
            .field("slots", &self.slots.len())
            .finish()
    }
}

fn entries_of(fence: &Arc<Fence>, idx: u32) -> Vec<Entry> {
    let envs = fence.envelopes();
    let multi = envs.len() > 1;
    let parts: &[Arc<PolyPart>] = match &fence.shape {
        Shape::Polygons { parts, .. } => parts,
        Shape::Circle(_) => &[],
    };
    envs.into_iter()
        .enumerate()
        .map(|(i, e)| Entry {
            env: AABB::from_corners(
                [f32_down(e[0]), f32_down(e[1])],
                [f32_up(e[2]), f32_up(e[3])],
            ),
            idx,
            part: i as u32,
            multi,
            geom: match parts.get(i) {
                Some(p) => match p.plain_flat() {
                    Some(flat) => Geom::Flat(flat.clone()),
                    None => Geom::Part(p.clone()),
                },
                None => Geom::Circle(fence.clone()),
            },
        })
        .collect()
}

impl FenceIndex {
    /// An empty index.
    pub fn new() -> FenceIndex {
        FenceIndex::default()
    }

    /// Builds an index from many fences at once (warm start, bulk load): the R-tree is
    /// packed by rstar's bulk loader, which gives a better tree than one insert per fence.
    /// Later fences replace earlier ones with the same id. Idx are assigned in order.
    pub fn from_fences(fences: impl IntoIterator<Item = Arc<Fence>>) -> FenceIndex {
        let mut ix = FenceIndex::new();
        for fence in fences {
            let idx = match ix.by_id.get(&fence.id) {
                Some(&i) => i,
                None => {
                    ix.slots.push(None);
                    (ix.slots.len() - 1) as u32
                }
            };
            let entries = entries_of(&fence, idx);
            ix.by_id.insert(fence.id.clone(), idx);
            ix.slots[idx as usize] = Some(Slot { fence, entries });
        }
        let all: Vec<Entry> = ix
            .slots
            .iter()
            .flatten()
            .flat_map(|s| s.entries.iter().cloned())
            .collect();
        ix.tree = RTree::bulk_load_with_params(all);
        let _ = ix.grid.set(PointGrid::build(&ix.slots));
        ix
    }

    /// Inserts or replaces (same id keeps its idx); returns the idx and the replaced fence.
    pub fn upsert(&mut self, fence: Arc<Fence>) -> (FenceIdx, Option<Arc<Fence>>) {
        let idx = match self.by_id.get(&fence.id) {
            Some(&i) => i,
            None => match self.free.pop() {
                Some(i) => i,
                None => {
                    self.slots.push(None);
                    (self.slots.len() - 1) as u32
                }
            },
        };
        let old = self.slots[idx as usize].take().map(|slot| {
            for e in &slot.entries {
                self.tree.remove(e);
            }
            if let Some(g) = self.grid.get_mut() {
                g.kill(idx, &slot.entries);
            }
            slot.fence
        });
        let entries = entries_of(&fence, idx);
        for e in &entries {
            self.tree.insert(e.clone());
        }
        if let Some(g) = self.grid.get_mut() {
            g.add(&entries);
        }
        self.grid_changed();
        self.by_id.insert(fence.id.clone(), idx);
        self.slots[idx as usize] = Some(Slot { fence, entries });
        (FenceIdx(idx), old)
    }

    /// Removes a fence by id.
    pub fn remove(&mut self, id: &str) -> Option<(FenceIdx, Arc<Fence>)> {
        let idx = self.by_id.remove(id)?;
        let slot = self.slots.get_mut(idx as usize)?.take()?;
        for e in &slot.entries {
            self.tree.remove(e);
        }
        if let Some(g) = self.grid.get_mut() {
            g.kill(idx, &slot.entries);
        }
        self.grid_changed();
        self.free.push(idx);
        Some((FenceIdx(idx), slot.fence))
    }

    /// The fence at `idx`.
    pub fn get(&self, idx: FenceIdx) -> Option<&Arc<Fence>> {
        self.slots
            .get(idx.0 as usize)
            .and_then(|s| s.as_ref())
            .map(|s| &s.fence)
    }

    /// The idx of fence `id`.
    pub fn idx_of(&self, id: &str) -> Option<FenceIdx> {
        self.by_id.get(id).map(|&i| FenceIdx(i))
    }

    /// Number of fences.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are no fences.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Every fence with its idx, in idx order.
    pub fn iter(&self) -> impl Iterator<Item = (FenceIdx, &Arc<Fence>)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (FenceIdx(i as u32), &s.fence)))
    }

    /// Size of the point grid that answers point queries (built now if a change dropped it):
    /// `(cells, records, heap bytes)` over all its levels, records counting pending and killed
    /// ones. For memory accounting and benchmarks.
    pub fn point_grid_size(&self) -> (usize, usize, usize) {
        self.grid().size()
    }

    /// Number of envelopes in the R-tree (one per polygon part; one or two per circle).
    pub fn envelope_count(&self) -> usize {
        self.tree.size()
    }

    /// Appends fences whose envelope contains (lon, lat); no exact test. Each fence appears at
    /// most once per call, in no particular order. Longitudes ±180 are the same meridian.
    pub fn candidates(&self, lon: f64, lat: f64, out: &mut Vec<FenceIdx>) {
        let start = out.len();
        self.collect(lon, lat, start, out);
        if lon.abs() == 180.0 {
            self.collect(-lon, lat, start, out);
            // The second pass may repeat any fence touching both sides of the meridian.
            let mut i = start;
            while i < out.len() {
                if out[start..i].contains(&out[i]) {
                    out.remove(i);
                } else {
                    i += 1;
                }
            }
        }
    }

    /// Drops the point grid once the changes patched into it would slow queries down (too
    /// many pending entries scanned per query) or waste too much of it (tombstones); the next
    /// query rebuilds it.
    fn grid_changed(&mut self) {
        if self.grid.get_mut().is_some_and(|g| g.worn_out()) {
            self.grid.take();
        }
    }

    /// The point grid, built now if a change dropped it.
    #[inline]
    fn grid(&self) -> &PointGrid {
        self.grid.get_or_init(|| PointGrid::build(&self.slots))
    }

    fn collect(&self, lon: f64, lat: f64, start: usize, out: &mut Vec<FenceIdx>) {
        self.grid().for_each_hit(lon, lat, |r| {
            let idx = FenceIdx(r.idx);
            // Only multi-envelope fences can repeat; they are rare, the scan is short.
            if !(r.multi() && out[start..].contains(&idx)) {
                out.push(idx);
            }
        });
    }

    /// [`FenceIndex::candidates`] answered by the R-tree instead of the grid (tests: the two
    /// must give the same set).
    #[cfg(test)]
    pub(crate) fn candidates_rtree(&self, lon: f64, lat: f64, out: &mut Vec<FenceIdx>) {
        for lon in [lon, -lon] {
            let _ = self.tree.locate_in_envelope_intersecting_int(
                AABB::from_point(f32_point(lon, lat)),
                |e| {
                    if !out.contains(&FenceIdx(e.idx)) {
                        out.push(FenceIdx(e.idx));
                    }
                    std::ops::ControlFlow::<()>::Continue(())
                },
            );
            if lon.abs() != 180.0 {
                break;
            }
        }
    }

    /// Appends the fences with an envelope that meets the closed rectangle `r` (no exact test;
    /// a fence may come more than once), stopping after `cap` envelopes. Returns whether every
    /// such envelope was seen, so that a caller can bound its work and fall back to another
    /// order when a window meets too many.
    pub fn envelope_hits(&self, r: &super::Rect, cap: usize, out: &mut Vec<FenceIdx>) -> bool {
        let window = AABB::from_corners(
            [f32_down(r.min_lon), f32_down(r.min_lat)],
            [f32_up(r.max_lon), f32_up(r.max_lat)],
        );
        let mut seen = 0usize;
        let stopped = self
            .tree
            .locate_in_envelope_intersecting_int(window, |e| {
                if seen == cap {
                    return std::ops::ControlFlow::Break(());
                }
                seen += 1;
                out.push(FenceIdx(e.idx));
                std::ops::ControlFlow::Continue(())
            })
            .is_break();
        !stopped
    }

    /// Appends fences that share a point with the closed rectangle `r` (envelopes from the
    /// R-tree, then [`Fence::meets_rect`]), each at most once, in no particular order.
    pub fn meeting(&self, r: &super::Rect, out: &mut Vec<FenceIdx>) {
        let window = AABB::from_corners(
            [f32_down(r.min_lon), f32_down(r.min_lat)],
            [f32_up(r.max_lon), f32_up(r.max_lat)],
        );
        let mut hits: Vec<u32> = self
            .tree
            .locate_in_envelope_intersecting(window)
            .map(|e| e.idx)
            .collect();
        // A fence with several envelopes may be hit once per envelope.
        hits.sort_unstable();
        hits.dedup();
        for i in hits {
            if let Some(Some(slot)) = self.slots.get(i as usize)
                && slot.fence.meets_rect(r)
            {
                out.push(FenceIdx(i));
            }
        }
    }

    /// Appends fences that contain (lon, lat) (candidates + exact boundary-inclusive test),
    /// each at most once. One point-grid lookup: each envelope hit is tested against just the
    /// polygon part it bounds.
    pub fn containing(&self, lon: f64, lat: f64, out: &mut Vec<FenceIdx>) {
        let start = out.len();
        self.contain_pass(lon, lat, start, false, out);
        if lon.abs() == 180.0 {
            self.contain_pass(-lon, lat, start, true, out);
        }
    }

    fn contain_pass(
        &self,
        lon: f64,
        lat: f64,
        start: usize,
        second: bool,
        out: &mut Vec<FenceIdx>,
    ) {
        let grid = self.grid();
        grid.for_each_hit(lon, lat, |r| {
            let idx = FenceIdx(r.idx);
            let seen = (r.multi() || second) && out[start..].contains(&idx);
            if !seen && grid.geom(r).contains(lon, lat) {
                out.push(idx);
            }
        });
    }
}
