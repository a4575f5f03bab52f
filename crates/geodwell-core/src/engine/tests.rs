//! Table tests: one or more per rule of `docs/semantics.md` sections 2 and 3.

use std::sync::Arc;

use super::*;
use crate::event::EventKind;
use crate::fences::FenceLimits;
use crate::fix::Fix;

/// 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600_000;

pub(super) const IN: (f64, f64) = (10.005, 50.005);
pub(super) const IN2: (f64, f64) = (10.006, 50.004);
/// On the western edge of the square.
pub(super) const EDGE: (f64, f64) = (10.0, 50.005);
/// About 14 m east of the eastern edge (1° of longitude is ~71.6 km at 50°N).
pub(super) const NEAR: (f64, f64) = (10.0102, 50.005);
pub(super) const FAR: (f64, f64) = (10.05, 50.05);

pub(super) fn ts(secs: i64) -> Ts {
    Ts(T0 + secs * 1000)
}

/// A fence from a GeoJSON Feature given as JSON.
pub(super) fn fence_from(v: serde_json::Value) -> Arc<Fence> {
    let f: geojson::Feature = serde_json::from_value(v).expect("test feature is GeoJSON");
    Arc::new(Fence::from_feature(&f, None, &FenceLimits::default()).expect("test fence is valid"))
}

/// The square 10.00..10.01 E, 50.00..50.01 N with the given properties.
pub(super) fn square(id: &str, props: serde_json::Value) -> Arc<Fence> {
    fence_from(serde_json::json!({
        "type": "Feature",
        "id": id,
        "geometry": {"type": "Polygon", "coordinates": [[
            [10.0, 50.0], [10.01, 50.0], [10.01, 50.01], [10.0, 50.01], [10.0, 50.0]
        ]]},
        "properties": props,
    }))
}

/// Drives one engine in `event` clock mode with lateness 0 unless set.
struct H {
    e: Engine,
    out: Vec<Event>,
    max_seen: Option<Ts>,
    lateness: Dur,
}

impl H {
    fn new(props: serde_json::Value) -> H {
        let mut h = H {
            e: Engine::new(EngineConfig::default()),
            out: Vec::new(),
            max_seen: None,
            lateness: Dur::ZERO,
        };
        let f = square("sq", props);
        h.e.upsert_fence(f, &mut h.out);
        h
    }

    fn fix_acc(&mut self, dev: &str, secs: i64, p: (f64, f64), accuracy: Option<f64>) -> Ingested {
        let fix = Fix::new(dev, ts(secs), p.1, p.0, accuracy, 64).unwrap();
        self.max_seen = Some(self.max_seen.map_or(fix.ts, |m| m.max(fix.ts)));
        let w = self.max_seen.unwrap().minus(self.lateness);
        self.e.ingest(&fix, w, &mut self.out).unwrap()
    }

    fn fix(&mut self, secs: i64, p: (f64, f64)) -> Ingested {
        self.fix_acc("d1", secs, p, None)
    }

    /// Raises the watermark to `secs` (as if other devices' data moved it).
    fn w(&mut self, secs: i64) {
        self.e.advance(ts(secs), &mut self.out);
    }

    /// Drains events as (kind, at, extra) in seconds: extra is dwell_s or duration_s or 0.
    fn take(&mut self) -> Vec<(EventKind, i64, i64)> {
        self.out
            .drain(..)
            .map(|e| {
                let extra = e
                    .dwell_s
                    .or(e.duration_s)
                    .map_or(0, |s| s.0.millis() / 1000);
                (e.kind, (e.at.0 - T0) / 1000, extra)
            })
            .collect()
    }
}

use EventKind::{Dwell, Enter, Exit};

#[test]
fn enter_dwell_exit_in_event_time() {
    let mut h = H::new(serde_json::json!({"dwell": ["10m"]}));
    h.fix(0, IN);
    assert_eq!(h.take(), vec![(Enter, 0, 0)]);
    h.fix(300, IN);
    h.w(600);
    assert_eq!(
        h.take(),
        vec![],
        "DWELL waits until W has passed the deadline"
    );
    h.w(601);
    assert_eq!(
        h.take(),
        vec![(Dwell, 600, 600)],
        "at is the deadline exactly"
    );
    h.fix(700, FAR);
    assert_eq!(
        h.take(),
        vec![(Exit, 700, 700)],
        "EXIT carries the visit duration"
    );
}

#[test]
fn boundary_counts_as_inside() {
    let mut h = H::new(serde_json::json!({}));
    h.fix(0, EDGE);
    assert_eq!(h.take(), vec![(Enter, 0, 0)]);
}

