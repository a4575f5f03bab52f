//! `GET /v1/events` filters over real HTTP: types, device, fence globs and event-time bounds,
//! paging with `next_seq` through a filtered log without skipping or repeating, and the 400s.

use crate::common::*;
use serde_json::{Value, json};

const EVENT_MODE: &str = "[time]\nclock = \"event\"\nlateness = \"0s\"\n";

fn fence_at(id: &str, lon: f64) -> Value {
    json!({"type": "Feature", "id": id, "properties": {"dwell": ["1m"]}, "geometry": {"type": "Polygon",
        "coordinates": [[[lon, 0.0], [lon + 1.0, 0.0], [lon + 1.0, 1.0], [lon, 1.0], [lon, 0.0]]]}})
}

/// Every event a filtered poll gives, page by page with `limit`, following `next_seq`.
async fn poll_all(srv: &Srv, filter: &str, limit: usize) -> Vec<Value> {
    let mut out = Vec::new();
    let mut from = 0u64;
    for _ in 0..1000 {
        let path = format!("/v1/events?from_seq={from}&limit={limit}&{filter}");
        let (s, page) = srv.get(&path).await;
        assert_eq!(s, 200, "{path}: {page}");
        let evs = page["events"].as_array().unwrap().clone();
        assert!(evs.len() <= limit);
        let next = page["next_seq"].as_u64().unwrap();
        assert!(next >= from, "{page}");
        out.extend(evs);
        if next == page["head_seq"].as_u64().unwrap() {
            return out;
        }
        from = next;
    }
    panic!("paging did not reach the head");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_filter_by_type_device_fence_and_time_and_page_without_gaps() {
    let srv = start(EVENT_MODE).await;
    for (id, lon) in [("yard-1", 0.0), ("yard-2", 2.0), ("dock-1", 4.0)] {
        assert_eq!(srv.put_fence(id, fence_at(id, lon)).await.status(), 201);
    }
    // Three devices each visit the three fences in turn, 5 minutes each: ENTER, DWELL 1m, EXIT.
    let mut fixes = Vec::new();
    // In time order: with lateness 0 a fix behind the latest one seen would be late.
    for (k, lon) in [0.5, 2.5, 4.5, 10.0].iter().enumerate() {
        for d in 0..3 {
            let ts = T0 + (k as i64 * 300 + d) * 1000;
            fixes.push(json!({"device": format!("t{d}"), "ts": ts, "lat": 0.5, "lon": lon}));
        }
    }
    let (s, r) = srv.post_fixes(Value::Array(fixes)).await;
    assert_eq!(s, 200, "{r}");
    let all = srv.events(27).await;
    assert_eq!(all.len(), 27, "{all:?}");

    check(&srv, &all, "types=enter,exit", &|e| e["type"] != "dwell").await;
    check(&srv, &all, "device=t1", &|e| e["device"] == "t1").await;
    check(&srv, &all, "fence=yard-*", &|e| {
        e["fence"].as_str().unwrap().starts_with("yard-")
    })
    .await;
    check(&srv, &all, "fence=yard-?&types=dwell&device=t2", &|e| {
        e["fence"].as_str().unwrap().starts_with("yard-")
            && e["type"] == "dwell"
            && e["device"] == "t2"
    })
    .await;
    // Event time: `since` inclusive, `until` exclusive, as RFC 3339 or Unix ms.
    let (since, until) = (T0 + 300_000, T0 + 600_000);
    let in_window = |e: &Value| {
        let at = chrono::DateTime::parse_from_rfc3339(e["at"].as_str().unwrap())
            .unwrap()
            .timestamp_millis();
        at >= since && at < until
    };
    check(
        &srv,
        &all,
        &format!("since={since}&until={until}"),
        &in_window,
    )
    .await;
    let rfc = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .to_rfc3339()
    };
    check(
        &srv,
        &all,
        &format!(
            "since={}&until={}",
            urlencode(&rfc(since)),
            urlencode(&rfc(until))
        ),
        &in_window,
    )
    .await;
    check(&srv, &all, "device=nobody", &|_| false).await;
    // A window with `until` at or before `since` is empty, not an error.
    check(&srv, &all, &format!("since={until}&until={since}"), &|_| {
        false
    })
    .await;

    for (q, needle) in [
        ("types=arrive", "unknown event type"),
        ("device=", "visible character"),
        ("since=yesterday", "since"),
        ("until=1e3", "until"),
        ("colour=red", "\"colour\""),
    ] {
        let (s, e) = srv.get(&format!("/v1/events?{q}")).await;
        assert_eq!(
            (s, e["error"]["code"].clone()),
            (400, json!("bad_query")),
            "{q}: {e}"
        );
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{q}: {msg}");
    }
    srv.stop().await;
}

