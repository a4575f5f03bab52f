//! The point grid: a flat, derived accelerator for the point queries of
//! [`FenceIndex`](super::FenceIndex), answering exactly what its R-tree would.
//!
//! Owns the grid levels, their records and the geometry list the records point into.
//! Invariant: for every point, the records whose envelope holds it (live records of every level,
//! the unfiled list and the pending list) are exactly the R-tree's entries holding it; killed
//! records hold no point. The argument is written out at [`PointGrid`].

use super::{Entry, Geom, Slot, f32_point};

/// One entry as the point grid stores it: the envelope inline (the same outward-rounded `f32`
/// bounds as the R-tree entry, so the grid's candidates are exactly the tree's), the fence idx,
/// and where the geometry for the exact test is. Most candidates of a cell are rejected on the
/// inline envelope, without touching their geometry. 24 bytes, plain data: a rebuild copies
/// records without touching reference counts.
#[derive(Clone, Copy, PartialEq)]
pub(super) struct Rec {
    /// `[min_lon, min_lat, max_lon, max_lat]`.
    env: [f32; 4],
    pub(super) idx: u32,
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
    pub(super) fn multi(&self) -> bool {
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
pub(super) struct PointGrid {
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
pub(super) const MAX_PENDING: usize = 64;

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
    pub(super) fn kill(&mut self, idx: u32, entries: &[Entry]) {
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

    /// A grid of every entry of the live slots.
    pub(super) fn build(slots: &[Option<Slot>]) -> PointGrid {
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
    pub(super) fn add(&mut self, entries: &[Entry]) {
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
    pub(super) fn for_each_hit(&self, lon: f64, lat: f64, mut f: impl FnMut(&Rec)) {
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

impl PointGrid {
    /// Whether the changes patched in since the build would slow queries down (too many pending
    /// records scanned per query) or waste too much of the grid (killed records): the index then
    /// drops it, and the next query rebuilds it.
    pub(super) fn worn_out(&self) -> bool {
        self.pending.len() > MAX_PENDING || self.dead > MAX_PENDING.max(self.filed / 8)
    }

    /// `(cells, records, heap bytes)` over all levels, records counting pending and killed ones.
    pub(super) fn size(&self) -> (usize, usize, usize) {
        let mut g = Some(self);
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

    /// The geometry the exact test of record `r` runs on.
    #[inline(always)]
    pub(super) fn geom(&self, r: &Rec) -> &Geom {
        &self.geoms[r.geom_ix()]
    }
}