#[test]
fn dwell_fires_as_soon_as_the_watermark_passes_the_deadline_whatever_the_tick() {
    for tick in [Dur(250), Dur::from_secs(1), Dur::from_secs(7)] {
        let mut h = H::new(serde_json::json!({"dwell": ["90s"]}));
        h.e = Engine::new(EngineConfig {
            tick,
            ..EngineConfig::default()
        });
        let f = square("sq", serde_json::json!({"dwell": ["90s"]}));
        h.e.upsert_fence(f, &mut h.out);
        h.fix(0, IN);
        h.take();
        h.w(90);
        assert_eq!(h.take(), vec![], "tick {tick}: not at W = d");
        assert!(
            h.e.next_due().is_some_and(|t| t <= ts(90).plus(Dur(1))),
            "the driver is told to wake by d + 1 ms"
        );
        h.e.advance(ts(90).plus(Dur(1)), &mut h.out);
        assert_eq!(
            h.take(),
            vec![(Dwell, 90, 90)],
            "tick {tick}: right after W passes d"
        );
    }
}

#[test]
fn each_threshold_fires_once_per_visit_and_reentry_restarts() {
    let mut h = H::new(serde_json::json!({"dwell": ["1h", "10m"], "stale_after": "off"}));
    h.fix(0, IN);
    h.w(4000);
    h.fix(4000, IN);
    h.w(5000);
    assert_eq!(
        h.take(),
        vec![(Enter, 0, 0), (Dwell, 600, 600), (Dwell, 3600, 3600)]
    );
    h.fix(5000, FAR);
    h.fix(5100, IN);
    h.w(5701);
    assert_eq!(
        h.take(),
        vec![(Exit, 5000, 5000), (Enter, 5100, 0), (Dwell, 5700, 600)],
        "a re-entry is a new visit with its own deadlines"
    );
}

#[test]
fn exit_at_or_before_the_deadline_cancels_the_dwell() {
    let mut h = H::new(serde_json::json!({"dwell": ["10m"]}));
    h.fix(0, IN);
    h.fix(600, FAR);
    h.w(2000);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Exit, 600, 600)]);
    let s = h.e.stats();
    assert_eq!(s.pairs, 0);
    assert_eq!(
        s.wheel.entries, s.wheel.tombstones,
        "nothing live is left in the wheel"
    );
}

#[test]
fn hysteresis_exit_buffer() {
    let mut h = H::new(serde_json::json!({"exit_buffer_m": 50}));
    h.fix(0, NEAR);
    assert_eq!(
        h.take(),
        vec![],
        "the buffer does not widen the fence for ENTER"
    );
    h.fix(10, IN);
    h.fix(20, NEAR);
    assert_eq!(
        h.take(),
        vec![(Enter, 10, 0)],
        "outside within the buffer is not outside"
    );
    h.fix(30, FAR);
    assert_eq!(h.take(), vec![(Exit, 30, 20)]);
}

#[test]
fn inaccurate_fixes_are_ignored_for_the_fence() {
    let mut h = H::new(serde_json::json!({"max_accuracy_m": 50, "exit_confirm": 2}));
    h.fix_acc("d1", 0, IN, Some(100.0));
    assert_eq!(h.take(), vec![]);
    h.fix_acc("d1", 10, IN, Some(10.0));
    h.fix_acc("d1", 20, FAR, Some(10.0));
    h.fix_acc("d1", 30, IN, Some(500.0));
    h.fix_acc("d1", 40, FAR, None);
    assert_eq!(
        h.take(),
        vec![(Enter, 10, 0), (Exit, 20, 10)],
        "the ignored inside fix neither counts nor breaks the exit run"
    );
}

#[test]
fn enter_confirm_needs_consecutive_inside_fixes() {
    let mut h = H::new(serde_json::json!({"enter_confirm": 3}));
    h.fix(0, IN);
    h.fix(10, IN);
    h.fix(20, FAR);
    h.fix(30, IN);
    h.fix(40, IN);
    assert_eq!(h.take(), vec![], "an outside fix breaks the run");
    h.fix(50, IN2);
    assert_eq!(
        h.take(),
        vec![(Enter, 30, 0)],
        "ENTER's time is the run's first fix"
    );
}

#[test]
fn exit_confirm_needs_consecutive_outside_fixes() {
    let mut h = H::new(serde_json::json!({"exit_confirm": 2}));
    h.fix(0, IN);
    h.fix(10, FAR);
    h.fix(20, IN);
    h.fix(30, FAR);
    h.fix(40, FAR);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Exit, 30, 30)]);
}

#[test]
fn votes_expire_after_confirm_within_and_a_gap_equal_to_it_counts() {
    let mut h = H::new(serde_json::json!({"enter_confirm": 2, "confirm_within": "60s"}));
    h.fix(0, IN);
    h.fix(61, IN);
    assert_eq!(
        h.take(),
        vec![],
        "a gap over confirm_within starts a new run"
    );
    h.fix(121, IN);
    assert_eq!(
        h.take(),
        vec![(Enter, 61, 0)],
        "a gap equal to confirm_within still counts"
    );
}

