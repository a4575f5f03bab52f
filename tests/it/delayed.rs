//! Delayed data from real trackers, on a live clock with the default settings: a fix that
//! arrives after the watermark passed it is applied in its device's own event time (not dropped
//! as late), and an offline queue, whether it arrives in one request or one MQTT message per
//! position, gives the events on-time delivery would have given (the core's naive reference
//! computes those), DWELLs included (docs/semantics.md 2.5).

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use geodwell_core::fences::{Fence, FenceLimits};
use geodwell_core::fix::Fix;
use geodwell_core::time::Ts;
use serde_json::{Value, json};

use crate::common::*;

/// The depot: the square of `common::square`, with a 10-minute dwell threshold.
fn depot() -> Value {
    square("depot", json!({"dwell": ["10m"]}))
}

/// A fences file holding the depot. A fence put over the API applies from the watermark it was
/// created at (fixes from before it never enter it); a preloaded one stands for a depot that
/// has long been there, so the hour-old queue can enter it.
fn depot_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("fences.geojson");
    let collection = json!({"type": "FeatureCollection", "features": [depot()]});
    std::fs::write(&path, collection.to_string()).unwrap();
    path
}

/// A server on a live clock with the default settings and the depot preloaded; the returned
/// directory holds the fences file.
async fn live_server() -> (Srv, tempfile::TempDir) {
    let dir = temp_dir();
    let file = depot_file(dir.path());
    let mut cfg = config("");
    cfg.fences_file = geodwell::config::FencePreload::File(file);
    (start_cfg(cfg).await, dir)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// An hour of a phone's positions, one a minute, ending `end_ago` before now: 20 minutes
/// outside, 25 inside (ENTER, then DWELL after 10), 15 outside (EXIT). (ts ms, inside).
fn queue(end_ago_ms: i64) -> Vec<(i64, bool)> {
    // Whole seconds: OwnTracks carries its time in seconds.
    let start = (now_ms() - end_ago_ms - 59 * 60_000) / 1000 * 1000;
    (0..60)
        .map(|m| (start + m * 60_000, (20..45).contains(&m)))
        .collect()
}

/// The events (id, type, at) the naive reference gives for `fixes` of one device once the
/// watermark is past all of them.
fn reference(device: &str, fixes: &[(i64, bool)]) -> BTreeSet<String> {
    let feat: geojson::Feature = serde_json::from_value(depot()).unwrap();
    let fence = Arc::new(Fence::from_feature(&feat, None, &FenceLimits::default()).unwrap());
    let core: Vec<Fix> = fixes
        .iter()
        .map(|&(ts, inside)| {
            let (lat, lon) = if inside {
                (50.005, 10.005)
            } else {
                (50.05, 10.05)
            };
            Fix::new(device, Ts(ts), lat, lon, None, 128).unwrap()
        })
        .collect();
    let w = Ts(now_ms());
    geodwell_core::reference::expected_events(&[fence], &core, w)
        .iter()
        .map(|e| {
            let v = serde_json::to_value(e).unwrap();
            format!("{} {} {}", v["id"], v["type"], v["at"])
        })
        .collect()
}

/// The events the server holds for `device`, as the reference writes them, once `n` are there.
async fn events_of_device(srv: &Srv, device: &str, n: usize) -> BTreeSet<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: BTreeSet<String> = all_events(&srv.http, &srv.base)
            .await
            .iter()
            .filter(|e| e["device"] == device)
            .map(|e| format!("{} {} {}", e["id"], e["type"], e["at"]))
            .collect();
        if got.len() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{device}: only {} of {n} events: {got:?}",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An OwnTracks location (the booklet's fields) at `ts` ms.
fn owntracks(ts: i64, inside: bool) -> String {
    let (lat, lon) = if inside {
        (50.005, 10.005)
    } else {
        (50.05, 10.05)
    };
    json!({"_type": "location", "tid": "ph", "lat": lat, "lon": lon, "tst": ts / 1000,
           "acc": 10, "t": "u"})
    .to_string()
}

/// A fix 30 s old, of a device never seen, is applied (its ENTER emitted at its own time) on a
/// live clock with the default 2 s lateness; the device view shows how late it arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fix_thirty_seconds_late_gives_its_enter() {
    let (srv, _dir) = live_server().await;
    let ts = now_ms() - 30_000;
    let (s, rep) = srv
        .post_fixes(json!({"device": "late-truck", "ts": ts, "lat": 50.005, "lon": 10.005}))
        .await;
    assert_eq!(s, 200, "{rep}");
    assert_eq!(rep["accepted"], 1, "{rep}");
    let evs = srv.events(1).await;
    let enter = evs
        .iter()
        .find(|e| e["device"] == "late-truck")
        .unwrap_or_else(|| panic!("no ENTER: {evs:?}"));
    assert_eq!(enter["type"], "enter");
    assert_eq!(
        enter["at"].as_str().unwrap(),
        Ts(ts).to_rfc3339(),
        "at is the fix's own time"
    );
    let (s, dev) = srv.get("/v1/devices/late-truck").await;
    assert_eq!(s, 200);
    assert_eq!(
        dev["frontier"].as_str().unwrap(),
        Ts(ts).to_rfc3339(),
        "{dev}"
    );
    let lag = dev["arrival_lag_s"].as_f64().unwrap();
    assert!((27.0..40.0).contains(&lag), "arrival lag {lag}: {dev}");
    assert_eq!(dev["delayed"][0]["outcome"], "applied", "{dev}");
    // The same fix again is behind the device now, with its reason in the answer.
    let (_, rep) = srv
        .post_fixes(json!({"device": "late-truck", "ts": ts - 1000, "lat": 50.0, "lon": 10.0}))
        .await;
    assert_eq!(rep["late"], 1, "{rep}");
    assert_eq!(rep["late_items"][0]["reason"], "behind_device", "{rep}");
    let m = srv.metrics().await;
    assert!(
        metric(&m, "geodwell_fixes_late_total{reason=\"behind_device\"}") >= 1.0,
        "{m}"
    );
    assert!(
        metric(&m, "geodwell_fix_arrival_delay_seconds_count") >= 1.0,
        "the arrival delay histogram: {m}"
    );
    srv.stop().await;
}

