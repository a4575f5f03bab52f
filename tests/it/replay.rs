//! Issue 3 acceptance: a multi-day fleet trace replayed through `POST /v1/fixes` in `event` mode
//! gives exactly the events docs/semantics.md sections 2-4 define (checked against the naive reference in
//! `geodwell_core::reference`), the same whether the fixes arrive in order in a few large JSON
//! batches or shuffled within the lateness in many small NDJSON batches.
//!
//! No real fleet trace can be fetched on these machines, so the trace is generated, seeded, with
//! the behaviour of a delivery fleet: a night at the depot with the tracker asleep (STALE dwell),
//! morning departure, 3-6 customer stops of varied length (some past the dwell thresholds, most
//! not), a fuel stop now and then, GPS noise, jitter at fence edges, reporting every 20-60 s
//! while moving and 60-180 s while parked, radio dropouts, and inaccurate fixes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use geodwell_core::fences::{Fence, FenceLimits};
use geodwell_core::fix::Fix;
use geodwell_core::time::{Dur, Ts};
use geodwell_sim::rng::Rng;
use serde_json::{Value, json};

/// (id, lon, lat, feature)
pub(crate) fn fences() -> Vec<(String, f64, f64, Value)> {
    let square = |id: &str, lon: f64, lat: f64, half: f64, props: Value| {
        let c = json!([[
            [lon - half, lat - half],
            [lon + half, lat - half],
            [lon + half, lat + half],
            [lon - half, lat + half],
            [lon - half, lat - half]
        ]]);
        (
            id.to_string(),
            lon,
            lat,
            json!({"type": "Feature", "id": id, "geometry": {"type": "Polygon", "coordinates": c}, "properties": props}),
        )
    };
    let circle = |id: &str, lon: f64, lat: f64, r: f64, mut props: Value| {
        props["radius_m"] = json!(r);
        (
            id.to_string(),
            lon,
            lat,
            json!({"type": "Feature", "id": id, "geometry": {"type": "Point", "coordinates": [lon, lat]}, "properties": props}),
        )
    };
    vec![
        square(
            "depot-north",
            10.000,
            53.600,
            0.0015,
            json!({"dwell": ["10m", "1h"], "enter_confirm": 2, "exit_confirm": 2, "exit_buffer_m": 30, "stale_after": "30m", "tags": {"kind": "depot"}}),
        ),
        square(
            "depot-south",
            10.050,
            53.500,
            0.0015,
            json!({"dwell": ["10m", "1h"], "exit_confirm": 2, "stale_after": "30m", "max_accuracy_m": 80}),
        ),
        circle(
            "cust-a",
            10.020,
            53.560,
            80.0,
            json!({"dwell": ["5m", "20m"], "exit_buffer_m": 20}),
        ),
        circle(
            "cust-b",
            10.080,
            53.540,
            60.0,
            json!({"dwell": ["5m", "20m"], "enter_confirm": 2}),
        ),
        square(
            "cust-c",
            9.960,
            53.530,
            0.0008,
            json!({"dwell": ["15m"], "stale_after": "5m"}),
        ),
        circle(
            "cust-d",
            10.110,
            53.590,
            100.0,
            json!({"dwell": ["5m", "30m"], "max_accuracy_m": 50}),
        ),
        square(
            "cust-e",
            10.030,
            53.620,
            0.0007,
            json!({"dwell": ["10m"], "exit_confirm": 3, "confirm_within": "3m"}),
        ),
        circle(
            "fuel",
            10.060,
            53.570,
            50.0,
            json!({"dwell": ["8m"], "stale_after": "off"}),
        ),
        // A large zone overlapping the northern depot and two customers.
        square(
            "zone-north",
            10.020,
            53.600,
            0.05,
            json!({"dwell": ["2h", "6h"], "stale_after": "off", "tags": ["zone"]}),
        ),
    ]
}

/// Metres to degrees of latitude / longitude near 53.5 N.
fn jitter(rng: &mut Rng, lon: f64, lat: f64, metres: f64) -> (f64, f64) {
    let dlat = rng.range(-metres, metres) / 111_200.0;
    let dlon = rng.range(-metres, metres) / (111_200.0 * 53.5f64.to_radians().cos());
    (lon + dlon, lat + dlat)
}