#[test]
fn the_expiry_sweep_runs_on_the_wheel() {
    let mut h = H::new(serde_json::json!({"enter_confirm": 2, "confirm_within": "60s"}));
    h.fix(0, IN);
    assert_eq!(h.e.stats().pairs, 1);
    h.w(60);
    assert_eq!(
        h.e.stats().pairs,
        1,
        "at W = last + confirm_within the run still stands"
    );
    h.w(62);
    assert_eq!(
        h.e.stats().pairs,
        0,
        "after it, the pending run is swept without any fix"
    );
    h.fix(62, IN);
    h.fix(70, IN);
    assert_eq!(h.take(), vec![(Enter, 62, 0)]);
}

#[test]
fn a_pending_exit_run_holds_the_dwell_until_its_outcome() {
    let props = serde_json::json!({"dwell": ["10m"], "exit_confirm": 2, "confirm_within": "5m"});
    // Confirmed: the EXIT time (first outside fix) is before the deadline, so no DWELL.
    let mut h = H::new(props.clone());
    h.fix(0, IN);
    h.fix(590, FAR);
    h.w(700);
    assert_eq!(
        h.take(),
        vec![(Enter, 0, 0)],
        "held while the run is pending"
    );
    h.fix(700, FAR);
    assert_eq!(h.take(), vec![(Exit, 590, 590)]);
    // Broken by an inside fix: DWELL fires, at the deadline.
    let mut h = H::new(props.clone());
    h.fix(0, IN);
    h.fix(590, FAR);
    h.fix(700, IN);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Dwell, 600, 600)]);
    // Expired (no second outside fix within confirm_within): DWELL fires.
    let mut h = H::new(props);
    h.fix(0, IN);
    h.fix(590, FAR);
    h.w(890);
    assert_eq!(h.take(), vec![(Enter, 0, 0)]);
    h.w(892);
    assert_eq!(h.take(), vec![(Dwell, 600, 600)]);
}

#[test]
fn an_exit_run_starting_after_the_deadline_does_not_hold_it() {
    let mut h = H::new(serde_json::json!({"dwell": ["10m"], "exit_confirm": 2}));
    h.fix(0, IN);
    h.fix(500, IN);
    h.fix(601, FAR);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Dwell, 600, 600)]);
}

#[test]
fn stale_dwell_waits_for_the_next_fix_that_is_not_outside() {
    let props = serde_json::json!({"dwell": ["30m"], "stale_after": "15m"});
    let mut h = H::new(props.clone());
    h.fix(0, IN);
    h.w(3600);
    assert_eq!(
        h.take(),
        vec![(Enter, 0, 0)],
        "quiet device: STALE at the deadline"
    );
    h.fix(4000, IN);
    assert_eq!(
        h.take(),
        vec![(Dwell, 1800, 1800)],
        "released by the next inside fix, at d"
    );
    // A visit that ends first never fires it.
    let mut h = H::new(props.clone());
    h.fix(0, IN);
    h.w(3600);
    h.fix(4000, FAR);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Exit, 4000, 4000)]);
    // A fix within stale_after before d (for any fence, even one far away) keeps it fresh.
    let mut h = H::new(props.clone());
    h.fix(0, IN);
    h.fix(1000, IN);
    h.w(1801);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Dwell, 1800, 1800)]);
}

#[test]
fn stale_uses_any_fix_of_the_device() {
    let mut h =
        H::new(serde_json::json!({"dwell": ["30m"], "stale_after": "15m", "max_accuracy_m": 20}));
    h.fix(0, IN);
    // Ignored for this fence (inaccurate), but it is a fix of the device.
    h.fix_acc("d1", 1000, FAR, Some(1000.0));
    h.w(1801);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Dwell, 1800, 1800)]);
}

#[test]
fn stale_after_off_fires_on_quiet_devices() {
    let mut h = H::new(serde_json::json!({"dwell": ["30m"], "stale_after": "off"}));
    h.fix(0, IN);
    h.w(1801);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Dwell, 1800, 1800)]);
}

#[test]
fn a_fix_exactly_at_the_deadline_counts_for_it() {
    // An outside fix at d: EXIT at d <= d, so no DWELL, even though W reached d before.
    let mut h = H::new(serde_json::json!({"dwell": ["10m"]}));
    h.fix(0, IN);
    h.w(600);
    h.fix(600, FAR);
    h.w(700);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Exit, 600, 600)]);
}

#[test]
fn late_enter_confirmation_fires_passed_thresholds() {
    let mut h =
        H::new(serde_json::json!({"dwell": ["60s"], "enter_confirm": 3, "confirm_within": "5m"}));
    h.fix(0, IN);
    h.fix(50, IN);
    h.fix(100, IN);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Dwell, 60, 60)]);
}

