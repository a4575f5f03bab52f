//! Bad input against the real server (issue 3, "Bad input"): every case gets its exact status and
//! an error JSON `{"error": {"code", "message"}}` (or a close code on WebSocket), nothing panics
//! (`/healthz` and `/readyz` still answer 200 afterwards, so every shard task is alive), and the
//! fixes accepted before the bad request are kept.
//!
//! The HTTP request/answer matrix goes through the running service's router in process
//! (`App`, `tower::ServiceExt::oneshot`): the same handlers, limits and state as the socket
//! serves. WebSocket ingest and the subscription's handshake stay on real connections: frames,
//! close codes and the upgrade exist only there.

use std::time::Duration;

use crate::common::*;
use futures_util::SinkExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

const EVENT_MODE: &str = "[time]\nclock = \"event\"\nlateness = \"0s\"\n";

/// Asserts `body` is `{"error": {"code": code, "message": <non-empty string>, ...}}`.
#[track_caller]
fn assert_error_body(body: &Value, code: &str) {
    let err = &body["error"];
    assert!(err.is_object(), "not an error JSON: {body}");
    assert_eq!(err["code"], code, "error code: {body}");
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "error message missing: {body}"
    );
}

/// Asserts the exact status and the error JSON.
#[track_caller]
fn assert_error(got: (u16, Value), status: u16, code: &str) -> Value {
    assert_eq!(got.0, status, "status: {}", got.1);
    assert_error_body(&got.1, code);
    got.1
}

/// POSTs raw bytes with a content type.
async fn post_raw(
    app: &App<'_>,
    path: &str,
    content_type: &str,
    body: impl Into<Vec<u8>>,
) -> (u16, Value) {
    app.send("POST", path, Some(content_type), body).await
}

async fn put_raw(app: &App<'_>, path: &str, body: impl Into<Vec<u8>>) -> (u16, Value) {
    app.send("PUT", path, Some("application/json"), body).await
}

async fn delete(app: &App<'_>, path: &str) -> (u16, Value) {
    app.json("DELETE", path, None).await
}

/// An event-mode server with fence `depot` and one accepted fix of `dev` inside it at T0.
async fn seeded(extra: &str, dev: &str) -> Srv {
    let srv = start(extra).await;
    let app = srv.app();
    assert_eq!(
        app.put_fence("depot", square("depot", json!({}))).await.0,
        201
    );
    let (s, rep) = app.post_fixes(fix(dev, 0, true)).await;
    assert_eq!((s, rep["accepted"].clone()), (200, json!(1)), "{rep}");
    srv
}

