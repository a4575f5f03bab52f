//! Polygon parts: flat coordinate storage, the exact point-in-polygon test (plain and
//! grid-indexed) and the distance from a point to the boundary.
//!
//! Invariants of a [`PolyPart`]:
//! - the positions hold every ring of one polygon back to back, each ring closed (last == first) with at
//!   least 4 positions; ring 0 is the exterior, the rest are holes. Rings are combined with the
//!   even-odd rule, which equals "in the exterior and in no hole" for a valid polygon.
//! - Edge `j` runs from position `j` to position `j + 1` and exists for every `j` that is not the last
//!   position of its ring.
//! - The edge grid, when present, lists in every cell each edge whose bounding box meets the
//!   cell (cells are the preimages of the monotone `col_of` / `row_of` maps, so "meets" is exact),
//!   and for every cell no edge meets, whether the cell is inside. The indexed test evaluates
//!   the same exact per-edge predicate as the plain scan and provably returns the same answer
//!   bit for bit; the argument is written out at [`Grid`] and in `docs/fences.md`.

use std::sync::Arc;

use robust::{Coord, orient2d};

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

/// Grid cells per edge when sizing the grid. Measured on ragged 10k-80k-vertex coastlines
/// (`docs/bench-fences.md`): 1 cell/edge walks too many boundary cells, 8 costs more memory
/// misses than it saves; 4 was fastest, at about 40 bytes per vertex including coordinates.
const CELLS_PER_EDGE: usize = 4;

/// Upper bound on cell entries per edge on average: guards against polygons of long diagonal
/// edges, whose bounding boxes cover many cells; the grid is made coarser until it holds.
const MAX_ENTRIES_PER_EDGE: usize = 6;

/// Largest grid side, in cells.
const MAX_SIDE: usize = 4096;

/// Mean Earth radius (IUGG), metres: the sphere of DESIGN section 3.
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

/// Cell states, kept in the top two bits of the cell's offset.
const TRAVERSE: u32 = 0;
const EMPTY_OUT: u32 = 1;
const EMPTY_IN: u32 = 2;
const STATE_SHIFT: u32 = 30;
const OFFS_MASK: u32 = (1 << STATE_SHIFT) - 1;

/// A uniform grid over a part's bounding box.
///
/// Cells are `{(x, y) : col_of(x) = c, row_of(y) = r}`; `col_of`/`row_of` are monotone (each
/// step is a correctly rounded monotone operation), so a cell is a rectangle and an edge whose
/// bounding box holds a point is filed under that point's cell. A cell with no edge is `EMPTY_IN`
/// or `EMPTY_OUT` (its inside state is constant: it is connected and meets no boundary), or
/// `TRAVERSE` if its centre could not be placed in it by rounding (then it just holds no edges).
///
/// Query for p in cell (r, c): walk east along row r from c to the first empty cell t (or past
/// the grid, which is outside). Then `inside(p) = state(t) XOR parity(#walked edges e with
/// Cross(e, p))`, each walked edge counted once (in the first walked cell listing it). Why this
/// equals the plain scan: take q = (centre x of t, p.y). An edge not filed in row r does not
/// straddle p.y (misses both p and q); one filed in row r but not in the walked cells lies wholly
/// west of c (misses both) or wholly east of t (crosses both rays or neither, by the `px < xlo`
/// rule); a walked edge lies wholly west of t, so it misses q. Hence the plain parities of p and
/// q differ exactly by the walked edges' crossings of p, and q's plain parity is its true state,
/// which is `state(t)`. A point on the boundary is on an edge filed in its own cell, which is
/// tested in full, so boundary points are found as in the plain scan.
///
/// Each cell entry carries the edge's latitude range within the cell's row, rounded outward to
/// 16 bits ([`EdgeRef`], [`Grid::row_frac`]); the walk skips entries whose range misses the
/// fix's latitude before reading coordinates. Such an edge is a `Miss` for the fix whatever the
/// rest of the test says, so the answer is unchanged.
#[derive(Clone)]
struct Grid {
    x0: f64,
    y0: f64,
    /// Cells per degree, or 0 for a single column / row.
    inv_w: f64,
    inv_h: f64,
    nx: usize,
    ny: usize,
    /// `edges[offs[k]..offs[k + 1]]` (low 30 bits) are cell `k = r * nx + c`'s edges (start
    /// indices in `pts`); the top 2 bits of `offs[k]` are the cell's state.
    offs: Vec<u32>,
    edges: Vec<EdgeRef>,
}

/// One edge as filed in a grid cell (8 bytes): its start index and its latitude range in the
/// cell's row, `qlo = floor(row_frac(ylo))`, `qhi = ceil(row_frac(yhi))`. The walk skips an
/// edge when `row_frac(py) < qlo` or `> qhi`: `row_frac` is monotone, so then `py < ylo` or
/// `py > yhi`, and the edge can neither straddle nor touch the fix's latitude (`edge_hit` would
/// return `Miss`), all without reading its coordinates.
#[derive(Clone, Copy, Debug)]
struct EdgeRef {
    j: u32,
    qlo: u16,
    qhi: u16,
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

impl Grid {
    // Truncation of a non-negative float is its floor (and, unlike `f64::floor` on the
    // baseline x86-64 target, not a libm call); `as` saturates, NaN goes to column 0.
    #[inline(always)]
    fn col_of(&self, x: f64) -> usize {
        let t = (x - self.x0) * self.inv_w;
        if t >= 0.0 {
            (t as usize).min(self.nx - 1)
        } else {
            0
        }
    }