pub(crate) fn trace(seed: u64, trucks: usize, days: i64) -> Vec<Value> {
    let mut rng = Rng::new(seed);
    let places = fences();
    let depots = [&places[0], &places[1]];
    let stops: Vec<&(String, f64, f64, Value)> = places[2..8].iter().collect();
    let t0 = T0; // 2026-01-01T00:00Z
    let mut out = Vec::new();
    for k in 0..trucks {
        let dev = format!("truck-{k:02}");
        let depot = depots[k % 2];
        let (mut lon, mut lat) = (depot.1, depot.2);
        let mut t = t0 + rng.below(600_000) as i64;
        let emit = |rng: &mut Rng, t: i64, lon: f64, lat: f64, out: &mut Vec<Value>| {
            let accuracy = if rng.below(25) == 0 {
                150.0
            } else {
                rng.range(3.0, 20.0)
            };
            let (x, y) = jitter(rng, lon, lat, 8.0);
            out.push(json!({"device": dev, "ts": t, "lat": y, "lon": x, "accuracy": accuracy}));
        };
        for day in 0..days {
            let morning = t0 + day * 86_400_000 + (6 * 3600 + rng.below(5400) as i64) * 1000;
            // Night at the depot: a few fixes, then the tracker sleeps until the morning.
            while t < morning {
                emit(&mut rng, t, lon, lat, &mut out);
                t += if rng.below(3) == 0 {
                    3_600_000
                } else {
                    150_000
                };
            }
            t = morning;
            let n_stops = 3 + rng.below(4) as usize;
            let mut route: Vec<(f64, f64, i64)> = (0..n_stops)
                .map(|_| {
                    let s = stops[rng.below(stops.len() as u64) as usize];
                    // Most stops are short; some pass the thresholds.
                    let stay = match rng.below(6) {
                        0 => 1800 + rng.below(1800) as i64,
                        1 | 2 => 400 + rng.below(600) as i64,
                        _ => 60 + rng.below(300) as i64,
                    };
                    (s.1, s.2, stay)
                })
                .collect();
            route.push((depot.1, depot.2, 0));
            for (tlon, tlat, stay) in route {
                // Drive at ~40 km/h, reporting every 20-60 s, with the odd radio dropout.
                loop {
                    let dx = (tlon - lon) * 111_200.0 * 53.5f64.to_radians().cos();
                    let dy = (tlat - lat) * 111_200.0;
                    let dist = (dx * dx + dy * dy).sqrt();
                    let step_s = 20 + rng.below(40) as i64;
                    let step_m = 11.0 * step_s as f64;
                    if dist <= step_m {
                        lon = tlon;
                        lat = tlat;
                        t += step_s * 1000;
                        emit(&mut rng, t, lon, lat, &mut out);
                        break;
                    }
                    lon += (tlon - lon) * step_m / dist;
                    lat += (tlat - lat) * step_m / dist;
                    t += step_s * 1000;
                    if rng.below(40) == 0 {
                        t += (300 + rng.below(900) as i64) * 1000;
                    }
                    emit(&mut rng, t, lon, lat, &mut out);
                }
                // Parked: jitter near the spot (edges included), fixes every 60-180 s.
                let until = t + stay * 1000;
                while t < until {
                    t += (60 + rng.below(120) as i64) * 1000;
                    let (x, y) = jitter(&mut rng, lon, lat, 40.0);
                    emit(&mut rng, t, x, y, &mut out);
                }
            }
        }
    }
    out
}

pub(crate) fn to_fix(v: &Value) -> Fix {
    Fix::new(
        v["device"].as_str().unwrap(),
        Ts(v["ts"].as_i64().unwrap()),
        v["lat"].as_f64().unwrap(),
        v["lon"].as_f64().unwrap(),
        v["accuracy"].as_f64(),
        128,
    )
    .unwrap()
}

