//! Tracker protocols against the real server: OsmAnd / Traccar Client (`/v1/trackers/osmand`,
//! query, form and JSON shapes) and OwnTracks HTTP mode (`/v1/trackers/owntracks`). Payload shapes
//! come from each protocol's documentation or reference implementation (sources quoted at each
//! payload); only ids, coordinates and times are changed so that they land in the test fence.
//! Each test checks what ingest made of them: the ENTER events (`GET /v1/events`) and the device
//! state (`GET /v1/devices/{id}`), plus the error answers for bad input, ignored OwnTracks message
//! types, metrics by transport, and API keys sent the way each app can send them.
//!
//! The payloads the apps send go over real sockets; the error matrix (bad input, wrong
//! methods) goes through the router in process (`App`).

use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

const EVENT_MODE: &str = "[time]\nclock = \"event\"\nlateness = \"0s\"\n";

/// `T0` (2026-01-01T00:00:00Z) in Unix seconds.
const S0: i64 = T0 / 1000;

/// Inside the test square (`common::square`: 10.00..10.01 E, 50.00..50.01 N).
const IN_LAT: f64 = 50.005;
const IN_LON: f64 = 10.005;

async fn text_or_json(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The helpers below go over a socket (`&Srv`) or in process (`&App`, for the error matrix).
async fn osmand_get(api: &impl Http, query: &str) -> (u16, Value) {
    let r = api
        .call("GET", &format!("/v1/trackers/osmand?{query}"), &[], None)
        .await;
    (r.status, r.json_or_text())
}

async fn osmand_post(
    api: &impl Http,
    query: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let headers: Vec<(&str, &str)> = content_type
        .map(|ct| ("content-type", ct))
        .into_iter()
        .collect();
    let r = api
        .call(
            "POST",
            &format!("/v1/trackers/osmand?{query}"),
            &headers,
            Some(body.as_bytes().to_vec()),
        )
        .await;
    (r.status, r.json_or_text())
}

async fn owntracks_post(
    api: &impl Http,
    path_query: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let r = api
        .call(
            "POST",
            &format!("/v1/trackers/owntracks{path_query}"),
            &all,
            Some(body.as_bytes().to_vec()),
        )
        .await;
    (r.status, r.json_or_text())
}

/// Asserts an `{"error": {"code", "message"}}` answer with this status and code; returns the
/// message.
#[track_caller]
fn assert_error(got: &(u16, Value), status: u16, code: &str) -> String {
    assert_eq!(got.0, status, "status: {}", got.1);
    assert_eq!(got.1["error"]["code"], code, "error code: {}", got.1);
    let msg = got.1["error"]["message"].as_str().unwrap_or("").to_string();
    assert!(!msg.is_empty(), "error message missing: {}", got.1);
    msg
}

async fn fence(api: &impl Http) {
    let body = square("depot", json!({"dwell": ["10m"]})).to_string();
    let r = api
        .call(
            "PUT",
            "/v1/fences/depot",
            &[("content-type", "application/json")],
            Some(body.into_bytes()),
        )
        .await;
    assert_eq!(r.status, 201);
}

/// `GET /v1/devices/{id}`, the id percent-encoded (OwnTracks ids contain `/`).
async fn device(api: &impl Http, id: &str) -> (u16, Value) {
    let enc: String = id
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    api.get_json(&format!("/v1/devices/{enc}")).await
}

/// Asserts the device's last fix and that it is inside `depot`.
#[track_caller]
fn assert_inside(dev: &(u16, Value), at: &str) {
    assert_eq!(dev.0, 200, "{}", dev.1);
    assert_eq!(dev.1["last_fix_at"], at, "{}", dev.1);
    assert_eq!(
        dev.1["last_position"],
        json!({"lat": IN_LAT, "lon": IN_LON}),
        "{}",
        dev.1
    );
    let pairs = dev.1["pairs"].as_array().expect("pairs");
    assert_eq!(pairs.len(), 1, "{}", dev.1);
    assert_eq!(pairs[0]["fence"], "depot");
    assert_eq!(pairs[0]["state"], "inside");
}

/// The ENTER events of the log, as (device, at).
async fn enters(api: &impl Http, n: usize) -> Vec<(String, String)> {
    let mut got: Vec<(String, String)> = events_of(api, n)
        .await
        .iter()
        .filter(|e| e["type"] == "enter")
        .map(|e| {
            assert_eq!(e["fence"], "depot", "{e}");
            (
                e["device"].as_str().unwrap().to_string(),
                e["at"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    got
}

fn at(secs: i64) -> String {
    let dt = chrono::DateTime::from_timestamp(S0 + secs, 0).unwrap();
    dt.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn osmand_query_shapes_enter_the_fence() {
    let srv = start(EVENT_MODE).await;
    fence(&srv).await;
    // Query shapes from Traccar's OsmAndProtocolDecoderTest (testDecodeQuery),
    // https://github.com/traccar/traccar/blob/master/src/test/java/org/traccar/protocol/OsmAndProtocolDecoderTest.java
    // and the example at https://www.traccar.org/osmand/ ; one device per timestamp form.
    let cases = [
        // Unix seconds.
        (
            "902064",
            format!(
                "id=902064&lat={IN_LAT}&lon={IN_LON}&timestamp={}&hdop=6.0&altitude=224.0&speed=0.0",
                S0
            ),
            0,
        ),
        // Unix milliseconds.
        (
            "902065",
            format!(
                "id=902065&lat={IN_LAT}&lon={IN_LON}&timestamp={}&hdop=6.0&altitude=224.0&speed=0.0",
                (S0 + 1) * 1000
            ),
            1,
        ),
        // ISO 8601, percent-encoded.
        (
            "902066",
            format!(
                "id=902066&lat={IN_LAT}&lon={IN_LON}&timestamp=2026-01-01T00%3A00%3A02Z&hdop=6.0&altitude=224.0&speed=0.0"
            ),
            2,
        ),
        // "YYYY-MM-DD HH:MM:SS" with `+` for the space, id last.
        (
            "353861053849681",
            format!(
                "lat={IN_LAT}&lon={IN_LON}&timestamp=2026-01-01+00%3A00%3A03&altitude=384.7&speed=0.0&id=353861053849681"
            ),
            3,
        ),
        // location=lat,lon.
        (
            "123456",
            format!("id=123456&timestamp={}&location={IN_LAT},{IN_LON}", S0 + 4),
            4,
        ),
        // deviceid and heading (the Traccar test has no timestamp; event mode needs one).
        (
            "123457",
            format!(
                "lat={IN_LAT}&lon={IN_LON}&speed=0.0&heading=0.0&vacc=0&hacc=0&altitude=0&deviceid=123457&timestamp={}",
                S0 + 5
            ),
            5,
        ),
    ];
    for (_, q, _) in &cases {
        let (s, rep) = osmand_get(&srv, q).await;
        assert_eq!(s, 200, "{q}: {rep}");
        assert_eq!(rep["accepted"], 1, "{q}: {rep}");
    }
    let mut want: Vec<(String, String)> = cases
        .iter()
        .map(|(id, _, secs)| (id.to_string(), at(*secs)))
        .collect();
    want.sort();
    assert_eq!(enters(&srv, cases.len()).await, want);
    for (id, _, secs) in &cases {
        assert_inside(&device(&srv, id).await, &at(*secs));
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traccar_client_post_query_form_and_json() {
    let srv = start(EVENT_MODE).await;
    fence(&srv).await;
    // Traccar Client for Android (before 9.0) puts its parameters in the URL of a POST, see
    // ProtocolFormatter.kt in https://github.com/traccar/traccar-client-android :
    // id, timestamp (s), lat, lon, speed (knots), bearing, altitude, accuracy, batt.
    let q = format!(
        "id=android-1&timestamp={}&lat={IN_LAT}&lon={IN_LON}&speed=12.5&bearing=87.0&altitude=35.0&accuracy=4.0&batt=81.0",
        S0
    );
    let (s, rep) = osmand_post(&srv, &q, None, "").await;
    assert_eq!((s, rep["accepted"].clone()), (200, json!(1)), "{rep}");
    // The same parameters as a form body (https://www.traccar.org/osmand/: "the data can be passed
    // as query parameters or form-based payload"), with an unrelated query parameter left in the
    // URL (such as an API key) that must not hide the body.
    let form = format!(
        "id=form-1&timestamp={}&lat={IN_LAT}&lon={IN_LON}&speed=0.0&bearing=0.0&altitude=0.0&accuracy=10.0&batt=50.0",
        S0 + 1
    );
    let (s, rep) = osmand_post(
        &srv,
        "key=not-used-here",
        Some("application/x-www-form-urlencoded"),
        &form,
    )
    .await;
    assert_eq!((s, rep["accepted"].clone()), (200, json!(1)), "{rep}");
    // Traccar Client 9+ JSON, the documented example at https://www.traccar.org/osmand/ (also
    // OsmAndProtocolDecoderTest.testDecodeJson); speed is m/s there, -1 means unknown.
    let body = json!({
        "location": {
            "timestamp": "2026-01-01T00:00:02.000Z",
            "coords": {"latitude": IN_LAT, "longitude": IN_LON, "accuracy": 5, "speed": -1, "heading": -1, "altitude": 5},
            "is_moving": false,
            "odometer": 0,
            "event": "motionchange",
            "battery": {"level": 1, "is_charging": false},
            "activity": {"type": "still"},
            "extras": {}
        },
        "device_id": "48241179"
    });
    let (s, rep) = osmand_post(&srv, "", Some("application/json"), &body.to_string()).await;
    assert_eq!((s, rep["accepted"].clone()), (200, json!(1)), "{rep}");
    assert_eq!(
        enters(&srv, 3).await,
        vec![
            ("48241179".to_string(), at(2)),
            ("android-1".to_string(), at(0)),
            ("form-1".to_string(), at(1)),
        ]
    );
    assert_inside(&device(&srv, "android-1").await, &at(0));
    assert_inside(&device(&srv, "form-1").await, &at(1));
    assert_inside(&device(&srv, "48241179").await, &at(2));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owntracks_locations_and_device_ids() {
    let srv = start(EVENT_MODE).await;
    fence(&srv).await;
    // The location message of https://owntracks.org/booklet/tech/json/ (fields as listed there),
    // and the Recorder's identification headers from https://owntracks.org/booklet/tech/http/ .
    let loc = |tst: i64, extra: Value| {
        let mut m = json!({
            "_type": "location", "acc": 12, "alt": 36, "batt": 88, "bs": 1, "conn": "w",
            "created_at": tst, "lat": IN_LAT, "lon": IN_LON, "m": 1, "t": "u", "tid": "JJ",
            "tst": tst, "vac": 3, "vel": 0
        });
        m.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        m.to_string()
    };
    let ok = json!([]);
    // X-Limit-U / X-Limit-D -> "jane/phone".
    let got = owntracks_post(
        &srv,
        "",
        &[("X-Limit-U", "jane"), ("X-Limit-D", "phone")],
        &loc(S0, json!({})),
    )
    .await;
    assert_eq!(got, (200, ok.clone()));
    // No headers, a topic (iOS sends one): "owntracks/jane/tablet" -> "jane/tablet".
    let got = owntracks_post(
        &srv,
        "",
        &[],
        &loc(
            S0 + 1,
            json!({"topic": "owntracks/jane/tablet", "tid": "JT"}),
        ),
    )
    .await;
    assert_eq!(got, (200, ok.clone()));
    // ?u=&d= in the URL (the Recorder's alternative to the headers) -> "bob/car".
    let got = owntracks_post(&srv, "?u=bob&d=car", &[], &loc(S0 + 2, json!({}))).await;
    assert_eq!(got, (200, ok.clone()));
    // Nothing but a tid -> "JJ" (the Traccar booklet page's minimal payload:
    // https://owntracks.org/booklet/features/traccar/).
    let minimal =
        json!({"lon": IN_LON, "lat": IN_LAT, "_type": "location", "tst": S0 + 3, "tid": "JJ"});
    let got = owntracks_post(&srv, "", &[], &minimal.to_string()).await;
    assert_eq!(got, (200, ok.clone()));

    assert_eq!(
        enters(&srv, 4).await,
        vec![
            ("JJ".to_string(), at(3)),
            ("bob/car".to_string(), at(2)),
            ("jane/phone".to_string(), at(0)),
            ("jane/tablet".to_string(), at(1)),
        ]
    );
    assert_inside(&device(&srv, "jane/phone").await, &at(0));
    assert_inside(&device(&srv, "jane/tablet").await, &at(1));
    assert_inside(&device(&srv, "bob/car").await, &at(2));
    assert_inside(&device(&srv, "JJ").await, &at(3));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owntracks_messages_other_than_locations_are_acknowledged_and_ignored() {
    let srv = start(EVENT_MODE).await;
    fence(&srv).await;
    let who = [("X-Limit-U", "ghost"), ("X-Limit-D", "phone")];
    // Shapes from https://owntracks.org/booklet/tech/json/ ; each carries coordinates or a tst
    // that would move the device or the watermark if it were taken for a location.
    let messages = [
        json!({"_type": "transition", "wtst": S0, "lat": IN_LAT, "lon": IN_LON, "tst": S0 + 10, "acc": 10, "tid": "GP", "event": "enter", "desc": "Depot", "t": "c", "rid": "a1b2"}),
        json!({"_type": "waypoint", "desc": "Depot", "lat": IN_LAT, "lon": IN_LON, "rad": 50, "tst": S0 + 11, "rid": "a1b2"}),
        json!({"_type": "waypoints", "waypoints": [{"_type": "waypoint", "desc": "Depot", "lat": IN_LAT, "lon": IN_LON, "rad": 50, "tst": S0 + 12}]}),
        json!({"_type": "lwt", "tst": S0 + 13}),
        json!({"_type": "status", "iOS": {"version": "17.0", "locale": "en"}}),
        json!({"_type": "card", "name": "Ghost", "tid": "GP"}),
        json!({"_type": "steps", "tst": S0 + 14, "steps": 1200, "from": S0, "to": S0 + 14}),
    ];
    for m in &messages {
        let got = owntracks_post(&srv, "", &who, &m.to_string()).await;
        assert_eq!(got, (200, json!([])), "{m}");
    }
    // The app POSTs a zero-length payload when a friend is deleted (booklet, HTTP mode).
    assert_eq!(owntracks_post(&srv, "", &who, "").await, (200, json!([])));
    // White space is not that message, and not JSON.
    assert_error(
        &owntracks_post(&srv, "", &who, "\t").await,
        400,
        "malformed_json",
    );
    // None of it became a fix: no such device, no event, no watermark.
    assert_eq!(device(&srv, "ghost/phone").await.0, 404);
    let (_, ready) = srv.get("/readyz").await;
    assert_eq!(ready["watermark"], Value::Null, "{ready}");
    // A location of the same device right after is taken.
    let loc = json!({"_type": "location", "lat": IN_LAT, "lon": IN_LON, "tst": S0, "tid": "GP"});
    assert_eq!(
        owntracks_post(&srv, "", &who, &loc.to_string()).await,
        (200, json!([]))
    );
    assert_eq!(
        enters(&srv, 1).await,
        vec![("ghost/phone".to_string(), at(0))]
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_400_error_and_keeps_earlier_fixes() {
    let srv = start(EVENT_MODE).await;
    let app = srv.app();
    fence(&app).await;
    let good = format!("id=truck&lat={IN_LAT}&lon={IN_LON}&timestamp={S0}");
    assert_eq!(osmand_get(&app, &good).await.0, 200);
    let ot_good =
        json!({"_type": "location", "lat": IN_LAT, "lon": IN_LON, "tst": S0, "tid": "VN"});
    let vessel = [("X-Limit-U", "vessel")];
    assert_eq!(
        owntracks_post(&app, "", &vessel, &ot_good.to_string()).await,
        (200, json!([]))
    );

    let t1 = S0 + 60;
    // OsmAnd: (query, code, a word the message must contain).
    let osmand_bad = [
        (
            format!("lat={IN_LAT}&lon={IN_LON}&timestamp={t1}"),
            "missing_field",
            "id",
        ),
        (
            format!("id=truck&lon={IN_LON}&timestamp={t1}"),
            "missing_field",
            "lat",
        ),
        (
            format!("id=truck&lat={IN_LAT}&timestamp={t1}"),
            "missing_field",
            "lon",
        ),
        (
            format!("id=truck&lat=91&lon={IN_LON}&timestamp={t1}"),
            "invalid_fix",
            "lat",
        ),
        (
            format!("id=truck&lat={IN_LAT}&lon=200.5&timestamp={t1}"),
            "invalid_fix",
            "lon",
        ),
        (
            format!("id=truck&lat=fifty&lon={IN_LON}&timestamp={t1}"),
            "invalid_fix",
            "fifty",
        ),
        (
            format!("id=truck&lat={IN_LAT}&lon={IN_LON}&timestamp=yesterday"),
            "invalid_ts",
            "yesterday",
        ),
        (
            format!("id=truck&lat={IN_LAT}&lon={IN_LON}"),
            "missing_field",
            "timestamp",
        ),
        (
            format!("id=truck&lat={IN_LAT}&lon={IN_LON}&timestamp={t1}&speed=fast"),
            "invalid_fix",
            "speed",
        ),
        (
            format!("id=truck&lat={IN_LAT}&lon={IN_LON}&timestamp={t1}&accuracy=-3"),
            "invalid_fix",
            "accuracy",
        ),
        (
            format!("id=truck&location=50.005;10.005&timestamp={t1}"),
            "invalid_fix",
            "location",
        ),
    ];
    for (q, code, word) in &osmand_bad {
        let got = osmand_get(&app, q).await;
        let msg = assert_error(&got, 400, code);
        assert!(msg.contains(word), "{q}: {msg}");
    }
    // Traccar Client JSON that is broken.
    let got = osmand_post(
        &app,
        "",
        Some("application/json"),
        "{\"device_id\": \"truck\",",
    )
    .await;
    assert_error(&got, 400, "malformed_json");
    let got = osmand_post(
        &app,
        "",
        Some("application/json"),
        &json!({"device_id": "truck", "location": {"timestamp": "2026-01-01T00:01:00Z", "coords": {"latitude": 91.0, "longitude": IN_LON}}}).to_string(),
    )
    .await;
    assert!(assert_error(&got, 400, "invalid_fix").contains("lat"));

    // OwnTracks.
    let ot = |v: Value| v.to_string();
    let ot_bad = [
        (
            ot(json!({"_type": "location", "lat": 91.0, "lon": IN_LON, "tst": t1})),
            "invalid_fix",
            "lat",
        ),
        (
            ot(json!({"_type": "location", "lat": "50.005", "lon": IN_LON, "tst": t1})),
            "invalid_fix",
            "lat",
        ),
        (
            ot(json!({"_type": "location", "lat": IN_LAT, "lon": IN_LON})),
            "missing_field",
            "tst",
        ),
        (
            ot(json!({"_type": "location", "lat": IN_LAT, "lon": IN_LON, "tst": "soon"})),
            "invalid_ts",
            "tst",
        ),
        (
            ot(json!({"_type": "location", "lat": IN_LAT, "lon": IN_LON, "tst": t1, "acc": -1})),
            "invalid_fix",
            "accuracy",
        ),
        ("not json".to_string(), "malformed_json", "JSON"),
        (
            ot(json!([{"_type": "location"}])),
            "malformed_body",
            "object",
        ),
        (ot(json!({"lat": IN_LAT})), "malformed_body", "_type"),
        (
            ot(json!({"_type": "encrypted", "data": "c2VjcmV0"})),
            "encryption_unsupported",
            "encryption",
        ),
    ];
    for (body, code, word) in &ot_bad {
        let got = owntracks_post(&app, "", &vessel, body).await;
        let msg = assert_error(&got, 400, code);
        assert!(msg.contains(word), "{body}: {msg}");
    }
    // No device id at all.
    let got = owntracks_post(
        &app,
        "",
        &[],
        &ot(json!({"_type": "location", "lat": IN_LAT, "lon": IN_LON, "tst": t1})),
    )
    .await;
    assert!(assert_error(&got, 400, "missing_field").contains("device id"));

    // Nothing of that moved either device or lost their first fix.
    assert_inside(&device(&app, "truck").await, &at(0));
    assert_inside(&device(&app, "vessel").await, &at(0));
    assert_eq!(
        enters(&app, 2).await,
        vec![("truck".to_string(), at(0)), ("vessel".to_string(), at(0))]
    );
    // The service is healthy and takes the next good fix: the truck leaves.
    let leave = format!("id=truck&lat=50.05&lon=10.05&timestamp={}", S0 + 700);
    assert_eq!(osmand_get(&app, &leave).await.0, 200);
    let evs = app.events(3).await;
    let exit = evs.iter().find(|e| e["type"] == "exit").expect("an exit");
    assert_eq!(
        (exit["device"].clone(), exit["duration_s"].clone()),
        (json!("truck"), json!(700))
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_and_duplicate_fixes_are_acknowledged() {
    let srv = start(EVENT_MODE).await;
    let q =
        |id: &str, secs: i64| format!("id={id}&lat={IN_LAT}&lon={IN_LON}&timestamp={}", S0 + secs);
    let (s, rep) = osmand_get(&srv, &q("d1", 100)).await;
    assert_eq!((s, rep["accepted"].clone()), (200, json!(1)), "{rep}");
    let (s, rep) = osmand_get(&srv, &q("d1", 100)).await;
    assert_eq!((s, rep["duplicate"].clone()), (200, json!(1)), "{rep}");
    let (s, rep) = osmand_get(&srv, &q("d1", 50)).await;
    assert_eq!((s, rep["late"].clone()), (200, json!(1)), "{rep}");
    // OwnTracks answers `[]` either way; the device keeps its newest fix.
    let m = json!({"_type": "location", "lat": IN_LAT, "lon": IN_LON, "tst": S0 + 40, "tid": "d1"})
        .to_string();
    assert_eq!(owntracks_post(&srv, "", &[], &m).await, (200, json!([])));
    let (_, dev) = device(&srv, "d1").await;
    assert_eq!(dev["last_fix_at"], at(100), "{dev}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_takes_the_arrival_time_when_osmand_sends_none() {
    let srv = start("").await;
    let before = chrono::Utc::now().timestamp_millis();
    let (s, rep) = osmand_get(&srv, &format!("id=no-time&lat={IN_LAT}&lon={IN_LON}")).await;
    assert_eq!((s, rep["accepted"].clone()), (200, json!(1)), "{rep}");
    let after = chrono::Utc::now().timestamp_millis();
    // Applied once the live watermark (wall - 2 s) passes it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let last = loop {
        let (_, dev) = device(&srv, "no-time").await;
        if let Some(t) = dev["last_fix_at"].as_str() {
            break chrono::DateTime::parse_from_rfc3339(t)
                .unwrap()
                .timestamp_millis();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never applied: {dev}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        (before..=after).contains(&last),
        "{before} <= {last} <= {after}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracker_fixes_are_counted_by_transport_and_wrong_methods_refused() {
    let srv = start(EVENT_MODE).await;
    let app = srv.app();
    for i in 0..3 {
        let q = format!("id=m{i}&lat={IN_LAT}&lon={IN_LON}&timestamp={}", S0 + i);
        assert_eq!(osmand_get(&app, &q).await.0, 200);
    }
    let m = json!({"_type": "location", "lat": IN_LAT, "lon": IN_LON, "tst": S0, "tid": "m"})
        .to_string();
    assert_eq!(owntracks_post(&app, "", &[], &m).await.0, 200);
    let bad = json!({"_type": "location", "lat": IN_LAT, "lon": IN_LON, "tid": "m"}).to_string();
    assert_eq!(owntracks_post(&app, "", &[], &bad).await.0, 400);
    // An ignored message type is not a fix.
    let lwt = json!({"_type": "lwt", "tst": S0}).to_string();
    assert_eq!(owntracks_post(&app, "", &[], &lwt).await.0, 200);

    let text = app.metrics().await;
    // The recorder is process-wide and other tests run alongside: at least what this test sent.
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{series} missing from /metrics"))
    };
    assert!(value("geodwell_fixes_received_total{transport=\"osmand\"}") >= 3.0);
    assert!(value("geodwell_fixes_received_total{transport=\"owntracks\"}") >= 2.0);
    assert!(value("geodwell_fixes_rejected_total{reason=\"missing_field\"}") >= 1.0);

    let r = app.call("GET", "/v1/trackers/owntracks", &[], None).await;
    assert_error(&(r.status, r.json_or_text()), 405, "method_not_allowed");
    let r = app
        .call("DELETE", "/v1/trackers/osmand?id=x", &[], None)
        .await;
    assert_error(&(r.status, r.json_or_text()), 405, "method_not_allowed");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_api_keys_trackers_authenticate_the_way_their_apps_can() {
    const INGEST: &str = "tracker-ingest-key-0123";
    const ADMIN: &str = "tracker-admin-key-01234";
    let srv = start(&format!(
        "{EVENT_MODE}[auth]\napi_keys = [\n  {{ name = \"phones\", scopes = [\"ingest\"], key = \"{INGEST}\" }},\n  {{ name = \"ops\", scopes = [\"admin\"], key = \"{ADMIN}\" }},\n]\n"
    ))
    .await;
    let q = format!("id=keyed&lat={IN_LAT}&lon={IN_LON}&timestamp={S0}");
    // Traccar Client and OsmAnd cannot send headers: the key rides in the configured URL.
    let msg = assert_error(&osmand_get(&srv, &q).await, 401, "unauthorized");
    assert!(
        msg.contains("?access_token=") && !msg.contains("Authorization"),
        "the 401 says what a Traccar Client user can do: {msg}"
    );
    let (s, rep) = osmand_get(&srv, &format!("access_token={INGEST}&{q}")).await;
    assert_eq!((s, rep["accepted"].clone()), (200, json!(1)), "{rep}");
    // OwnTracks sends HTTP basic auth: the password is the key, the username also names the
    // device through X-Limit-U.
    let loc = json!({"_type": "location", "lat": IN_LAT, "lon": IN_LON, "tst": S0, "tid": "JP"})
        .to_string();
    let post = |auth: Option<&str>| {
        let mut req = srv
            .http
            .post(srv.url("/v1/trackers/owntracks"))
            .header("X-Limit-U", "jane")
            .header("X-Limit-D", "phone")
            .body(loc.clone());
        if let Some(password) = auth {
            req = req.basic_auth("jane", Some(password));
        }
        req.send()
    };
    assert_eq!(text_or_json(post(None).await.unwrap()).await.0, 401);
    assert_eq!(
        text_or_json(post(Some(INGEST)).await.unwrap()).await,
        (200, json!([]))
    );
    // Both fixes arrived under their own ids (the key was not taken for a parameter).
    for id in ["keyed", "jane%2Fphone"] {
        let r = srv
            .http
            .get(srv.url(&format!("/v1/devices/{id}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let (s, dev) = text_or_json(r).await;
        assert_eq!(
            (s, dev["last_fix_at"].clone()),
            (200, json!(at(0))),
            "{id}: {dev}"
        );
    }
    srv.stop().await;
}
