//! The edge grid of a large polygon part: a uniform grid over its bounding box listing, per
//! cell, the edges that meet the cell, and per cell the inside state of a reference point (the
//! cell's reference point). Built once with the part; answers the containment test from the fix's own
//! cell, so a test costs the edges of one cell whatever the polygon's shape elsewhere.
//!
//! Invariant: the indexed test evaluates the same exact per-edge predicates (`edge_hit`, and its
//! transpose for a northward ray) as the plain scan and returns the same answer bit for bit; the
//! argument is written out at [`Grid`] and in `docs/fences.md`. The grid is also what the
//! boundary-distance search of the parent module walks in rings of cells.
//!
//! Why this file is long: the filing, the reference states, the cell test and the walk are one
//! exactness argument (written at [`Grid`]); split apart, each half would state invariants the
//! other half establishes.

use super::{Hit, PolyPart, edge_hit};

/// Grid cells per edge when sizing the grid. Measured on ragged 10k-80k-vertex coastlines
/// (`docs/bench-fences.md`): 1 cell/edge leaves too many edges per cell, 8 costs more memory
/// misses than it saves; 4 was fastest, at about 40 bytes per vertex including coordinates.
const CELLS_PER_EDGE: usize = 4;

/// Upper bound on cell entries per edge on average: guards against polygons of long edges,
/// which cross many cells; the grid is made coarser until it holds. Measured on the
/// adversarial shapes of `benches/fences_adversarial.rs` (`docs/bench-fences.md`).
const MAX_ENTRIES_PER_EDGE: usize = 6;

/// Largest grid side, in cells.
const MAX_SIDE: usize = 4096;

/// Slack, in degrees, by which an edge's part within a row is widened before it is filed: far
/// above the rounding of the clip (coordinates are at most 360 in magnitude, so a few ulps are
/// below 1e-12), so the filed cells always cover every cell the edge meets.
const CLIP_SLACK: f64 = 1e-9;

/// Where in its cell (as a fraction of the cell's width and height) the reference point lies:
/// off the centre and off simple fractions, so that data aligned with the grid (regular combs,
/// rectangles on a graticule, edges through cell centres or quarter points) does not put its
/// edges through the references. A polygon crafted to do so loses those cells' references; they
/// are answered by the walk, and the cost counted at build time ([`Grid::cost`]) includes it.
const REF_FX: f64 = 0.538_196_601_125;
const REF_FY: f64 = 0.447_213_595_5;

/// Cell states, kept in the top two bits of the cell's offset: the cell's reference point is
/// outside or inside (folded with the reference's own northward crossings, see [`Grid`]), or
/// the cell has no usable reference point and is answered by the walk.
const NO_REF: u32 = 0;
const REF_OUT: u32 = 1;
const REF_IN: u32 = 2;
/// A cell with edges whose walk reads at most [`WALK_MAX`] entries: the walk answers it, as
/// it is cheaper there (one predicate per entry that survives the latitude skip, where the
/// cell test evaluates up to three). Its reference is not needed: the walk stops only at
/// edge-free cells.
const WALK: u32 = 3;

/// Longest walk, in entries, preferred to the cell test (see [`WALK`]). Ordinary polygons'
/// boundary cells are mostly within a few cells of an edge-free one.
const WALK_MAX: usize = 32;
const STATE_SHIFT: u32 = 30;
const OFFS_MASK: u32 = (1 << STATE_SHIFT) - 1;

/// Top bit of [`EdgeRef::j`]: the edge's longitude range holds the cell's reference longitude, so
/// the northward test at that longitude can be anything but a miss.
const SPANS_CX: u32 = 1 << 31;

