//! Issue 16 over real HTTP: a fence's occupants (`GET /v1/fences/{id}/devices`, the `inside`
//! count of `GET /v1/fences/{id}`), `DELETE /v1/devices/{id}` and `POST /v1/watermark`: paging
//! to the end, the answers' contents, and the bad requests of each. Durability across `kill -9`
//! is in `durability.rs`, the match with the reference in `replay.rs`.

use std::collections::BTreeSet;

use crate::common::*;
use serde_json::{Value, json};

const EVENT_MODE: &str = "[time]\nclock = \"event\"\nlateness = \"0s\"\n";

async fn call(srv: &Srv, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    srv.app().json(method, path, body.as_ref()).await
}

/// Every occupant of `fence`, page by page (`limit` each).
async fn occupants(srv: &Srv, fence: &str, limit: usize) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10_000 {
        let mut path = format!("/v1/fences/{fence}/devices?limit={limit}");
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        let (s, page) = srv.get(&path).await;
        assert_eq!(s, 200, "{path}: {page}");
        assert_eq!(page["fence"], fence);
        let devs = page["devices"].as_array().unwrap();
        assert!(devs.len() <= limit, "{page}");
        out.extend(devs.iter().cloned());
        match page["next_after"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => return out,
        }
    }
    panic!("paging never ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fences_occupants_are_listed_and_counted_as_the_engine_holds_them() {
    let srv = start(EVENT_MODE).await;
    assert_eq!(
        srv.put_fence("depot", square("depot", json!({"dwell": ["10m", "1h"]})))
            .await
            .status(),
        201
    );
    let far = json!({"type": "Feature", "id": "far", "properties": {}, "geometry": {"type": "Polygon",
        "coordinates": [[[20.0, 0.0], [21.0, 0.0], [21.0, 1.0], [20.0, 1.0], [20.0, 0.0]]]}});
    assert_eq!(srv.put_fence("far", far).await.status(), 201);
    // 300 devices enter at T0; 20 of them leave at T0+60s; 10 never come near.
    let mut fixes: Vec<Value> = (0..300)
        .map(|i| fix(&format!("t-{i:03}"), 0, true))
        .collect();
    fixes.extend((0..10).map(|i| fix(&format!("x-{i}"), 0, false)));
    assert_eq!(srv.post_fixes(Value::Array(fixes)).await.0, 200);
    let leave: Vec<Value> = (0..20)
        .map(|i| fix(&format!("t-{i:03}"), 60, false))
        .collect();
    assert_eq!(srv.post_fixes(Value::Array(leave)).await.0, 200);
    // The watermark passes the 10m threshold (another device's fix far away).
    assert_eq!(
        srv.post_fixes(json!([fix("clock", 700, false)])).await.0,
        200
    );

    let (s, f) = srv.get("/v1/fences/depot").await;
    assert_eq!(s, 200, "{f}");
    assert_eq!(f["inside"], 280, "{f}");
    assert_eq!(f["type"], "Feature");
    let (_, f) = srv.get("/v1/fences/far").await;
    assert_eq!(f["inside"], 0, "{f}");

    for limit in [1, 7, 1000] {
        let all = occupants(&srv, "depot", limit).await;
        let names: BTreeSet<String> = all
            .iter()
            .map(|o| o["device"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names.len(), all.len(), "limit {limit}: nobody twice");
        let want: BTreeSet<String> = (20..300).map(|i| format!("t-{i:03}")).collect();
        assert_eq!(names, want, "limit {limit}");
    }
    let one = &occupants(&srv, "depot", 1000).await[0];
    assert_eq!(one["entered_at"], "2026-01-01T00:00:00.000Z", "{one}");
    assert_eq!(one["dwell_fired"], json!(["10m"]), "{one}");
    assert_eq!(one["next_due"], "2026-01-01T01:00:00.000Z", "{one}");
    assert_eq!(one["state"], "inside", "{one}");
    assert_eq!(one["last_fix_at"], "2026-01-01T00:00:00.000Z", "{one}");
    assert!(occupants(&srv, "far", 10).await.is_empty());

    // A fence written back as it was read: `inside` is answered, not taken as input.
    let (_, f) = srv.get("/v1/fences/depot").await;
    let r = srv.put_fence("depot", f).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());

    // Bad requests.
    for (path, status, code) in [
        ("/v1/fences/nope/devices", 404, "fence_not_found"),
        ("/v1/fences/depot/devices?limit=0", 400, "bad_query"),
        ("/v1/fences/depot/devices?limit=10001", 400, "bad_query"),
        ("/v1/fences/depot/devices?after=x", 400, "bad_query"),
        ("/v1/fences/depot/devices?fence=depot", 400, "bad_query"),
    ] {
        let (s, e) = srv.get(path).await;
        assert_eq!(
            (s, e["error"]["code"].as_str()),
            (status, Some(code)),
            "{path}: {e}"
        );
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_device_is_forgotten_without_an_exit_and_its_next_fix_starts_afresh() {
    let srv = start(EVENT_MODE).await;
    srv.put_fence("depot", square("depot", json!({"dwell": ["10m"]})))
        .await;
    assert_eq!(srv.post_fixes(json!([fix("truck", 0, true)])).await.0, 200);
    let (s, _) = call(&srv, "DELETE", "/v1/devices/truck", None).await;
    assert_eq!(s, 204);
    let (s, e) = call(&srv, "DELETE", "/v1/devices/truck", None).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (404, Some("device_not_found"))
    );
    let (s, _) = srv.get("/v1/devices/truck").await;
    assert_eq!(s, 404);
    let (_, f) = srv.get("/v1/fences/depot").await;
    assert_eq!(f["inside"], 0, "{f}");
    // The watermark passes the old visit's deadline: nothing fires for it.
    assert_eq!(
        srv.post_fixes(json!([fix("truck", 900, true)])).await.0,
        200
    );
    assert_eq!(
        srv.post_fixes(json!([fix("clock", 1600, false)])).await.0,
        200
    );
    let evs = srv.events(3).await;
    let got: Vec<(String, String)> = evs
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().into(),
                e["at"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("enter", "2026-01-01T00:00:00.000Z"),
            ("enter", "2026-01-01T00:15:00.000Z"),
            ("dwell", "2026-01-01T00:25:00.000Z"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .to_vec(),
        "no EXIT and no DWELL for the deleted visit; a new visit from the next fix"
    );
    // (The recorder is the process's: other tests' removals count too.)
    let m = srv.metrics().await;
    let deleted: f64 = metric(&m, "geodwell_devices_removed_total{reason=\"delete\"}");
    assert!(deleted >= 1.0, "{m}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watermark_is_advanced_by_hand_only_forward_and_only_on_an_event_clock() {
    let srv = start(EVENT_MODE).await;
    srv.put_fence("depot", square("depot", json!({"dwell": ["10m", "1h"]})))
        .await;
    // Before any fix there is no watermark: any time is ahead of it.
    let (s, r) = call(
        &srv,
        "POST",
        "/v1/watermark",
        Some(json!({"watermark": "2025-12-31T00:00:00Z"})),
    )
    .await;
    assert_eq!((s, &r["previous"]), (200, &Value::Null), "{r}");
    assert_eq!(srv.post_fixes(json!([fix("truck", 0, true)])).await.0, 200);
    // The backfill ends at T0; the dwells are due at T0+10m and T0+1h (a deadline fires once
    // the watermark is past it).
    let (s, r) = call(
        &srv,
        "POST",
        "/v1/watermark",
        Some(json!({"watermark": T0 + 600_001})),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["watermark"], "2026-01-01T00:10:00.001Z");
    assert_eq!(r["previous"], "2026-01-01T00:00:00.000Z", "{r}");
    // The answer comes once the DWELL it fired is committed.
    let (_, page) = srv.get("/v1/events?from_seq=0").await;
    let kinds: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["enter", "dwell"], "{page}");
    // The same time again is a no-op; a time behind is refused.
    assert_eq!(
        call(
            &srv,
            "POST",
            "/v1/watermark",
            Some(json!({"watermark": T0 + 600_001}))
        )
        .await
        .0,
        200
    );
    let (s, e) = call(
        &srv,
        "POST",
        "/v1/watermark",
        Some(json!({"watermark": T0})),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (409, Some("watermark_behind")),
        "{e}"
    );
    // A fix behind the new watermark is late.
    let (_, rep) = srv.post_fixes(json!([fix("truck", 300, true)])).await;
    assert_eq!(rep["late"], 1, "{rep}");
    for (body, status, code) in [
        (json!({}), 422, "invalid_watermark"),
        (json!({"watermark": "soon"}), 422, "invalid_watermark"),
        (json!({"watermark": 1.5}), 422, "invalid_watermark"),
        (
            json!({"watermark": T0, "extra": 1}),
            422,
            "invalid_watermark",
        ),
        (json!([1]), 400, "bad_body"),
    ] {
        let (s, e) = call(&srv, "POST", "/v1/watermark", Some(body.clone())).await;
        assert_eq!(
            (s, e["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}: {e}"
        );
    }
    srv.stop().await;

    let live = start("[time]\nclock = \"live\"\n").await;
    let (s, e) = call(
        &live,
        "POST",
        "/v1/watermark",
        Some(json!({"watermark": T0})),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (409, Some("live_clock")),
        "{e}"
    );
    live.stop().await;
}
