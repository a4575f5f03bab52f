//! Data generators shared by `benches/fences.rs` and `benches/postgis.rs`: the same code and
//! seeds give both benchmarks the same fences and fixes, so PostGIS is timed on exactly the data
//! the fence benchmark measures. Included with `#[path]`; each bench uses a subset.
#![allow(dead_code)]

use geodwell_core::fences::Fence;
pub use geodwell_sim::rng::Rng;

pub const M_PER_DEG: f64 = Fence::M_PER_DEG;

/// A polygon's rings: exterior first, then holes; each closed.
pub type Rings = Vec<Vec<[f64; 2]>>;

/// A generated small fence: id, rings, centre lon, centre lat, radius (m).
pub type SmallFence = (String, Rings, f64, f64, f64);

/// Small-fence region (about 155 km x 220 km) and large-fence region (about 2,100 km x 2,200 km).
pub const SMALL_REGION: [f64; 4] = [10.0, 45.0, 12.0, 47.0];
pub const LARGE_REGION: [f64; 4] = [0.0, 35.0, 30.0, 55.0];

/// A star-shaped ring around (lon, lat) with the given radii (metres) at even angles, closed.
pub fn radial_ring(lon: f64, lat: f64, radii: &[f64], reverse: bool) -> Vec<[f64; 2]> {
    let n = radii.len();
    let kx = M_PER_DEG * lat.to_radians().cos();
    let mut ring: Vec<[f64; 2]> = (0..n)
        .map(|i| {
            let a = i as f64 / n as f64 * std::f64::consts::TAU;
            [
                lon + radii[i] * a.cos() / kx,
                lat + radii[i] * a.sin() / M_PER_DEG,
            ]
        })
        .collect();
    if reverse {
        ring.reverse();
    }
    ring.push(ring[0]);
    ring
}

pub fn small_fences(rng: &mut Rng, count: usize) -> Vec<SmallFence> {
    let mut out: Vec<SmallFence> = Vec::with_capacity(count);
    for i in 0..count {
        // 5% share a previous fence's centre (nested/overlapping sites); the rest are uniform.
        let (lon, lat) = if i > 0 && rng.unit() < 0.05 {
            let j = rng.below(i as u64) as usize;
            (out[j].2, out[j].3)
        } else {
            (
                rng.range(SMALL_REGION[0], SMALL_REGION[2]),
                rng.range(SMALL_REGION[1], SMALL_REGION[3]),
            )
        };
        // Log-uniform radius 50 m .. 2 km.
        let r = 50.0 * (40f64).powf(rng.unit());
        let n = rng.between(20, 200) as usize;
        let radii: Vec<f64> = (0..n).map(|_| r * rng.range(0.7, 1.0)).collect();
        let mut rings = vec![radial_ring(lon, lat, &radii, false)];
        if rng.unit() < 0.2 {
            let hn = rng.between(6, 24) as usize;
            let hr: Vec<f64> = (0..hn).map(|_| r * rng.range(0.2, 0.4)).collect();
            rings.push(radial_ring(lon, lat, &hr, true));
        }
        out.push((format!("small-{i}"), rings, lon, lat, r));
    }
    out
}

/// Midpoint displacement of a periodic radius profile: a ragged, coastline-like star polygon.
pub fn coastline_radii(rng: &mut Rng, n: usize, r: f64) -> Vec<f64> {
    let mut prof: Vec<f64> = (0..16).map(|_| r * rng.range(0.7, 1.3)).collect();
    let mut amp = 0.25 * r;
    while prof.len() < n {
        let m = prof.len();
        let mut next = Vec::with_capacity(2 * m);
        for k in 0..m {
            let (a, b) = (prof[k], prof[(k + 1) % m]);
            next.push(a);
            next.push(0.5 * (a + b) + amp * (rng.unit() - 0.5));
        }
        prof = next;
        amp *= 0.62;
    }
    let m = prof.len();
    (0..n).map(|i| prof[i * m / n].max(0.1 * r)).collect()
}

pub fn large_fences(rng: &mut Rng, count: usize) -> Vec<(String, Rings)> {
    (0..count)
        .map(|i| {
            let lon = rng.range(LARGE_REGION[0] + 1.0, LARGE_REGION[2] - 1.0);
            let lat = rng.range(LARGE_REGION[1] + 1.0, LARGE_REGION[3] - 1.0);
            let r = rng.range(15_000.0, 60_000.0);
            let n = rng.between(10_000, 80_000) as usize;
            let radii = coastline_radii(rng, n - 1, r);
            (
                format!("large-{i}"),
                vec![radial_ring(lon, lat, &radii, false)],
            )
        })
        .collect()
}