    #[inline(always)]
    fn row_of(&self, y: f64) -> usize {
        let t = (y - self.y0) * self.inv_h;
        if t >= 0.0 {
            (t as usize).min(self.ny - 1)
        } else {
            0
        }
    }

    /// Latitude `y` as a position within row `r` on a 16-bit scale, clamped to `[0, 65535]`.
    /// Monotone in `y`: the steps of `row_of` (correctly rounded subtraction and
    /// multiplication), a correctly rounded subtraction, an exact scaling by 2^16, a clamp.
    #[inline(always)]
    fn row_frac(&self, y: f64, r: usize) -> f64 {
        (((y - self.y0) * self.inv_h - r as f64) * 65536.0).clamp(0.0, 65535.0)
    }

    /// Cell `k`'s state and edges: one lookup in `offs`, whose top bits hold the state so the
    /// walk touches one array per cell.
    #[inline(always)]
    fn cell(&self, k: usize) -> (u32, &[EdgeRef]) {
        let (a, b) = (self.offs[k], self.offs[k + 1]);
        (
            a >> STATE_SHIFT,
            &self.edges[(a & OFFS_MASK) as usize..(b & OFFS_MASK) as usize],
        )
    }

    /// Cell width and height in degrees (infinite for a single column / row).
    fn cell_size(&self) -> (f64, f64) {
        let w = if self.inv_w > 0.0 {
            1.0 / self.inv_w
        } else {
            f64::INFINITY
        };
        let h = if self.inv_h > 0.0 {
            1.0 / self.inv_h
        } else {
            f64::INFINITY
        };
        (w, h)
    }
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
        let grid = self.grid.as_ref().map_or(0, |g| {
            g.offs.capacity() * 4 + g.edges.capacity() * std::mem::size_of::<EdgeRef>()
        });
        self.flat.len() * 8 + self.ring_ends.capacity() * 4 + grid
    }

    /// Whether the edge grid was built.
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

    /// Edge `j`'s bounding box `[xlo, ylo, xhi, yhi]`.
    #[inline(always)]
    fn edge_box(&self, j: usize) -> [f64; 4] {
        let pts = self.pts();
        let (a, b) = (pts[j], pts[j + 1]);
        [
            a[0].min(b[0]),
            a[1].min(b[1]),
            a[0].max(b[0]),
            a[1].max(b[1]),
        ]
    }

    /// The edge grid, or `None` if even a coarse grid would exceed the 30-bit offsets.
    fn build_grid(&self) -> Option<Grid> {
        let edges = self.edge_count();
        let (w, h) = (self.bbox[2] - self.bbox[0], self.bbox[3] - self.bbox[1]);
        let target = (edges * CELLS_PER_EDGE).max(4) as f64;
        let (mut nx, mut ny) = if w > 0.0 && h > 0.0 {
            let nx = (target * w / h).sqrt().round().clamp(1.0, MAX_SIDE as f64) as usize;
            let ny = (target / nx as f64).round().clamp(1.0, MAX_SIDE as f64) as usize;
            (nx, ny)
        } else if w > 0.0 {
            ((target as usize).clamp(1, MAX_SIDE), 1)
        } else if h > 0.0 {
            (1, (target as usize).clamp(1, MAX_SIDE))
        } else {
            (1, 1)
        };
        loop {
            let mut g = Grid {
                x0: self.bbox[0],
                y0: self.bbox[1],
                inv_w: if nx > 1 { nx as f64 / w } else { 0.0 },
                inv_h: if ny > 1 { ny as f64 / h } else { 0.0 },
                nx,
                ny,
                offs: Vec::new(),
                edges: Vec::new(),
            };
            // Count first, so a polygon of long diagonal edges is re-gridded coarser before
            // anything big is allocated. Halving the longer side always makes progress, down to
            // a single cell, where every edge is filed once.
            let mut total = 0usize;
            for j in self.edge_starts() {
                let (c0, r0, c1, r1) = self.edge_cells(&g, j);
                total += (c1 - c0 + 1) * (r1 - r0 + 1);
            }
            if total > edges.saturating_mul(MAX_ENTRIES_PER_EDGE) && nx * ny > 1 {
                if nx >= ny {
                    nx = (nx / 2).max(1);
                } else {
                    ny = (ny / 2).max(1);
                }
                continue;
            }
            if total > OFFS_MASK as usize {
                return None; // beyond any configured limit in practice; the plain scan is exact
            }
            let mut counts = vec![0u32; nx * ny + 1];
            for j in self.edge_starts() {
                let (c0, r0, c1, r1) = self.edge_cells(&g, j);
                for r in r0..=r1 {
                    for c in &mut counts[r * nx + c0..=r * nx + c1] {
                        *c += 1;
                    }
                }
            }
            let mut acc = 0u32;
            for c in counts.iter_mut() {
                let n = *c;
                *c = acc;
                acc += n;
            }
            g.offs = counts;
            g.edges = vec![
                EdgeRef {
                    j: 0,
                    qlo: 0,
                    qhi: 0
                };
                acc as usize
            ];
            let mut fill: Vec<u32> = g.offs[..nx * ny].to_vec();
            for j in self.edge_starts() {
                let eb = self.edge_box(j);
                let (c0, r0, c1, r1) = self.edge_cells(&g, j);
                for r in r0..=r1 {
                    // In [0, 65535] already: the casts are exact.
                    let qlo = g.row_frac(eb[1], r).floor() as u16;
                    let qhi = g.row_frac(eb[3], r).ceil() as u16;
                    for f in &mut fill[r * nx + c0..=r * nx + c1] {
                        g.edges[*f as usize] = EdgeRef {
                            j: j as u32,
                            qlo,
                            qhi,
                        };
                        *f += 1;
                    }
                }
            }
            let state = self.empty_cell_states(&g);
            for (o, st) in g.offs.iter_mut().zip(state) {
                *o |= st << STATE_SHIFT;
            }
            return Some(g);
        }
    }

