//! Fence CRUD over real HTTP: PUT create/replace, GET (normalized Feature), list, POST
//! Feature/FeatureCollection (all or nothing), DELETE, id mismatch, limits, and a circle fence
//! end to end. The validation error matrix (invalid collections and properties, id mismatch,
//! the fence count limit) goes through the router in process (`App`).

use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

const EVENT_MODE: &str = "[time]\nclock = \"event\"\nlateness = \"0s\"\n";

/// Over a socket (`&Srv`) or in process (`&App`, for the validation error matrix).
async fn send(api: &impl Http, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let r = match body {
        Some(b) => {
            api.call(
                method,
                path,
                &[("content-type", "application/json")],
                Some(serde_json::to_vec(&b).unwrap()),
            )
            .await
        }
        None => api.call(method, path, &[], None).await,
    };
    (r.status, r.json())
}

async fn put(api: &impl Http, id: &str, f: Value) -> (u16, Value) {
    send(api, "PUT", &format!("/v1/fences/{id}"), Some(f)).await
}

async fn post(api: &impl Http, doc: Value) -> (u16, Value) {
    send(api, "POST", "/v1/fences", Some(doc)).await
}

async fn delete(api: &impl Http, id: &str) -> (u16, Value) {
    send(api, "DELETE", &format!("/v1/fences/{id}"), None).await
}

