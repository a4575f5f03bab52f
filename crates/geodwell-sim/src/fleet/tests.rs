use std::collections::HashMap;

use super::*;
use geodwell_core::event::EventKind;
use geodwell_core::fix::Fix;
use geodwell_core::reference::expected_events;

fn layout(sites: u32) -> Vec<Arc<Fence>> {
    generate_fences(&LayoutSpec {
        sites,
        ..LayoutSpec::default()
    })
    .into_iter()
    .map(Arc::new)
    .collect()
}

fn spec(devices: u32, disorder: i64) -> FleetSpec {
    FleetSpec {
        devices,
        disorder: Dur(disorder),
        ..FleetSpec::default()
    }
}

fn to_fix(f: &SimFix) -> Fix {
    f.to_fix("sim-").expect("generated fix is valid")
}

#[test]
fn generated_fences_are_valid_unique_and_varied() {
    let fences = layout(400);
    assert!(
        fences.len() >= 400 && fences.len() < 500,
        "{} fences",
        fences.len()
    );
    let ids: std::collections::HashSet<_> = fences.iter().map(|f| f.id.clone()).collect();
    assert_eq!(ids.len(), fences.len());
    assert!(fences.iter().any(|f| f.is_circle()));
    assert!(fences.iter().any(|f| !f.is_circle()));
    assert!(fences.iter().any(|f| f.settings.enter_confirm == 2));
    assert!(fences.iter().any(|f| f.settings.exit_confirm == 2));
    assert!(fences.iter().any(|f| f.settings.exit_buffer_m > 0.0));
    assert!(fences.iter().any(|f| f.settings.max_accuracy_m.is_some()));
    assert!(fences.iter().all(|f| !f.settings.dwell.is_empty()));
    // Same seed, same layout.
    let again = layout(400);
    for (a, b) in fences.iter().zip(&again) {
        assert_eq!(a.to_feature(), b.to_feature());
    }
}

#[test]
fn same_spec_same_trace_and_seeds_differ() {
    let fences = layout(50);
    let a: Vec<SimFix> = Fleet::new(spec(300, 0), &fences)
        .unwrap()
        .take(20_000)
        .collect();
    let b: Vec<SimFix> = Fleet::new(spec(300, 0), &fences)
        .unwrap()
        .take(20_000)
        .collect();
    assert_eq!(a, b);
    let other = FleetSpec {
        seed: 2,
        ..spec(300, 0)
    };
    let c: Vec<SimFix> = Fleet::new(other, &fences).unwrap().take(20_000).collect();
    assert_ne!(a, c);
}

#[test]
fn a_device_trace_does_not_depend_on_fleet_size() {
    let fences = layout(50);
    let dev0 = |n: u32| -> Vec<SimFix> {
        Fleet::new(spec(n, 0), &fences)
            .unwrap()
            .filter(|f| f.device == 0)
            .take(300)
            .collect()
    };
    assert_eq!(dev0(1), dev0(40));
}

#[test]
fn in_order_without_disorder_and_bounded_with_it() {
    let fences = layout(50);
    let fixes: Vec<SimFix> = Fleet::new(spec(500, 0), &fences)
        .unwrap()
        .take(50_000)
        .collect();
    assert!(fixes.windows(2).all(|w| w[0].ts <= w[1].ts));
    let mut last: HashMap<u32, Ts> = HashMap::new();
    for f in &fixes {
        if let Some(prev) = last.insert(f.device, f.ts) {
            assert!(f.ts > prev, "device {} repeats or goes back", f.device);
        }
    }
    for d in [500, 5_000] {
        let fixes: Vec<SimFix> = Fleet::new(spec(500, d), &fences)
            .unwrap()
            .take(50_000)
            .collect();
        let mut max_seen = i64::MIN;
        let mut disordered = 0;
        for f in &fixes {
            assert!(
                max_seen.saturating_sub(f.ts.0) <= d,
                "disorder {} > {d}",
                max_seen - f.ts.0
            );
            if f.ts.0 < max_seen {
                disordered += 1;
            }
            max_seen = max_seen.max(f.ts.0);
        }
        assert!(
            disordered > 1000,
            "only {disordered} fixes out of order at {d} ms"
        );
        // Disorder reorders, it does not drop: the same multiset as the ordered trace's prefix
        // (up to the tail still held back).
        let ordered: Vec<SimFix> = Fleet::new(spec(500, 0), &fences)
            .unwrap()
            .take(50_000)
            .collect();
        let cut = ordered[40_000].ts;
        let key = |f: &SimFix| (f.device, f.ts);
        let mut a: Vec<_> = ordered.iter().filter(|f| f.ts < cut).map(key).collect();
        let mut b: Vec<_> = fixes.iter().filter(|f| f.ts < cut).map(key).collect();
        a.sort_unstable();
        b.sort_unstable();
        assert!(
            a == b,
            "disorder {d} changed the fixes ({} vs {})",
            a.len(),
            b.len()
        );
    }
}

