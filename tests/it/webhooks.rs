//! Webhooks over real sockets: the real server (with a store in a temp dir) delivers to receivers
//! that are axum servers on 127.0.0.1:0 inside the test. Covers order and signatures, filters,
//! retries, dead letters and their retry, isolation from a hanging receiver, resuming after a
//! restart, a backlog read from the store past the log's retention, drops without a store, and
//! `kill -9` of the real binary in the middle of deliveries (at least once: no gaps).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

/// A Standard Webhooks secret (32 bytes of key).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwZbMA3wnmMvI=";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Ok,
    /// Answer 500 to the first K requests, then 2xx.
    FailFirst(usize),
    AlwaysFail,
    /// Never answer.
    Hang,
    /// Answer 2xx after this many milliseconds.
    Slow(u64),
}

#[derive(Debug, Clone)]
struct Req {
    id: String,
    ts: String,
    sig: String,
    ctype: String,
    body: String,
}

impl Req {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("body is JSON")
    }
    fn seq(&self) -> u64 {
        self.json()["seq"].as_u64().expect("seq")
    }
}

struct RecvState {
    mode: Mutex<Mode>,
    hits: AtomicUsize,
    attempts: Mutex<Vec<Req>>,
    delivered: Mutex<Vec<Req>>,
}

struct Receiver {
    addr: SocketAddr,
    st: Arc<RecvState>,
}