#[test]
fn late_and_duplicate_fixes_change_nothing() {
    let mut h = H::new(serde_json::json!({}));
    h.lateness = Dur::from_secs(10);
    assert_eq!(h.fix(100, FAR), Ingested::Accepted);
    assert_eq!(
        h.fix(95, IN),
        Ingested::Accepted,
        "within lateness: reordered"
    );
    assert_eq!(
        h.fix(100, (10.06, 50.06)),
        Ingested::Duplicate,
        "same ts, later in (lat, lon) order"
    );
    assert_eq!(
        h.fix(89, IN),
        Ingested::Late(LateReason::TooOld),
        "before W = 90 (max_delay 0: any fix behind W)"
    );
    h.fix(200, FAR);
    assert_eq!(h.take(), vec![(Enter, 95, 0), (Exit, 100, 5)]);
    assert_eq!(h.fix(100, IN), Ingested::Late(LateReason::TooOld));
    assert_eq!(h.take(), vec![]);
}

#[test]
fn duplicates_keep_the_first_in_lat_lon_order_whatever_arrives_first() {
    for order in [[IN, FAR], [FAR, IN]] {
        let mut h = H::new(serde_json::json!({}));
        h.lateness = Dur::from_secs(10);
        let a = h.fix(100, order[0]);
        let b = h.fix(100, order[1]);
        assert_eq!(a, Ingested::Accepted);
        assert_eq!(
            b,
            if order[1] == IN {
                Ingested::Accepted
            } else {
                Ingested::Duplicate
            }
        );
        h.w(200);
        // IN (lat 50.005) sorts before FAR (lat 50.05): it is kept.
        assert_eq!(h.take(), vec![(Enter, 100, 0)]);
    }
}

#[test]
fn fixes_wait_for_the_watermark_and_apply_in_event_time_order() {
    let mut h = H::new(serde_json::json!({}));
    h.lateness = Dur::from_secs(30);
    h.fix(20, FAR);
    h.fix(10, IN);
    assert_eq!(h.take(), vec![]);
    assert_eq!(h.e.device("d1").unwrap().buffered, 2);
    h.fix(60, FAR);
    assert_eq!(h.take(), vec![(Enter, 10, 0), (Exit, 20, 10)]);
}

#[test]
fn exit_tombstones_the_visit_timers() {
    let mut h = H::new(serde_json::json!({"dwell": ["1h"]}));
    h.fix(0, IN);
    let before = h.e.stats().wheel;
    assert_eq!(before.entries - before.tombstones, 1);
    h.fix(10, FAR);
    let after = h.e.stats().wheel;
    assert_eq!(after.entries - after.tombstones, 0);
    h.w(4000);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Exit, 10, 10)]);
}

#[test]
fn deleting_a_fence_drops_its_pairs_and_timers() {
    let mut h = H::new(serde_json::json!({"dwell": ["1h"]}));
    h.fix(0, IN);
    assert!(h.e.remove_fence("sq"));
    assert_eq!(h.e.stats().pairs, 0);
    h.w(4000);
    assert_eq!(h.take(), vec![(Enter, 0, 0)]);
    assert!(!h.e.remove_fence("sq"));
}

#[test]
fn geometry_changes_apply_from_the_next_fix() {
    let mut h = H::new(serde_json::json!({}));
    h.fix(0, IN);
    // Move the square far away: the open visit stays open until the next fix says otherwise.
    let moved = fence_from(serde_json::json!({
        "type": "Feature", "id": "sq",
        "geometry": {"type": "Polygon", "coordinates": [[
            [20.0, 50.0], [20.01, 50.0], [20.01, 50.01], [20.0, 50.01], [20.0, 50.0]
        ]]},
        "properties": {}
    }));
    h.e.upsert_fence(moved, &mut h.out);
    assert_eq!(h.take(), vec![(Enter, 0, 0)]);
    h.fix(10, IN);
    assert_eq!(h.take(), vec![(Exit, 10, 10)]);
}

#[test]
fn circles_use_haversine_radius() {
    let mut h = H::new(serde_json::json!({}));
    let circle = fence_from(serde_json::json!({
        "type": "Feature", "id": "c",
        "geometry": {"type": "Point", "coordinates": [0.0, 0.0]},
        "properties": {"radius_m": 1000}
    }));
    h.e.upsert_fence(circle, &mut h.out);
    // 0.0089° of latitude is ~989.6 m; 0.0091° is ~1011.9 m.
    h.fix_acc("c1", 0, (0.0, 0.0089), None);
    h.fix_acc("c2", 0, (0.0, 0.0091), None);
    let devs: Vec<_> = h.out.iter().map(|e| e.device.to_string()).collect();
    assert_eq!(devs, vec!["c1".to_string()]);
}

#[test]
fn ids_are_deterministic() {
    let run = || {
        let mut h = H::new(serde_json::json!({"dwell": ["1m"]}));
        h.fix(0, IN);
        h.w(61);
        std::mem::take(&mut h.out)
    };
    let (a, b) = (run(), run());
    assert_eq!(a, b);
    assert_eq!(a.len(), 2);
}

