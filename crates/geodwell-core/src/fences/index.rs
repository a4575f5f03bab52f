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
//!   [`MAX_PENDING`] additions or enough kills it is dropped and rebuilt by the next query.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use rstar::{AABB, RStarInsertionStrategy, RTree, RTreeObject, RTreeParams};

use super::edges::{PolyPart, contains_flat, f32_down, f32_up};
use super::{Fence, FenceIdx, Shape};

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
    /// Point-location accelerator derived from the entries: built by `from_fences`, dropped by
    /// every upsert / remove and rebuilt on the next query (see [`PointGrid`]).
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
        let mut g = Some(self.grid());
        let (mut cells, mut recs, mut bytes) = (0, 0, 0);
        while let Some(l) = g {
            let n = l.recs.len() + l.big.len() + l.pending.len();
            cells += l.nx * l.ny;
            recs += n;
            bytes += l.offs.len() * 4
                + n * std::mem::size_of::<Rec>()
                + l.geoms.len() * std::mem::size_of::<Geom>();
            g = l.next.as_deref();
        }
        (cells, recs, bytes)
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
        if let Some(g) = self.grid.get_mut()
            && (g.pending.len() > MAX_PENDING || g.dead > MAX_PENDING.max(g.filed / 8))
        {
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
            if !seen && grid.geoms[r.geom_ix()].contains(lon, lat) {
                out.push(idx);
            }
        });
    }
}

/// One entry as the point grid stores it: the envelope inline (the same outward-rounded `f32`
/// bounds as the R-tree entry, so the grid's candidates are exactly the tree's), the fence idx,
/// and where the geometry for the exact test is. Most candidates of a cell are rejected on the
/// inline envelope, without touching their geometry. 24 bytes, plain data: a rebuild copies
/// records without touching reference counts.
#[derive(Clone, Copy, PartialEq)]
struct Rec {
    /// `[min_lon, min_lat, max_lon, max_lat]`.
    env: [f32; 4],
    idx: u32,
    /// Index into the grid's `geoms`; top bit: the fence has several entries.
    geom: u32,
}

const MULTI_BIT: u32 = 1 << 31;

fn env_of(e: &Entry) -> [f32; 4] {
    [
        e.env.lower()[0],
        e.env.lower()[1],
        e.env.upper()[0],
        e.env.upper()[1],
    ]
}

impl Rec {
    fn of(e: &Entry, geom: usize) -> Rec {
        Rec {
            env: env_of(e),
            idx: e.idx,
            geom: geom as u32 | if e.multi { MULTI_BIT } else { 0 },
        }
    }

    #[inline(always)]
    fn multi(&self) -> bool {
        self.geom & MULTI_BIT != 0
    }

    #[inline(always)]
    fn geom_ix(&self) -> usize {
        (self.geom & !MULTI_BIT) as usize
    }

    /// Same predicate as rstar's envelope intersection with a point envelope.
    #[inline(always)]
    fn hit(&self, p: [f32; 2]) -> bool {
        self.env[0] <= p[0] && p[0] <= self.env[2] && self.env[1] <= p[1] && p[1] <= self.env[3]
    }

    fn width(&self) -> f64 {
        f64::from(self.env[2]) - f64::from(self.env[0])
    }

    fn height(&self) -> f64 {
        f64::from(self.env[3]) - f64::from(self.env[1])
    }
}

/// Cell side as a multiple of the median envelope side (width and height separately).
/// Measured on the benchmark's two mixes (`docs/bench-fences.md`).
const CELL_FACTOR: f64 = 2.0;
/// Envelopes wider or taller than this many median sides are not filed in the cells; they go
/// to the next, coarser level (or, when few, to a list tested on every query).
const OUTLIER_FACTOR: f64 = 64.0;
/// An envelope covering more cells than this is not filed either (same treatment as outliers).
const MAX_CELLS_PER_REC: usize = 256;
/// Cells per entry at most (the grid gets coarser beyond), and the absolute cap.
const CELLS_PER_REC: usize = 16;
const MAX_CELLS: usize = 1 << 22;
/// Up to this many unfiled entries are kept as a plain list; more get a coarser grid level.
const MAX_BIG_LIST: usize = 32;