impl Receiver {
    async fn start(mode: Mode) -> Receiver {
        let st = Arc::new(RecvState {
            mode: Mutex::new(mode),
            hits: AtomicUsize::new(0),
            attempts: Mutex::new(Vec::new()),
            delivered: Mutex::new(Vec::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/hook", post(hook))
            .with_state(st.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, st }
    }
    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }
    fn set(&self, mode: Mode) {
        *self.st.mode.lock().unwrap() = mode;
    }
    fn delivered(&self) -> Vec<Req> {
        self.st.delivered.lock().unwrap().clone()
    }
    fn attempts(&self) -> Vec<Req> {
        self.st.attempts.lock().unwrap().clone()
    }
    fn seqs(&self) -> Vec<u64> {
        self.delivered().iter().map(Req::seq).collect()
    }
    async fn wait_delivered(&self, n: usize) -> Vec<Req> {
        wait_for(&format!("{n} deliveries at {}", self.url()), || {
            self.st.delivered.lock().unwrap().len() >= n
        })
        .await;
        self.delivered()
    }
}

async fn hook(State(st): State<Arc<RecvState>>, headers: HeaderMap, body: String) -> StatusCode {
    let n = st.hits.fetch_add(1, Ordering::SeqCst) + 1;
    let h = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let req = Req {
        id: h("webhook-id"),
        ts: h("webhook-timestamp"),
        sig: h("webhook-signature"),
        ctype: h("content-type"),
        body,
    };
    st.attempts.lock().unwrap().push(req.clone());
    let mode = *st.mode.lock().unwrap();
    let ok = match mode {
        Mode::Ok => true,
        Mode::FailFirst(k) => n > k,
        Mode::AlwaysFail => false,
        Mode::Hang => {
            std::future::pending::<()>().await;
            false
        }
        Mode::Slow(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            true
        }
    };
    if ok {
        st.delivered.lock().unwrap().push(req);
        StatusCode::NO_CONTENT
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Verifies a request the way a Standard Webhooks receiver does, with its own HMAC.
fn signature_ok(r: &Req) -> bool {
    let key = base64::engine::general_purpose::STANDARD
        .decode(SECRET.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.{}", r.id, r.ts, r.body).as_bytes());
    let want = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    r.sig
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .any(|s| s == want)
}

fn sink(id: &str, url: &str, extra: Value) -> Value {
    let mut v = json!({
        "id": id,
        "url": url,
        "secret": SECRET,
        "timeout": "2s",
        "backoff_base": "10ms",
        "backoff_max": "40ms",
    });
    for (k, x) in extra.as_object().cloned().unwrap_or_default() {
        v[k] = x;
    }
    v
}

/// Over a socket (`&Srv`) or in process (`&App`, for the API's error matrix).
async fn create(api: &impl Http, body: Value) -> (u16, Value) {
    let r = api
        .call(
            "POST",
            "/v1/webhooks",
            &[("content-type", "application/json")],
            Some(serde_json::to_vec(&body).unwrap()),
        )
        .await;
    (r.status, r.json())
}

async fn status(srv: &Srv, id: &str) -> Value {
    let (s, v) = srv.get(&format!("/v1/webhooks/{id}")).await;
    assert_eq!(s, 200, "{v}");
    v["status"].clone()
}

/// Polls a sink's status until `cond` holds.
async fn wait_status(srv: &Srv, id: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let st = status(srv, id).await;
        if cond(&st) {
            return st;
        }
        assert!(Instant::now() < deadline, "timed out; status of {id}: {st}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

const EVENT_MODE: &str = "[time]\nclock = \"event\"\nlateness = \"0s\"\n";

async fn setup_fence(srv: &Srv) {
    assert_eq!(
        srv.put_fence("depot", square("depot", json!({"tags": {"site": "n"}})))
            .await
            .status(),
        201
    );
}

/// One fix per device at `secs` (inside or not): one ENTER or EXIT per device.
async fn move_all(srv: &Srv, devices: &[String], secs: i64, inside: bool) {
    let fixes: Vec<Value> = devices.iter().map(|d| fix(d, secs, inside)).collect();
    let (s, rep) = srv.post_fixes(json!(fixes)).await;
    assert_eq!(s, 200, "{rep}");
}

fn devs(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_every_event_in_order_signed_and_filtered() {
    let all = Receiver::start(Mode::Ok).await;
    let exits = Receiver::start(Mode::Ok).await;
    let srv = start(EVENT_MODE).await;
    setup_fence(&srv).await;
    let (s, v) = create(&srv, sink("all", &all.url(), json!({}))).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["source"], "api");
    assert_eq!(v["status"]["cursor"], 1);
    assert!(
        !v.to_string().contains("whsec_"),
        "secret is write-only: {v}"
    );
    let (s, v) = create(
        &srv,
        sink(
            "exits",
            &exits.url(),
            json!({"types": ["exit"], "fences": ["dep*"]}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{v}");

    let d = devs("t", 5);
    move_all(&srv, &d, 0, true).await;
    move_all(&srv, &d, 10, false).await;
    let events = srv.events(10).await;
    assert_eq!(events.len(), 10);

    let got = all.wait_delivered(10).await;
    assert_eq!(
        got.iter().map(Req::json).collect::<Vec<_>>(),
        events,
        "every event, in seq order, as the same JSON the log serves"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for r in &got {
        assert!(signature_ok(r), "signature verifies: {r:?}");
        assert_eq!(
            r.id,
            r.json()["id"].as_str().unwrap(),
            "webhook-id = event id"
        );
        let ts: i64 = r.ts.parse().unwrap();
        assert!((now - ts).abs() < 60, "timestamp is now-ish: {ts} vs {now}");
        assert_eq!(r.ctype, "application/json");
        // A tampered body does not verify.
        let mut bad = r.clone();
        bad.body = bad.body.replace("\"seq\"", "\"seq \"");
        assert!(!signature_ok(&bad));
    }
    assert_eq!(
        all.attempts().len(),
        10,
        "no retries against a healthy receiver"
    );

    let got = exits.wait_delivered(5).await;
    assert!(
        got.iter().all(|r| r.json()["type"] == "exit"),
        "the filter passes EXITs only"
    );
    let want: Vec<u64> = events
        .iter()
        .filter(|e| e["type"] == "exit")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(exits.seqs(), want);

    let st = wait_status(&srv, "all", |s| s["lag"] == 0 && s["sent"] == 10).await;
    assert_eq!(
        (st["failed"].clone(), st["cursor"].clone()),
        (json!(0), json!(11))
    );
    let st = wait_status(&srv, "exits", |s| s["lag"] == 0).await;
    assert_eq!(st["sent"], 5, "filtered events are skipped, not sent: {st}");
    let (s, list) = srv.get("/v1/webhooks").await;
    assert_eq!(s, 200);
    let ids: Vec<&str> = list["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["all", "exits"]);
    assert!(!list.to_string().contains("whsec_"));
    // Metrics, per sink.
    let metrics = srv.metrics().await;
    assert!(
        metrics.contains("geodwell_webhook_sent_total{sink=\"all\"} 10"),
        "{metrics}"
    );
    assert!(metrics.contains("geodwell_webhook_lag_events{sink=\"exits\"}"));
    assert!(metrics.contains("geodwell_webhook_delivery_duration_seconds_bucket{sink=\"all\""));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_receiver_gets_retries_then_the_event() {
    let rx = Receiver::start(Mode::FailFirst(3)).await;
    let srv = start(EVENT_MODE).await;
    setup_fence(&srv).await;
    let (s, v) = create(&srv, sink("flaky", &rx.url(), json!({"max_attempts": 5}))).await;
    assert_eq!(s, 201, "{v}");
    move_all(&srv, &devs("f", 1), 0, true).await;
    let got = rx.wait_delivered(1).await;
    let attempts = rx.attempts();
    assert_eq!(attempts.len(), 4, "3 failures, then success");
    assert!(
        attempts
            .iter()
            .all(|a| a.id == got[0].id && a.body == got[0].body),
        "every attempt carries the same event and id"
    );
    assert!(attempts.iter().all(signature_ok));
    let st = wait_status(&srv, "flaky", |s| s["sent"] == 1).await;
    assert_eq!(
        (
            st["failed"].clone(),
            st["retried"].clone(),
            st["dead_letters"].clone()
        ),
        (json!(3), json!(3), json!(0)),
        "{st}"
    );
    assert_eq!(st["last_error"], "HTTP 500 Internal Server Error");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_after_max_attempts_while_other_sinks_keep_receiving() {
    let good = Receiver::start(Mode::Ok).await;
    let bad = Receiver::start(Mode::AlwaysFail).await;
    // The healthy sink comes from the config file.
    let srv = start(&format!(
        "{EVENT_MODE}[[webhooks]]\nid = \"good\"\nurl = \"{}\"\nsecret = \"{SECRET}\"\n",
        good.url()
    ))
    .await;
    setup_fence(&srv).await;
    let (s, v) = create(&srv, sink("bad", &bad.url(), json!({"max_attempts": 3}))).await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = srv.get("/v1/webhooks/good").await;
    assert_eq!((s, v["source"].clone()), (200, json!("config")), "{v}");

    let d = devs("b", 2);
    move_all(&srv, &d, 0, true).await;
    move_all(&srv, &d, 10, false).await;
    let events = srv.events(4).await;
    assert_eq!(good.wait_delivered(4).await.len(), 4);
    assert_eq!(good.seqs(), vec![1, 2, 3, 4]);

    let st = wait_status(&srv, "bad", |s| s["dead_letters"] == 4 && s["lag"] == 0).await;
    assert_eq!(
        (
            st["dead_lettered"].clone(),
            st["failed"].clone(),
            st["sent"].clone()
        ),
        (json!(4), json!(12), json!(0)),
        "{st}"
    );
    assert_eq!(bad.attempts().len(), 12, "3 attempts per event");
    let (s, dl) = srv.get("/v1/webhooks/bad/dead-letters").await;
    assert_eq!(s, 200, "{dl}");
    assert_eq!(dl["count"], 4);
    let list = dl["dead_letters"].as_array().unwrap();
    for (d, e) in list.iter().zip(&events) {
        assert_eq!(d["seq"], e["seq"]);
        assert_eq!(d["id"], e["id"]);
        assert_eq!(d["attempts"], 3);
        assert_eq!(d["event"], *e, "the dead letter holds the event as sent");
        assert_eq!(d["last_error"], "HTTP 500 Internal Server Error");
    }
    let (s, dl) = srv.get("/v1/webhooks/bad/dead-letters?limit=1").await;
    assert_eq!((s, dl["dead_letters"].as_array().unwrap().len()), (200, 1));
    let metrics = srv.metrics().await;
    assert!(metrics.contains("geodwell_webhook_dead_lettered_total{sink=\"bad\"} 4"));
    assert!(metrics.contains("geodwell_webhook_retries_total{sink=\"bad\"} 8"));

    // A config sink cannot be deleted over the API.
    let r = srv.delete("/v1/webhooks/good").await;
    assert_eq!(r.status().as_u16(), 409);

    // The receiver recovers; a retry delivers every dead letter and empties the list.
    bad.set(Mode::Ok);
    let r = srv
        .http
        .post(srv.url("/v1/webhooks/bad/dead-letters/retry"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    assert_eq!(r.json::<Value>().await.unwrap()["queued"], 4);
    bad.wait_delivered(4).await;
    assert_eq!(bad.seqs(), vec![1, 2, 3, 4]);
    assert!(bad.delivered().iter().all(signature_ok));
    let st = wait_status(&srv, "bad", |s| s["dead_letters"] == 0).await;
    assert_eq!(st["sent"], 4, "{st}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_receiver_slows_neither_ingest_nor_other_sinks() {
    let hang = Receiver::start(Mode::Hang).await;
    let ok = Receiver::start(Mode::Ok).await;
    let srv = start(EVENT_MODE).await;
    setup_fence(&srv).await;
    let (s, _) = create(&srv, sink("hang", &hang.url(), json!({"timeout": "60s"}))).await;
    assert_eq!(s, 201);
    let (s, _) = create(&srv, sink("ok", &ok.url(), json!({}))).await;
    assert_eq!(s, 201);

    let d = devs("h", 10);
    let mut slowest = Duration::ZERO;
    for round in 0..20 {
        let started = Instant::now();
        move_all(&srv, &d, round * 10, round % 2 == 0).await;
        slowest = slowest.max(started.elapsed());
    }
    // 200 events; every ingest request answered without waiting for the hanging receiver.
    assert!(
        slowest < Duration::from_secs(2),
        "slowest ingest request took {slowest:?}"
    );
    assert_eq!(srv.events(200).await.len(), 200);
    ok.wait_delivered(200).await;
    assert_eq!(ok.seqs(), (1..=200).collect::<Vec<u64>>());
    let st = status(&srv, "hang").await;
    assert_eq!(st["state"], "delivering", "{st}");
    assert_eq!(st["cursor"], 1);
    assert_eq!(st["lag"], 200);
    assert_eq!(hang.attempts().len(), 1);
    // Shutdown does not wait for the hanging request (stop() asserts a clean, prompt stop).
    let started = Instant::now();
    srv.stop().await;
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_from_the_cursor_without_gap_or_repeat() {
    let rx = Receiver::start(Mode::Ok).await;
    // The store outlives the first server: the second one restarts on it.
    let dir = temp_dir();
    let srv = start_cfg(config(EVENT_MODE).with_data_dir(dir.path())).await;
    setup_fence(&srv).await;
    let (s, v) = create(&srv, sink("r", &rx.url(), json!({"max_attempts": 100}))).await;
    assert_eq!(s, 201, "{v}");
    let d = devs("r", 2);
    move_all(&srv, &d, 0, true).await;
    move_all(&srv, &d, 10, false).await;
    rx.wait_delivered(4).await;
    // The receiver goes down; four more events wait behind the first one being retried.
    rx.set(Mode::AlwaysFail);
    move_all(&srv, &d, 20, true).await;
    move_all(&srv, &d, 30, false).await;
    wait_for("attempts at seq 5", || {
        rx.attempts().iter().any(|a| a.seq() == 5)
    })
    .await;
    let st = wait_status(&srv, "r", |s| s["lag"] == 4).await;
    assert_eq!(st["cursor"], 5);
    srv.stop().await;
    let (sent, failed, success) = (
        st["sent"].as_u64().unwrap(),
        st["failed"].as_u64().unwrap(),
        st["last_success_at"].clone(),
    );
    assert_eq!(sent, 4);
    assert!(failed >= 1 && success.is_string(), "{st}");

    // Back up, same data dir: the API-created sink is restored and resumes at seq 5.
    rx.set(Mode::Ok);
    let srv = start_cfg(config(EVENT_MODE).with_data_dir(dir.path())).await;
    let (s, v) = srv.get("/v1/webhooks/r").await;
    assert_eq!((s, v["source"].clone()), (200, json!("api")), "{v}");
    // The counters and times carry on from before the restart.
    assert!(v["status"]["sent"].as_u64().unwrap() >= sent, "{v}");
    assert!(v["status"]["failed"].as_u64().unwrap() >= failed, "{v}");
    assert!(
        v["status"]["last_success_at"].as_str() >= success.as_str(),
        "{v}"
    );
    rx.wait_delivered(8).await;
    assert_eq!(
        rx.seqs(),
        (1..=8).collect::<Vec<u64>>(),
        "in order, no gap, and no repeat after a clean stop"
    );
    let st = wait_status(&srv, "r", |s| s["lag"] == 0).await;
    assert_eq!(st["cursor"], 9);
    assert_eq!(st["sent"], 8, "counted across the restart");
    // More events after the restart keep flowing.
    move_all(&srv, &d, 40, true).await;
    rx.wait_delivered(10).await;
    assert_eq!(rx.seqs(), (1..=10).collect::<Vec<u64>>());
    srv.stop().await;
}

/// One ENTER (seq 1) is stuck at a failing receiver while nine more events push it out of the
/// 3-event log; then the receiver recovers.
async fn backlog_past_retention(durability: &str, id: &str) -> (Receiver, Srv) {
    let rx = Receiver::start(Mode::AlwaysFail).await;
    let srv = start(&format!(
        "{EVENT_MODE}[events]\nlog_capacity = 3\n[store]\ndurability = \"{durability}\"\n"
    ))
    .await;
    setup_fence(&srv).await;
    let (s, v) = create(&srv, sink(id, &rx.url(), json!({"max_attempts": 100}))).await;
    assert_eq!(s, 201, "{v}");
    move_all(&srv, &devs("first", 1), 0, true).await;
    wait_for("an attempt at seq 1", || !rx.attempts().is_empty()).await;
    move_all(&srv, &devs("more", 9), 10, true).await;
    let (_, v) = srv.get("/v1/events?from_seq=0").await;
    assert_eq!(v["first_seq"], 8, "the log holds only 8..=10: {v}");
    rx.set(Mode::Ok);
    (rx, srv)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_behind_the_log_reads_its_backlog_from_the_store() {
    let (rx, srv) = backlog_past_retention("sync", "store-backlog").await;
    rx.wait_delivered(10).await;
    assert_eq!(rx.seqs(), (1..=10).collect::<Vec<u64>>());
    let st = wait_status(&srv, "store-backlog", |s| s["lag"] == 0).await;
    assert_eq!(st["dropped"], 0, "{st}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_store_a_sink_behind_the_log_counts_the_lost_events() {
    let (rx, srv) = backlog_past_retention("none", "lossy").await;
    rx.wait_delivered(4).await;
    let st = wait_status(&srv, "lossy", |s| s["lag"] == 0).await;
    assert_eq!(rx.seqs(), vec![1, 8, 9, 10], "2..=7 were gone from the log");
    assert_eq!(st["dropped"], 6, "{st}");
    let metrics = srv.metrics().await;
    assert!(metrics.contains("geodwell_webhook_dropped_total{sink=\"lossy\"} 6"));
    // A new sink asked to start before the retained range starts at its beginning, without
    // counting events that were gone before it existed.
    let replay = Receiver::start(Mode::Ok).await;
    let (s, v) = create(&srv, sink("replay", &replay.url(), json!({"from_seq": 0}))).await;
    assert_eq!((s, v["status"]["cursor"].clone()), (201, json!(8)), "{v}");
    replay.wait_delivered(3).await;
    assert_eq!(replay.seqs(), vec![8, 9, 10]);
    assert_eq!(status(&srv, "replay").await["dropped"], 0);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_rejects_bad_input_with_clear_errors() {
    let srv = start(EVENT_MODE).await;
    let app = srv.app();
    let (s, v) = create(
        &app,
        json!({"id": "x y", "url": "ftp://h/", "secret": "plain", "max_attempts": 0, "nope": 1}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].clone()),
        (422, json!("invalid_webhook")),
        "{v}"
    );
    let fields: Vec<&str> = v["error"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["field"].as_str().unwrap())
        .collect();
    for f in ["id", "url", "secret", "max_attempts", "nope"] {
        assert!(fields.contains(&f), "{f} missing: {v}");
    }
    assert!(
        !v.to_string().contains("plain\""),
        "the secret is not echoed: {v}"
    );
    let r = app
        .call("POST", "/v1/webhooks", &[], Some(b"{not json".to_vec()))
        .await;
    assert_eq!(r.status, 400);
    let (s, v) = create(
        &app,
        sink("ahead", "http://127.0.0.1:9/", json!({"from_seq": 99})),
    )
    .await;
    assert_eq!(s, 422, "{v}");
    let (s, _) = create(&app, sink("dup", "http://127.0.0.1:9/", json!({}))).await;
    assert_eq!(s, 201);
    let (s, v) = create(&app, sink("dup", "http://127.0.0.1:9/", json!({}))).await;
    assert_eq!(
        (s, v["error"]["code"].clone()),
        (409, json!("webhook_exists"))
    );
    for path in ["/v1/webhooks/nope", "/v1/webhooks/nope/dead-letters"] {
        let (s, v) = app.get(path).await;
        assert_eq!(
            (s, v["error"]["code"].clone()),
            (404, json!("webhook_not_found"))
        );
    }
    let (s, v) = app.get("/v1/webhooks/dup/dead-letters?limit=0").await;
    assert_eq!(s, 400, "{v}");
    let r = app.call("DELETE", "/v1/webhooks/dup", &[], None).await;
    assert_eq!(r.status, 204);
    let r = app.call("DELETE", "/v1/webhooks/dup", &[], None).await;
    assert_eq!(r.status, 404);
    srv.stop().await;
}

/// `kill -9` of the real binary while a sink is delivering, twice, then a clean run to the end:
/// every event the server logged reaches the receiver (at least once, so no gaps), and the first
/// delivery of each comes in `seq` order. Repeats are allowed (at-least-once) and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_delivery_loses_no_event() {
    let rx = Receiver::start(Mode::Slow(5)).await;
    let dir = temp_dir();
    let http = reqwest::Client::new();
    let (mut child, base) = spawn_bin(dir.path(), "0s", &[]);
    let put = http
        .put(format!("{base}/v1/fences/depot"))
        .json(&square("depot", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    let created = http
        .post(format!("{base}/v1/webhooks"))
        .json(&sink("crash", &rx.url(), json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    // 300 devices enter, then leave: 600 events, about 3 s of deliveries at 5 ms each.
    let devices = devs("k", 300);
    for (secs, inside) in [(0, true), (60, false)] {
        let fixes: Vec<Value> = devices.iter().map(|d| fix(d, secs, inside)).collect();
        let r = http
            .post(format!("{base}/v1/fixes"))
            .json(&fixes)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let mut base = base;
    for round in 0..2 {
        // Kill once some, not all, of the events were delivered.
        let target = 120 * (round + 1);
        rx.wait_delivered(target).await;
        let delivered = rx.delivered().len();
        assert!(
            delivered < 600,
            "round {round}: the kill came too late ({delivered})"
        );
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        (child, base) = spawn_bin(dir.path(), "0s", &[]);
    }
    let logged: Vec<Value> = http
        .get(format!("{base}/v1/events?from_seq=0&limit=10000"))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["events"]
        .as_array()
        .cloned()
        .unwrap();
    assert_eq!(logged.len(), 600, "the server logged every event");
    let want: std::collections::BTreeSet<String> = logged
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    wait_for("every logged event delivered", || {
        let got: std::collections::BTreeSet<String> =
            rx.delivered().iter().map(|r| r.id.clone()).collect();
        want.is_subset(&got)
    })
    .await;
    let delivered = rx.delivered();
    let mut seen = std::collections::BTreeSet::new();
    let mut firsts = Vec::new();
    for r in &delivered {
        assert!(signature_ok(r), "signature of {}", r.id);
        if seen.insert(r.id.clone()) {
            firsts.push(r.seq());
        }
    }
    assert!(
        firsts.windows(2).all(|w| w[0] < w[1]),
        "first deliveries in seq order"
    );
    let repeats = delivered.len() - seen.len();
    eprintln!(
        "kill -9 twice during delivery: {} deliveries of 600 events ({repeats} repeats)",
        delivered.len()
    );
    let _ = child.kill();
    let _ = child.wait();
}
