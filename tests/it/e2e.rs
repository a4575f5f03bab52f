//! End to end over real sockets: ENTER -> DWELL -> EXIT in event and live mode, subscription
//! resume, the lagged path, and shutdown with clients connected.

use std::time::Duration;

use crate::common::*;
use futures_util::SinkExt;
use serde_json::{Value, json};

fn kinds(evs: &[Value]) -> Vec<String> {
    evs.iter()
        .map(|e| e["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_dwell_exit_in_event_mode() {
    let srv = start("[time]\nclock = \"event\"\nlateness = \"0s\"\n").await;
    assert_eq!(
        srv.put_fence(
            "depot",
            square(
                "depot",
                json!({"dwell": ["10m"], "tags": {"site": "north"}})
            )
        )
        .await
        .status(),
        201
    );
    let mut sub = srv.ws("/v1/events/ws?from_seq=0").await;

    let (status, rep) = srv
        .post_fixes(json!([
            fix("truck-17", 0, true),
            fix("truck-17", 300, true)
        ]))
        .await;
    assert_eq!(status, 200, "{rep}");
    assert_eq!(rep["accepted"], 2);
    // Another device moves the watermark past the deadline (event time, not wall time).
    srv.post_fixes(fix("other", 601, false)).await;
    srv.post_fixes(fix("truck-17", 700, false)).await;

    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(
            next_json(&mut sub, Duration::from_secs(10))
                .await
                .expect("event arrives"),
        );
    }
    assert_eq!(kinds(&got), vec!["enter", "dwell", "exit"]);
    assert_eq!(
        got[1]["at"], "2026-01-01T00:10:00.000Z",
        "DWELL at is entered_at + 10m exactly"
    );
    assert_eq!(got[1]["dwell_s"], 600);
    assert_eq!(got[2]["duration_s"], 700);
    assert_eq!(got[0]["tags"]["site"], "north");
    let seqs: Vec<u64> = got.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![1, 2, 3], "seq is gap-free");
    // The same events through polling, and the device's state.
    let polled = srv.events(3).await;
    assert_eq!(
        polled.iter().map(|e| e["id"].clone()).collect::<Vec<_>>(),
        got.iter().map(|e| e["id"].clone()).collect::<Vec<_>>()
    );
    let (s, dev) = srv.get("/v1/devices/truck-17").await;
    assert_eq!(s, 200);
    assert_eq!(
        dev["pairs"].as_array().unwrap().len(),
        0,
        "the visit is over: {dev}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_dwell_exit_in_live_mode_with_a_short_dwell() {
    // In live mode W = wall - lateness, so a fix is late once it is older than the lateness when
    // it arrives: with lateness 0 any transit time at all would make it late.
    let srv = start("[time]\nclock = \"live\"\nlateness = \"1s\"\ntick = \"100ms\"\n").await;
    srv.put_fence(
        "bay",
        square("bay", json!({"dwell": ["2s"], "stale_after": "off"})),
    )
    .await;
    let mut sub = srv.ws("/v1/events/ws").await;
    let now = || chrono::Utc::now().timestamp_millis();
    let t0 = now();
    let (status, rep) = srv
        .post_fixes(json!({"device": "van-1", "ts": t0, "lat": 50.005, "lon": 10.005}))
        .await;
    assert_eq!((status, rep["accepted"].clone()), (200, json!(1)), "{rep}");
    let enter = next_json(&mut sub, Duration::from_secs(5))
        .await
        .expect("ENTER");
    assert_eq!(enter["type"], "enter");
    // Nothing else arrives: the device stays; DWELL fires from the wall clock alone.
    let dwell = next_json(&mut sub, Duration::from_secs(10))
        .await
        .expect("DWELL");
    assert_eq!(dwell["type"], "dwell");
    let at = chrono::DateTime::parse_from_rfc3339(dwell["at"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    assert_eq!(at, t0 + 2000, "at is the deadline, not the firing time");
    let emitted = chrono::DateTime::parse_from_rfc3339(dwell["emitted_at"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    assert!(
        emitted >= at,
        "never early: emitted {emitted} < deadline {at}"
    );
    srv.post_fixes(json!({"device": "van-1", "ts": now(), "lat": 50.05, "lon": 10.05}))
        .await;
    let exit = next_json(&mut sub, Duration::from_secs(5))
        .await
        .expect("EXIT");
    assert_eq!(exit["type"], "exit");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_resumes_from_seq_after_a_disconnect() {
    let srv = start("[time]\nclock = \"event\"\nlateness = \"0s\"\n").await;
    srv.put_fence("a", square("a", json!({}))).await;
    let mut sub = srv.ws("/v1/events/ws?from_seq=1&types=enter").await;
    srv.post_fixes(json!([fix("d1", 0, true), fix("d2", 1, true)]))
        .await;
    let first = next_json(&mut sub, Duration::from_secs(5)).await.unwrap();
    let seq = first["seq"].as_u64().unwrap();
    drop(sub);
    // While disconnected: more events.
    srv.post_fixes(json!([fix("d3", 2, true), fix("d1", 3, false)]))
        .await;
    let mut sub = srv
        .ws(&format!("/v1/events/ws?from_seq={}&types=enter", seq + 1))
        .await;
    let mut rest = Vec::new();
    while let Some(e) = next_json(&mut sub, Duration::from_millis(1500)).await {
        rest.push(e);
    }
    let devices: Vec<&str> = rest.iter().map(|e| e["device"].as_str().unwrap()).collect();
    assert_eq!(
        rest.len(),
        2,
        "exactly the ENTERs after the last seen seq: {rest:?}"
    );
    assert!(devices.contains(&"d3"));
    assert!(
        rest.iter().all(|e| e["type"] == "enter"),
        "types filter holds"
    );
    // fence glob and device filters
    let mut by_dev = srv.ws("/v1/events/ws?from_seq=0&device=d1&fence=a*").await;
    let d1: Vec<Value> = {
        let mut v = Vec::new();
        while let Some(e) = next_json(&mut by_dev, Duration::from_millis(1500)).await {
            v.push(e);
        }
        v
    };
    assert_eq!(kinds(&d1), vec!["enter", "exit"]);
    let mut no_match = srv.ws("/v1/events/ws?from_seq=0&fence=zzz*").await;
    assert!(
        next_json(&mut no_match, Duration::from_millis(800))
            .await
            .is_none()
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_falls_behind_is_told_and_can_resume_without_loss() {
    let srv =
        start("[time]\nclock = \"event\"\nlateness = \"0s\"\n[events]\nsubscriber_queue = 5\n")
            .await;
    srv.put_fence("a", square("a", json!({}))).await;
    let mut sub = srv.ws("/v1/events/ws").await;
    // One request makes 20 ENTERs at once: more than the subscriber's queue of 5.
    let fixes: Vec<Value> = (0..20).map(|i| fix(&format!("dev-{i}"), i, true)).collect();
    srv.post_fixes(Value::Array(fixes)).await;
    let lagged = next_json(&mut sub, Duration::from_secs(5))
        .await
        .expect("lagged frame");
    assert_eq!(lagged["type"], "lagged", "{lagged}");
    let resume = lagged["resume_from"].as_u64().unwrap();
    assert_eq!(close_code(&mut sub).await, Some(1008));
    // Resuming replays the backlog (no lag while catching up) and loses nothing.
    let mut sub = srv.ws(&format!("/v1/events/ws?from_seq={resume}")).await;
    let mut got = Vec::new();
    while let Some(e) = next_json(&mut sub, Duration::from_millis(1500)).await {
        got.push(e["seq"].as_u64().unwrap());
    }
    assert_eq!(got, (resume..resume + 20).collect::<Vec<_>>());
    let (_, m) = (0, srv.metrics().await);
    assert!(
        m.contains("geodwell_subscribers_lagged_total"),
        "lagged metric exported"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_clients_connected_closes_them_and_exits_cleanly() {
    let srv = start("[time]\nclock = \"event\"\n").await;
    let mut sub = srv.ws("/v1/events/ws").await;
    let mut ing = srv.ws("/v1/ingest/ws").await;
    ing.send(tokio_tungstenite::tungstenite::Message::Text(
        fix("x", 0, true).to_string().into(),
    ))
    .await
    .unwrap();
    let rep = next_json(&mut ing, Duration::from_secs(5)).await.unwrap();
    assert_eq!(rep["accepted"], 1);
    srv.svc.begin_shutdown(Duration::from_secs(10));
    assert_eq!(
        close_code(&mut sub).await,
        Some(1001),
        "subscriber told the server is going away"
    );
    assert_eq!(
        close_code(&mut ing).await,
        Some(1001),
        "ingest socket told too"
    );
    let res = tokio::time::timeout(Duration::from_secs(15), srv.svc.wait()).await;
    assert!(matches!(res, Ok(Ok(()))), "{res:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_readiness() {
    let srv = start("").await;
    srv.post_fixes(
        json!({"device": "m", "ts": chrono::Utc::now().timestamp_millis(), "lat": 1.0, "lon": 1.0}),
    )
    .await;
    let m = srv.metrics().await;
    for name in [
        "geodwell_fixes_received_total",
        "geodwell_http_requests_total",
        "geodwell_pairs_live",
        "geodwell_wheel_timers_live",
        "geodwell_wheel_tombstones",
        "geodwell_wheel_carry",
        "geodwell_wheel_tick_duration_seconds",
        "geodwell_watermark_lag_seconds",
    ] {
        assert!(m.contains(name), "{name} missing from /metrics");
    }
    assert!(
        m.contains("route=\"/v1/fixes\""),
        "requests are labelled by matched route"
    );
    assert_eq!(srv.get("/healthz").await.0, 200);
    let (s, r) = srv.get("/readyz").await;
    assert_eq!((s, r["status"].clone()), (200, json!("ready")));
    srv.stop().await;
}

/// A fresh process (its own recorder): every counter with known label values is exported at 0
/// before anything happens, with build info and process metrics; and in live mode the
/// ingest-to-event histogram holds one sample per event, measured from the arrival of the fix
/// that decided it (so its wait for the watermark, the lateness, is in it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_exist_from_the_start_and_latency_covers_every_event() {
    let dir = temp_dir();
    let child = serve_cmd(dir.path())
        .args(["--clock", "live", "--lateness", "1s"])
        .env("GEODWELL_FENCES_FILE", "")
        .env("GEODWELL_DURABILITY", "none")
        .spawn()
        .unwrap();
    let mut child = Proc(child);
    let base = format!("http://{}", listening_addr(&mut child, None));
    let http = reqwest::Client::new();
    let scrape = || async {
        http.get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let m = scrape().await;
    for line in [
        "geodwell_fixes_received_total{transport=\"http\"} 0",
        "geodwell_fixes_received_total{transport=\"owntracks\"} 0",
        "geodwell_fixes_rejected_total{reason=\"buffer_full\"} 0",
        "geodwell_fixes_rejected_total{reason=\"overloaded\"} 0",
        "geodwell_fixes_late_total{reason=\"too_old\"} 0",
        "geodwell_fixes_late_total{reason=\"behind_device\"} 0",
        "geodwell_fixes_duplicate_total 0",
        "geodwell_events_emitted_total{type=\"dwell\"} 0",
        "geodwell_devices_removed_total{reason=\"idle\"} 0",
        "geodwell_subscribers_lagged_total 0",
    ] {
        assert!(
            m.lines().any(|l| l == line),
            "{line} missing at start:\n{m}"
        );
    }
    assert!(m.contains("geodwell_build_info{"), "{m}");
    for name in [
        "geodwell_process_resident_memory_bytes",
        "geodwell_process_open_fds",
        "geodwell_process_max_fds",
        "geodwell_process_start_time_seconds",
    ] {
        assert!(metric(&m, name) > 0.0, "{name}: {m}");
    }
    // Whole seconds (a counter), so 0 this early.
    assert!(m.contains("\ngeodwell_process_cpu_seconds_total "), "{m}");

    let r = http
        .put(format!("{base}/v1/fences/depot"))
        .json(&square("depot", json!({"dwell": ["1s"]})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // Three devices enter now; each fix waits a second (the lateness) for the watermark.
    let now = chrono::Utc::now().timestamp_millis();
    let fixes: Vec<Value> = (0..3)
        .map(|i| json!({"device": format!("d{i}"), "ts": now, "lat": 50.005, "lon": 10.005}))
        .collect();
    let r = http
        .post(format!("{base}/v1/fixes"))
        .json(&fixes)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // 3 ENTERs, then 3 DWELLs one second later (fired by time alone).
    let t0 = std::time::Instant::now();
    let m = loop {
        let m = scrape().await;
        if metric(&m, "geodwell_events_emitted_total") >= 6.0 {
            break m;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let count = metric(&m, "geodwell_ingest_to_event_latency_seconds_count");
    let sum = metric(&m, "geodwell_ingest_to_event_latency_seconds_sum");
    assert_eq!(count, 6.0, "one sample per event:\n{m}");
    // ENTERs waited about the lateness since their fix arrived; DWELLs are measured from the
    // watermark passing their deadline (a tick at most).
    assert!(
        sum >= 3.0 * 0.9,
        "ENTERs include their wait for the watermark: sum {sum}"
    );
    assert!(sum < 6.0 * 3.0, "sum {sum}");
    drop(child);
}