/// A uniform grid over a part's bounding box.
///
/// Cells are `{(x, y) : col_of(x) = c, row_of(y) = r}`; `col_of`/`row_of` are monotone (each
/// step is a correctly rounded monotone operation), so a cell is a rectangle. An edge is filed,
/// in each row its latitude range meets, under the columns of its part within that row (the
/// segment clipped to the row's band and widened by [`CLIP_SLACK`]), so every cell an edge
/// meets lists it; the columns of one edge in one row are contiguous.
///
/// Query for p in cell k with reference point q = (qx, qy) (at [`REF_FX`], [`REF_FY`] of the
/// cell; a cell whose reference rounds into another cell, or lies on an edge, has none). Let p' =
/// (qx, py). Write E(x) for the parity of edges crossing x's eastward ray (`edge_hit`) and N(x)
/// for the parity of edges crossing its northward ray (the same predicate on swapped axes).
/// For x on no edge, E(x) = N(x) = inside(x) (both are the winding number mod 2). An edge not
/// filed in k meets neither p, p' nor the segment between them, so it crosses both eastward
/// rays or neither: E(p) = E(p') XOR (parity over k's edges of E-crossings of p and p').
/// Likewise along the vertical segment p'q: N(p') = N(q) XOR (k's edges' N-crossings of p' and
/// q). With p off the boundary (else an edge of k says so) and p' off the boundary (else the
/// walk answers): `inside(p) = N(q) XOR sum_k [N(e,p') + E(e,p) + E(e,p')]`. The cell stores
/// `S = inside(q) XOR sum_k N(e,q)`, so a test reads the cell's edges once. The build computes
/// inside(q) along each row from the east: E of two successive references differ exactly by the
/// E-crossings of the edges filed between them (the same argument on the row's reference line).
///
/// The walk (cells without a reference): walk east along row r from c to the first edge-free
/// cell t with a reference. Then `inside(p) = state(t) XOR parity(#walked edges e with
/// Cross(e, p))`, each walked edge counted once (in the first walked cell listing it): an edge
/// filed in row r but in no walked cell lies (within the row) wholly west of c (misses p and q)
/// or wholly east of t (crosses both rays or neither); a walked edge lies wholly west of t's
/// reference q, so misses it; an edge not filed in row r does not reach p.y.
///
/// Each cell entry carries the edge's latitude range within the cell's row, rounded outward to
/// 16 bits ([`EdgeRef`], [`Grid::row_frac`]); both eastward tests skip entries whose range
/// misses the fix's latitude before reading coordinates. Such an edge is a `Miss` for p and p'
/// whatever the rest of the test says, so the answer is unchanged.
#[derive(Clone)]
pub(super) struct Grid {
    pub(super) x0: f64,
    pub(super) y0: f64,
    /// Cells per degree, or 0 for a single column / row.
    inv_w: f64,
    inv_h: f64,
    /// Centre of the bounding box: the reference coordinate of a single column / row.
    xm: f64,
    ym: f64,
    pub(super) nx: usize,
    pub(super) ny: usize,
    /// `edges[offs[k]..offs[k + 1]]` (low 30 bits) are cell `k = r * nx + c`'s edges (start
    /// indices in `pts`); the top 2 bits of `offs[k]` are the cell's state.
    offs: Vec<u32>,
    edges: Vec<EdgeRef>,
    /// Entries a test reads, `(worst, mean)` over the cells, counted at build time.
    pub(super) cost: (usize, f64),
}

/// One edge as filed in a grid cell (8 bytes): its start index (with [`SPANS_CX`]) and its
/// latitude range in the cell's row, `qlo = floor(row_frac(ylo))`, `qhi =
/// ceil(row_frac(yhi))`. A test skips an edge's eastward tests when `row_frac(py) < qlo` or
/// `> qhi`: `row_frac` is monotone, so then `py < ylo` or `py > yhi`, and the edge can neither
/// straddle nor touch the fix's latitude (`edge_hit` would return `Miss`), all without reading
/// its coordinates.
#[derive(Clone, Copy, Debug)]
pub(super) struct EdgeRef {
    j: u32,
    qlo: u16,
    qhi: u16,
}

impl EdgeRef {
    /// The edge's start index in the part's positions.
    #[inline(always)]
    pub(super) fn edge(self) -> usize {
        (self.j & !SPANS_CX) as usize
    }
}

/// [`edge_hit`] for the ray going north from the point: the same predicate with the axes
/// swapped (a mirror, exact), so its half-open rule is on longitude.
#[inline(always)]
fn edge_hit_north(a: [f64; 2], b: [f64; 2], px: f64, py: f64) -> Hit {
    edge_hit([a[1], a[0]], [b[1], b[0]], py, px)
}