#[test]
fn device_view_shows_pairs() {
    let mut h = H::new(serde_json::json!({"dwell": ["10m"]}));
    h.fix(0, IN);
    let v = h.e.device("d1").unwrap();
    assert_eq!(v.last_fix_at, Some(ts(0)));
    assert_eq!(v.pairs.len(), 1);
    assert!(v.pairs[0].1.inside);
    assert_eq!(v.pairs[0].1.next_due, Some(ts(600)));
    assert!(h.e.device("nobody").is_none());
}

#[test]
fn buffer_limit_is_an_error_not_a_loss() {
    let mut e = Engine::new(EngineConfig {
        max_buffered_per_device: 2,
        ..EngineConfig::default()
    });
    let mut out = Vec::new();
    for (i, expect_ok) in [(1, true), (2, true), (3, false)] {
        let fix = Fix::new("d", ts(100 + i), 0.0, 0.0, None, 8).unwrap();
        assert_eq!(e.ingest(&fix, ts(0), &mut out).is_ok(), expect_ok);
    }
    assert_eq!(e.stats().buffered, 2);
}

#[test]
fn changed_thresholds_apply_to_open_visits() {
    let mut h = H::new(serde_json::json!({"dwell": ["1h"]}));
    h.fix(0, IN);
    h.fix(700, IN);
    h.e.upsert_fence(
        square("sq", serde_json::json!({"dwell": ["10m", "1h"]})),
        &mut h.out,
    );
    h.w(701);
    assert_eq!(h.take(), vec![(Enter, 0, 0), (Dwell, 600, 600)]);
}

#[test]
fn device_pages_walk_every_device_once_and_name_the_fences_it_is_inside() {
    let mut h = H::new(serde_json::json!({}));
    for i in 0..7 {
        let p = if i % 2 == 0 { IN } else { FAR };
        h.fix_acc(&format!("d{i}"), i, p, None);
    }
    let mut seen = Vec::new();
    let mut from = 0;
    loop {
        let (page, next) = h.e.device_page(from, 3);
        assert!(page.len() <= 3);
        seen.extend(page);
        match next {
            Some(n) => from = n,
            None => break,
        }
    }
    let ids: Vec<&str> = seen.iter().map(|d| &*d.id).collect();
    assert_eq!(ids, ["d0", "d1", "d2", "d3", "d4", "d5", "d6"]);
    for (i, d) in seen.iter().enumerate() {
        let want: Vec<&str> = if i % 2 == 0 { vec!["sq"] } else { vec![] };
        assert_eq!(
            d.inside.iter().map(|f| &**f).collect::<Vec<_>>(),
            want,
            "{}",
            d.id
        );
        assert_eq!(d.last_fix_at, Some(ts(i as i64)));
    }
    assert_eq!(h.e.device_page(100, 3), (vec![], None), "past the end");
}

/// The records whose count scales with the fleet; their sizes are what a live pair costs
/// (docs/bench-e2e.md). A size regression should be a decision, not an accident.
#[test]
fn record_sizes() {
    assert_eq!(std::mem::size_of::<records::Device>(), 40);
    assert_eq!(std::mem::size_of::<Pair>(), 40);
}

/// A square `d` degrees wide with its south-west corner at (10.0, 50.0).
fn nested(id: &str, d: f64) -> Arc<Fence> {
    fence_from(serde_json::json!({
        "type": "Feature",
        "id": id,
        "geometry": {"type": "Polygon", "coordinates": [[
            [10.0, 50.0], [10.0 + d, 50.0], [10.0 + d, 50.0 + d], [10.0, 50.0 + d], [10.0, 50.0]
        ]]},
        "properties": {"dwell": ["10m"]},
    }))
}

#[test]
fn pair_lists_survive_leaving_fences_in_any_order() {
    // Three nested squares; a device walks out of them from the inside out and back, and other
    // devices interleave, so list heads, middles and tails are all unlinked at some point.
    let mut e = Engine::new(EngineConfig::default());
    let mut out = Vec::new();
    for (id, d) in [("a", 0.03), ("b", 0.02), ("c", 0.01)] {
        e.upsert_fence(nested(id, d), &mut out);
    }
    // (lon, lat) offsets inside 3, 2, 1 and 0 of the fences.
    let spots = [0.005, 0.015, 0.025, 0.05];
    let walk = [0, 1, 2, 3, 0, 2, 1, 0, 3];
    let mut t = 0;
    for (step, &i) in walk.iter().enumerate() {
        for dev in ["x", "y", "z"] {
            let i = (i + dev.len() * step) % spots.len();
            let p = 10.0 + spots[i];
            let fix = Fix::new(dev, ts(t), 50.0 + spots[i], p, None, 64).unwrap();
            e.ingest(&fix, ts(t), &mut out).unwrap();
            e.check_records();
            t += 30;
        }
    }
    let inside: Vec<usize> = ["x", "y", "z"]
        .iter()
        .map(|d| e.device(d).unwrap().pairs.len())
        .collect();
    assert_eq!(e.stats().pairs, inside.iter().sum::<usize>() as u64);
    // x parks inside all three, then the middle fence goes: its pairs leave every list, the
    // others keep their timers.
    let fix = Fix::new("x", ts(t), 50.005, 10.005, None, 64).unwrap();
    e.ingest(&fix, ts(t), &mut out).unwrap();
    assert_eq!(e.device("x").unwrap().pairs.len(), 3);
    assert!(e.remove_fence("b"));
    e.check_records();
    out.clear();
    e.advance(ts(t + 7200), &mut out);
    e.check_records();
    let mut dwelled: Vec<&str> = out
        .iter()
        .filter(|ev| ev.kind == EventKind::Dwell && &*ev.device == "x")
        .map(|ev| &*ev.fence)
        .collect();
    dwelled.sort();
    assert_eq!(dwelled, ["a", "c"]);
}