/// Point-location accelerator: a uniform grid over the bounding box of the (non-outlier) entry
/// envelopes, in CSR layout (`offs` + one contiguous `recs` array), each cell listing every
/// entry whose `f32` envelope meets the cell. A query is one offset lookup and a short
/// contiguous scan, instead of an R-tree descent of dependent node visits.
///
/// Exactness: cells are preimages of the monotone maps `col_of` / `row_of` (correctly rounded
/// subtraction and multiplication, then truncation) evaluated on `f32` values; the query maps its
/// `f32`-rounded point, so a point with `lo <= p <= hi` (the tree's own test, in `f32`) lies in a
/// cell between the cells of `lo` and `hi`, where the entry is filed. Hence every entry the
/// R-tree would report is found, and the inline test is the tree's test: the candidate sets are
/// equal (tested), only their order differs (cell order = idx order).
///
/// The grid is derived data; the R-tree stays the source of truth. Changes are patched in: a
/// removed or replaced fence's records are killed in place (their envelope made empty), new
/// entries go to `pending`, scanned on every query. After [`MAX_PENDING`] additions, or when
/// killed records exceed an eighth of the filed ones, the index drops the grid and the next
/// query rebuilds it (`O(entries x cells per entry)`: about 1 ms for 10,000 small fences, so
/// about 12 µs per change amortized).
#[derive(Clone)]
pub(crate) struct PointGrid {
    x0: f64,
    y0: f64,
    /// Cells per degree, or 0 for a single column / row.
    inv_w: f64,
    inv_h: f64,
    nx: usize,
    ny: usize,
    /// `recs[offs[k]..offs[k + 1]]` are cell `k = row * nx + col`'s entries.
    offs: Vec<u32>,
    recs: Vec<Rec>,
    /// Entries not filed in cells (outliers), tested on every query.
    big: Vec<Rec>,
    /// A coarser level for the outliers when there are many of them.
    next: Option<Box<PointGrid>>,
    /// Entries added since the build (top level only), tested on every query.
    pending: Vec<Rec>,
    /// The geometry of every record (top level only; the coarser levels index into it).
    geoms: Vec<Geom>,
    /// Records filed at build time (all levels), and how many have been killed since.
    filed: usize,
    dead: usize,
}

/// Changes patched into a built grid before it is dropped and rebuilt on the next query: at
/// most this many pending entries are scanned per query.
const MAX_PENDING: usize = 64;

/// A killed record's envelope: no point is in it (not even NaN), so queries skip it.
const DEAD_ENV: [f32; 4] = [
    f32::INFINITY,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NEG_INFINITY,
];

impl PointGrid {
    fn empty() -> PointGrid {
        PointGrid {
            x0: 0.0,
            y0: 0.0,
            inv_w: 0.0,
            inv_h: 0.0,
            nx: 1,
            ny: 1,
            offs: vec![0, 0],
            recs: Vec::new(),
            big: Vec::new(),
            next: None,
            pending: Vec::new(),
            geoms: Vec::new(),
            filed: 0,
            dead: 0,
        }
    }

    /// Kills every record of fence `idx` filed for these entries (all levels, and pending).
    fn kill(&mut self, idx: u32, entries: &[Entry]) {
        self.pending.retain(|r| r.idx != idx);
        let mut killed = 0;
        for e in entries {
            let env = env_of(e);
            let mut g = &mut *self;
            loop {
                let (c0, c1) = (g.col_of(env[0]), g.col_of(env[2]));
                let (r0, r1) = (g.row_of(env[1]), g.row_of(env[3]));
                for row in r0..=r1 {
                    let (a, b) = (g.offs[row * g.nx + c0], g.offs[row * g.nx + c1 + 1]);
                    for r in &mut g.recs[a as usize..b as usize] {
                        if r.idx == idx && r.env != DEAD_ENV {
                            r.env = DEAD_ENV;
                            killed += 1;
                        }
                    }
                }
                for r in &mut g.big {
                    if r.idx == idx && r.env != DEAD_ENV {
                        r.env = DEAD_ENV;
                        killed += 1;
                    }
                }
                match g.next.as_deref_mut() {
                    Some(n) => g = n,
                    None => break,
                }
            }
        }
        self.dead += killed;
    }

    fn build(slots: &[Option<Slot>]) -> PointGrid {
        let mut geoms = Vec::new();
        let mut all = Vec::new();
        for e in slots.iter().flatten().flat_map(|s| s.entries.iter()) {
            all.push(Rec::of(e, geoms.len()));
            geoms.push(e.geom.clone());
        }
        let mut g = PointGrid::from_recs(all);
        g.geoms = geoms;
        g
    }

    /// Adds entries as pending records (tested on every query until the next rebuild).
    fn add(&mut self, entries: &[Entry]) {
        for e in entries {
            self.pending.push(Rec::of(e, self.geoms.len()));
            self.geoms.push(e.geom.clone());
        }
    }