pub fn small_fixes(rng: &mut Rng, n: usize, fences: &[SmallFence]) -> Vec<[f64; 2]> {
    (0..n)
        .map(|_| {
            if rng.unit() < 0.5 {
                [
                    rng.range(SMALL_REGION[0], SMALL_REGION[2]),
                    rng.range(SMALL_REGION[1], SMALL_REGION[3]),
                ]
            } else {
                // Near a fence: within 1.5 radii of its centre.
                let f = &fences[rng.below(fences.len() as u64) as usize];
                let (d, a) = (
                    f.4 * 1.5 * rng.unit().sqrt(),
                    rng.range(0.0, std::f64::consts::TAU),
                );
                [
                    f.2 + d * a.cos() / (M_PER_DEG * f.3.to_radians().cos()),
                    f.3 + d * a.sin() / M_PER_DEG,
                ]
            }
        })
        .collect()
}

pub fn large_fixes(rng: &mut Rng, n: usize, fences: &[(String, Rings)]) -> Vec<[f64; 2]> {
    (0..n)
        .map(|_| {
            if rng.unit() < 0.3 {
                [
                    rng.range(LARGE_REGION[0], LARGE_REGION[2]),
                    rng.range(LARGE_REGION[1], LARGE_REGION[3]),
                ]
            } else {
                // Near an edge: a point on a random edge moved up to 200 m in each direction.
                let ring = &fences[rng.below(fences.len() as u64) as usize].1[0];
                let k = rng.below(ring.len() as u64 - 1) as usize;
                let (a, b) = (ring[k], ring[k + 1]);
                let t = rng.unit();
                let kx = M_PER_DEG * a[1].to_radians().cos();
                [
                    a[0] + t * (b[0] - a[0]) + rng.range(-200.0, 200.0) / kx,
                    a[1] + t * (b[1] - a[1]) + rng.range(-200.0, 200.0) / M_PER_DEG,
                ]
            }
        })
        .collect()
}

/// Adversarial shapes for the edge grid, each a single closed ring of about `n` vertices inside
/// the 0.2 x 0.2 degree box at (10, 50): names and rings. They are what a careless or hostile
/// client can upload: a star of long thin spikes (every spike edge a long diagonal), a comb of
/// vertical teeth (every row crosses every tooth), the same comb turned 45 degrees (long
/// diagonals and no edge-free cells), a saw of horizontal teeth and a tight spiral strip.
pub fn adversarial_fences(n: usize) -> Vec<(String, Rings)> {
    let (cx, cy, s) = (10.1, 50.1, 0.1);
    let close = |mut r: Vec<[f64; 2]>| {
        r.push(r[0]);
        r
    };
    let star = {
        let k = n / 2;
        close(
            (0..2 * k)
                .map(|i| {
                    let a = i as f64 / (2 * k) as f64 * std::f64::consts::TAU;
                    let rad = if i % 2 == 0 { s } else { s * 0.05 };
                    [cx + rad * a.cos(), cy + rad * a.sin()]
                })
                .collect(),
        )
    };
    // Teeth along x from a base strip; tooth i spans [x_i, x_i + w/2] and rises to the top.
    let comb = |teeth: usize| -> Vec<[f64; 2]> {
        let w = 2.0 * s / teeth as f64;
        let (x0, y0) = (cx - s, cy - s);
        let mut r = vec![[x0, y0]];
        r.push([x0 + 2.0 * s, y0]);
        for i in (0..teeth).rev() {
            let xa = x0 + i as f64 * w;
            r.push([xa + w / 2.0, y0 + 0.1 * s]);
            r.push([xa + w / 2.0, y0 + 2.0 * s]);
            r.push([xa, y0 + 2.0 * s]);
            r.push([xa, y0 + 0.1 * s]);
        }
        r.pop();
        r
    };
    let teeth = n / 4;
    let vcomb = close(comb(teeth));
    let rot = |p: [f64; 2]| {
        let (dx, dy) = (p[0] - cx, p[1] - cy);
        let h = std::f64::consts::FRAC_1_SQRT_2;
        [cx + (dx - dy) * h, cy + (dx + dy) * h]
    };
    let dcomb = close(comb(teeth).into_iter().map(rot).collect());
    let hsaw = close(
        comb(teeth)
            .into_iter()
            .map(|p| [cx + (p[1] - cy), cy + (p[0] - cx)])
            .collect(),
    );
    let spiral = {
        // An Archimedean strip: out along r = a + b t, back along r = a + b t + gap.
        let m = n / 2;
        let turns = (m as f64 / 250.0).max(2.0);
        let b = s * 0.9 / (turns * std::f64::consts::TAU);
        let gap = b * std::f64::consts::TAU * 0.5;
        let pt = |t: f64, off: f64| {
            let rad = s * 0.05 + b * t + off;
            [cx + rad * t.cos(), cy + rad * t.sin()]
        };
        let tmax = turns * std::f64::consts::TAU;
        let mut r: Vec<[f64; 2]> = (0..m)
            .map(|i| pt(tmax * i as f64 / m as f64, 0.0))
            .collect();
        r.extend((0..m).rev().map(|i| pt(tmax * i as f64 / m as f64, gap)));
        close(r)
    };
    vec![
        ("star".into(), vec![star]),
        ("comb".into(), vec![vcomb]),
        ("comb-45".into(), vec![dcomb]),
        ("saw".into(), vec![hsaw]),
        ("spiral".into(), vec![spiral]),
    ]
}