async fn replay(
    batches: Vec<(bool, Vec<Value>)>,
    lateness: &str,
    expect: usize,
) -> BTreeSet<String> {
    let srv = start(&format!(
        "[time]\nclock = \"event\"\nlateness = \"{lateness}\"\n"
    ))
    .await;
    for (_, _, _, f) in fences() {
        let id = f["id"].as_str().unwrap().to_string();
        assert_eq!(srv.put_fence(&id, f).await.status(), 201);
    }
    let mut accepted = 0;
    for (ndjson, batch) in batches {
        let req = srv.http.post(srv.url("/v1/fixes"));
        let req = if ndjson {
            let body: String = batch.iter().map(|v| v.to_string() + "\n").collect();
            req.header("content-type", "application/x-ndjson")
                .body(body)
        } else {
            req.json(&batch)
        };
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200);
        let rep: Value = r.json().await.unwrap();
        assert_eq!(
            rep["late"], 0,
            "disorder within the lateness is never late: {rep}"
        );
        assert_eq!(rep["rejected"], 0, "{rep}");
        accepted += rep["accepted"].as_u64().unwrap();
    }
    assert!(accepted > 0);
    // DWELLs fire when the shards see the final watermark; wait until the log settles.
    let mut evs = srv.events(expect).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = srv.events(expect).await;
    if again.len() > evs.len() {
        evs = again;
    }
    let seqs: Vec<u64> = evs.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=evs.len() as u64).collect::<Vec<_>>(),
        "seq is gap-free from 1"
    );
    srv.stop().await;
    evs.iter()
        .map(|e| {
            format!(
                "{} {} {} {} {}",
                e["id"], e["type"], e["device"], e["fence"], e["at"]
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_day_fleet_trace_gives_the_defined_events_whatever_the_arrival() {
    let lateness = Dur::from_secs(90);
    let mut fixes = trace(0x5EED_F1EE7, 24, 4);
    fixes.sort_by_key(|v| v["ts"].as_i64().unwrap());
    assert!(
        fixes.len() > 10_000,
        "a real workload: {} fixes",
        fixes.len()
    );

    // The expected events from the naive reference.
    let limits = FenceLimits::default();
    let fence_objs: Vec<Arc<Fence>> = fences()
        .iter()
        .map(|(_, _, _, f)| {
            let feat: geojson::Feature = serde_json::from_value(f.clone()).unwrap();
            Arc::new(Fence::from_feature(&feat, None, &limits).unwrap())
        })
        .collect();
    let core_fixes: Vec<Fix> = fixes.iter().map(to_fix).collect();
    let w_final = core_fixes
        .iter()
        .map(|f| f.ts)
        .max()
        .unwrap()
        .minus(lateness);
    let reference = geodwell_core::reference::expected_events(&fence_objs, &core_fixes, w_final);
    let expected: BTreeSet<String> = reference
        .iter()
        .map(|e| {
            let v = serde_json::to_value(e).unwrap();
            format!(
                "{} {} {} {} {}",
                v["id"], v["type"], v["device"], v["fence"], v["at"]
            )
        })
        .collect();
    let count = |k: &str| reference.iter().filter(|e| e.kind.as_str() == k).count();
    assert!(
        count("enter") > 100 && count("dwell") > 50,
        "the trace exercises the rules: {} enter, {} dwell, {} exit",
        count("enter"),
        count("dwell"),
        count("exit")
    );

    eprintln!(
        "trace: {} fixes; reference: {} enter, {} dwell, {} exit",
        fixes.len(),
        count("enter"),
        count("dwell"),
        count("exit")
    );
    // In order, a few large JSON arrays.
    let in_order: Vec<(bool, Vec<Value>)> =
        fixes.chunks(8000).map(|c| (false, c.to_vec())).collect();
    let a = replay(in_order, "90s", expected.len()).await;
    assert_eq!(a, expected, "in order vs reference");

    // Shuffled within the lateness, many small NDJSON batches.
    let mut rng = Rng::new(42);
    let mut arrival: Vec<(i64, usize)> = fixes
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (
                v["ts"].as_i64().unwrap() + rng.below(lateness.millis() as u64) as i64,
                i,
            )
        })
        .collect();
    arrival.sort();
    let mut batches = Vec::new();
    let mut i = 0;
    while i < arrival.len() {
        let n = 1 + rng.below(400) as usize;
        batches.push((
            true,
            arrival[i..(i + n).min(arrival.len())]
                .iter()
                .map(|&(_, k)| fixes[k].clone())
                .collect(),
        ));
        i += n;
    }
    let b = replay(batches, "90s", expected.len()).await;
    assert_eq!(b, expected, "shuffled, many batches vs reference");
}

/// Visitors: devices outside every fence on day 0 (then silent, so they go idle and are
/// forgotten), the first three coming back on day 2 for a visit of the northern depot.
fn visitors() -> Vec<Value> {
    let mut out = Vec::new();
    for k in 0..6 {
        let dev = format!("visitor-{k}");
        for i in 0..60 {
            let t = T0 + 8 * 3_600_000 + k * 61_000 + i * 60_000;
            out.push(json!({"device": dev, "ts": t, "lat": 54.0 + k as f64 * 0.01, "lon": 11.0}));
        }
        if k < 3 {
            for i in 0..40 {
                let t = T0 + 2 * 86_400_000 + 10 * 3_600_000 + k * 7_000 + i * 60_000;
                let (lat, lon) = if i < 30 {
                    (53.600, 10.000)
                } else {
                    (53.7, 10.0)
                };
                out.push(json!({"device": dev, "ts": t, "lat": lat, "lon": lon}));
            }
        }
    }
    out
}

/// Issue 16 acceptance: devices deleted mid-trace (`DELETE /v1/devices/{id}`, their later fixes
/// starting afresh) and others forgotten by `devices.idle_ttl` still give exactly the
/// reference's events (which models the deletions and not the expiry: expiry must change
/// nothing), ids included; and `POST /v1/watermark` at the end fires the DWELLs after the last
/// fix, as the reference does with the watermark moved that far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletions_and_idle_expiry_mid_trace_still_give_the_reference_events() {
    let lateness = Dur::from_secs(90);
    let mut fixes = trace(0x5EED_0016, 12, 4);
    fixes.extend(visitors());
    fixes.sort_by_key(|v| v["ts"].as_i64().unwrap());
    let srv =
        // Idle expiry waits for max(idle_ttl, max_delay): a max_delay within the idle TTL
        // lets the trace see it.
        start("[time]\nclock = \"event\"\nlateness = \"90s\"\nmax_delay = \"1h\"\n[devices]\nidle_ttl = \"2h\"\n")
            .await;
    for (_, _, _, f) in fences() {
        let id = f["id"].as_str().unwrap().to_string();
        assert_eq!(srv.put_fence(&id, f).await.status(), 201);
    }
    let admin = |method: reqwest::Method, path: &str| srv.http.request(method, srv.url(path));
    let mut inputs: Vec<geodwell_core::reference::Input> = Vec::new();
    let mut max_ts = i64::MIN;
    let mut deleted = 0;
    let mut saw_forgotten = false;
    for (n, chunk) in fixes.chunks(400).enumerate() {
        let (s, rep) = srv.post_fixes(Value::Array(chunk.to_vec())).await;
        assert_eq!(s, 200, "{rep}");
        assert_eq!(
            (rep["late"].as_u64(), rep["rejected"].as_u64()),
            (Some(0), Some(0)),
            "{rep}"
        );
        for v in chunk {
            max_ts = max_ts.max(v["ts"].as_i64().unwrap());
            inputs.push(geodwell_core::reference::Input::Fix(to_fix(v)));
        }
        if n % 2 == 1 {
            // Bring every shard exactly to the watermark the batches made (a no-op for the
            // watermark itself), so that the reference knows where the removal ends each life.
            let w = max_ts - lateness.millis();
            let r = admin(reqwest::Method::POST, "/v1/watermark")
                .json(&json!({ "watermark": w }))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
            let dev = format!("truck-{:02}", (n / 2) % 12);
            let r = admin(reqwest::Method::DELETE, &format!("/v1/devices/{dev}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 204, "{dev}");
            deleted += 1;
            inputs.push(geodwell_core::reference::Input::Remove {
                device: Arc::from(dev.as_str()),
                w: Ts(w),
            });
            let (s, _) = srv.get(&format!("/v1/devices/{dev}")).await;
            assert_eq!(s, 404, "{dev} is gone until its next fix");
        }
        // Day 1: the visitors went quiet on day 0 and are forgotten (the sweep runs every
        // 100 ms of wall time), before three of them come back on day 2.
        if !saw_forgotten
            && max_ts > T0 + 86_400_000 + 6 * 3_600_000
            && max_ts < T0 + 2 * 86_400_000
        {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let (s, _) = srv.get("/v1/devices/visitor-5").await;
                if s == 404 {
                    saw_forgotten = true;
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "visitor-5 was never forgotten"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(
        deleted >= 10 && saw_forgotten,
        "{deleted} deleted, forgotten: {saw_forgotten}"
    );
    let m = srv.metrics().await;
    let idle: f64 = metric(&m, "geodwell_devices_removed_total{reason=\"idle\"}");
    assert!(idle >= 6.0, "every visitor expired at least once: {idle}");

    // The end of the backfill: one day past the last fix.
    let w_final = Ts(max_ts + 86_400_000);
    let r = admin(reqwest::Method::POST, "/v1/watermark")
        .json(&json!({ "watermark": w_final.0 }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = admin(reqwest::Method::POST, "/v1/watermark")
        .json(&json!({ "watermark": w_final.0 - 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409, "the watermark never moves back");

    let limits = FenceLimits::default();
    let fence_objs: Vec<Arc<Fence>> = fences()
        .iter()
        .map(|(_, _, _, f)| {
            let feat: geojson::Feature = serde_json::from_value(f.clone()).unwrap();
            Arc::new(Fence::from_feature(&feat, None, &limits).unwrap())
        })
        .collect();
    let reference =
        geodwell_core::reference::expected_events_with_removals(&fence_objs, &inputs, w_final);
    let expected: BTreeSet<String> = reference
        .iter()
        .map(|e| {
            let v = serde_json::to_value(e).unwrap();
            format!(
                "{} {} {} {} {}",
                v["id"], v["type"], v["device"], v["fence"], v["at"]
            )
        })
        .collect();
    let visitor_enters = reference
        .iter()
        .filter(|e| {
            e.device.starts_with("visitor-")
                && e.kind.as_str() == "enter"
                && &*e.fence == "depot-north"
        })
        .count();
    assert_eq!(
        visitor_enters, 3,
        "forgotten visitors come back and enter afresh"
    );
    // Events after the last fix exist only because of the final watermark.
    let after_last = reference.iter().filter(|e| e.at.0 > max_ts).count();
    assert!(
        after_last > 0,
        "the final watermark fires DWELLs past the last fix"
    );
    let evs = srv.events(expected.len()).await;
    let got: BTreeSet<String> = evs
        .iter()
        .map(|e| {
            format!(
                "{} {} {} {} {}",
                e["id"], e["type"], e["device"], e["fence"], e["at"]
            )
        })
        .collect();
    assert_eq!(got.len(), evs.len(), "no event twice");
    assert_eq!(got, expected, "deletions and expiry vs reference");

    // Which devices expiry keeps, by the reference: a day past the last fix (more than the
    // 2 h TTL, and every pending run long expired) exactly those whose last life (the fixes
    // after their last deletion) ends inside some fence.
    let mut last_life: std::collections::BTreeMap<String, Vec<Fix>> = Default::default();
    for i in &inputs {
        match i {
            geodwell_core::reference::Input::Fix(f) => last_life
                .entry(f.device.to_string())
                .or_default()
                .push(f.clone()),
            geodwell_core::reference::Input::Remove { device, .. } => {
                last_life.insert(device.to_string(), Vec::new());
            }
        }
    }
    let keep: BTreeSet<String> = last_life
        .iter()
        .filter(|(_, fixes)| {
            let evs = geodwell_core::reference::expected_events(&fence_objs, fixes, w_final);
            let mut open = std::collections::BTreeMap::new();
            for e in &evs {
                match e.kind.as_str() {
                    "enter" => open.insert(e.fence.to_string(), true),
                    "exit" => open.insert(e.fence.to_string(), false),
                    _ => None,
                };
            }
            open.values().any(|&o| o)
        })
        .map(|(d, _)| d.clone())
        .collect();
    assert!(!keep.is_empty() && keep.len() < last_life.len(), "{keep:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, page) = srv.get("/v1/devices?limit=10000").await;
        let held: BTreeSet<String> = page["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["device"].as_str().unwrap().to_string())
            .collect();
        if held == keep {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server holds {held:?}, the reference keeps {keep:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    srv.stop().await;
}