/// The behaviour the generator promises, measured on six hours of a 150-device fleet, with the
/// events computed by the reference implementation of docs/semantics.md sections 2-4.
#[test]
fn the_trace_has_dwells_edge_jitter_silences_and_noise() {
    let fences = layout(60);
    let fleet = Fleet::new(spec(150, 0), &fences).unwrap();
    let start = fleet.spec().start;
    let end = start.plus(Dur(6 * 3_600_000));
    let fixes: Vec<SimFix> = fleet.take_while(|f| f.ts < end).collect();
    assert!(fixes.len() > 150 * 6 * 3600 / 30, "{} fixes", fixes.len());

    // Plausible speeds between consecutive accurate fixes of one device.
    let mut by_dev: HashMap<u32, Vec<&SimFix>> = HashMap::new();
    for f in &fixes {
        by_dev.entry(f.device).or_default().push(f);
    }
    let mut long_gaps = 0;
    for fx in by_dev.values() {
        for w in fx.windows(2) {
            let dt = (w[1].ts.0 - w[0].ts.0) as f64 / 1000.0;
            if dt > 15.0 * 60.0 {
                long_gaps += 1;
            }
            if w[0].accuracy < 40.0 && w[1].accuracy < 40.0 {
                let d = distance_m((w[0].lon, w[0].lat), (w[1].lon, w[1].lat));
                assert!(d <= 22.0 * dt + 40.0, "{d} m in {dt} s");
            }
        }
    }
    assert!(
        long_gaps >= 5,
        "silences longer than stale_after: {long_gaps}"
    );
    let outliers = fixes.iter().filter(|f| f.accuracy >= 60.0).count();
    let share = outliers as f64 / fixes.len() as f64;
    assert!((0.005..0.02).contains(&share), "outlier share {share}");

    let trace: Vec<Fix> = fixes.iter().map(to_fix).collect();
    let events = expected_events(&fences, &trace, end);
    let count = |k: EventKind| events.iter().filter(|e| e.kind == k).count();
    let (enters, exits, dwells) = (
        count(EventKind::Enter),
        count(EventKind::Exit),
        count(EventKind::Dwell),
    );
    assert!(enters > 500, "{enters} enters");
    assert!(exits > 400, "{exits} exits");
    assert!(dwells > 100, "{dwells} dwells");
    // Most visits end before their fence's first threshold; some pass an hour.
    assert!(dwells < enters, "{dwells} dwells vs {enters} enters");
    assert!(
        events
            .iter()
            .any(|e| e.kind == EventKind::Dwell && e.dwell_s.is_some_and(|s| s.0.0 >= 3_600_000)),
        "no hour-long dwell"
    );
    // Edge jitter: visits shorter than a minute (enter then exit at the boundary).
    let short = events
        .iter()
        .filter(|e| e.kind == EventKind::Exit && e.duration_s.is_some_and(|s| s.0.0 < 60_000))
        .count();
    assert!(short >= 20, "only {short} visits shorter than a minute");
}

#[test]
fn fleet_errors_are_reported() {
    assert_eq!(
        Fleet::new(FleetSpec::default(), &[]).err(),
        Some(FleetError::NoFences)
    );
    let bad = FleetSpec {
        interval_min: Dur(10_000),
        interval_max: Dur(5_000),
        ..FleetSpec::default()
    };
    assert!(matches!(
        Fleet::new(bad, &layout(3)).err(),
        Some(FleetError::BadInterval(..))
    ));
}

#[test]
fn fixes_serialize_as_the_api_takes_them() {
    let f = SimFix {
        device: 7,
        ts: Ts(1_767_225_600_123),
        lon: 5.1234567,
        lat: 52.7654321,
        accuracy: 4.2,
        speed: 12.0,
    };
    let mut out = Vec::new();
    f.write_json("sim-", &mut out);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["device"], "sim-7");
    assert_eq!(v["ts"], 1_767_225_600_123i64);
    assert_eq!(v["lat"], 52.7654321);
    assert_eq!(v["lon"], 5.1234567);
}

#[test]
fn generated_values_survive_the_wire_exactly() {
    let fences = layout(20);
    for f in Fleet::new(spec(100, 0), &fences).unwrap().take(5_000) {
        let mut out = Vec::new();
        f.write_json("sim-", &mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["lat"].as_f64(), Some(f.lat));
        assert_eq!(v["lon"].as_f64(), Some(f.lon));
        assert_eq!(v["accuracy"].as_f64(), Some(f.accuracy));
        assert_eq!(v["speed"].as_f64(), Some(f.speed));
    }
}

#[test]
fn parked_devices_sit_inside_a_fence() {
    let fences = layout(30);
    let spec = FleetSpec {
        parked: 1.0,
        ..spec(2_000, 0)
    };
    let first: Vec<SimFix> = Fleet::new(spec, &fences).unwrap().take(2_000).collect();
    let inside = first
        .iter()
        .filter(|f| fences.iter().any(|z| z.contains(f.lon, f.lat)))
        .count();
    // GPS noise can put a fix just outside a small fence; nearly all are in.
    assert!(inside >= 1_900, "{inside} of 2000 parked fixes inside");
}
