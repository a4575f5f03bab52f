//! Adversarial fence benchmark (harness = false).
//!
//! `cargo bench --bench fences_adversarial [-- --vertices N --fixes M]`. Builds the shapes of
//! `adversarial_fences` (star, combs, saw, spiral; default 100,000 vertices each), evaluates M
//! fixes uniform in each shape's bounding box (default 200,000) through the edge grid and a
//! subset through the plain scan of every edge, checks both agree (exit 1 on a mismatch), and
//! prints per shape: whether the default `max_test_edges` refuses it (it is measured either
//! way), evaluations/s indexed and plain, the ratio, the grid's worst and mean
//! edges examined per test, and its memory. Writes `target/bench/fences_adversarial.json`.
//! See `docs/bench-fences.md`.

use std::hint::black_box;
use std::time::Instant;

use geodwell_core::fences::{Fence, FenceLimits, FenceSettings};

#[path = "common/fencegen.rs"]
mod fencegen;
use fencegen::*;

#[path = "common/out.rs"]
mod benchout;

#[path = "common/args.rs"]
mod args;
use args::arg;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n = arg(&args, "--vertices", 100_000).max(100);
    let fixes_n = arg(&args, "--fixes", 200_000).max(100);
    let plain_n = (fixes_n / 20).max(100);
    let limits = FenceLimits {
        max_vertices: n * 2,
        ..FenceLimits::default()
    };
    let relaxed = FenceLimits {
        max_test_edges: usize::MAX,
        ..limits.clone()
    };
    let mut rng = Rng::stream(0x9E37_79B9_7F4A_7C15, 77);
    let mut rows = Vec::new();
    let mut failed = false;
    println!("\n## adversarial fences ({n} vertices each, {fixes_n} fixes uniform in the bbox)\n");
    println!(
        "| shape | vertices | default limits | build ms | grid MiB | edges per test: worst / mean | inside | indexed evals/s | plain evals/s | indexed / plain |"
    );
    println!("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, rings) in adversarial_fences(n) {
        // Refused under the default limits? Measured either way, with the cost limit lifted.
        let one = std::slice::from_ref(&rings);
        let refused = Fence::new_polygon(&name, one, FenceSettings::default(), &limits)
            .err()
            .map(|e| e.to_string());
        let t = Instant::now();
        let fence = match Fence::new_polygon(&name, one, FenceSettings::default(), &relaxed) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("{name}: invalid: {e}");
                failed = true;
                continue;
            }
        };
        let build_ms = t.elapsed().as_secs_f64() * 1e3;
        let b = fence.envelopes()[0];
        let fixes: Vec<[f64; 2]> = (0..fixes_n)
            .map(|_| {
                [
                    b[0] + rng.unit() * (b[2] - b[0]),
                    b[1] + rng.unit() * (b[3] - b[1]),
                ]
            })
            .collect();
        let t = Instant::now();
        let mut inside = 0usize;
        for p in &fixes {
            inside += usize::from(fence.contains(black_box(p[0]), black_box(p[1])));
        }
        let idx_rate = fixes_n as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut plain = Vec::with_capacity(plain_n);
        for p in &fixes[..plain_n] {
            plain.push(fence.contains_unindexed(black_box(p[0]), black_box(p[1])));
        }
        let plain_rate = plain_n as f64 / t.elapsed().as_secs_f64();
        let mism = fixes[..plain_n]
            .iter()
            .zip(&plain)
            .filter(|(p, want)| fence.contains(p[0], p[1]) != **want)
            .count();
        if mism > 0 {
            eprintln!("MISMATCH {name}: {mism} of {plain_n}");
            failed = true;
        }
        let cost = fence.test_cost();
        let vertices = fence.vertex_count();
        let grid_mib = fence.heap_bytes() as f64 / (1024.0 * 1024.0);
        println!(
            "| {name} | {vertices} | {} | {build_ms:.0} | {grid_mib:.1} | {} / {:.0} | {:.0} % | {:.0} | {:.0} | {:.0}x |",
            if refused.is_some() {
                "refused"
            } else {
                "accepted"
            },
            cost.worst,
            cost.mean,
            100.0 * inside as f64 / fixes_n as f64,
            idx_rate,
            plain_rate,
            idx_rate / plain_rate
        );
        rows.push(serde_json::json!({
            "shape": name, "vertices": vertices, "refused_by_default": refused, "build_ms": build_ms, "heap_bytes": fence.heap_bytes(),
            "worst_edges_per_test": cost.worst, "mean_edges_per_test": cost.mean,
            "inside_fraction": inside as f64 / fixes_n as f64,
            "indexed_evals_per_s": idx_rate, "plain_evals_per_s": plain_rate, "mismatches": mism,
        }));
    }
    let json = serde_json::json!({"vertices": n, "fixes": fixes_n, "shapes": rows});
    match benchout::write_json("fences_adversarial", &json) {
        Ok(path) => println!("\nwrote {}", path.display()),
        Err(e) => eprintln!("could not write target/bench/fences_adversarial.json: {e}"),
    }
    if failed {
        std::process::exit(1);
    }
}
