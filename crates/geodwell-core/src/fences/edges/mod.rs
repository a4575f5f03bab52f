//! Polygon parts: flat coordinate storage, the exact point-in-polygon test (plain and
//! grid-indexed) and the distance from a point to the boundary.
//!
//! Invariants of a [`PolyPart`]:
//! - the positions hold every ring of one polygon back to back, each ring closed (last == first)
//!   with at least 4 positions; ring 0 is the exterior, the rest are holes. Rings are combined
//!   with the even-odd rule, which equals "in the exterior and in no hole" for a valid polygon.
//! - Edge `j` runs from position `j` to position `j + 1` and exists for every `j` that is not the
//!   last position of its ring.
//! - The edge grid, when present, lists in every cell each edge that meets the cell (the
//!   edge's part within each row it crosses, widened against rounding; cells are the preimages
//!   of the monotone `col_of` / `row_of` maps), and per cell the inside state of a reference
//!   point. The indexed test evaluates the same exact per-edge predicates as the plain scan
//!   and provably returns the same answer bit for bit; the argument is written out at [`Grid`]
//!   and in `docs/fences.md`.
//!
//! This module keeps the storage, the plain scan, the per-edge predicate and the distances; the
//! edge grid (its layout, construction and indexed test) is the submodule `grid`.

use std::sync::Arc;

use robust::{Coord, orient2d};

mod grid;

use grid::Grid;

/// Parts with at least this many edges get an edge grid; smaller ones use the plain scan,
/// which for a few hundred edges is as fast and touches one flat array.
pub const EDGE_INDEX_THRESHOLD: usize = 256;

/// Edges per latitude-summary chunk of the plain scan: a chunk is skipped when the fix's
/// latitude is outside its range, so the scan reads a few cache lines instead of the whole ring.
const CHUNK: usize = 8;

/// Layout of a part's flat buffer: `[min_lon, min_lat, max_lon, max_lat, n_chunks,
/// n_chunks x (ylo, yhi, first, last), positions as (lon, lat)...]`. A chunk is a run of at
/// most [`CHUNK`] consecutive edges of one ring, from position `first` to position `last`, with
/// the exact latitude range of those positions, so skipping a chunk never skips a non-miss edge.
/// One allocation, shared (`Arc`) with the index's R-tree entry: a small polygon's exact test
/// costs one pointer hop and then reads forward.
const HEAD: usize = 5;

/// The plain scan on a flat buffer: bbox check, then every chunk whose latitude range holds
/// the fix, even-odd crossings of the eastward ray, boundary inclusive.
#[inline]
pub(crate) fn contains_flat(flat: &[f64], px: f64, py: f64) -> bool {
    if !(px >= flat[0] && px <= flat[2] && py >= flat[1] && py <= flat[3]) {
        return false;
    }
    let n = flat[4] as usize;
    let (head, rest) = flat[HEAD..].split_at(4 * n);
    let pts = rest.as_chunks::<2>().0;
    let mut inside = false;
    for ch in head.as_chunks::<4>().0 {
        if py < ch[0] || py > ch[1] {
            continue;
        }
        let run = &pts[ch[2] as usize..=ch[3] as usize];
        let mut prev = run[0];
        let mut dprev = prev[1] - py;
        for &cur in &run[1..] {
            let d = cur[1] - py;
            // Cheap exact pre-filter: the sign of a float difference is exact, so a positive
            // product means both endpoints are strictly on one side of the fix's latitude,
            // where `edge_hit` is a miss.
            if dprev * d <= 0.0 {
                match edge_hit(prev, cur, px, py) {
                    Hit::Boundary => return true,
                    Hit::Cross => inside = !inside,
                    Hit::Miss => {}
                }
            }
            prev = cur;
            dprev = d;
        }
    }
    inside
}

/// Mean Earth radius (IUGG), metres: the sphere of `docs/semantics.md` section 3.1.
pub const EARTH_RADIUS_M: f64 = 6_371_008.8;

/// Metres per degree of latitude on that sphere.
pub(crate) const M_PER_DEG: f64 = EARTH_RADIUS_M * std::f64::consts::PI / 180.0;