    fn from_recs(all: Vec<Rec>) -> PointGrid {
        let mut g = PointGrid::empty();
        if all.is_empty() {
            return g;
        }
        let median = |mut v: Vec<f64>| {
            let m = v.len() / 2;
            *v.select_nth_unstable_by(m, f64::total_cmp).1
        };
        // A floor of 1e-6° (0.1 m) keeps degenerate (zero-width) envelopes from making the
        // cells absurdly small.
        let mw = median(all.iter().map(Rec::width).collect()).max(1e-6);
        let mh = median(all.iter().map(Rec::height).collect()).max(1e-6);
        let n_all = all.len();
        let (normal, mut big): (Vec<Rec>, Vec<Rec>) = all
            .into_iter()
            .partition(|r| r.width() <= OUTLIER_FACTOR * mw && r.height() <= OUTLIER_FACTOR * mh);
        if !normal.is_empty() {
            let mut b = [
                f64::INFINITY,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::NEG_INFINITY,
            ];
            for r in &normal {
                b[0] = b[0].min(f64::from(r.env[0]));
                b[1] = b[1].min(f64::from(r.env[1]));
                b[2] = b[2].max(f64::from(r.env[2]));
                b[3] = b[3].max(f64::from(r.env[3]));
            }
            let (w, h) = (b[2] - b[0], b[3] - b[1]);
            let side = |len: f64, cell: f64| (len / cell).ceil().clamp(1.0, 65_536.0) as usize;
            let (mut nx, mut ny) = (side(w, CELL_FACTOR * mw), side(h, CELL_FACTOR * mh));
            let cap = (CELLS_PER_REC * normal.len()).clamp(1024, MAX_CELLS);
            while nx * ny > cap {
                let f = ((nx * ny) as f64 / cap as f64).sqrt().max(1.01);
                nx = ((nx as f64 / f) as usize).max(1);
                ny = ((ny as f64 / f) as usize).max(1);
            }
            g.x0 = b[0];
            g.y0 = b[1];
            g.nx = nx;
            g.ny = ny;
            g.inv_w = if nx > 1 { nx as f64 / w } else { 0.0 };
            g.inv_h = if ny > 1 { ny as f64 / h } else { 0.0 };
            let mut filed = Vec::with_capacity(normal.len());
            let mut counts = vec![0u32; nx * ny + 1];
            for r in normal {
                let (c0, c1) = (g.col_of(r.env[0]), g.col_of(r.env[2]));
                let (r0, r1) = (g.row_of(r.env[1]), g.row_of(r.env[3]));
                if (c1 - c0 + 1) * (r1 - r0 + 1) > MAX_CELLS_PER_REC {
                    big.push(r);
                    continue;
                }
                for row in r0..=r1 {
                    for c in &mut counts[row * nx + c0..=row * nx + c1] {
                        *c += 1;
                    }
                }
                filed.push((r, c0, c1, r0, r1));
            }
            let mut acc = 0u32;
            for c in counts.iter_mut() {
                let n = *c;
                *c = acc;
                acc += n;
            }
            let mut fill: Vec<u32> = counts[..nx * ny].to_vec();
            let dead = Rec {
                env: DEAD_ENV,
                idx: 0,
                geom: 0,
            };
            let mut recs = vec![dead; acc as usize];
            for (r, c0, c1, r0, r1) in filed {
                for row in r0..=r1 {
                    for f in &mut fill[row * nx + c0..=row * nx + c1] {
                        recs[*f as usize] = r;
                        *f += 1;
                    }
                }
            }
            g.offs = counts;
            g.recs = recs;
        }
        if big.len() > MAX_BIG_LIST && big.len() < n_all {
            g.next = Some(Box::new(PointGrid::from_recs(big)));
        } else {
            g.big = big;
        }
        g.filed = g.recs.len() + g.big.len() + g.next.as_ref().map_or(0, |n| n.filed);
        g
    }

    // Monotone in `x` (correctly rounded steps, then truncation); NaN goes to column 0.
    #[inline(always)]
    fn col_of(&self, x: f32) -> usize {
        let t = (f64::from(x) - self.x0) * self.inv_w;
        if t >= 0.0 {
            (t as usize).min(self.nx - 1)
        } else {
            0
        }
    }

    #[inline(always)]
    fn row_of(&self, y: f32) -> usize {
        let t = (f64::from(y) - self.y0) * self.inv_h;
        if t >= 0.0 {
            (t as usize).min(self.ny - 1)
        } else {
            0
        }
    }

    /// Calls `f` for every entry whose envelope holds the point (the R-tree's candidates).
    #[inline]
    fn for_each_hit(&self, lon: f64, lat: f64, mut f: impl FnMut(&Rec)) {
        let p = f32_point(lon, lat);
        let mut g = self;
        loop {
            let k = g.row_of(p[1]) * g.nx + g.col_of(p[0]);
            let (a, b) = (g.offs[k] as usize, g.offs[k + 1] as usize);
            for r in g.recs[a..b].iter().chain(&g.big).chain(&g.pending) {
                if r.hit(p) {
                    f(r);
                }
            }
            match &g.next {
                Some(n) => g = n,
                None => return,
            }
        }
    }
}
