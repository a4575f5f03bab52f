//! Generated fence layouts: sites of star-shaped polygons and circles on a jittered grid, with
//! varied dwell thresholds, exit buffers, confirm counts and accuracy filters, and the GeoJSON
//! form fences are uploaded and written in.
//!
//! Invariants: pure (no clock, no I/O); the same [`LayoutSpec`] gives the same fences, with the
//! same ids (`site-{i}`, `site-{i}-dock`); every generated fence passes the validation the API
//! applies to a posted one (a failure is a generator bug and panics).

use std::sync::Arc;

use serde_json::json;

use crate::rng::Rng;
use geodwell_core::fences::{Fence, FenceLimits, FenceSettings};
use geodwell_core::time::Dur;

const M_PER_DEG: f64 = Fence::M_PER_DEG;

/// Layout of generated fences.
#[derive(Debug, Clone, PartialEq)]
pub struct LayoutSpec {
    /// Seed of the layout.
    pub seed: u64,
    /// Number of sites; about 15 % of them get a second, nested fence (a dock inside a yard).
    pub sites: u32,
    /// Centre of the area, degrees.
    pub center_lat: f64,
    /// Centre of the area, degrees.
    pub center_lon: f64,
    /// Distance between neighbouring sites, metres.
    pub spacing_m: f64,
}

impl Default for LayoutSpec {
    /// 100 sites 1.2 km apart around 52.0 N 5.0 E.
    fn default() -> LayoutSpec {
        LayoutSpec {
            seed: 1,
            sites: 100,
            center_lat: 52.0,
            center_lon: 5.0,
            spacing_m: 1200.0,
        }
    }
}

/// The fences as one GeoJSON FeatureCollection, each in the normalized form the API serves
/// (what `POST /v1/fences` takes and `--write-trace` writes).
pub fn feature_collection(fences: &[Arc<Fence>]) -> geojson::FeatureCollection {
    geojson::FeatureCollection {
        bbox: None,
        features: fences.iter().map(|f| f.to_feature()).collect(),
        foreign_members: None,
    }
}

/// Generates `spec.sites` sites of fences: star-shaped polygons (8-32 vertices, 80-350 m) and
/// circles (60-250 m), on a jittered grid, with varied dwell thresholds, exit buffers, confirm
/// counts and accuracy filters. Every fence is validated like one posted to the API.
pub fn generate_fences(spec: &LayoutSpec) -> Vec<Fence> {
    let mut rng = Rng::new(spec.seed ^ 0x5EED_FE4C);
    let side = (spec.sites as f64).sqrt().ceil().max(1.0) as u32;
    let kx = M_PER_DEG * spec.center_lat.to_radians().cos();
    let half = side as f64 * spec.spacing_m / 2.0;
    let limits = FenceLimits::default();
    let dwell_sets: [&[i64]; 5] = [
        &[300_000],
        &[600_000],
        &[300_000, 1_800_000],
        &[900_000, 3_600_000],
        &[120_000, 600_000],
    ];
    let kinds = ["depot", "customer", "yard", "port", "site"];
    let mut out = Vec::new();
    for i in 0..spec.sites {
        let (gx, gy) = (i % side, i / side);
        let x = gx as f64 * spec.spacing_m - half + rng.range(-0.25, 0.25) * spec.spacing_m;
        let y = gy as f64 * spec.spacing_m - half + rng.range(-0.25, 0.25) * spec.spacing_m;
        let lat = spec.center_lat + y / M_PER_DEG;
        let lon = spec.center_lon + x / kx;
        let settings = FenceSettings {
            dwell: rng.pick(&dwell_sets).iter().map(|&ms| Dur(ms)).collect(),
            exit_buffer_m: *rng.pick(&[0.0, 0.0, 10.0, 25.0]),
            enter_confirm: if rng.chance(0.2) { 2 } else { 1 },
            exit_confirm: if rng.chance(0.3) { 2 } else { 1 },
            max_accuracy_m: rng.chance(0.3).then_some(50.0),
            tags: Arc::new(json!({"kind": rng.pick(&kinds), "site": i})),
            ..FenceSettings::default()
        };
        let id = format!("site-{i}");
        let fence = if rng.chance(0.4) {
            Fence::new_circle(&id, lon, lat, rng.range(60.0, 250.0), settings, &limits)
        } else {
            let n = rng.between(8, 32) as usize;
            let r = rng.range(80.0, 350.0);
            let mut ring: Vec<[f64; 2]> = (0..n)
                .map(|k| {
                    let a = k as f64 / n as f64 * std::f64::consts::TAU;
                    let rr = r * rng.range(0.6, 1.0);
                    [lon + rr * a.cos() / kx, lat + rr * a.sin() / M_PER_DEG]
                })
                .collect();
            ring.push(ring[0]);
            Fence::new_polygon(&id, &[vec![ring]], settings, &limits)
        };
        // Generated geometry is valid by construction; a failure is a generator bug.
        out.push(fence.expect("generated fence is valid"));
        if rng.chance(0.15) {
            let dock = FenceSettings {
                dwell: vec![Dur(120_000), Dur(900_000)],
                tags: Arc::new(json!({"kind": "dock", "site": i})),
                ..FenceSettings::default()
            };
            let r = rng.range(25.0, 50.0);
            let id = format!("site-{i}-dock");
            out.push(
                Fence::new_circle(&id, lon, lat, r, dock, &limits)
                    .expect("generated dock is valid"),
            );
        }
    }
    out
}