    /// The inclusive cell range `(c0, r0, c1, r1)` an edge is filed under.
    fn edge_cells(&self, g: &Grid, j: usize) -> (usize, usize, usize, usize) {
        let b = self.edge_box(j);
        (
            g.col_of(b[0]),
            g.row_of(b[1]),
            g.col_of(b[2]),
            g.row_of(b[3]),
        )
    }

    /// Inside state of every edge-free cell, one sweep per row: at the row's centre latitude
    /// `cy`, an edge-free cell's centre is crossed eastward exactly by the row's edges that
    /// straddle `cy` and start in a later column (an edge filed in the row but not in the cell
    /// lies wholly east or wholly west of it), so a suffix parity over columns gives them all.
    fn empty_cell_states(&self, g: &Grid) -> Vec<u32> {
        let (nx, ny) = (g.nx, g.ny);
        let (w, h) = g.cell_size();
        let mut state = vec![TRAVERSE; nx * ny];
        let mut starts = vec![false; nx + 1];
        for r in 0..ny {
            let cy = if ny > 1 {
                g.y0 + (r as f64 + 0.5) * h
            } else {
                g.y0
            };
            if g.row_of(cy) != r {
                continue; // rounding put the centre elsewhere: leave the row TRAVERSE
            }
            starts.iter_mut().for_each(|s| *s = false);
            for c in 0..nx {
                for e in g.cell(r * nx + c).1 {
                    let j = e.j as usize;
                    let b = self.edge_box(j);
                    let first = g.col_of(b[0]);
                    // Each edge once: in its first column.
                    if first != c {
                        continue;
                    }
                    let (a, e) = (self.pts()[j], self.pts()[j + 1]);
                    if (a[1] > cy) != (e[1] > cy) {
                        starts[first] = !starts[first];
                    }
                }
            }
            // parity of straddling edges starting east of column c
            let mut east = false;
            for c in (0..nx).rev() {
                let k = r * nx + c;
                if g.offs[k] == g.offs[k + 1] {
                    let cx = if nx > 1 {
                        g.x0 + (c as f64 + 0.5) * w
                    } else {
                        g.x0
                    };
                    if g.col_of(cx) == c {
                        state[k] = if east { EMPTY_IN } else { EMPTY_OUT };
                    }
                }
                east ^= starts[c];
            }
        }
        state
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

    fn contains_grid(&self, g: &Grid, px: f64, py: f64) -> bool {
        if !self.bbox_contains(px, py) {
            return false;
        }
        let (r, c) = (g.row_of(py), g.col_of(px));
        let row = r * g.nx;
        let pts = self.pts();
        let qp = g.row_frac(py, r);
        let mut inside = false;
        for cc in c..g.nx {
            let (state, edges) = g.cell(row + cc);
            match state {
                EMPTY_IN => return !inside,
                EMPTY_OUT => return inside,
                _ => {}
            }
            for e in edges {
                // Exact skip: outside the edge's latitude range `edge_hit` is a miss.
                if qp < f64::from(e.qlo) || qp > f64::from(e.qhi) {
                    continue;
                }
                let j = e.j as usize;
                // Count each edge in the first walked cell that lists it.
                if cc != c && g.col_of(pts[j][0].min(pts[j + 1][0])) != cc {
                    continue;
                }
                match edge_hit(pts[j], pts[j + 1], px, py) {
                    Hit::Boundary => return true,
                    Hit::Cross => inside = !inside,
                    Hit::Miss => {}
                }
            }
        }
        inside
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
                        best = best.min(d2(e.j as usize));
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