impl Grid {
    // Truncation of a non-negative float is its floor (and, unlike `f64::floor` on the
    // baseline x86-64 target, not a libm call); `as` saturates, NaN goes to column 0.
    #[inline(always)]
    pub(super) fn col_of(&self, x: f64) -> usize {
        let t = (x - self.x0) * self.inv_w;
        if t >= 0.0 {
            (t as usize).min(self.nx - 1)
        } else {
            0
        }
    }

    #[inline(always)]
    pub(super) fn row_of(&self, y: f64) -> usize {
        let t = (y - self.y0) * self.inv_h;
        if t >= 0.0 {
            (t as usize).min(self.ny - 1)
        } else {
            0
        }
    }

    /// Longitude of column `c`'s reference points (the same expression at build and query).
    #[inline(always)]
    fn ref_x(&self, c: usize) -> f64 {
        if self.nx > 1 {
            self.x0 + (c as f64 + REF_FX) / self.inv_w
        } else {
            self.xm
        }
    }

    /// Latitude of row `r`'s reference points.
    #[inline(always)]
    fn ref_y(&self, r: usize) -> f64 {
        if self.ny > 1 {
            self.y0 + (r as f64 + REF_FY) / self.inv_h
        } else {
            self.ym
        }
    }

    /// Latitude `y` as a position within row `r` on a 16-bit scale, clamped to `[0, 65535]`.
    /// Monotone in `y`: the steps of `row_of` (correctly rounded subtraction and
    /// multiplication), a correctly rounded subtraction, an exact scaling by 2^16, a clamp.
    #[inline(always)]
    fn row_frac(&self, y: f64, r: usize) -> f64 {
        (((y - self.y0) * self.inv_h - r as f64) * 65536.0).clamp(0.0, 65535.0)
    }

    /// Cell `k`'s state and edges: one lookup in `offs`, whose top bits hold the state so a
    /// test touches one array per cell.
    #[inline(always)]
    pub(super) fn cell(&self, k: usize) -> (u32, &[EdgeRef]) {
        let (a, b) = (self.offs[k], self.offs[k + 1]);
        (
            a >> STATE_SHIFT,
            &self.edges[(a & OFFS_MASK) as usize..(b & OFFS_MASK) as usize],
        )
    }

    /// Cell width and height in degrees (infinite for a single column / row).
    pub(super) fn cell_size(&self) -> (f64, f64) {
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

    /// Heap bytes held by the cell offsets and entries.
    pub(super) fn heap_bytes(&self) -> usize {
        self.offs.capacity() * 4 + self.edges.capacity() * std::mem::size_of::<EdgeRef>()
    }
}

impl PolyPart {
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

    /// The rows `(r0, r1)` edge `j` is filed in: those its latitude range meets.
    fn edge_rows(&self, g: &Grid, j: usize) -> (usize, usize) {
        let b = self.edge_box(j);
        (g.row_of(b[1]), g.row_of(b[3]))
    }

    /// The columns `(c0, c1)` edge `j` is filed under in row `r`: the longitudes of its part
    /// within the row's latitude band (widened by [`CLIP_SLACK`] in both axes, and never beyond
    /// the edge's own bounding box). The same expression at build and query, so a walk can
    /// tell where an edge was first filed.
    fn row_cols(&self, g: &Grid, j: usize, r: usize) -> (usize, usize) {
        let b = self.edge_box(j);
        let (r0, r1) = (g.row_of(b[1]), g.row_of(b[3]));
        if r0 == r1 {
            return (g.col_of(b[0]), g.col_of(b[2]));
        }
        let pts = self.pts();
        let (a, e) = (pts[j], pts[j + 1]);
        let (_, h) = g.cell_size();
        // The row's band, widened; the edge's latitude range is not flat here (r0 < r1).
        let lo = (g.y0 + r as f64 * h - CLIP_SLACK).max(b[1]);
        let hi = (g.y0 + (r + 1) as f64 * h + CLIP_SLACK).min(b[3]);
        let dy = e[1] - a[1];
        let at = |y: f64| a[0] + ((y - a[1]) / dy).clamp(0.0, 1.0) * (e[0] - a[0]);
        let (xa, xb) = (at(lo), at(hi));
        let xlo = (xa.min(xb) - CLIP_SLACK).max(b[0]);
        let xhi = (xa.max(xb) + CLIP_SLACK).min(b[2]);
        (g.col_of(xlo), g.col_of(xhi.max(xlo)))
    }