/// The server is alive (no panic took it down, every shard still runs) and `dev`'s good fix at
/// T0 is still held: `last_fix_at` on the device and its ENTER in the event log. Asked over a
/// socket (`Srv`) or in process (`App`).
async fn assert_healthy_and_kept(api: &impl Http, dev: &str) {
    assert_eq!(
        api.get_json("/healthz").await.0,
        200,
        "healthz after bad input"
    );
    let (s, r) = api.get_json("/readyz").await;
    assert_eq!(
        (s, r["status"].clone()),
        (200, json!("ready")),
        "readyz after bad input"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (s, d) = api.get_json(&format!("/v1/devices/{dev}")).await;
        if s == 200 && d["last_fix_at"] == "2026-01-01T00:00:00.000Z" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "fix of {dev} lost: {s} {d}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let evs = events_of(api, 1).await;
    assert!(
        evs.iter()
            .any(|e| e["type"] == "enter" && e["device"] == dev && e["fence"] == "depot"),
        "ENTER of {dev} lost: {evs:?}"
    );
}

// ---------------------------------------------------------------- POST /v1/fixes (in process)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_is_400() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    for body in [
        "{\"device\": \"a\", \"ts\": 1",
        "not json at all",
        "[{\"device\": \"a\"},",
        "{\"device\": \"a\", \"lat\": NaN, \"lon\": 1, \"ts\": 0}",
        "",
    ] {
        let got = post_raw(&app, "/v1/fixes", "application/json", body).await;
        assert_error(got, 400, "malformed_json");
    }
    // Valid JSON but not a fix, an array or NDJSON.
    for body in ["42", "null", "\"a fix\"", "true"] {
        let got = post_raw(&app, "/v1/fixes", "application/json", body).await;
        assert_error(got, 400, "malformed_batch");
    }
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_types_are_per_item_errors() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    let t = T0 + 10_000;
    let bad = [
        json!({"device": "a", "ts": t, "lat": "50.0", "lon": 10.0}),
        json!({"device": "a", "ts": t, "lat": 50.0, "lon": [10.0]}),
        json!({"device": 17, "ts": t, "lat": 50.0, "lon": 10.0}),
        json!({"device": "a", "ts": true, "lat": 50.0, "lon": 10.0}),
        json!({"device": "a", "ts": 1.5e12 + 0.5, "lat": 50.0, "lon": 10.0}),
        json!({"device": "a", "ts": "yesterday", "lat": 50.0, "lon": 10.0}),
        json!({"device": "a", "ts": t, "lat": 50.0, "lon": 10.0, "accuracy": "good"}),
        json!({"device": "a", "ts": t, "lat": 50.0, "lon": 10.0, "accuracy": -1}),
        json!("a string item"),
    ];
    // A bare JSON string as the whole body is not a batch at all.
    let got = app.post_fixes(bad[bad.len() - 1].clone()).await;
    assert_error(got, 400, "malformed_batch");
    let codes = [
        "invalid_fix",
        "invalid_fix",
        "invalid_fix",
        "invalid_ts",
        "invalid_ts",
        "invalid_ts",
        "invalid_fix",
        "invalid_fix",
        "invalid_fix",
    ];
    // One bad object alone: every item was rejected -> 422 with the item's error.
    for (item, code) in bad.iter().zip(codes).filter(|(i, _)| i.is_object()) {
        let body = assert_error(app.post_fixes(item.clone()).await, 422, "no_valid_fixes");
        let errs = &body["error"]["details"]["errors"];
        assert_eq!(errs.as_array().map(Vec::len), Some(1), "{body}");
        assert_eq!(errs[0]["index"], 0, "{body}");
        assert_eq!(errs[0]["code"], code, "{item}: {body}");
        assert!(
            errs[0]["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
    }
    // An all-bad array: 422 and every item listed with its index, in order.
    let body = assert_error(
        app.post_fixes(Value::Array(bad.to_vec())).await,
        422,
        "no_valid_fixes",
    );
    let d = &body["error"]["details"];
    assert_eq!(d["accepted"], 0, "{body}");
    assert_eq!(d["rejected"], bad.len(), "{body}");
    let idx: Vec<u64> = d["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, (0..bad.len() as u64).collect::<Vec<_>>(), "{body}");
    let got: Vec<&str> = d["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["code"].as_str().unwrap())
        .collect();
    assert_eq!(got, codes, "{body}");
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_finite_and_out_of_range_coordinates_are_rejected() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    let t = T0 + 10_000;
    // Out of range: a per-item error, the item's index reported.
    for (lat, lon) in [(91.0, 10.0), (-90.5, 10.0), (50.0, 181.0), (50.0, -180.5)] {
        let item = json!({"device": "a", "ts": t, "lat": lat, "lon": lon});
        let body = assert_error(app.post_fixes(item).await, 422, "no_valid_fixes");
        let e = &body["error"]["details"]["errors"][0];
        assert_eq!(
            (e["index"].clone(), e["code"].clone()),
            (json!(0), json!("invalid_fix")),
            "{body}"
        );
        let field = if lat != 50.0 { "lat" } else { "lon" };
        assert!(e["message"].as_str().unwrap().contains(field), "{body}");
    }
    // The edges of the ranges are valid.
    let edges = json!([
        {"device": "edge", "ts": t, "lat": 90.0, "lon": 180.0},
        {"device": "edge", "ts": t + 1, "lat": -90.0, "lon": -180.0},
    ]);
    let (s, rep) = app.post_fixes(edges).await;
    assert_eq!(
        (s, rep["accepted"].clone(), rep["rejected"].clone()),
        (200, json!(2), json!(0)),
        "{rep}"
    );
    // JSON has no NaN or infinity; `1e999` overflows f64. serde_json refuses such a number, so the
    // whole body is not JSON the server can read: 400, and nothing of that body is applied.
    for body in [
        r#"{"device": "inf", "ts": 1767225610000, "lat": 1e999, "lon": 10.0}"#,
        r#"{"device": "inf", "ts": 1767225610000, "lat": 50.0, "lon": -1e999}"#,
        r#"[{"device": "inf", "ts": 1767225610000, "lat": 50.005, "lon": 10.005}, {"device": "inf2", "ts": 1767225610000, "lat": 1e999, "lon": 10.0}]"#,
    ] {
        let got = post_raw(&app, "/v1/fixes", "application/json", body).await;
        assert_error(got, 400, "malformed_json");
    }
    assert_eq!(
        app.get("/v1/devices/inf").await.0,
        404,
        "nothing of a refused body was applied"
    );
    // In NDJSON the overflowing line is one item: an error at its index, the other lines applied.
    let nd = "{\"device\": \"nd-inf\", \"ts\": 1767225620000, \"lat\": 1e999, \"lon\": 10.0}\n\
              {\"device\": \"nd-ok\", \"ts\": 1767225620000, \"lat\": 50.005, \"lon\": 10.005}\n";
    let (s, rep) = post_raw(&app, "/v1/fixes", "application/x-ndjson", nd).await;
    assert_eq!(s, 200, "{rep}");
    assert_eq!(
        (rep["accepted"].clone(), rep["rejected"].clone()),
        (json!(1), json!(1)),
        "{rep}"
    );
    assert_eq!(rep["errors"][0]["index"], 0, "{rep}");
    assert_eq!(rep["errors"][0]["code"], "malformed_json", "{rep}");
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_device_or_ts_is_a_per_item_error() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    let t = T0 + 10_000;
    let cases = [
        (
            json!({"ts": t, "lat": 50.0, "lon": 10.0}),
            "missing_field",
            "device",
        ),
        (
            json!({"device": "a", "lat": 50.0, "lon": 10.0}),
            "missing_field",
            "ts",
        ),
        (
            json!({"device": "a", "ts": t, "lon": 10.0}),
            "missing_field",
            "lat",
        ),
        (
            json!({"device": "a", "ts": t, "lat": 50.0}),
            "missing_field",
            "lon",
        ),
        (
            json!({"device": "", "ts": t, "lat": 50.0, "lon": 10.0}),
            "invalid_fix",
            "device",
        ),
        (
            json!({"device": null, "ts": t, "lat": 50.0, "lon": 10.0}),
            "invalid_fix",
            "device",
        ),
        (json!({}), "missing_field", "device"),
    ];
    for (item, code, field) in cases {
        let body = assert_error(app.post_fixes(item.clone()).await, 422, "no_valid_fixes");
        let e = &body["error"]["details"]["errors"][0];
        assert_eq!(
            (e["index"].clone(), e["code"].clone()),
            (json!(0), json!(code)),
            "{item}: {body}"
        );
        assert!(
            e["message"].as_str().unwrap().contains(field),
            "{item}: {body}"
        );
    }
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_id_longer_than_the_limit_is_rejected() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    let t = T0 + 10_000;
    // The default limit is 128 bytes: 128 is fine, 129 is not; bytes, not characters.
    let at_limit = "d".repeat(128);
    let (s, rep) = srv
        .post_fixes(json!({"device": at_limit, "ts": t, "lat": 50.0, "lon": 10.0}))
        .await;
    assert_eq!((s, rep["accepted"].clone()), (200, json!(1)), "{rep}");
    for dev in ["d".repeat(129), "é".repeat(65)] {
        let body = assert_error(
            app.post_fixes(json!({"device": dev, "ts": t, "lat": 50.0, "lon": 10.0}))
                .await,
            422,
            "no_valid_fixes",
        );
        let e = &body["error"]["details"]["errors"][0];
        assert_eq!(e["code"], "invalid_fix", "{body}");
        assert!(
            e["message"].as_str().unwrap().contains("limit of 128"),
            "{body}"
        );
    }
    assert_eq!(
        app.get(&format!("/v1/devices/{}", "d".repeat(129))).await.0,
        404
    );
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_ts_in_live_mode_is_rejected() {
    // lateness 5s: a fix stamped "now" by the client is not behind the watermark on arrival.
    let srv = start("[time]\nclock = \"live\"\nlateness = \"5s\"\ntick = \"100ms\"\n").await;
    let app = srv.app();
    assert_eq!(
        app.put_fence("depot", square("depot", json!({}))).await.0,
        201
    );
    let now = chrono::Utc::now().timestamp_millis();
    let (s, rep) = srv
        .post_fixes(json!({"device": "good", "ts": now, "lat": 50.005, "lon": 10.005}))
        .await;
    assert_eq!((s, rep["accepted"].clone()), (200, json!(1)), "{rep}");
    // max_future defaults to 60s: 30 s ahead is accepted, 2 min ahead is not.
    let (s, rep) = srv
        .post_fixes(json!({"device": "soon", "ts": now + 30_000, "lat": 1.0, "lon": 1.0}))
        .await;
    assert_eq!((s, rep["accepted"].clone()), (200, json!(1)), "{rep}");
    let body = assert_error(
        app.post_fixes(json!({"device": "later", "ts": now + 120_000, "lat": 1.0, "lon": 1.0}))
            .await,
        422,
        "no_valid_fixes",
    );
    assert_eq!(
        body["error"]["details"]["errors"][0]["code"], "future_ts",
        "{body}"
    );
    // As RFC 3339, and mixed with a good one: 200, the good one taken.
    let future = chrono::DateTime::from_timestamp_millis(now + 3_600_000)
        .unwrap()
        .to_rfc3339();
    let (s, rep) = srv
        .post_fixes(json!([
            {"device": "later", "ts": future, "lat": 1.0, "lon": 1.0},
            {"device": "ok2", "ts": now, "lat": 1.0, "lon": 1.0},
        ]))
        .await;
    assert_eq!(s, 200, "{rep}");
    assert_eq!(
        (rep["accepted"].clone(), rep["rejected"].clone()),
        (json!(1), json!(1)),
        "{rep}"
    );
    assert_eq!(rep["errors"][0]["index"], 0);
    assert_eq!(rep["errors"][0]["code"], "future_ts");
    assert_eq!(app.get("/v1/devices/later").await.0, 404);
    // Still healthy, and the good fix was applied (live mode: once the wall clock passes it).
    assert_eq!(app.get("/healthz").await.0, 200);
    let evs = app.events(1).await;
    assert!(
        evs.iter()
            .any(|e| e["type"] == "enter" && e["device"] == "good"),
        "{evs:?}"
    );
    let (s, d) = app.get("/v1/devices/good").await;
    assert_eq!(s, 200);
    let last = chrono::DateTime::parse_from_rfc3339(d["last_fix_at"].as_str().unwrap()).unwrap();
    assert_eq!(last.timestamp_millis(), now, "{d}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_too_large_is_413_json() {
    let srv = seeded(
        &format!("{EVENT_MODE}[ingest]\nmax_body_bytes = 1024\n"),
        "good",
    )
    .await;
    let app = srv.app();
    let items: Vec<Value> = (0..40)
        .map(|i| fix(&format!("big-{i}"), 10 + i, true))
        .collect();
    let body = serde_json::to_vec(&items).unwrap();
    assert!(body.len() > 1024);
    let got = post_raw(&app, "/v1/fixes", "application/json", body.clone()).await;
    let err = assert_error(got, 413, "body_too_large");
    assert!(
        err["error"]["message"].as_str().unwrap().contains("1024"),
        "{err}"
    );
    let got = post_raw(&app, "/v1/fixes", "application/x-ndjson", body.clone()).await;
    assert_error(got, 413, "body_too_large");
    // Fences have the same limit.
    let got = put_raw(&app, "/v1/fences/huge", body.clone()).await;
    assert_error(got, 413, "body_too_large");
    let got = post_raw(&app, "/v1/fences", "application/json", body).await;
    assert_error(got, 413, "body_too_large");
    assert_eq!(
        app.get("/v1/devices/big-0").await.0,
        404,
        "nothing of the refused body applied"
    );
    assert_eq!(app.get("/v1/fences/huge").await.0, 404);
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_larger_than_max_batch_is_413() {
    let srv = seeded(&format!("{EVENT_MODE}[ingest]\nmax_batch = 3\n"), "good").await;
    let app = srv.app();
    let items: Vec<Value> = (0..4)
        .map(|i| fix(&format!("b-{i}"), 10 + i, true))
        .collect();
    let body = assert_error(
        app.post_fixes(Value::Array(items)).await,
        413,
        "batch_too_large",
    );
    assert!(
        body["error"]["message"].as_str().unwrap().contains('3'),
        "{body}"
    );
    assert_eq!(app.get("/v1/devices/b-0").await.0, 404);
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_batch_is_400() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    assert_error(app.post_fixes(json!([])).await, 400, "empty_batch");
    for body in ["", "\n\n  \n"] {
        let got = post_raw(&app, "/v1/fixes", "application/x-ndjson", body).await;
        assert_error(got, 400, "empty_batch");
    }
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_applies_the_good_items_and_lists_the_bad_ones() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    let batch = json!([
        fix("m1", 10, true),
        {"device": "m2", "ts": T0 + 11_000, "lat": "50.005", "lon": 10.005},
        fix("m1", 10, true),
        fix("m3", 12, true),
        {"device": "m4", "lat": 50.005, "lon": 10.005},
        {"device": "m5", "ts": T0 + 13_000, "lat": 91.0, "lon": 10.005},
        fix("good", -3600, true),
    ]);
    let (s, rep) = app.post_fixes(batch).await;
    assert_eq!(s, 200, "{rep}");
    assert_eq!(rep["accepted"], 2, "{rep}");
    assert_eq!(
        rep["duplicate"], 1,
        "m1's second fix has the same ts: {rep}"
    );
    assert_eq!(
        rep["late"], 1,
        "good's fix an hour back is behind the watermark: {rep}"
    );
    assert_eq!(rep["rejected"], 3, "{rep}");
    let errs: Vec<(u64, &str)> = rep["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["index"].as_u64().unwrap(), e["code"].as_str().unwrap()))
        .collect();
    assert_eq!(
        errs,
        vec![(1, "invalid_fix"), (4, "missing_field"), (5, "invalid_fix")],
        "{rep}"
    );
    let evs = app.events(3).await;
    for dev in ["m1", "m3"] {
        assert!(
            evs.iter()
                .any(|e| e["type"] == "enter" && e["device"] == dev),
            "{dev}: {evs:?}"
        );
    }
    for dev in ["m2", "m4", "m5"] {
        assert_eq!(
            app.get(&format!("/v1/devices/{dev}")).await.0,
            404,
            "{dev} was rejected"
        );
    }
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ndjson_with_a_bad_line_reports_its_position_among_non_empty_lines() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    let line = |d: &str, s: i64| fix(d, s, true).to_string();
    let body = format!(
        "{}\n\n{}\n   \n{}\r\n{}\n{}\n",
        line("n1", 10),
        "{\"device\": \"n2\", \"ts\": ",
        line("n3", 11),
        r#"{"device": "n4", "lat": 50.005, "lon": 10.005}"#,
        "[1, 2]",
    );
    let (s, rep) = post_raw(&app, "/v1/fixes", "application/x-ndjson", body).await;
    assert_eq!(s, 200, "{rep}");
    assert_eq!(
        (rep["accepted"].clone(), rep["rejected"].clone()),
        (json!(2), json!(3)),
        "{rep}"
    );
    let errs: Vec<(u64, &str)> = rep["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["index"].as_u64().unwrap(), e["code"].as_str().unwrap()))
        .collect();
    assert_eq!(
        errs,
        vec![
            (1, "malformed_json"),
            (3, "missing_field"),
            (4, "invalid_fix")
        ],
        "{rep}"
    );
    // An NDJSON body whose every line is bad: 422 with each line's index.
    let (s, rep) = post_raw(&app, "/v1/fixes", "application/x-ndjson", "nope\n{}\n").await;
    let body = assert_error((s, rep), 422, "no_valid_fixes");
    let idx: Vec<u64> = body["error"]["details"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, vec![0, 1], "{body}");
    let evs = app.events(3).await;
    assert!(evs.iter().any(|e| e["device"] == "n3"), "{evs:?}");
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

// ---------------------------------------------------------------- fences (in process)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_geojson_fences_are_422_with_paths() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    let poly = |ring: Value| json!({"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [ring]}, "properties": {}});
    // Unclosed ring.
    let unclosed = poly(json!([
        [10.0, 50.0],
        [10.01, 50.0],
        [10.01, 50.01],
        [10.0, 50.01]
    ]));
    let body = assert_error(
        put_raw(&app, "/v1/fences/bad", unclosed.to_string()).await,
        422,
        "invalid_fence",
    );
    let d = &body["error"]["details"];
    assert_eq!(d[0]["path"], "geometry.coordinates[0]", "{body}");
    assert!(
        d[0]["message"].as_str().unwrap().contains("not closed"),
        "{body}"
    );
    // Too few points.
    let short = poly(json!([[10.0, 50.0], [10.01, 50.0], [10.0, 50.0]]));
    let body = assert_error(
        put_raw(&app, "/v1/fences/bad", short.to_string()).await,
        422,
        "invalid_fence",
    );
    let d = &body["error"]["details"];
    assert_eq!(d[0]["path"], "geometry.coordinates[0]", "{body}");
    assert!(
        d[0]["message"]
            .as_str()
            .unwrap()
            .contains("at least 4 positions"),
        "{body}"
    );
    // Out-of-range vertex: every bad position listed.
    let far = poly(json!([
        [10.0, 50.0],
        [190.0, 50.0],
        [10.0, 95.0],
        [10.0, 50.0]
    ]));
    let body = assert_error(
        put_raw(&app, "/v1/fences/bad", far.to_string()).await,
        422,
        "invalid_fence",
    );
    let paths: Vec<&str> = body["error"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        vec!["geometry.coordinates[0][1]", "geometry.coordinates[0][2]"],
        "{body}"
    );
    // A geometry type that cannot be a fence.
    let line = json!({"type": "Feature", "geometry": {"type": "LineString", "coordinates": [[10.0, 50.0], [10.01, 50.0]]}, "properties": {}});
    let body = assert_error(
        put_raw(&app, "/v1/fences/bad", line.to_string()).await,
        422,
        "invalid_fence",
    );
    assert_eq!(
        body["error"]["details"][0]["path"], "geometry.type",
        "{body}"
    );
    assert!(
        body["error"]["details"][0]["message"]
            .as_str()
            .unwrap()
            .contains("LineString"),
        "{body}"
    );
    // An unknown geometry type is not GeoJSON at all.
    let circle = json!({"type": "Feature", "geometry": {"type": "Circle", "coordinates": [10.0, 50.0], "radius": 100}, "properties": {}});
    let body = assert_error(
        put_raw(&app, "/v1/fences/bad", circle.to_string()).await,
        422,
        "invalid_fence",
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Circle"),
        "{body}"
    );
    // ... and in a collection it is reported as one whole-document error.
    let fc = json!({"type": "FeatureCollection", "features": [circle]});
    let body = assert_error(
        post_raw(&app, "/v1/fences", "application/json", fc.to_string()).await,
        422,
        "invalid_fence",
    );
    assert_eq!(body["error"]["details"][0]["path"], "", "{body}");
    // Not JSON at all: 400, as on /v1/fixes.
    let got = put_raw(&app, "/v1/fences/bad", "{\"type\": \"Feature\",").await;
    assert_error(got, 400, "malformed_json");
    let got = post_raw(&app, "/v1/fences", "application/json", "[[[").await;
    assert_error(got, 400, "malformed_json");
    // A bare geometry is not a Feature.
    let geom = json!({"type": "Polygon", "coordinates": [[[10.0, 50.0], [10.01, 50.0], [10.01, 50.01], [10.0, 50.0]]]});
    assert_error(
        put_raw(&app, "/v1/fences/bad", geom.to_string()).await,
        422,
        "invalid_fence",
    );
    let body = assert_error(
        post_raw(&app, "/v1/fences", "application/json", geom.to_string()).await,
        422,
        "invalid_fence",
    );
    assert_eq!(body["error"]["details"][0]["path"], "type", "{body}");
    // Nothing was installed, and the existing fence still works.
    assert_eq!(app.get("/v1/fences/bad").await.0, 404);
    let (s, list) = app.get("/v1/fences").await;
    assert_eq!(s, 200);
    assert_eq!(list["features"].as_array().map(Vec::len), Some(1), "{list}");
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

// ---------------------------------------------------------------- routes, queries (in process)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_and_routes_are_404() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    assert_error(app.get("/v1/fences/nope").await, 404, "fence_not_found");
    assert_error(
        delete(&app, "/v1/fences/nope").await,
        404,
        "fence_not_found",
    );
    assert_error(app.get("/v1/devices/nobody").await, 404, "device_not_found");
    assert_error(app.get("/v1/nothing-here").await, 404, "no_route");
    // The existing fence was not touched.
    assert_eq!(app.get("/v1/fences/depot").await.0, 200);
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_query_parameters_are_400() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    for q in [
        "from_seq=abc",
        "from_seq=-1",
        "from_seq=1.5",
        "limit=0",
        "limit=-3",
        "limit=many",
        "limit=10001",
        "colour=blue",
        "from_seq=0&fenc=a",
        "types=arrive",
        "since=yesterday",
    ] {
        let got = app.get(&format!("/v1/events?{q}")).await;
        let body = assert_error(got, 400, "bad_query");
        assert!(
            !body["error"]["message"].as_str().unwrap().is_empty(),
            "{q}"
        );
    }
    // The upper bound of limit is max_poll_limit (10000 by default).
    assert_eq!(app.get("/v1/events?limit=10000").await.0, 200);
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn framework_rejections_are_json_errors_too() {
    let srv = seeded(EVENT_MODE, "good").await;
    let app = srv.app();
    let any_error = |(s, body): (u16, Value), status: u16| {
        assert_eq!(s, status, "{body}");
        assert!(
            body["error"]["code"].is_string(),
            "not an error JSON: {body}"
        );
        assert!(
            body["error"]["message"].is_string(),
            "not an error JSON: {body}"
        );
    };
    // Path segment that is not UTF-8.
    any_error(app.get("/v1/fences/%FF").await, 400);
    any_error(app.get("/v1/devices/%FF").await, 400);
    // Method not allowed on a known route.
    any_error(
        post_raw(&app, "/v1/events", "application/json", "{}").await,
        405,
    );
    any_error(delete(&app, "/v1/fixes").await, 405);
    // A WebSocket route asked without the upgrade headers (and with a bad query).
    any_error(app.get("/v1/events/ws").await, 400);
    any_error(app.get("/v1/events/ws?types=bogus").await, 400);
    any_error(app.get("/v1/ingest/ws").await, 400);
    assert_healthy_and_kept(&app, "good").await;
    srv.stop().await;
}

// ---------------------------------------------------------------- WebSocket (real connections)

/// A WebSocket handshake that the server refuses: its HTTP status and JSON body. Sent with
/// reqwest and the upgrade headers so the whole error body is read.
async fn refused_upgrade(srv: &Srv, path: &str) -> (u16, Value) {
    let url = format!("ws://{}{}", srv.svc.addr(), path);
    match tokio_tungstenite::connect_async(url).await {
        Ok(_) => panic!("{path}: the handshake should be refused"),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 400, "{path}");
        }
        Err(e) => panic!("{path}: unexpected handshake error {e}"),
    }
    let r = srv
        .http
        .get(srv.url(path))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The same query checks on the subscription's WebSocket handshake, which needs a real
/// connection: the client's handshake is refused with the HTTP 400 and its error body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_subscription_queries_refuse_the_websocket_handshake() {
    let srv = seeded(EVENT_MODE, "good").await;
    for q in ["types=bogus", "types=enter,Dwell", "from_seq=x", "limit=5"] {
        let got = refused_upgrade(&srv, &format!("/v1/events/ws?{q}")).await;
        assert_error(got, 400, "bad_query");
    }
    assert_healthy_and_kept(&srv, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_ingest_text_frame_that_is_not_json_gets_an_error_frame_and_1007() {
    let srv = seeded(EVENT_MODE, "good").await;
    let mut ws = srv.ws("/v1/ingest/ws").await;
    // A good frame first: its report comes back and the fix is kept after the bad frame.
    send_text(&mut ws, &fix("ws-good", 10, true).to_string()).await;
    let rep = next_json(&mut ws, Duration::from_secs(5))
        .await
        .expect("report");
    assert_eq!(rep["accepted"], 1, "{rep}");
    send_text(&mut ws, "{this is not json").await;
    let err = next_json(&mut ws, Duration::from_secs(5))
        .await
        .expect("error frame");
    assert_error_body(&err, "malformed_json");
    assert_eq!(close_code(&mut ws).await, Some(1007));
    // Valid JSON that is not a fix or an array: the same.
    let mut ws = srv.ws("/v1/ingest/ws").await;
    send_text(&mut ws, "42").await;
    let err = next_json(&mut ws, Duration::from_secs(5))
        .await
        .expect("error frame");
    assert_error_body(&err, "malformed_batch");
    assert_eq!(close_code(&mut ws).await, Some(1007));
    let evs = srv.events(2).await;
    assert!(
        evs.iter()
            .any(|e| e["device"] == "ws-good" && e["type"] == "enter"),
        "{evs:?}"
    );
    assert_healthy_and_kept(&srv, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_ingest_binary_frame_is_closed_with_1003() {
    let srv = seeded(EVENT_MODE, "good").await;
    let mut ws = srv.ws("/v1/ingest/ws").await;
    ws.send(Message::Binary(
        fix("bin", 10, true).to_string().into_bytes().into(),
    ))
    .await
    .unwrap();
    let err = next_json(&mut ws, Duration::from_secs(5))
        .await
        .expect("error frame");
    assert_error_body(&err, "binary_frame");
    assert_eq!(close_code(&mut ws).await, Some(1003));
    assert_eq!(
        srv.get("/v1/devices/bin").await.0,
        404,
        "a binary frame is not ingested"
    );
    assert_healthy_and_kept(&srv, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_ingest_bad_items_and_empty_frames_keep_the_connection() {
    let srv = seeded(EVENT_MODE, "good").await;
    let mut ws = srv.ws("/v1/ingest/ws").await;
    // Per-item errors are reported like POST /v1/fixes; the socket stays open.
    let frame = json!([fix("w1", 10, true), {"device": "w2", "lat": 1.0, "lon": 1.0}]);
    send_text(&mut ws, &frame.to_string()).await;
    let rep = next_json(&mut ws, Duration::from_secs(5))
        .await
        .expect("report");
    assert_eq!(
        (rep["accepted"].clone(), rep["rejected"].clone()),
        (json!(1), json!(1)),
        "{rep}"
    );
    assert_eq!(rep["errors"][0]["index"], 1, "{rep}");
    assert_eq!(rep["errors"][0]["code"], "missing_field", "{rep}");
    // An empty array: an error frame, the socket stays open.
    send_text(&mut ws, "[]").await;
    let err = next_json(&mut ws, Duration::from_secs(5))
        .await
        .expect("error frame");
    assert_error_body(&err, "bad_batch_size");
    send_text(&mut ws, &fix("w3", 11, true).to_string()).await;
    let rep = next_json(&mut ws, Duration::from_secs(5))
        .await
        .expect("report after the error");
    assert_eq!(rep["accepted"], 1, "{rep}");
    ws.close(None).await.unwrap();
    assert_healthy_and_kept(&srv, "good").await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn ws_ingest_frame_larger_than_the_body_limit_is_closed_with_1009() {
    let srv = seeded(
        &format!("{EVENT_MODE}[ingest]\nmax_body_bytes = 1024\n"),
        "good",
    )
    .await;
    let mut ws = srv.ws("/v1/ingest/ws").await;
    let items: Vec<Value> = (0..40)
        .map(|i| fix(&format!("big-{i}"), 10 + i, true))
        .collect();
    let _ = ws
        .send(Message::Text(Value::Array(items).to_string().into()))
        .await;
    assert_eq!(close_code(&mut ws).await, Some(1009));
    assert_healthy_and_kept(&srv, "good").await;
    srv.stop().await;
}
