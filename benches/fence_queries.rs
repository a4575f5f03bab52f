//! The API's fence queries (harness = false): `GET /v1/fences?contains=` and `?bbox=` as the
//! server answers them, from its read copy of the fences (`geodwell::fences::FenceMap`: the
//! R-tree's candidates sorted by id, then the exact test, a page of at most 10,000),
//! side by side with the alternative of testing every fence, on the same 10,000 polygon fences
//! and points as `benches/fences.rs` (and PostGIS in `benches/postgis.rs`).
//!
//! `cargo bench --bench fence_queries [-- --fences N --queries M]`: per query kind, p50 / p99 /
//! max latency of one query and the ratio to the scan; every answer is compared with the scan's
//! (exit 1 on a difference). Writes `target/bench/fence_queries.json`. See
//! `docs/bench-fences.md`.

use std::sync::Arc;
use std::time::Instant;

use geodwell::fences::FenceMap;
use geodwell_core::fences::{Fence, FenceLimits, FenceSettings, Rect};

#[path = "common/fencegen.rs"]
mod fencegen;
use fencegen::*;

#[path = "common/out.rs"]
mod benchout;

#[path = "common/args.rs"]
mod args;
use args::arg;

/// p50, p99, max of `ns`, in microseconds.
fn pcts(ns: &mut [u64]) -> [f64; 3] {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    [at(0.5), at(0.99), at(1.0)]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n = arg(&args, "--fences", 10_000).max(10);
    let queries = arg(&args, "--queries", 100_000).max(100);
    let scans = (queries / 20).max(100);
    let mut rng = Rng::stream(0x9E37_79B9_7F4A_7C15, 1);
    let small = small_fences(&mut rng, n);
    let fences: Vec<Arc<Fence>> = small
        .iter()
        .map(|(id, rings, ..)| {
            Arc::new(
                Fence::new_polygon(
                    id,
                    std::slice::from_ref(rings),
                    FenceSettings::default(),
                    &FenceLimits::default(),
                )
                .expect("generated fences are valid"),
            )
        })
        .collect();
    let t = Instant::now();
    let map = FenceMap::new(&fences);
    let build_ms = t.elapsed().as_secs_f64() * 1000.0;
    let points = small_fixes(&mut rng, queries, &small);
    // Windows of 100 m to 20 km a side around the same points (a map viewport to a city).
    let windows: Vec<Rect> = points
        .iter()
        .map(|p| {
            let side_m = 100.0 * 200f64.powf(rng.unit());
            let dlat = side_m / M_PER_DEG / 2.0;
            let dlon = dlat / p[1].to_radians().cos();
            Rect {
                min_lon: p[0] - dlon,
                min_lat: p[1] - dlat,
                max_lon: p[0] + dlon,
                max_lat: p[1] + dlat,
            }
        })
        .collect();
    let sorted_ids = |mut v: Vec<String>| {
        v.sort();
        v
    };

    let mut rows = Vec::new();
    let mut failed = false;
    println!("\n## fence queries: {n} polygon fences, {queries} queries (scan: {scans})\n");
    println!("index + grid built in {build_ms:.1} ms\n");
    println!(
        "| query | answer | p50 µs | p99 µs | max µs | mean matches | scan p50 µs | scan p99 µs | p99 scan / index |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for kind in ["contains", "bbox"] {
        let mut ns = Vec::with_capacity(queries);
        let mut matches = 0usize;
        let mut answers = Vec::with_capacity(scans);
        for i in 0..queries {
            let t = Instant::now();
            // As the API answers a page of up to 10,000 fences.
            let (lon, lat) = (points[i][0], points[i][1]);
            let page = match kind {
                "contains" => map.filtered_page(&[Rect::point(lon, lat)], None, 10_000, |f| {
                    f.contains(lon, lat)
                }),
                _ => {
                    let w = &windows[i];
                    map.filtered_page(std::slice::from_ref(w), None, 10_000, |f| f.meets_rect(w))
                }
            };
            ns.push(t.elapsed().as_nanos() as u64);
            assert!(page.resume.is_none(), "one page holds every match");
            let got = page.fences;
            matches += got.len();
            if i < scans {
                answers.push(
                    got.iter()
                        .map(|s| s.fence.id.to_string())
                        .collect::<Vec<_>>(),
                );
            }
        }
        let mut scan_ns = Vec::with_capacity(scans);
        for (i, want) in answers.iter().enumerate() {
            let t = Instant::now();
            let hit: Vec<String> = fences
                .iter()
                .filter(|f| match kind {
                    "contains" => f.contains(points[i][0], points[i][1]),
                    _ => f.meets_rect(&windows[i]),
                })
                .map(|f| f.id.to_string())
                .collect();
            let hit = sorted_ids(hit);
            scan_ns.push(t.elapsed().as_nanos() as u64);
            if hit != *want {
                eprintln!("MISMATCH {kind} query {i}: index {want:?}, scan {hit:?}");
                failed = true;
            }
        }
        let [p50, p99, max] = pcts(&mut ns);
        let [s50, s99, _] = pcts(&mut scan_ns);
        let mean = matches as f64 / queries as f64;
        println!(
            "| {kind} | the fences, sorted by id | {p50:.1} | {p99:.1} | {max:.1} | {mean:.2} | {s50:.1} | {s99:.1} | {:.0}x |",
            s99 / p99
        );
        rows.push(serde_json::json!({
            "query": kind, "fences": n, "queries": queries, "p50_us": p50, "p99_us": p99,
            "max_us": max, "mean_matches": mean, "scan_p50_us": s50, "scan_p99_us": s99,
        }));
    }
    let doc = serde_json::json!({"build_ms": build_ms, "rows": rows});
    match benchout::write_json("fence_queries", &doc) {
        Ok(p) => println!("\nJSON: {}", p.display()),
        Err(e) => eprintln!("cannot write the JSON: {e}"),
    }
    if failed {
        std::process::exit(1);
    }
}