    /// The edge grid, or `None` if even a coarse grid would exceed the 30-bit offsets.
    pub(super) fn build_grid(&self) -> Option<Grid> {
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
                xm: self.bbox[0] + w / 2.0,
                ym: self.bbox[1] + h / 2.0,
                nx,
                ny,
                offs: Vec::new(),
                edges: Vec::new(),
                cost: (0, 0.0),
            };
            // Count first, so a polygon of long edges is re-gridded coarser before anything
            // big is allocated. Entries come from rows spanned (`across_rows`) and columns
            // spanned within a row (`across_cols`); halving the side that contributes more
            // keeps long vertical teeth in many thin columns and long horizontal ones in many
            // thin rows. Each halving makes progress, down to a single cell, where every edge
            // is filed once.
            let limit = edges.saturating_mul(MAX_ENTRIES_PER_EDGE);
            let (mut total, mut across_rows, mut across_cols) = (0usize, 0usize, 0usize);
            for j in self.edge_starts() {
                let (r0, r1) = self.edge_rows(&g, j);
                across_rows += r1 - r0;
                for r in r0..=r1 {
                    let (c0, c1) = self.row_cols(&g, j, r);
                    total += c1 - c0 + 1;
                    across_cols += c1 - c0;
                }
                if total > limit.saturating_mul(4) {
                    break; // far over: the split below is decided on what was counted
                }
            }
            if total > limit && nx * ny > 1 {
                if ny > 1 && (across_rows >= across_cols || nx == 1) {
                    ny = (ny / 2).max(1);
                } else {
                    nx = (nx / 2).max(1);
                }
                continue;
            }
            if total > OFFS_MASK as usize {
                return None; // beyond any configured limit in practice; the plain scan is exact
            }
            let mut counts = vec![0u32; nx * ny + 1];
            for j in self.edge_starts() {
                let (r0, r1) = self.edge_rows(&g, j);
                for r in r0..=r1 {
                    let (c0, c1) = self.row_cols(&g, j, r);
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
            // The first column each entry's edge is filed under in its row: the sweep counts
            // an edge once over a run of cells. Dropped after the build.
            let mut first = vec![0u32; acc as usize];
            let mut fill: Vec<u32> = g.offs[..nx * ny].to_vec();
            for j in self.edge_starts() {
                let eb = self.edge_box(j);
                let (r0, r1) = self.edge_rows(&g, j);
                for r in r0..=r1 {
                    let (c0, c1) = self.row_cols(&g, j, r);
                    // In [0, 65535] already: the casts are exact.
                    let qlo = g.row_frac(eb[1], r).floor() as u16;
                    let qhi = g.row_frac(eb[3], r).ceil() as u16;
                    for c in c0..=c1 {
                        let f = &mut fill[r * nx + c];
                        let cx = g.ref_x(c);
                        let spans = if eb[0] <= cx && cx <= eb[2] {
                            SPANS_CX
                        } else {
                            0
                        };
                        g.edges[*f as usize] = EdgeRef {
                            j: j as u32 | spans,
                            qlo,
                            qhi,
                        };
                        first[*f as usize] = c0 as u32;
                        *f += 1;
                    }
                }
            }
            let state = self.reference_states(&g, &first);
            for (o, st) in g.offs.iter_mut().zip(state) {
                *o |= st << STATE_SHIFT;
            }
            // Cells whose walk is short are walked (it reads the edge-free cells' states only,
            // which are final by now). The cost of a test from each cell, in entries read:
            // its own for the cell test, the walk's otherwise. Cells are equal in area, so the
            // mean is the expected cost of a fix uniform in the bounding box.
            let (mut worst, mut total) = (0usize, 0f64);
            for r in 0..ny {
                let mut run = 0usize;
                for c in (0..nx).rev() {
                    let k = r * nx + c;
                    let (state, edges) = g.cell(k);
                    let n = edges.len();
                    run = if n == 0 && state != NO_REF {
                        0
                    } else {
                        run + n
                    };
                    let cost = if n > 0 && state != NO_REF && run > WALK_MAX {
                        n
                    } else {
                        if n > 0 && state != NO_REF {
                            g.offs[k] = (g.offs[k] & OFFS_MASK) | (WALK << STATE_SHIFT);
                        }
                        run
                    };
                    worst = worst.max(cost);
                    total += cost as f64;
                }
            }
            g.cost = (worst, total / (nx * ny) as f64);
            return Some(g);
        }
    }