/// An hour's OwnTracks queue posted to the OwnTracks HTTP route one position per request, as the
/// app's HTTP mode sends it when its link returns: the events of on-time delivery (ENTER,
/// DWELL, EXIT), ids included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hour_of_owntracks_queue_one_post_per_position_gives_the_on_time_events() {
    let (srv, _dir) = live_server().await;
    let q = queue(5 * 60_000);
    let want = reference("jane/phone", &q);
    assert_eq!(want.len(), 3, "ENTER, DWELL, EXIT: {want:?}");
    // The app's HTTP mode posts its queue as an array of location messages.
    let body: Vec<Value> = q
        .iter()
        .map(|&(ts, inside)| serde_json::from_str(&owntracks(ts, inside)).unwrap())
        .collect();
    for chunk in body.chunks(1) {
        let r = srv
            .http
            .post(srv.url("/v1/trackers/owntracks"))
            .header("x-limit-u", "jane")
            .header("x-limit-d", "phone")
            .json(&chunk[0])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }
    let got = events_of_device(&srv, "jane/phone", 3).await;
    assert_eq!(got, want);
    srv.stop().await;
}

/// The same hour's queue over generic JSON in one `POST /v1/fixes`: the on-time events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hour_of_queue_in_one_request_gives_the_on_time_events() {
    let (srv, _dir) = live_server().await;
    let q = queue(5 * 60_000);
    let fixes: Vec<Value> = q
        .iter()
        .map(|&(ts, inside)| {
            let (lat, lon) = if inside {
                (50.005, 10.005)
            } else {
                (50.05, 10.05)
            };
            json!({"device": "truck-q", "ts": ts, "lat": lat, "lon": lon})
        })
        .collect();
    let (s, rep) = srv.post_fixes(Value::Array(fixes)).await;
    assert_eq!(s, 200, "{rep}");
    assert_eq!(rep["accepted"], 60, "{rep}");
    let got = events_of_device(&srv, "truck-q", 3).await;
    assert_eq!(got, reference("truck-q", &q));
    srv.stop().await;
}

/// An hour's OwnTracks queue over MQTT, one message per position (as the app sends it when its
/// link returns), to the real binary on a live clock with the default settings: the on-time
/// events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hour_of_owntracks_queue_over_mqtt_gives_the_on_time_events() {
    let run = format!("dq{}x{}", std::process::id(), now_ms() % 1_000_000);
    let dir = temp_dir();
    let file = depot_file(dir.path());
    let mut child = Proc(
        serve_cmd(&dir.path().join("data"))
            .env("GEODWELL_FENCES_FILE", &file)
            .env("GEODWELL_MQTT_URL", "mqtt://127.0.0.1:1883")
            .env("GEODWELL_MQTT_TOPICS", format!("owntracks/{run}/+"))
            .env("GEODWELL_MQTT_CLIENT_ID", &run)
            .spawn()
            .expect("binary starts"),
    );
    let base = format!("http://{}", listening_addr(&mut child, None));
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r: Value = get_value(&http, format!("{base}/readyz")).await;
        if r["mqtt"]["connected"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "MQTT never connected: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let q = queue(10 * 60_000);
    let device = format!("{run}/phone");
    for &(ts, inside) in &q {
        let ok = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", "1883", "-q", "1"])
            .args([
                "-t",
                &format!("owntracks/{device}"),
                "-m",
                &owntracks(ts, inside),
            ])
            .stderr(Stdio::null())
            .status()
            .expect("mosquitto_pub runs")
            .success();
        assert!(ok);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let got = loop {
        let got: BTreeSet<String> = all_events(&http, &base)
            .await
            .iter()
            .filter(|e| e["device"] == device.as_str())
            .map(|e| format!("{} {} {}", e["id"], e["type"], e["at"]))
            .collect();
        if got.len() >= 3 {
            break got;
        }
        assert!(Instant::now() < deadline, "only {got:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(got, reference(&device, &q));
    drop(child);
}