#[test]
fn a_fence_scoped_to_some_devices_ignores_the_others_and_a_scope_change_applies_from_the_next_fix()
{
    let mut h = H::new(serde_json::json!({"devices": ["truck-*", "van-7"]}));
    h.fix_acc("truck-1", 0, IN, None);
    h.fix_acc("car-1", 1, IN, None);
    h.fix_acc("van-7", 2, IN, None);
    let entered: Vec<String> = h.out.drain(..).map(|e| e.device.to_string()).collect();
    assert_eq!(entered, vec!["truck-1", "van-7"], "car-1 is out of scope");
    // The scope drops the trucks: truck-1's next fix, still inside the geometry, is an EXIT.
    h.e.upsert_fence(
        square("sq", serde_json::json!({"devices": ["van-*"]})),
        &mut h.out,
    );
    assert_eq!(h.take(), vec![], "a scope change emits nothing by itself");
    h.fix_acc("truck-1", 10, IN, None);
    h.fix_acc("van-7", 11, IN, None);
    let got: Vec<(String, EventKind)> = h
        .out
        .drain(..)
        .map(|e| (e.device.to_string(), e.kind))
        .collect();
    assert_eq!(got, vec![("truck-1".to_string(), Exit)]);
    // Without a scope every device takes part again.
    h.e.upsert_fence(square("sq", serde_json::json!({})), &mut h.out);
    h.fix_acc("car-1", 20, IN, None);
    assert_eq!(h.take(), vec![(Enter, 20, 0)]);
}

#[test]
fn device_scopes_are_validated_and_written_back() {
    let f = square("sq", serde_json::json!({"devices": ["truck-*", "van-7"]}));
    assert!(f.settings.devices.matches("truck-12") && !f.settings.devices.matches("car"));
    let props = f.to_feature().properties.unwrap();
    assert_eq!(props["devices"], serde_json::json!(["truck-*", "van-7"]));
    assert!(
        square("a", serde_json::json!({}))
            .to_feature()
            .properties
            .unwrap()
            .get("devices")
            .is_none()
    );
    for bad in [
        serde_json::json!([]),
        serde_json::json!("truck-*"),
        serde_json::json!([""]),
        serde_json::json!([7]),
        serde_json::json!(["x".repeat(300)]),
        serde_json::json!(vec!["a"; 65]),
    ] {
        let feature: geojson::Feature = serde_json::from_value(serde_json::json!({
            "type": "Feature", "id": "x", "properties": {"devices": bad},
            "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]]]},
        }))
        .unwrap();
        let e = Fence::from_feature(&feature, None, &FenceLimits::default()).unwrap_err();
        assert!(e.to_string().contains("properties.devices"), "{bad}: {e}");
    }
}

#[test]
fn occupancy_lists_exactly_the_devices_inside_across_pages_and_counts_them() {
    let mut h = H::new(serde_json::json!({"dwell": ["10m"]}));
    for i in 0..25 {
        h.fix_acc(&format!("in-{i}"), 1, IN, None);
    }
    for i in 0..7 {
        h.fix_acc(&format!("out-{i}"), 1, FAR, None);
    }
    // Two leave: their pairs are freed, and a freed slot must not count.
    h.fix_acc("in-3", 2, FAR, None);
    h.fix_acc("in-4", 2, FAR, None);
    h.w(3);
    assert_eq!(h.e.fence_inside("sq"), 23);
    assert_eq!(h.e.fence_inside("nope"), 0);
    // Pages of 4 with a scan budget of 3 slots: short pages, never a repeat, all 23 in the end.
    let mut seen = std::collections::BTreeSet::new();
    let mut from = 0;
    loop {
        let (page, next) = h.e.fence_occupants("sq", from, 4, 3);
        assert!(page.len() <= 3);
        for o in page {
            assert!(o.pair.inside);
            assert_eq!(o.pair.entered_at, ts(1));
            assert_eq!(o.pair.next_due, Some(ts(601)));
            assert!(seen.insert(o.device.to_string()), "listed twice");
        }
        match next {
            Some(n) => from = n,
            None => break,
        }
    }
    let want: std::collections::BTreeSet<String> = (0..25)
        .filter(|i| *i != 3 && *i != 4)
        .map(|i| format!("in-{i}"))
        .collect();
    assert_eq!(seen, want);
    assert_eq!(h.e.fence_occupants("nope", 0, 10, 100), (vec![], None));
}