/// Result of testing one edge against a point and the ray going east from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hit {
    /// The edge neither contains the point nor crosses the ray.
    Miss,
    /// The edge crosses the eastward ray (half-open rule on latitude: exactly one endpoint is
    /// strictly north of the point, so a ray through a vertex is counted once).
    Cross,
    /// The point lies on the (closed) edge.
    Boundary,
}

/// The per-edge predicate shared by the plain and the indexed test. Exact: the only arithmetic
/// is an adaptive-precision orientation test; everything else is comparisons.
#[inline(always)]
fn edge_hit(a: [f64; 2], b: [f64; 2], px: f64, py: f64) -> Hit {
    let (ylo, yhi) = if a[1] <= b[1] {
        (a[1], b[1])
    } else {
        (b[1], a[1])
    };
    if py < ylo || py > yhi {
        return Hit::Miss;
    }
    let (xlo, xhi) = if a[0] <= b[0] {
        (a[0], b[0])
    } else {
        (b[0], a[0])
    };
    if px > xhi {
        // Entirely west of the point: cannot hold it nor cross an eastward ray.
        return Hit::Miss;
    }
    let straddle = (a[1] > py) != (b[1] > py);
    if px < xlo {
        // Entirely east of the point: it cannot hold the point; it crosses iff it straddles.
        return if straddle { Hit::Cross } else { Hit::Miss };
    }
    let o = orient2d(
        Coord { x: a[0], y: a[1] },
        Coord { x: b[0], y: b[1] },
        Coord { x: px, y: py },
    );
    if o == 0.0 {
        // Collinear and inside the edge's bounding box: on the segment.
        return Hit::Boundary;
    }
    if !straddle {
        return Hit::Miss;
    }
    // For an edge going north the point is west of it iff it is left of it (o > 0); for an edge
    // going south iff it is right of it.
    if (b[1] > py) == (o > 0.0) {
        Hit::Cross
    } else {
        Hit::Miss
    }
}

/// Squared distance from the origin to the segment (a, b) in a plane.
#[inline(always)]
fn seg_dist2(ax: f64, ay: f64, bx: f64, by: f64) -> f64 {
    let dx = bx - ax;
    let dy = by - ay;
    let l2 = dx * dx + dy * dy;
    let t = if l2 > 0.0 {
        (-(ax * dx + ay * dy) / l2).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let x = ax + t * dx;
    let y = ay + t * dy;
    x * x + y * y
}

/// Largest `f32` not above `x`.
pub(crate) fn f32_down(x: f64) -> f32 {
    let r = x as f32;
    if f64::from(r) > x { r.next_down() } else { r }
}

/// Smallest `f32` not below `x`.
pub(crate) fn f32_up(x: f64) -> f32 {
    let r = x as f32;
    if f64::from(r) < x { r.next_up() } else { r }
}

/// One polygon (exterior + holes) of a fence.
#[derive(Clone)]
pub(crate) struct PolyPart {
    /// Bbox, chunk summaries and all rings' positions back to back (see [`HEAD`]).
    flat: Arc<[f64]>,
    /// Offset of the first position in `flat`.
    pts_off: usize,
    /// Exclusive end offset of each ring in the positions.
    ring_ends: Vec<u32>,
    /// `[min_lon, min_lat, max_lon, max_lat]` over all positions.
    pub(crate) bbox: [f64; 4],
    /// Inline rather than boxed: one pointer hop less on the hot path.
    grid: Option<Grid>,
}

impl std::fmt::Debug for PolyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolyPart")
            .field("rings", &self.ring_ends.len())
            .field("positions", &self.pts().len())
            .field("bbox", &self.bbox)
            .field("grid", &self.grid.as_ref().map(|g| (g.nx, g.ny)))
            .finish()
    }
}