    /// Every cell's state: for a cell whose reference q rounds into it and lies on no edge,
    /// `inside(q) XOR (parity of its edges' northward crossings of q)`; else [`NO_REF`]. One
    /// sweep per row from the east: E(q) of the row's references, each from the previous one
    /// east of it and the edges filed between them (see [`Grid`]); E is 0 east of the grid.
    fn reference_states(&self, g: &Grid, first: &[u32]) -> Vec<u32> {
        let (nx, ny) = (g.nx, g.ny);
        let pts = self.pts();
        let mut state = vec![NO_REF; nx * ny];
        for r in 0..ny {
            let cy = g.ref_y(r);
            if g.row_of(cy) != r {
                continue; // rounding put the references elsewhere: the row is walked
            }
            // E parity of the last reference passed (east of the grid: nothing east, 0), and its
            // column (`nx` for "east of the grid").
            let (mut east_e, mut east_c) = (false, nx);
            for c in (0..nx).rev() {
                let cx = g.ref_x(c);
                if g.col_of(cx) != c {
                    continue;
                }
                // Edges filed in cells c..=east_c (to the grid's end when nothing is east),
                // each counted once in the first of those cells listing it, change E between
                // the two references by their crossings of either.
                let mut e_here = east_e;
                for cc in c..=east_c.min(nx - 1) {
                    let k = r * nx + cc;
                    let base = (g.offs[k] & OFFS_MASK) as usize;
                    for (i, e) in g.cell(k).1.iter().enumerate() {
                        if cc != c && first[base + i] as usize != cc {
                            continue; // also listed in cell cc - 1 >= c
                        }
                        let j = e.edge();
                        let (a, b) = (pts[j], pts[j + 1]);
                        if edge_hit(a, b, cx, cy) == Hit::Cross {
                            e_here = !e_here;
                        }
                        if east_c < nx && edge_hit(a, b, g.ref_x(east_c), cy) == Hit::Cross {
                            e_here = !e_here;
                        }
                    }
                }
                east_e = e_here;
                east_c = c;
                // The reference itself: on no edge of its cell (so on none at all), and its
                // northward crossings folded in.
                let k = r * nx + c;
                let mut s = e_here;
                let mut on_edge = false;
                for e in g.cell(k).1 {
                    let j = e.edge();
                    let (a, b) = (pts[j], pts[j + 1]);
                    match edge_hit_north(a, b, cx, cy) {
                        Hit::Boundary => on_edge = true,
                        Hit::Cross => s = !s,
                        Hit::Miss => {}
                    }
                }
                if !on_edge {
                    state[k] = if s { REF_IN } else { REF_OUT };
                }
            }
        }
        state
    }