/// An engine with the delayed-data rules on (`max_delay` 1 h, `delay_hold` 5 s), driven on an
/// explicit watermark: `at(w)` moves it, `late(dev, secs, p)` sends a fix under it.
struct Delayed {
    e: Engine,
    out: Vec<Event>,
    w: Ts,
}

impl Delayed {
    fn new(props: serde_json::Value) -> Delayed {
        let mut d = Delayed {
            e: Engine::new(EngineConfig {
                max_delay: Dur::from_secs(3600),
                delay_hold: Dur::from_secs(5),
                ..EngineConfig::default()
            }),
            out: Vec::new(),
            w: ts(0),
        };
        d.e.upsert_fence(square("sq", props), &mut d.out);
        d
    }

    fn at(&mut self, secs: i64) {
        self.w = ts(secs);
        self.e.advance(self.w, &mut self.out);
    }

    fn fix(&mut self, dev: &str, secs: i64, p: (f64, f64)) -> Ingested {
        let fix = Fix::new(dev, ts(secs), p.1, p.0, None, 64).unwrap();
        self.e.ingest(&fix, self.w, &mut self.out).unwrap()
    }

    fn take(&mut self) -> Vec<(EventKind, i64, i64)> {
        self.out
            .drain(..)
            .map(|e| {
                let extra = e
                    .dwell_s
                    .or(e.duration_s)
                    .map_or(0, |s| s.0.millis() / 1000);
                (e.kind, (e.at.0 - T0) / 1000, extra)
            })
            .collect()
    }
}

#[test]
fn a_fix_behind_the_watermark_is_applied_in_its_device_time() {
    let mut d = Delayed::new(serde_json::json!({}));
    d.at(1000);
    assert_eq!(d.fix("d1", 970, IN), Ingested::Accepted, "30 s late");
    assert_eq!(d.take(), vec![(Enter, 970, 0)]);
    assert_eq!(
        d.e.device("d1").unwrap().frontier,
        Some(ts(970)),
        "the frontier is its latest fix"
    );
    assert_eq!(
        d.fix("d1", 960, FAR),
        Ingested::Late(LateReason::BehindDevice)
    );
    assert_eq!(d.fix("d1", 970, FAR), Ingested::Duplicate);
    assert_eq!(
        d.fix("d2", 1000 - 3601, IN),
        Ingested::Late(LateReason::TooOld),
        "more than max_delay behind"
    );
    assert_eq!(d.fix("d2", 1000 - 3600, IN), Ingested::Accepted);
    let v = d.e.device("d1").unwrap();
    assert_eq!(v.delayed.len(), 2, "{v:?}");
    assert_eq!(v.delayed[0].late, Some(LateReason::BehindDevice));
    assert_eq!(v.delayed[1].behind, Dur::from_secs(30));
}

#[test]
fn a_dwell_decided_by_the_watermark_stands_against_the_queue() {
    // Not STALE at its deadline: the silent device's DWELL fires, and its queued fixes from
    // before the deadline are behind it.
    let mut d = Delayed::new(serde_json::json!({"dwell": ["10m"], "stale_after": "15m"}));
    d.at(0);
    d.fix("d1", 0, IN);
    d.at(700);
    assert_eq!(d.take(), vec![(Enter, 0, 0), (Dwell, 600, 600)]);
    assert_eq!(
        d.fix("d1", 120, FAR),
        Ingested::Late(LateReason::BehindDevice)
    );
    assert_eq!(d.fix("d1", 650, FAR), Ingested::Accepted, "after the DWELL");
    assert_eq!(d.take(), vec![(Exit, 650, 650)]);
}

#[test]
fn a_stale_dwell_waits_for_the_queue_and_its_presence_releases_it() {
    // STALE at its deadline: the DWELL waits; the queue shows the device was there.
    let mut d = Delayed::new(serde_json::json!({"dwell": ["10m"], "stale_after": "5m"}));
    d.at(0);
    d.fix("d1", 0, IN);
    d.at(3000);
    assert_eq!(
        d.take(),
        vec![(Enter, 0, 0)],
        "STALE at 600: the DWELL waits"
    );
    // The queue, one fix per request, a second apart.
    for (i, secs) in [200, 400, 580, 900].into_iter().enumerate() {
        d.at(3000 + i as i64);
        assert_eq!(d.fix("d1", secs, IN), Ingested::Accepted);
    }
    d.at(3010);
    assert_eq!(
        d.take(),
        vec![(Dwell, 600, 600)],
        "a fix 20 s before the deadline makes it not STALE"
    );
}

