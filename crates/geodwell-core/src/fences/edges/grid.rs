//! The edge grid of a large polygon part: a uniform grid over its bounding box listing, per
//! cell, the edges whose bounding box meets the cell, and for each edge-free cell whether it is
//! inside. Built once with the part; answers the containment test in a short walk along one row.
//!
//! Invariant: the indexed test evaluates the same exact per-edge predicate (`edge_hit`) as the
//! plain scan and returns the same answer bit for bit; the argument is written out at [`Grid`]
//! and in `docs/fences.md`. The grid is also what the boundary-distance search of the parent
//! module walks in rings of cells.

use super::{Hit, PolyPart, edge_hit};

/// Grid cells per edge when sizing the grid. Measured on ragged 10k-80k-vertex coastlines
/// (`docs/bench-fences.md`): 1 cell/edge walks too many boundary cells, 8 costs more memory
/// misses than it saves; 4 was fastest, at about 40 bytes per vertex including coordinates.
const CELLS_PER_EDGE: usize = 4;

/// Upper bound on cell entries per edge on average: guards against polygons of long diagonal
/// edges, whose bounding boxes cover many cells; the grid is made coarser until it holds.
const MAX_ENTRIES_PER_EDGE: usize = 6;

/// Largest grid side, in cells.
const MAX_SIDE: usize = 4096;

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
pub(super) struct Grid {
    pub(super) x0: f64,
    pub(super) y0: f64,
    /// Cells per degree, or 0 for a single column / row.
    inv_w: f64,
    inv_h: f64,
    pub(super) nx: usize,
    pub(super) ny: usize,
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
pub(super) struct EdgeRef {
    pub(super) j: u32,
    qlo: u16,
    qhi: u16,
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

    /// [`PolyPart::contains`] through the edge grid: the walk described at [`Grid`].
    pub(super) fn contains_grid(&self, g: &Grid, px: f64, py: f64) -> bool {
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
}