impl PolyPart {
    /// Builds a part from validated rings (closed, >= 4 positions, finite, in range). Builds the
    /// edge grid when the part has at least `index_threshold` edges.
    pub(crate) fn new(rings: Vec<Vec<[f64; 2]>>, index_threshold: usize) -> PolyPart {
        let total: usize = rings.iter().map(Vec::len).sum();
        let mut pts = Vec::with_capacity(total);
        let mut ring_ends = Vec::with_capacity(rings.len());
        let mut bbox = [
            f64::INFINITY,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
        ];
        for ring in rings {
            for p in &ring {
                bbox[0] = bbox[0].min(p[0]);
                bbox[1] = bbox[1].min(p[1]);
                bbox[2] = bbox[2].max(p[0]);
                bbox[3] = bbox[3].max(p[1]);
            }
            pts.extend_from_slice(&ring);
            ring_ends.push(pts.len() as u32);
        }
        let mut chunks: Vec<[f64; 4]> = Vec::with_capacity(total / CHUNK + ring_ends.len());
        let mut start = 0usize;
        for &end in &ring_ends {
            let last_edge_end = (end as usize).saturating_sub(1);
            let mut j = start;
            while j < last_edge_end {
                let e = (j + CHUNK).min(last_edge_end);
                let (mut ylo, mut yhi) = (f64::INFINITY, f64::NEG_INFINITY);
                for p in &pts[j..=e] {
                    ylo = ylo.min(p[1]);
                    yhi = yhi.max(p[1]);
                }
                chunks.push([ylo, yhi, j as f64, e as f64]);
                j = e;
            }
            start = end as usize;
        }
        let mut flat = Vec::with_capacity(HEAD + 4 * chunks.len() + 2 * pts.len());
        flat.extend_from_slice(&bbox);
        flat.push(chunks.len() as f64);
        flat.extend(chunks.iter().flatten());
        let pts_off = flat.len();
        flat.extend(pts.iter().flatten());
        let mut part = PolyPart {
            flat: Arc::from(flat),
            pts_off,
            ring_ends,
            bbox,
            grid: None,
        };
        if part.edge_count() >= index_threshold.max(1) {
            part.grid = part.build_grid();
        }
        part
    }

    /// All positions, ring after ring.
    #[inline(always)]
    fn pts(&self) -> &[[f64; 2]] {
        self.flat[self.pts_off..].as_chunks::<2>().0
    }

    /// The flat buffer for the index's hot path, when this part answers by the plain scan.
    pub(crate) fn plain_flat(&self) -> Option<&Arc<[f64]>> {
        self.grid.is_none().then_some(&self.flat)
    }

    /// The rings as stored (closed), exterior first.
    pub(crate) fn rings(&self) -> impl Iterator<Item = &[[f64; 2]]> {
        let mut start = 0usize;
        self.ring_ends.iter().map(move |&end| {
            let r = &self.pts()[start..end as usize];
            start = end as usize;
            r
        })
    }

    /// Number of stored positions (closing positions included).
    pub(crate) fn vertex_count(&self) -> usize {
        self.pts().len()
    }

    /// Number of edges.
    pub(crate) fn edge_count(&self) -> usize {
        self.pts().len() - self.ring_ends.len()
    }

    /// Approximate heap bytes held (coordinates, ring offsets, edge grid).
    pub(crate) fn heap_bytes(&self) -> usize {
        let grid = self.grid.as_ref().map_or(0, Grid::heap_bytes);
        self.flat.len() * 8 + self.ring_ends.capacity() * 4 + grid
    }

    /// Whether the edge grid was built.
    /// Edges a containment test examines: `(worst, mean)` over the bounding box (the plain
    /// scan: every edge).
    pub(crate) fn test_cost(&self) -> (usize, f64) {
        match &self.grid {
            Some(g) => g.cost,
            None => (self.edge_count(), self.edge_count() as f64),
        }
    }

    pub(crate) fn is_indexed(&self) -> bool {
        self.grid.is_some()
    }