#[test]
fn a_queue_split_into_requests_gives_the_events_of_one_request() {
    // The first queued fix is inside and would, on its own, release the STALE dwell; the EXIT
    // before the deadline comes two requests later. The hold keeps the deadline waiting.
    let props = serde_json::json!({"dwell": ["10m"], "stale_after": "5m"});
    let queue = [(200, IN), (400, IN), (500, FAR)];
    let run = |split: bool| {
        let mut d = Delayed::new(props.clone());
        d.at(0);
        d.fix("d1", 0, IN);
        d.at(3600);
        for (i, &(secs, p)) in queue.iter().enumerate() {
            if split {
                d.at(3600 + 2 * i as i64);
            }
            assert_eq!(d.fix("d1", secs, p), Ingested::Accepted);
        }
        d.at(3700);
        d.take()
    };
    let whole = run(false);
    assert_eq!(whole, vec![(Enter, 0, 0), (Exit, 500, 500)]);
    assert_eq!(run(true), whole);
    // Without the hold, the split queue's first part releases the dwell before the EXIT.
    let mut d = Delayed::new(props);
    d.e = Engine::new(EngineConfig {
        max_delay: Dur::from_secs(3600),
        ..EngineConfig::default()
    });
    d.e.upsert_fence(
        square(
            "sq",
            serde_json::json!({"dwell": ["10m"], "stale_after": "5m"}),
        ),
        &mut d.out,
    );
    d.at(0);
    d.fix("d1", 0, IN);
    d.at(3600);
    assert_eq!(d.fix("d1", 200, IN), Ingested::Accepted);
    assert_eq!(d.take(), vec![(Enter, 0, 0)], "still STALE at 600");
    d.at(3602);
    assert_eq!(d.fix("d1", 400, IN), Ingested::Accepted);
    assert_eq!(
        d.take(),
        vec![(Dwell, 600, 600)],
        "no hold: the deadline is judged with the queue's first parts only"
    );
    d.at(3604);
    assert_eq!(
        d.fix("d1", 500, FAR),
        Ingested::Late(LateReason::BehindDevice),
        "and the EXIT before it is behind the DWELL"
    );
}

#[test]
fn a_removed_device_holds_off_its_delayed_fixes_and_is_forgotten_later() {
    let mut d = Delayed::new(serde_json::json!({}));
    d.at(100);
    d.fix("d1", 100, IN);
    d.at(200);
    assert!(d.e.remove_device("d1"));
    assert!(d.e.device("d1").is_none(), "not a device to the API");
    assert_eq!(
        d.fix("d1", 150, IN),
        Ingested::Late(LateReason::BehindDevice),
        "from before the removal"
    );
    d.at(201);
    assert_eq!(d.fix("d1", 201, IN), Ingested::Accepted, "a new device");
    assert_eq!(d.take(), vec![(Enter, 100, 0), (Enter, 201, 0)]);
    assert!(d.e.remove_device("d1"));
    assert!(!d.e.remove_device("d1"), "a tombstone is not removed again");
    let rule = IdleRule { ttl: Dur::ZERO };
    assert!(d.e.expire_idle(rule, d.w, 10).is_empty());
    d.at(201 + 3601);
    assert_eq!(d.e.expire_idle(rule, d.w, 10), vec![Arc::<str>::from("d1")]);
    assert!(d.e.forget_device("d1"));
    assert_eq!(d.e.stats().devices, 0);
}

#[test]
fn a_fence_ignores_delayed_fixes_from_before_it_existed() {
    let mut d = Delayed::new(serde_json::json!({}));
    d.at(1000);
    let mut late_fence = (*square("new", serde_json::json!({}))).clone();
    late_fence.active_since = Some(ts(1000));
    d.e.upsert_fence(Arc::new(late_fence), &mut d.out);
    assert_eq!(d.fix("d1", 990, IN), Ingested::Accepted);
    assert_eq!(
        d.take(),
        vec![(Enter, 990, 0)],
        "ENTER for the old fence only"
    );
    assert_eq!(d.out.len(), 0);
    d.at(1002);
    d.fix("d1", 1001, IN);
    let fences: Vec<String> = d.out.iter().map(|e| e.fence.to_string()).collect();
    assert_eq!(fences, vec!["new"], "from its creation on");
}

#[test]
fn a_device_stored_without_a_frontier_gets_the_watermark_of_its_checkpoint() {
    let mut d = Delayed::new(serde_json::json!({}));
    d.at(100);
    d.fix("d1", 50, IN);
    let mut states = d.e.export();
    assert_eq!(states[0].frontier, Some(ts(50).0));
    states[0].frontier = None;
    let mut e = Engine::new(d.e.config().clone());
    e.upsert_fence(square("sq", serde_json::json!({})), &mut d.out);
    e.restore(states, Some(ts(100))).unwrap();
    assert_eq!(e.device("d1").unwrap().frontier, Some(ts(100)));
    let fix = Fix::new("d1", ts(80), IN.1, IN.0, None, 64).unwrap();
    assert_eq!(
        e.ingest(&fix, ts(100), &mut d.out).unwrap(),
        Ingested::Late(LateReason::BehindDevice),
        "anything up to the watermark may have been decided"
    );
}