/// Polls with `filter` at several page lengths and compares with the unfiltered events `keep`
/// selects.
async fn check(srv: &Srv, all: &[Value], filter: &str, keep: &dyn Fn(&Value) -> bool) {
    let want: Vec<Value> = all.iter().filter(|e| keep(e)).cloned().collect();
    for limit in [1, 4, 1000] {
        let got = poll_all(srv, filter, limit).await;
        assert_eq!(got, want, "{filter}, limit {limit}");
    }
}

fn urlencode(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_devices_visits_are_rebuilt_from_the_event_log_and_paged() {
    let srv = start(EVENT_MODE).await;
    for (id, lon) in [("yard-1", 0.0), ("yard-2", 2.0), ("dock-1", 4.0)] {
        assert_eq!(srv.put_fence(id, fence_at(id, lon)).await.status(), 201);
    }
    // t0 visits yard-1 (5 min, DWELL 1m), yard-2 (30 s: no DWELL), dock-1 (still inside);
    // t1 visits yard-1 only.
    let fix = |d: &str, s: i64, lon: f64| json!({"device": d, "ts": T0 + s * 1000, "lat": 0.5, "lon": lon});
    let fixes = json!([
        fix("t0", 0, 0.5),
        fix("t1", 1, 0.5),
        fix("t0", 300, 2.5),
        fix("t1", 301, 10.0),
        fix("t0", 330, 4.5),
        fix("t0", 400, 4.6),
    ]);
    let (s, r) = srv.post_fixes(fixes).await;
    assert_eq!(s, 200, "{r}");
    // t0: 3 + 2 + 2 events, t1: 3.
    let all = srv.events(10).await;
    assert_eq!(all.len(), 10, "{all:?}");
    let (s, page) = srv.get("/v1/devices/t0/visits").await;
    assert_eq!(s, 200, "{page}");
    let visits = page["visits"].as_array().unwrap();
    let summary: Vec<(String, Value, Value, Value)> = visits
        .iter()
        .map(|v| {
            (
                v["fence"].as_str().unwrap().to_string(),
                v["duration_s"].clone(),
                v["dwell_reached_s"].clone(),
                v["complete"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("yard-1".into(), json!(300.0), json!([60.0]), json!(true)),
            ("yard-2".into(), json!(30.0), json!([]), json!(true)),
            ("dock-1".into(), Value::Null, json!([60.0]), json!(true)),
        ],
        "{page}"
    );
    assert!(
        visits[2].get("exited_at").is_none(),
        "dock-1 is still open: {page}"
    );
    assert_eq!(visits[0]["entered_at"], "2026-01-01T00:00:00.000Z");
    assert_eq!(visits[0]["exited_at"], "2026-01-01T00:05:00.000Z");
    assert!(page["next_after"].is_null());
    // Every event of the device belongs to exactly one visit.
    let mut seqs: Vec<u64> = visits
        .iter()
        .flat_map(|v| {
            v["seqs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_u64().unwrap())
        })
        .collect();
    seqs.sort();
    let mut want: Vec<u64> = all
        .iter()
        .filter(|e| e["device"] == "t0")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    want.sort();
    assert_eq!(seqs, want);

    // Paged one at a time: the same visits, in the same order.
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!(
                "/v1/devices/t0/visits?limit=1&after={}",
                a.replace(':', "%3A")
            ),
            None => "/v1/devices/t0/visits?limit=1".to_string(),
        };
        let (s, p) = srv.get(&path).await;
        assert_eq!(s, 200, "{path}: {p}");
        paged.extend(p["visits"].as_array().unwrap().iter().cloned());
        match p["next_after"].as_str() {
            Some(a) => after = Some(a.to_string()),
            None => break,
        }
    }
    assert_eq!(&paged, visits);

    let (_, one) = srv.get("/v1/devices/t1/visits").await;
    assert_eq!(one["visits"].as_array().unwrap().len(), 1, "{one}");
    let (s, none) = srv.get("/v1/devices/nobody/visits").await;
    assert_eq!((s, none["visits"].clone()), (200, json!([])));
    for q in ["limit=0", "limit=1001", "after=x", "colour=red"] {
        let (s, e) = srv.get(&format!("/v1/devices/t0/visits?{q}")).await;
        assert_eq!(
            (s, e["error"]["code"].clone()),
            (400, json!("bad_query")),
            "{q}: {e}"
        );
    }
    srv.stop().await;
}
