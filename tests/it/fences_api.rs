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
    // GET answers the same Feature, with how many devices are inside it now.
    let (s, mut got) = srv.get("/v1/fences/depot").await;
    assert_eq!(s, 200);
    assert_eq!(
        got.as_object_mut().unwrap().remove("inside"),
        Some(json!(0))
    );
    assert_eq!(got, created);
    // Replace: 200 and the new settings.
    let props = json!({"dwell": "30m", "exit_buffer_m": 25, "enter_confirm": 2, "stale_after": "off", "max_accuracy_m": 50});
    let (s, replaced) = put(&srv, "depot", square("depot", props)).await;
    assert_eq!(s, 200, "{replaced}");
    let (_, mut got) = srv.get("/v1/fences/depot").await;
    got.as_object_mut().unwrap().remove("inside");
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
    let r = srv.delete("/v1/fences/c").await;
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

fn rect_fence(id: &str, w: f64, s: f64, e: f64, n: f64) -> Value {
    json!({"type": "Feature", "id": id, "properties": {}, "geometry": {"type": "Polygon",
        "coordinates": [[[w, s], [e, s], [e, n], [w, n], [w, s]]]}})
}

/// Every fence id of a listing, page by page (`limit` each), checking that each page but the
/// last is full and names its last id as `next_after`.
async fn all_pages(srv: &Srv, query: &str, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = format!("/v1/fences?limit={limit}&{query}");
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        let (s, page) = srv.get(&path).await;
        assert_eq!(s, 200, "{path}: {page}");
        assert_eq!(page["type"], "FeatureCollection");
        let got = ids(&page);
        assert!(got.len() <= limit, "{path}: {page}");
        out.extend(got.iter().cloned());
        match page["next_after"].as_str() {
            Some(next) => {
                assert_eq!(
                    got.len(),
                    limit,
                    "only a full page names a next one: {page}"
                );
                assert_eq!(Some(next), got.last().map(String::as_str));
                after = Some(next.to_string());
            }
            None => {
                assert!(page["next_after"].is_null(), "{page}");
                return out;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_are_paged_and_queried_by_point_and_window_as_the_engine_sees_them() {
    let srv = start(EVENT_MODE).await;
    // 25 one-degree squares side by side along the equator, a big square over all of them with
    // a hole, a circle, and two squares either side of the antimeridian.
    let mut features: Vec<Value> = (0..25)
        .map(|i| rect_fence(&format!("g{i:02}"), i as f64, 0.0, i as f64 + 1.0, 1.0))
        .collect();
    let mut big = rect_fence("big", 0.0, -5.0, 30.0, 5.0);
    big["geometry"]["coordinates"]
        .as_array_mut()
        .unwrap()
        .push(json!([
            [12.2, 0.2],
            [12.8, 0.2],
            [12.8, 0.8],
            [12.2, 0.8],
            [12.2, 0.2]
        ]));
    features.push(big);
    features.push(
        json!({"type": "Feature", "id": "ring", "properties": {"radius_m": 1000},
        "geometry": {"type": "Point", "coordinates": [5.5, 0.5]}}),
    );
    features.push(rect_fence("east", 179.0, 0.0, 180.0, 1.0));
    features.push(rect_fence("west", -180.0, 0.0, -179.0, 1.0));
    let (s, r) = post(
        &srv,
        json!({"type": "FeatureCollection", "features": features}),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    let mut every: Vec<String> = (0..25).map(|i| format!("g{i:02}")).collect();
    every.extend(["big", "ring", "east", "west"].map(String::from));
    every.sort();

    // Paging to the end gives every fence once, in id order, whatever the page length.
    for limit in [1, 7, 29, 1000] {
        assert_eq!(all_pages(&srv, "", limit).await, every, "limit {limit}");
    }
    // Without limit: one page of up to 1000.
    let (_, page) = srv.get("/v1/fences").await;
    assert_eq!(ids(&page), every);
    assert!(page["next_after"].is_null());

    // Points: inside, on a shared edge (boundary inclusive), in the hole, on the circle.
    let cases: [(&str, &[&str]); 6] = [
        ("0.5,5.5", &["big", "g05", "ring"]),
        ("0.5,1", &["big", "g00", "g01"]),
        ("0.5,12.5", &["g12"]),
        ("0.5,12.2", &["big", "g12"]),
        ("3,3", &["big"]),
        ("0.5,180", &["east", "west"]),
    ];
    for (point, want) in cases {
        assert_eq!(
            all_pages(&srv, &format!("contains={point}"), 2).await,
            want,
            "contains={point}"
        );
    }
    assert_eq!(
        all_pages(&srv, "contains=-45,-45", 5).await,
        Vec::<String>::new()
    );

    // Windows: overlapping, touching, inside the hole, across the antimeridian.
    let cases: [(&str, &[&str]); 4] = [
        ("4.2,0.2,6.8,0.8", &["big", "g04", "g05", "g06", "ring"]),
        ("30,5,31,6", &["big"]),
        ("12.3,0.3,12.7,0.7", &["g12"]),
        ("179.5,0.5,-179.5,0.6", &["east", "west"]),
    ];
    for (bbox, want) in cases {
        assert_eq!(
            all_pages(&srv, &format!("bbox={bbox}"), 2).await,
            want,
            "bbox={bbox}"
        );
    }
    assert_eq!(all_pages(&srv, "bbox=-180,-90,180,90", 4).await, every);
    // South above north is an empty window; both filters together are the point's fences that
    // also meet the window.
    assert_eq!(
        all_pages(&srv, "bbox=0,5,1,4", 3).await,
        Vec::<String>::new()
    );
    assert_eq!(
        all_pages(&srv, "contains=0.5,5.5&bbox=5.2,0.2,5.4,0.4", 3).await,
        vec!["big", "g05"]
    );
    assert_eq!(
        all_pages(&srv, "contains=0.5,5.5&bbox=35,0,36,1", 3).await,
        Vec::<String>::new()
    );

    // The engine agrees: a device at each point is inside exactly the fences listed for it.
    for (n, (lat, lon)) in [(0.5, 5.5), (0.5, 1.0), (0.5, 12.2), (0.5, 180.0)]
        .into_iter()
        .enumerate()
    {
        let dev = format!("probe-{n}");
        let (s, r) = srv
            .post_fixes(json!([{"device": dev, "ts": T0 + n as i64, "lat": lat, "lon": lon}]))
            .await;
        assert_eq!(s, 200, "{r}");
        let want = all_pages(&srv, &format!("contains={lat},{lon}"), 100).await;
        // Event clock, lateness 0: the fix is applied as soon as its batch is; poll anyway.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let inside = loop {
            let (_, d) = srv.get(&format!("/v1/devices/{dev}")).await;
            let mut fences: Vec<String> = d["pairs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["state"] == "inside")
                .map(|p| p["fence"].as_str().unwrap().to_string())
                .collect();
            fences.sort();
            if fences == want {
                break Some(fences);
            }
            if std::time::Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(inside.is_some(), "device at {lat},{lon}: want {want:?}");
    }

    // Bad parameters: one clear 400 each, naming what is wrong.
    for (q, needle) in [
        ("contains=91,0", "contains"),
        ("contains=abc", "contains"),
        ("contains=1", "contains"),
        ("bbox=1,2,3", "bbox"),
        ("bbox=0,0,181,1", "bbox"),
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("limit=x", "limit"),
        ("colour=red", "\"colour\""),
    ] {
        let (s, e) = srv.get(&format!("/v1/fences?{q}")).await;
        assert_eq!(s, 400, "{q}: {e}");
        assert_eq!(e["error"]["code"], "bad_query", "{q}: {e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{q}: {msg}");
    }
    // Every route refuses what it does not take, including those that take nothing.
    for path in [
        "/v1/fences/g00?x=1",
        "/v1/devices?colour=red",
        "/v1/events?fenc=a",
        "/healthz?x=1",
    ] {
        let (s, e) = srv.get(path).await;
        assert_eq!(
            (s, e["error"]["code"].clone()),
            (400, json!("bad_query")),
            "{path}: {e}"
        );
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_carry_the_fence_name_and_the_deciding_fix() {
    let srv = start(EVENT_MODE).await;
    let props = json!({"name": "North depot", "enter_confirm": 2, "dwell": ["1m"]});
    assert_eq!(put(&srv, "depot", square("depot", props)).await.0, 201);
    assert_eq!(put(&srv, "plain", square("plain", json!({}))).await.0, 201);
    let at = |s: i64| T0 + s * 1000;
    let fixes = json!([
        {"device": "t1", "ts": at(0), "lat": 50.002, "lon": 10.002, "accuracy": 5.5},
        {"device": "t1", "ts": at(10), "lat": 50.004, "lon": 10.006},
        {"device": "t1", "ts": at(100), "lat": 50.05, "lon": 10.05, "accuracy": 30},
    ]);
    let (s, r) = srv.post_fixes(fixes).await;
    assert_eq!(s, 200, "{r}");
    // plain: ENTER at 0 (confirm 1), EXIT at 100; depot: ENTER (confirmed by the fix at 10),
    // DWELL 1m, EXIT at 100.
    let events = srv.events(5).await;
    assert_eq!(events.len(), 5, "{events:?}");
    let find = |fence: &str, kind: &str| {
        events
            .iter()
            .find(|e| e["fence"] == fence && e["type"] == kind)
            .unwrap_or_else(|| panic!("no {kind} of {fence}: {events:?}"))
            .clone()
    };
    let enter = find("depot", "enter");
    assert_eq!(enter["name"], "North depot");
    // `at` is the run's first fix; the position is the fix that confirmed it (no accuracy).
    assert_eq!(enter["entered_at"], enter["at"]);
    assert_eq!(
        (enter["lat"].clone(), enter["lon"].clone()),
        (json!(50.004), json!(10.006))
    );
    assert!(enter.get("accuracy").is_none(), "{enter}");
    let dwell = find("depot", "dwell");
    assert_eq!(dwell["name"], "North depot");
    for k in ["lat", "lon", "accuracy"] {
        assert!(dwell.get(k).is_none(), "DWELL has no position: {dwell}");
    }
    let exit = find("depot", "exit");
    assert_eq!(
        (
            exit["name"].clone(),
            exit["lat"].clone(),
            exit["lon"].clone(),
            exit["accuracy"].clone()
        ),
        (
            json!("North depot"),
            json!(50.05),
            json!(10.05),
            json!(30.0)
        )
    );
    let plain = find("plain", "enter");
    assert!(
        plain.get("name").is_none(),
        "a fence without a name: {plain}"
    );
    assert_eq!(
        (
            plain["lat"].clone(),
            plain["lon"].clone(),
            plain["accuracy"].clone()
        ),
        (json!(50.002), json!(10.002), json!(5.5))
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_scoped_to_some_devices_only_pairs_with_them() {
    let srv = start(EVENT_MODE).await;
    let (s, f) = put(
        &srv,
        "depot",
        square("depot", json!({"devices": ["truck-*"]})),
    )
    .await;
    assert_eq!(s, 201, "{f}");
    assert_eq!(f["properties"]["devices"], json!(["truck-*"]));
    let (s, e) = put(&srv, "bad", square("bad", json!({"devices": []}))).await;
    assert_eq!(
        (s, e["error"]["code"].clone()),
        (422, json!("invalid_fence")),
        "{e}"
    );
    let fixes = json!([
        {"device": "truck-1", "ts": T0, "lat": 50.005, "lon": 10.005},
        {"device": "car-1", "ts": T0 + 1, "lat": 50.005, "lon": 10.005},
    ]);
    assert_eq!(srv.post_fixes(fixes).await.0, 200);
    let events = srv.events(1).await;
    let devices: Vec<&str> = events
        .iter()
        .map(|e| e["device"].as_str().unwrap())
        .collect();
    assert_eq!(devices, vec!["truck-1"], "{events:?}");
    let (_, car) = srv.get("/v1/devices/car-1").await;
    assert_eq!(car["pairs"], json!([]), "{car}");
    srv.stop().await;
}