    /// [`PolyPart::contains`] through the edge grid: the cell test described at [`Grid`], or
    /// the walk when the cell has no reference or p' is on the boundary.
    pub(super) fn contains_grid(&self, g: &Grid, px: f64, py: f64) -> bool {
        if !self.bbox_contains(px, py) {
            return false;
        }
        let (r, c) = (g.row_of(py), g.col_of(px));
        let (state, edges) = g.cell(r * g.nx + c);
        if state == NO_REF || state == WALK {
            return self.walk(g, px, py, r, c);
        }
        let pts = self.pts();
        let qp = g.row_frac(py, r);
        let qx = g.ref_x(c);
        let mut inside = state == REF_IN;
        for e in edges {
            let j = e.edge();
            let eastward = !(qp < f64::from(e.qlo) || qp > f64::from(e.qhi));
            if !eastward && e.j & SPANS_CX == 0 {
                continue; // misses all three tests
            }
            let (a, b) = (pts[j], pts[j + 1]);
            if eastward {
                match edge_hit(a, b, px, py) {
                    Hit::Boundary => return true,
                    Hit::Cross => inside = !inside,
                    Hit::Miss => {}
                }
                match edge_hit(a, b, qx, py) {
                    Hit::Boundary => return self.contains_via_column(g, edges, px, py, r, c),
                    Hit::Cross => inside = !inside,
                    Hit::Miss => {}
                }
            }
            if e.j & SPANS_CX != 0 {
                match edge_hit_north(a, b, qx, py) {
                    Hit::Boundary => return self.contains_via_column(g, edges, px, py, r, c),
                    Hit::Cross => inside = !inside,
                    Hit::Miss => {}
                }
            }
        }
        inside
    }

    /// The cell test by the other corner: p' = (qx, py) lies on an edge, so go from p north or
    /// south to p2 = (px, qy), then east or west to q. With p and p2 on no edge,
    /// `inside(p) = N(p) = N(p2) XOR sum_k [N(e,p) + N(e,p2)]` and `N(p2) = E(p2) = inside(q)
    /// XOR sum_k [E(e,p2) + E(e,q)]`, the same argument as at [`Grid`] with the axes swapped.
    /// `inside(q)` is the stored state with q's own northward crossings taken out again. If p2
    /// lies on an edge too, the walk answers. Only reached when the fix's latitude is one at
    /// which an edge of the cell meets the reference's longitude.
    fn contains_via_column(
        &self,
        g: &Grid,
        edges: &[EdgeRef],
        px: f64,
        py: f64,
        r: usize,
        c: usize,
    ) -> bool {
        let pts = self.pts();
        let (state, _) = g.cell(r * g.nx + c);
        let (qx, qy) = (g.ref_x(c), g.ref_y(r));
        let mut inside = state == REF_IN;
        for e in edges {
            let j = e.edge();
            let (a, b) = (pts[j], pts[j + 1]);
            // Undo the fold: S = inside(q) XOR N-crossings of q.
            if edge_hit_north(a, b, qx, qy) == Hit::Cross {
                inside = !inside;
            }
            match edge_hit_north(a, b, px, py) {
                Hit::Boundary => return true,
                Hit::Cross => inside = !inside,
                Hit::Miss => {}
            }
            match edge_hit_north(a, b, px, qy) {
                Hit::Boundary => return self.walk(g, px, py, r, c),
                Hit::Cross => inside = !inside,
                Hit::Miss => {}
            }
            if edge_hit(a, b, px, qy) == Hit::Cross {
                inside = !inside;
            }
            if edge_hit(a, b, qx, qy) == Hit::Cross {
                inside = !inside;
            }
        }
        inside
    }

    /// The walk east from cell (r, c) to the first edge-free cell with a reference (see
    /// [`Grid`]); past the grid's east end the state is outside.
    fn walk(&self, g: &Grid, px: f64, py: f64, r: usize, c: usize) -> bool {
        let row = r * g.nx;
        let pts = self.pts();
        let qp = g.row_frac(py, r);
        let mut inside = false;
        for cc in c..g.nx {
            let (state, edges) = g.cell(row + cc);
            if edges.is_empty() && state != NO_REF {
                // An edge-free cell's state is its reference's inside state.
                return inside != (state == REF_IN);
            }
            for e in edges {
                // Exact skip: outside the edge's latitude range `edge_hit` is a miss.
                if qp < f64::from(e.qlo) || qp > f64::from(e.qhi) {
                    continue;
                }
                let j = e.edge();
                // Count each edge in the first walked cell that lists it.
                if cc != c && self.row_cols(g, j, r).0 != cc {
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
}