fn ids(list: &Value) -> Vec<String> {
    list["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_creates_then_replaces_and_get_returns_the_normalized_feature() {
    let srv = start(EVENT_MODE).await;
    let props = json!({"dwell": ["1h", "90s", 600, "90s"], "tags": {"site": "north", "dock": 4}, "name": "North depot"});
    let (s, created) = put(&srv, "depot", square("depot", props)).await;
    assert_eq!(s, 201, "{created}");
    assert_eq!(created["type"], "Feature");
    assert_eq!(created["id"], "depot");
    let p = &created["properties"];
    assert_eq!(
        p["dwell"],
        json!(["90s", "10m", "1h"]),
        "sorted, deduplicated, human units: {p}"
    );
    assert_eq!(p["tags"], json!({"site": "north", "dock": 4}));
    assert_eq!(p["name"], "North depot");
    // Every setting appears with its effective (default) value.
    assert_eq!(p["exit_buffer_m"], 0.0);
    assert_eq!(p["enter_confirm"], 1);
    assert_eq!(p["exit_confirm"], 1);
    assert_eq!(p["confirm_within"], "5m");
    assert_eq!(p["stale_after"], "15m");
    assert_eq!(p["max_accuracy_m"], "off");
    assert!(p.get("radius_m").is_none(), "{p}");
    assert_eq!(created["geometry"]["type"], "Polygon");
    assert_eq!(
        created["geometry"]["coordinates"],
        square("x", json!({}))["geometry"]["coordinates"]
    );
    // GET answers the same Feature.
    let (s, got) = srv.get("/v1/fences/depot").await;
    assert_eq!(s, 200);
    assert_eq!(got, created);
    // Replace: 200 and the new settings.
    let props = json!({"dwell": "30m", "exit_buffer_m": 25, "enter_confirm": 2, "stale_after": "off", "max_accuracy_m": 50});
    let (s, replaced) = put(&srv, "depot", square("depot", props)).await;
    assert_eq!(s, 200, "{replaced}");
    let (_, got) = srv.get("/v1/fences/depot").await;
    assert_eq!(got, replaced);
    let p = &got["properties"];
    assert_eq!(p["dwell"], json!(["30m"]));
    assert_eq!(p["exit_buffer_m"], 25.0);
    assert_eq!(p["enter_confirm"], 2);
    assert_eq!(p["stale_after"], "off");
    assert_eq!(p["max_accuracy_m"], 50.0);
    assert_eq!(
        p["tags"],
        json!({}),
        "a replace does not merge: tags are back to the default"
    );
    assert!(p.get("name").is_none(), "{p}");
    // A Feature without an id takes the id of the path.
    let mut anon = square("x", json!({}));
    anon.as_object_mut().unwrap().remove("id");
    let (s, f) = put(&srv, "anon", anon).await;
    assert_eq!((s, f["id"].clone()), (201, json!("anon")), "{f}");
    // A numeric Feature id matching the path is accepted.
    let mut num = square("x", json!({}));
    num["id"] = json!(42);
    let (s, f) = put(&srv, "42", num).await;
    assert_eq!((s, f["id"].clone()), (201, json!("42")), "{f}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_post_collection_and_delete() {
    let srv = start(EVENT_MODE).await;
    let (s, list) = srv.get("/v1/fences").await;
    assert_eq!(s, 200);
    assert_eq!(list["type"], "FeatureCollection");
    assert_eq!(list["features"], json!([]));
    assert_eq!(put(&srv, "b", square("b", json!({}))).await.0, 201);
    // A collection: one replaces "b", two are new.
    let fc = json!({"type": "FeatureCollection", "features": [
        square("c", json!({"dwell": ["5m"]})),
        square("b", json!({"tags": {"v": 2}})),
        square("a", json!({})),
    ]});
    let (s, r) = post(&srv, fc).await;
    assert_eq!(s, 201, "{r}");
    assert_eq!(
        r,
        json!({"created": 2, "replaced": 1, "ids": ["c", "b", "a"]})
    );
    let (_, b) = srv.get("/v1/fences/b").await;
    assert_eq!(b["properties"]["tags"], json!({"v": 2}));
    // A single Feature through POST.
    let (s, r) = post(&srv, square("d", json!({}))).await;
    assert_eq!(s, 201, "{r}");
    assert_eq!(r, json!({"created": 1, "replaced": 0, "ids": ["d"]}));
    // The list is sorted by id and holds normalized Features.
    let (s, list) = srv.get("/v1/fences").await;
    assert_eq!(s, 200);
    assert_eq!(ids(&list), vec!["a", "b", "c", "d"]);
    assert_eq!(list["features"][2]["properties"]["dwell"], json!(["5m"]));
    // DELETE: 204 without a body, then 404 on GET and on a second DELETE.
    let r = srv
        .http
        .delete(srv.url("/v1/fences/c"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert!(r.bytes().await.unwrap().is_empty());
    let (s, e) = srv.get("/v1/fences/c").await;
    assert_eq!(
        (s, e["error"]["code"].clone()),
        (404, json!("fence_not_found"))
    );
    let (s, e) = delete(&srv, "c").await;
    assert_eq!(
        (s, e["error"]["code"].clone()),
        (404, json!("fence_not_found"))
    );
    let (_, list) = srv.get("/v1/fences").await;
    assert_eq!(ids(&list), vec!["a", "b", "d"]);
    // An empty collection is a 400.
    let (s, e) = post(&srv, json!({"type": "FeatureCollection", "features": []})).await;
    assert_eq!(
        (s, e["error"]["code"].clone()),
        (400, json!("empty_collection")),
        "{e}"
    );
    // The fence count metric follows.
    let m = srv.metrics().await;
    assert!(
        m.lines().any(|l| l.starts_with("geodwell_fences ")),
        "geodwell_fences exported"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_collection_applies_nothing_and_lists_every_error() {
    let srv = start(EVENT_MODE).await;
    let app = srv.app();
    assert_eq!(
        put(&app, "keep", square("keep", json!({"dwell": ["10m"]})))
            .await
            .0,
        201
    );
    let unclosed = json!({"type": "Feature", "id": "open", "geometry": {"type": "Polygon",
        "coordinates": [[[10.0, 50.0], [10.01, 50.0], [10.01, 50.01], [10.0, 50.01]]]}, "properties": {}});
    let fc = json!({"type": "FeatureCollection", "features": [
        square("new-good", json!({})),
        square("keep", json!({"dwell": ["bogus"], "colour": "red"})),
        unclosed,
        square("new-good", json!({})),
        {"type": "Feature", "geometry": {"type": "Point", "coordinates": [10.0, 50.0]}, "properties": {}},
    ]});
    let (s, body) = post(&app, fc).await;
    assert_eq!(s, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_fence");
    let details: Vec<(String, String)> = body["error"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_string(),
                e["message"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let paths: Vec<&str> = details.iter().map(|(p, _)| p.as_str()).collect();
    for want in [
        "features[1].properties.dwell[0]",
        "features[1].properties.colour",
        "features[2].geometry.coordinates[0]",
        "features[3].id",
        "features[4].id",
        "features[4].properties",
    ] {
        assert!(paths.contains(&want), "{want} missing from {paths:?}");
    }
    assert_eq!(details.len(), 6, "{details:?}");
    let msg = |p: &str| details.iter().find(|(q, _)| q == p).unwrap().1.clone();
    assert!(msg("features[3].id").contains("duplicate"), "{details:?}");
    assert!(msg("features[4].id").contains("needs an id"), "{details:?}");
    assert!(
        msg("features[4].properties").contains("radius_m"),
        "{details:?}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("6 fence errors"),
        "{body}"
    );
    // Nothing was applied: the good new fence is absent and "keep" is unchanged.
    assert_eq!(app.get("/v1/fences/new-good").await.0, 404);
    let (_, keep) = app.get("/v1/fences/keep").await;
    assert_eq!(keep["properties"]["dwell"], json!(["10m"]));
    let (_, list) = app.get("/v1/fences").await;
    assert_eq!(ids(&list), vec!["keep"]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_and_body_ids_must_match() {
    let srv = start(EVENT_MODE).await;
    let app = srv.app();
    let (s, body) = put(&app, "a", square("b", json!({}))).await;
    assert_eq!(s, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_fence");
    assert_eq!(body["error"]["details"][0]["path"], "id", "{body}");
    let m = body["error"]["details"][0]["message"].as_str().unwrap();
    assert!(
        m.contains("\"b\"") && m.contains("\"a\"") && m.contains("does not match"),
        "{m}"
    );
    assert_eq!(app.get("/v1/fences/a").await.0, 404);
    assert_eq!(app.get("/v1/fences/b").await.0, 404);
    // A FeatureCollection is not accepted by PUT.
    let (s, body) = put(
        &app,
        "a",
        json!({"type": "FeatureCollection", "features": [square("a", json!({}))]}),
    )
    .await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (422, json!("invalid_fence")),
        "{body}"
    );
    assert_eq!(app.get("/v1/fences/a").await.0, 404);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_properties_are_422_with_their_paths() {
    let srv = start(EVENT_MODE).await;
    let app = srv.app();
    let cases = [
        (
            json!({"radius_m": 50}),
            "properties.radius_m",
            "only to Point",
        ),
        (json!({"dwell": "-5m"}), "properties.dwell", "duration"),
        (json!({"enter_confirm": 0}), "properties.enter_confirm", ""),
        (
            json!({"tags": "north"}),
            "properties.tags",
            "object or array",
        ),
        (
            json!({"max_accuracy_m": -1}),
            "properties.max_accuracy_m",
            "> 0",
        ),
        (
            json!({"exit_buffer_m": 1e9}),
            "properties.exit_buffer_m",
            "outside",
        ),
    ];
    for (props, path, msg) in cases {
        let (s, body) = put(&app, "p", square("p", props.clone())).await;
        assert_eq!(s, 422, "{props}: {body}");
        assert_eq!(body["error"]["code"], "invalid_fence");
        assert_eq!(body["error"]["details"][0]["path"], path, "{props}: {body}");
        assert!(
            body["error"]["details"][0]["message"]
                .as_str()
                .unwrap()
                .contains(msg),
            "{props}: {body}"
        );
    }
    assert_eq!(app.get("/v1/fences/p").await.0, 404);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_count_limit_is_enforced() {
    let mut cfg = config(EVENT_MODE);
    cfg.max_fences = 2;
    let srv = start_cfg(cfg).await;
    let app = srv.app();
    assert_eq!(put(&app, "a", square("a", json!({}))).await.0, 201);
    // Two new ones would make three.
    let fc = json!({"type": "FeatureCollection", "features": [square("b", json!({})), square("c", json!({}))]});
    let (s, body) = post(&app, fc).await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (422, json!("too_many_fences")),
        "{body}"
    );
    assert_eq!(app.get("/v1/fences/b").await.0, 404, "all or nothing");
    assert_eq!(put(&app, "b", square("b", json!({}))).await.0, 201);
    let (s, body) = put(&app, "c", square("c", json!({}))).await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (422, json!("too_many_fences")),
        "{body}"
    );
    // Replacing an existing one is still allowed at the limit.
    assert_eq!(
        put(&app, "b", square("b", json!({"dwell": "1m"}))).await.0,
        200
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circle_fence_works_end_to_end() {
    let srv = start(EVENT_MODE).await;
    // 100 m around (10.0, 50.0).
    let circle = json!({"type": "Feature", "id": "yard",
        "geometry": {"type": "Point", "coordinates": [10.0, 50.0]},
        "properties": {"radius_m": 100, "dwell": ["5m"], "tags": {"kind": "yard"}}});
    let (s, f) = put(&srv, "yard", circle).await;
    assert_eq!(s, 201, "{f}");
    assert_eq!(
        f["geometry"],
        json!({"type": "Point", "coordinates": [10.0, 50.0]})
    );
    assert_eq!(f["properties"]["radius_m"], 100.0);
    let mut sub = srv.ws("/v1/events/ws?from_seq=0").await;
    // ~55 m north of the centre: inside; ~220 m: outside.
    let at = |dev: &str, secs: i64, lat: f64| json!({"device": dev, "ts": T0 + secs * 1000, "lat": lat, "lon": 10.0});
    let (s, rep) = srv
        .post_fixes(json!([at("v1", 0, 50.0005), at("v2", 0, 50.002)]))
        .await;
    assert_eq!((s, rep["accepted"].clone()), (200, json!(2)), "{rep}");
    srv.post_fixes(at("v1", 200, 50.0005)).await;
    srv.post_fixes(at("v2", 301, 50.002)).await; // moves the watermark past the 5m deadline
    srv.post_fixes(at("v1", 400, 50.002)).await; // leaves
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(
            next_json(&mut sub, Duration::from_secs(10))
                .await
                .expect("event arrives"),
        );
    }
    let kinds: Vec<&str> = got.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, vec!["enter", "dwell", "exit"], "{got:?}");
    assert!(
        got.iter()
            .all(|e| e["device"] == "v1" && e["fence"] == "yard"),
        "{got:?}"
    );
    assert_eq!(got[0]["tags"], json!({"kind": "yard"}));
    assert_eq!(got[1]["at"], "2026-01-01T00:05:00.000Z");
    assert!(
        next_json(&mut sub, Duration::from_millis(500))
            .await
            .is_none(),
        "v2 never entered"
    );
    // The device view shows the pair gone after the exit.
    let (s, d) = srv.get("/v1/devices/v1").await;
    assert_eq!(s, 200);
    assert_eq!(d["pairs"], json!([]), "{d}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_fence_drops_its_pairs() {
    let srv = start(EVENT_MODE).await;
    assert_eq!(
        put(&srv, "depot", square("depot", json!({"dwell": ["10m"]})))
            .await
            .0,
        201
    );
    srv.post_fixes(fix("t1", 0, true)).await;
    let evs = srv.events(1).await;
    assert_eq!(evs.len(), 1, "{evs:?}");
    let (_, d) = srv.get("/v1/devices/t1").await;
    assert_eq!(d["pairs"][0]["fence"], "depot", "{d}");
    assert_eq!(d["pairs"][0]["state"], "inside", "{d}");
    assert_eq!(delete(&srv, "depot").await.0, 204);
    let (_, d) = srv.get("/v1/devices/t1").await;
    assert_eq!(d["pairs"], json!([]), "{d}");
    // No DWELL for a deleted fence, and a fix inside its old area does nothing.
    srv.post_fixes(json!([fix("t1", 700, true), fix("t2", 701, true)]))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, v) = srv.get("/v1/events?from_seq=0").await;
    assert_eq!(v["events"].as_array().unwrap().len(), 1, "{v}");
    srv.stop().await;
}
