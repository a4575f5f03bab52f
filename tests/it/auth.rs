//! API keys over real HTTP and WebSocket: 401 without or with a wrong key, 403 for a missing
//! scope, the scopes' routes, the open routes, the query-parameter and Basic forms, and config
//! validation that reports every bad key at once.

use std::collections::BTreeMap;

use crate::common::*;
use geodwell::config::Config;
use serde_json::{Value, json};

const ADMIN: &str = "admin-key-0123456789";
const INGEST: &str = "ingest-key-0123456789";
const READ: &str = "read-key-0123456789ab";

fn keyed(open_metrics: bool) -> String {
    format!(
        "[time]\nclock = \"event\"\nlateness = \"0s\"\n[auth]\nopen_metrics = {open_metrics}\napi_keys = [\n  {{ name = \"ops\", scopes = [\"admin\"], key = \"{ADMIN}\" }},\n  {{ name = \"trk\", scopes = [\"ingest\"], key = \"{INGEST}\" }},\n  {{ name = \"dash\", scopes = [\"read\"], key_sha256 = \"{}\" }},\n]\n",
        hex(&geodwell::auth::digest(READ))
    )
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

async fn call(
    srv: &Srv,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut req = srv.http.request(method, srv.url(path));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        headers,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_scopes_guard_every_route() {
    use reqwest::Method as M;
    let srv = start(&keyed(true)).await;
    let fence = square("depot", json!({}));
    let fixes = json!([fix("d1", 0, true), fix("d1", 1, true)]);

    // No key: 401 with a challenge and error JSON.
    let (s, body, h) = call(&srv, M::GET, "/v1/fences", None, None).await;
    assert_eq!(s, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized");
    assert!(h.get("www-authenticate").is_some());
    // A wrong key: 401.
    let (s, body, _) = call(
        &srv,
        M::GET,
        "/v1/fences",
        Some("not-a-key-0123456789"),
        None,
    )
    .await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (401, Some("invalid_key"))
    );

    // ingest may not change fences or read; read may not ingest; admin may do all.
    let (s, body, _) = call(
        &srv,
        M::PUT,
        "/v1/fences/depot",
        Some(INGEST),
        Some(fence.clone()),
    )
    .await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{body}"
    );
    assert!(
        body["error"]["message"].as_str().unwrap().contains("admin"),
        "{body}"
    );
    let (s, _, _) = call(
        &srv,
        M::PUT,
        "/v1/fences/depot",
        Some(READ),
        Some(fence.clone()),
    )
    .await;
    assert_eq!(s, 403);
    let (s, body, _) = call(&srv, M::PUT, "/v1/fences/depot", Some(ADMIN), Some(fence)).await;
    assert_eq!(s, 201, "{body}");
    let (s, _, _) = call(&srv, M::POST, "/v1/fixes", Some(READ), Some(fixes.clone())).await;
    assert_eq!(s, 403);
    let (s, _, _) = call(&srv, M::POST, "/v1/fixes", None, Some(fixes.clone())).await;
    assert_eq!(s, 401);
    let (s, body, _) = call(&srv, M::POST, "/v1/fixes", Some(INGEST), Some(fixes)).await;
    assert_eq!((s, body["accepted"].as_u64()), (200, Some(2)), "{body}");
    let (s, _, _) = call(&srv, M::GET, "/v1/events", Some(INGEST), None).await;
    assert_eq!(s, 403);
    let (s, body, _) = call(&srv, M::GET, "/v1/events?from_seq=0", Some(READ), None).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["events"][0]["type"], "enter", "{body}");
    let (s, body, _) = call(&srv, M::GET, "/v1/devices/d1", Some(ADMIN), None).await;
    assert_eq!(s, 200, "{body}");
    let (s, _, _) = call(&srv, M::DELETE, "/v1/fences/depot", Some(READ), None).await;
    assert_eq!(s, 403);
    // Occupancy is read; removing a device and moving the watermark are admin.
    let (s, body, _) = call(&srv, M::GET, "/v1/fences/depot/devices", Some(READ), None).await;
    assert_eq!(
        (s, body["devices"][0]["device"].as_str()),
        (200, Some("d1")),
        "{body}"
    );
    let (s, _, _) = call(&srv, M::GET, "/v1/fences/depot/devices", Some(INGEST), None).await;
    assert_eq!(s, 403);
    let wm = Some(json!({"watermark": "2026-01-01T00:00:01Z"}));
    for key in [INGEST, READ] {
        let (s, _, _) = call(&srv, M::POST, "/v1/watermark", Some(key), wm.clone()).await;
        assert_eq!(s, 403);
        let (s, _, _) = call(&srv, M::DELETE, "/v1/devices/d1", Some(key), None).await;
        assert_eq!(s, 403);
    }
    let (s, body, _) = call(&srv, M::POST, "/v1/watermark", Some(ADMIN), wm).await;
    assert_eq!(s, 200, "{body}");
    let (s, _, _) = call(&srv, M::DELETE, "/v1/devices/d1", Some(ADMIN), None).await;
    assert_eq!(s, 204);

    // Open routes need no key; unknown routes still answer 404, not 401.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (s, _, _) = call(&srv, M::GET, path, None, None).await;
        assert_eq!(s, 200, "{path}");
    }
    let (s, _, _) = call(&srv, M::GET, "/nope", None, None).await;
    assert_eq!(s, 404);

    // The query form works (and is stripped before the handler, which rejects unknown
    // parameters); a key in Basic auth's password works too.
    let (s, body, _) = call(
        &srv,
        M::GET,
        &format!("/v1/events?from_seq=0&limit=5&access_token={READ}"),
        None,
        None,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let r = srv
        .http
        .get(srv.url("/v1/fences"))
        .basic_auth("owntracks-user", Some(READ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // WebSocket subscription: refused without a key, accepted with ?access_token=.
    let url = format!("ws://{}/v1/events/ws?from_seq=0", srv.svc.addr());
    let err = tokio_tungstenite::connect_async(&url).await.unwrap_err();
    assert!(err.to_string().contains("401"), "{err}");
    let mut ws = srv
        .ws(&format!("/v1/events/ws?from_seq=0&access_token={READ}"))
        .await;
    let first = next_json(&mut ws, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(first["type"], "enter", "{first}");

    // Failures are counted by reason.
    let (_, _, _) = call(&srv, M::GET, "/healthz", None, None).await;
    let text = srv.metrics().await;
    for reason in ["missing", "invalid", "forbidden"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("geodwell_auth_failures_total")
                    && l.contains(&format!("reason=\"{reason}\""))),
            "no {reason} line in metrics"
        );
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_require_a_key_and_everything_is_open_without_keys() {
    let srv = start(&keyed(false)).await;
    assert_eq!(srv.get("/metrics").await.0, 401);
    let r = srv
        .http
        .get(srv.url("/metrics"))
        .bearer_auth(READ)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(srv.get("/healthz").await.0, 200);
    srv.stop().await;

    let open = start("").await;
    assert_eq!(open.get("/v1/fences").await.0, 200);
    assert_eq!(
        open.put_fence("a", square("a", json!({})))
            .await
            .status()
            .as_u16(),
        201
    );
    open.stop().await;
}

#[test]
fn bad_keys_are_all_reported_at_once() {
    let text = "[auth]\napi_keys = [\n  { name = \"a\", scopes = [\"read\"], key = \"short\" },\n  { name = \"b\", scopes = [\"root\"], key = \"0123456789abcdef\" },\n  { name = \"c\", scopes = [\"read\"] },\n  { name = \"a\", scopes = [\"read\"], key = \"0123456789abcdefgh\", extra = 1 },\n]\nopen_metrics = \"maybe\"\n";
    let err = Config::load(Some(("t.toml", text)), &BTreeMap::new(), 2).unwrap_err();
    let msg = err.to_string();
    for want in [
        "auth.api_keys[0]: key must be at least 16",
        "auth.api_keys[1]: unknown scope \"root\"",
        "auth.api_keys[2]: needs key or key_sha256",
        "auth.api_keys[3]: unknown field \"extra\"",
        "auth.open_metrics: expected true or false",
    ] {
        assert!(msg.contains(want), "missing {want:?} in:\n{msg}");
    }
    // The environment form, and its errors.
    let mut env = BTreeMap::new();
    env.insert(
        "GEODWELL_API_KEYS".to_string(),
        "ops:admin+read:0123456789abcdef,trk:ingest:fedcba9876543210".to_string(),
    );
    let cfg = Config::load(None, &env, 2).unwrap();
    assert_eq!(cfg.api_keys.len(), 2);
    env.insert(
        "GEODWELL_API_KEYS".to_string(),
        "ops:admin:x,ops:read:0123456789abcdef".into(),
    );
    let msg = Config::load(None, &env, 2).unwrap_err().to_string();
    assert!(msg.contains("at least 16"), "{msg}");
}