    /// Start indices of all edges.
    fn edge_starts(&self) -> impl Iterator<Item = usize> + '_ {
        let mut start = 0usize;
        self.ring_ends.iter().flat_map(move |&end| {
            let r = start..(end as usize).saturating_sub(1);
            start = end as usize;
            r
        })
    }

    #[inline(always)]
    fn bbox_contains(&self, px: f64, py: f64) -> bool {
        px >= self.bbox[0] && px <= self.bbox[2] && py >= self.bbox[1] && py <= self.bbox[3]
    }

    /// Boundary-inclusive containment, using the edge grid when there is one.
    #[inline]
    pub(crate) fn contains(&self, px: f64, py: f64) -> bool {
        match &self.grid {
            Some(g) => self.contains_grid(g, px, py),
            None => self.contains_plain(px, py),
        }
    }

    /// The reference test: every edge, even-odd crossings of the eastward ray.
    pub(crate) fn contains_plain(&self, px: f64, py: f64) -> bool {
        contains_flat(&self.flat, px, py)
    }

    /// The longitude to use for the fix so that a part near the antimeridian is measured the
    /// short way round: `px`, `px + 360` or `px - 360`, whichever is nearest the part's bbox.
    fn unwrap_lon(&self, px: f64) -> f64 {
        let gap = |x: f64| {
            if x < self.bbox[0] {
                self.bbox[0] - x
            } else if x > self.bbox[2] {
                x - self.bbox[2]
            } else {
                0.0
            }
        };
        let mut best = px;
        for c in [px - 360.0, px + 360.0] {
            if gap(c) < gap(best) {
                best = c;
            }
        }
        best
    }

    /// Squared metres from the point to the nearest edge on the local equirectangular plane of
    /// the fix. With `stop2 >= 0` the search may stop early: as soon as an edge within
    /// `sqrt(stop2)` is found (returning its distance), or once every unsearched edge is
    /// provably farther than that (returning a value above `stop2`). `plain` forces the full
    /// scan (reference for tests).
    pub(crate) fn boundary_dist2(&self, px: f64, py: f64, stop2: f64, plain: bool) -> f64 {
        let px = self.unwrap_lon(px);
        let ky = M_PER_DEG;
        let kx = ky * py.to_radians().cos();
        let pts = self.pts();
        let d2 = |j: usize| {
            let (a, b) = (pts[j], pts[j + 1]);
            seg_dist2(
                (a[0] - px) * kx,
                (a[1] - py) * ky,
                (b[0] - px) * kx,
                (b[1] - py) * ky,
            )
        };
        let mut best = f64::INFINITY;
        let g = match (&self.grid, plain) {
            (Some(g), false) => g,
            _ => {
                for j in self.edge_starts() {
                    best = best.min(d2(j));
                    if best <= stop2 {
                        return best;
                    }
                }
                return best;
            }
        };
        // Square rings of cells around the fix's (clamped) cell, nearest first. After ring k,
        // every unvisited cell is beyond the ring's outer border; stop when that border is
        // farther than the best edge (or than the stop distance). Borders are taken a little
        // wide so rounding in `col_of`/`row_of` can never stop the search too early.
        let (w, h) = g.cell_size();
        let (c0, r0) = (g.col_of(px) as i64, g.row_of(py) as i64);
        let (nx, ny) = (g.nx as i64, g.ny as i64);
        let max_k = nx.max(ny);
        for k in 0..=max_k {
            let (clo, chi, rlo, rhi) = (c0 - k, c0 + k, r0 - k, r0 + k);
            for r in rlo.max(0)..=rhi.min(ny - 1) {
                let full = r == rlo || r == rhi;
                let mut c = clo.max(0);
                while c <= chi.min(nx - 1) {
                    for e in g.cell((r * nx + c) as usize).1 {
                        best = best.min(d2(e.edge()));
                    }
                    c = if full || c == chi { c + 1 } else { chi };
                }
            }
            if best <= stop2 {
                return best;
            }
            // Distance from the fix to the outside of ring k's square (in degrees).
            let slack_x = w * 1e-6;
            let slack_y = h * 1e-6;
            let mut gap = f64::INFINITY;
            if clo > 0 {
                gap = gap.min((px - (g.x0 + clo as f64 * w) - slack_x).max(0.0) * kx);
            }
            if chi < nx - 1 {
                gap = gap.min(((g.x0 + (chi + 1) as f64 * w) - px - slack_x).max(0.0) * kx);
            }
            if rlo > 0 {
                gap = gap.min((py - (g.y0 + rlo as f64 * h) - slack_y).max(0.0) * ky);
            }
            if rhi < ny - 1 {
                gap = gap.min(((g.y0 + (rhi + 1) as f64 * h) - py - slack_y).max(0.0) * ky);
            }
            if gap == f64::INFINITY {
                return best; // the whole grid is searched
            }
            let gap2 = gap * gap;
            if gap2 >= best || (stop2 >= 0.0 && gap2 > stop2) {
                return best;
            }
        }
        best
    }
}
