//! MQTT and NATS integrations against real brokers and real clients: the machine's Mosquitto
//! (127.0.0.1:1883) and NATS (127.0.0.1:4222, JetStream) for the end-to-end paths, and a
//! Mosquitto of the test's own (a free port, persistence in a temp dir) to restart mid-run.
//! Publishers and subscribers are Debian's `mosquitto_pub` / `mosquitto_sub` (mosquitto-clients,
//! which `.ci/run` installs when missing). Every topic and subject carries a run id, so tests
//! on the shared brokers never see each other's messages.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{Value, json};

/// A run id: unique per test process and call.
fn run_id(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{what}{}x{nanos}", std::process::id())
}

/// `mosquitto_pub -q 1`: true once the broker acknowledged the message.
fn publish(port: u16, topic: &str, payload: &str) -> bool {
    Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1"])
        .args(["-t", topic, "-m", payload])
        .stderr(Stdio::null())
        .status()
        .expect("mosquitto_pub runs (Debian's mosquitto-clients)")
        .success()
}

/// Publishes until the broker acknowledges (a broker restarting refuses for a moment).
fn publish_acked(port: u16, topic: &str, payload: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !publish(port, topic, payload) {
        assert!(Instant::now() < deadline, "the broker never took {topic}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `mosquitto_sub -v` with a persistent session (`-c -i`), lines collected on a thread.
struct Sub {
    _child: Proc,
    lines: Arc<Mutex<Vec<(String, Value)>>>,
}

impl Sub {
    fn start(port: u16, filter: &str, id: &str) -> Sub {
        let mut child = Proc(
            Command::new("mosquitto_sub")
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1", "-v"])
                .args(["-c", "-i", id, "-t", filter])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("mosquitto_sub runs"),
        );
        let out = child.0.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some((topic, body)) = l.split_once(' ')
                    && let Ok(v) = serde_json::from_str::<Value>(body)
                {
                    sink.lock().unwrap().push((topic.to_string(), v));
                }
            }
        });
        Sub {
            _child: child,
            lines,
        }
    }

    fn got(&self) -> Vec<(String, Value)> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits until the messages' distinct event ids include all of `ids`.
    async fn wait_ids(&self, ids: &[String]) -> Vec<(String, Value)> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = self.got();
            let seen: std::collections::HashSet<&str> =
                got.iter().filter_map(|(_, v)| v["id"].as_str()).collect();
            let missing: Vec<&String> = ids.iter().filter(|i| !seen.contains(i.as_str())).collect();
            if missing.is_empty() {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {} events never arrived on MQTT, e.g. {:?}",
                missing.len(),
                ids.len(),
                missing.first()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A Mosquitto of the test's own, with persistence, that can be restarted on its port. It sends
/// a subscriber as many QoS 1 messages at once as the subscriber takes (no in-flight limit of
/// its own), as a busy production broker may.
struct Broker {
    port: u16,
    conf: std::path::PathBuf,
    child: Option<Proc>,
    _dir: tempfile::TempDir,
}

impl Broker {
    fn start() -> Broker {
        let dir = temp_dir();
        let port = crate::common::free_port();
        // Mosquitto started as root drops to its own user: it must be able to write its
        // persistence file here, or sessions would not survive the restart.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n\
                 persistence_location {}/\nmax_queued_messages 100000\n\
                 max_inflight_messages 0\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let mut b = Broker {
            port,
            conf,
            child: None,
            _dir: dir,
        };
        b.run();
        b
    }

    fn run(&mut self) {
        let bin = ["/usr/sbin/mosquitto", "mosquitto"]
            .into_iter()
            .find(|b| !b.starts_with('/') || std::path::Path::new(b).exists())
            .unwrap();
        let child = Command::new(bin)
            .arg("-c")
            .arg(&self.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto (the broker) runs");
        self.child = Some(Proc(child));
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "mosquitto did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the broker the way a service manager does (SIGTERM: it saves its sessions and
    /// queued messages) and starts it again on the same port.
    fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.0.id() as i32, libc::SIGTERM) };
            let _ = c.0.wait();
        }
        std::thread::sleep(Duration::from_millis(500));
        self.run();
    }
}

fn ids(evs: &[Value]) -> Vec<String> {
    evs.iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

/// Waits until the server at `base` reports its MQTT connection up (`/readyz`).
async fn wait_connected(http: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r: Value = get_value(http, format!("{base}/readyz")).await;
        if r["mqtt"]["connected"] == true {
            return;
        }
        assert!(Instant::now() < deadline, "never connected: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls until `cond` holds for the server's events (generous: the machine is shared).
async fn wait_events(
    base: &str,
    http: &reqwest::Client,
    what: &str,
    cond: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let evs = all_events(http, base).await;
        if cond(&evs) {
            return evs;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: never; {} events",
            evs.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// OwnTracks' MQTT mode (topic `owntracks/<user>/<device>`, the booklet's location payload) and
/// generic JSON fixes on another topic become fixes and events; an unreadable message is one
/// rejected fix and changes nothing else; `/readyz` and the metrics show the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owntracks_and_json_messages_become_fixes_and_events() {
    let run = run_id("ot");
    let srv = start(&format!(
        "[time]\nclock = \"event\"\nlateness = \"0s\"\n[mqtt]\nurl = \"mqtt://127.0.0.1:1883\"\n\
         topics = [\"owntracks/{run}/+\", \"gd/{run}/fixes/#\"]\nclient_id = \"{run}\"\n"
    ))
    .await;
    assert_eq!(
        srv.put_fence("depot", square("depot", json!({})))
            .await
            .status(),
        201
    );
    wait_connected(&srv.http, &srv.base).await;
    // The booklet's location message, inside the depot.
    let tst = T0 / 1000;
    let loc = |tst: i64, inside: bool| {
        let (lat, lon) = if inside {
            (50.005, 10.005)
        } else {
            (50.05, 10.05)
        };
        json!({"_type": "location", "tid": "ph", "lat": lat, "lon": lon, "tst": tst,
               "acc": 12, "batt": 80, "conn": "w", "vel": 18, "t": "u"})
        .to_string()
    };
    assert!(publish(
        1883,
        &format!("owntracks/{run}/phone"),
        &loc(tst, true)
    ));
    // Other message types are no fix; neither is an empty (retained-clearing) payload.
    let lwt = json!({"_type": "lwt", "tst": tst}).to_string();
    assert!(publish(1883, &format!("owntracks/{run}/phone"), &lwt));
    // Generic fixes, one message holding an array.
    let batch = json!([fix("truck-1", 0, true), fix("truck-2", 0, true)]).to_string();
    assert!(publish(1883, &format!("gd/{run}/fixes/a"), &batch));
    assert!(publish(1883, &format!("gd/{run}/fixes/a"), "not json"));
    assert!(publish(
        1883,
        &format!("gd/{run}/fixes/b"),
        &fix("truck-1", 60, false).to_string()
    ));
    assert!(publish(
        1883,
        &format!("owntracks/{run}/phone"),
        &loc(tst + 60, false)
    ));
    let want = |evs: &[Value]| evs.len() >= 5;
    let evs = wait_events(&srv.base, &srv.http, "5 events", want).await;
    let mut got: Vec<(String, String)> = evs
        .iter()
        .map(|e| {
            (
                e["device"].as_str().unwrap().to_string(),
                e["type"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    let me = format!("{run}/phone");
    let mut expect = vec![
        (me.clone(), "enter".to_string()),
        (me.clone(), "exit".to_string()),
        ("truck-1".into(), "enter".into()),
        ("truck-1".into(), "exit".into()),
        ("truck-2".into(), "enter".into()),
    ];
    expect.sort();
    assert_eq!(got, expect);
    let enter = evs
        .iter()
        .find(|e| e["device"] == me.as_str() && e["type"] == "enter")
        .unwrap();
    assert_eq!(enter["lat"], 50.005, "{enter}");
    assert_eq!(enter["accuracy"], 12.0, "{enter}");
    let (s, d) = srv
        .get(&format!("/v1/devices/{}", me.replace('/', "%2F")))
        .await;
    assert_eq!(s, 200, "{d}");
    let metrics = srv.metrics().await;
    // This is the one in-process server reading MQTT; `malformed_json` is shared with others.
    for line in [
        "geodwell_fixes_received_total{transport=\"mqtt\"} 6",
        "geodwell_mqtt_connected 1",
        "geodwell_mqtt_messages_total 6",
        "geodwell_fixes_rejected_total{reason=\"malformed_json\"} ",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    srv.stop().await;
}

/// Events reach an MQTT topic (QoS 1, templated by fence and type), a NATS subject held by a
/// JetStream stream (one stream message per event, `Nats-Msg-Id` = event id) and a plain NATS
/// subject, each as the event's JSON; filters apply as for webhooks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_an_mqtt_topic_a_nats_stream_and_a_nats_subject() {
    let run = run_id("sk");
    let sub = Sub::start(1883, &format!("gd/{run}/events/#"), &format!("{run}-sub"));
    let nats = async_nats::connect("127.0.0.1:4222")
        .await
        .expect("the machine's NATS at 127.0.0.1:4222");
    let js = async_nats::jetstream::new(nats.clone());
    let stream_name = format!("GDTEST_{}", run.to_uppercase());
    let mut stream = js
        .create_stream(async_nats::jetstream::stream::Config {
            name: stream_name.clone(),
            subjects: vec![format!("gdjs.{run}.>")],
            max_messages: 10_000,
            ..Default::default()
        })
        .await
        .expect("JetStream is on at 127.0.0.1:4222");
    let mut core = nats.subscribe(format!("gdcore.{run}.>")).await.unwrap();
    nats.flush().await.unwrap();

    let srv = start("[time]\nclock = \"event\"\nlateness = \"0s\"\n").await;
    assert_eq!(
        srv.put_fence("depot", square("depot", json!({})))
            .await
            .status(),
        201
    );
    let sinks = [
        json!({"id": "mq", "url": format!("mqtt://127.0.0.1:1883/gd/{run}/events/{{fence}}/{{type}}")}),
        json!({"id": "js", "url": format!("nats://127.0.0.1:4222/gdjs.{run}.{{fence}}.{{type}}")}),
        json!({"id": "core", "url": format!("nats://127.0.0.1:4222/gdcore.{run}.{{device}}"), "types": ["enter"]}),
    ];
    for s in &sinks {
        let r = srv
            .http
            .post(srv.url("/v1/webhooks"))
            .json(s)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    }
    // A secret on a broker sink is refused (nothing would sign with it).
    let r = srv
        .http
        .post(srv.url("/v1/webhooks"))
        .json(&json!({"id": "x", "url": "mqtt://127.0.0.1:1883/t", "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwZbMA3wnmMvI="}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let devices: Vec<String> = (0..10).map(|i| format!("v.{i}")).collect();
    for (secs, inside) in [(0, true), (60, false)] {
        let fixes: Vec<Value> = devices.iter().map(|d| fix(d, secs, inside)).collect();
        let (s, rep) = srv.post_fixes(json!(fixes)).await;
        assert_eq!(s, 200, "{rep}");
    }
    let evs = wait_events(&srv.base, &srv.http, "20 events", |e| e.len() >= 20).await;
    let want = ids(&evs);
    // MQTT: every event on its fence/type topic, the body the event's JSON.
    let got = sub.wait_ids(&want).await;
    for (topic, v) in &got {
        assert_eq!(
            topic,
            &format!("gd/{run}/events/depot/{}", v["type"].as_str().unwrap())
        );
        let e = evs.iter().find(|e| e["id"] == v["id"]).unwrap();
        assert_eq!(v, e);
    }
    // JetStream: one message per event, deduplicated by id.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let info = stream.info().await.unwrap();
        if info.state.messages >= 20 {
            assert_eq!(info.state.messages, 20, "one stream message per event");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stream holds {}",
            info.state.messages
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for seq in 1..=20u64 {
        let m = stream.get_raw_message(seq).await.unwrap();
        let v: Value = serde_json::from_slice(&m.payload).unwrap();
        let msg_id = m
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|h| h.as_str().to_string());
        assert_eq!(msg_id.as_deref(), v["id"].as_str());
        assert_eq!(
            m.subject.as_str(),
            format!("gdjs.{run}.depot.{}", v["type"].as_str().unwrap())
        );
    }
    // Core NATS: the ENTERs only (the sink's filter), on per-device subjects ('.' in a device
    // id becomes '_', so one id is one token).
    use futures_util::StreamExt;
    let mut enters = Vec::new();
    while enters.len() < 10 {
        let m = tokio::time::timeout(Duration::from_secs(60), core.next())
            .await
            .expect("ENTERs on the core subject")
            .unwrap();
        let v: Value = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(v["type"], "enter");
        let dev = v["device"].as_str().unwrap().replace('.', "_");
        assert_eq!(m.subject.as_str(), format!("gdcore.{run}.{dev}"));
        enters.push(v["id"].as_str().unwrap().to_string());
    }
    // Each NATS sink remembers the stream lookup of every subject it published to: the JetStream
    // sink two (ENTER and EXIT of one fence), the core sink one per device. Deleting a sink
    // closes its connection, and its lookups go with it.
    let cache = |m: &str, sink: &str| {
        metric(
            m,
            &format!("geodwell_webhook_subject_cache_entries{{sink=\"{sink}\"}}"),
        )
    };
    let m = srv.metrics().await;
    for (sink, subjects) in [("js", 2.0), ("core", 10.0)] {
        let failed = metric(
            &m,
            &format!("geodwell_webhook_failed_total{{sink=\"{sink}\"}}"),
        );
        if failed == 0.0 {
            assert_eq!(cache(&m, sink), subjects, "{m}");
        } else {
            // A failed attempt dropped the connection and its lookups; the one after it looked
            // up only the subjects it published to since.
            assert!((1.0..=subjects).contains(&cache(&m, sink)), "{m}");
        }
    }
    let r = srv.delete("/v1/webhooks/core").await;
    assert!(r.status().is_success(), "{}", r.status());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = srv.metrics().await;
        if cache(&m, "core") == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "core sink's subject cache after delete:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, st) = srv.get("/v1/webhooks/js").await;
    assert_eq!(st["status"]["dead_lettered"], 0, "{st}");
    assert_eq!(
        st["url"],
        format!("nats://127.0.0.1:4222/gdjs.{run}.{{fence}}.{{type}}")
    );
    js.delete_stream(&stream_name).await.unwrap();
    drop(sub);
    srv.stop().await;
}

/// Fixes over MQTT and events out over MQTT while the broker restarts and geodwell is killed
/// (`kill -9`) mid-run: every fix the broker acknowledged to the publisher is applied exactly
/// once (the events equal those of the input, no id twice), and every event reaches the
/// subscriber at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_and_a_kill_9_lose_no_fix_and_no_event() {
    let run = run_id("rs");
    let mut broker = Broker::start();
    let port = broker.port;
    let sub = Sub::start(port, "gd/events/#", &format!("{run}-sub"));
    let dir = temp_dir();
    let url = format!("mqtt://127.0.0.1:{port}");
    let client_id = format!("{run}-geodwell");
    let env = [
        ("GEODWELL_MQTT_URL", url.as_str()),
        ("GEODWELL_MQTT_TOPICS", "gd/fixes/#"),
        ("GEODWELL_MQTT_CLIENT_ID", client_id.as_str()),
    ];
    let http = reqwest::Client::new();
    let (mut child, mut base) = spawn_bin(dir.path(), "0s", &env);
    let r = http
        .put(format!("{base}/v1/fences/depot"))
        .json(&square("depot", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = http
        .post(format!("{base}/v1/webhooks"))
        .json(&json!({"id": "out", "url": format!("mqtt://127.0.0.1:{port}/gd/events/{{device}}/{{type}}"),
                      "timeout": "2s", "backoff_base": "50ms", "backoff_max": "500ms", "max_attempts": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    // Wait for the ingest subscription before the first message (the session starts then).
    wait_connected(&http, &base).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let devices: Vec<String> = (0..20).map(|i| format!("d{i}")).collect();
    const ROUNDS: i64 = 10;
    for round in 0..ROUNDS {
        // In on even rounds, out on odd: one ENTER or EXIT per device per round.
        let fixes: Vec<Value> = devices
            .iter()
            .map(|d| fix(d, round * 60, round % 2 == 0))
            .collect();
        publish_acked(port, "gd/fixes/all", &json!(fixes).to_string());
        if round == 3 {
            broker.restart();
        }
        if round == 6 {
            child.0.kill().unwrap();
            let _ = child.0.wait();
            // Messages published while geodwell is away wait in its session at the broker.
            publish_acked(
                port,
                "gd/fixes/all",
                &json!(
                    devices
                        .iter()
                        .map(|d| fix(d, 7 * 60, false))
                        .collect::<Vec<_>>()
                )
                .to_string(),
            );
            let (c, b) = spawn_bin(dir.path(), "0s", &env);
            (child, base) = (c, b);
        }
    }
    // Round 7's fixes were published above already; publishing them again is a duplicate.
    let total = devices.len() * ROUNDS as usize;
    let evs = wait_events(&base, &http, "every fix applied", |e| e.len() >= total).await;
    assert_eq!(evs.len(), total, "no event twice, none lost");
    let mut per_device: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for e in &evs {
        per_device
            .entry(e["device"].as_str().unwrap())
            .or_default()
            .push(e["type"].as_str().unwrap());
    }
    for d in &devices {
        let want: Vec<&str> = (0..ROUNDS)
            .map(|r| if r % 2 == 0 { "enter" } else { "exit" })
            .collect();
        assert_eq!(per_device.get(d.as_str()), Some(&want), "{d}");
    }
    let mut unique = ids(&evs);
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), total);
    sub.wait_ids(&ids(&evs)).await;
    let st: Value = get_value(&http, format!("{base}/v1/webhooks/out")).await;
    assert_eq!(st["status"]["dead_lettered"], 0, "{st}");
    drop(sub);
    drop(child);
}

/// Publishes a file's content with `mosquitto_pub -f` (large payloads), QoS 1.
fn publish_file(port: u16, topic: &str, file: &std::path::Path) -> bool {
    Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1"])
        .args(["-t", topic, "-f"])
        .arg(file)
        .stderr(Stdio::null())
        .status()
        .expect("mosquitto_pub runs")
        .success()
}

/// A JSON array of `n` fixes inside the square, devices `{prefix}{k}`.
fn fixes_array(prefix: &str, n: usize, secs: i64) -> String {
    let fixes: Vec<Value> = (0..n)
        .map(|k| fix(&format!("{prefix}{k}"), secs, true))
        .collect();
    json!(fixes).to_string()
}

/// MQTT ingest keeps HTTP's bounds: a message holding more than `ingest.max_batch` fixes is one
/// rejected item (HTTP answers such a body 413), and a message larger than
/// `ingest.max_body_bytes` is never read at all: MQTT 5's Maximum Packet Size has the broker
/// drop it, so it neither costs memory nor comes back at every reconnect to stall ingest.
/// Messages whose fixes together exceed `max_batch` are split over batches, every fix applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_messages_are_held_to_max_batch_and_max_body_bytes() {
    let run = run_id("mb");
    let broker = Broker::start();
    let port = broker.port;
    let dir = temp_dir();
    let url = format!("mqtt://127.0.0.1:{port}");
    let topics = format!("gd/{run}/#");
    let env = [
        ("GEODWELL_MQTT_URL", url.as_str()),
        ("GEODWELL_MQTT_TOPICS", topics.as_str()),
        ("GEODWELL_MQTT_CLIENT_ID", run.as_str()),
        ("GEODWELL_MAX_BATCH", "1000"),
        ("GEODWELL_MAX_BODY_BYTES", "1048576"),
    ];
    let http = reqwest::Client::new();
    let (child, base) = spawn_bin(dir.path(), "0s", &env);
    wait_connected(&http, &base).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = |path: String| {
        let http = http.clone();
        async move { http.get(path).send().await.unwrap().status().as_u16() }
    };
    // 1,500 fixes in one message: over max_batch.
    assert!(publish(
        port,
        &format!("gd/{run}/a"),
        &fixes_array("big-", 1500, 1)
    ));
    // 4 MB, over max_body_bytes, at QoS 1 on the persistent session.
    let files = temp_dir();
    let huge = files.path().join("huge.json");
    std::fs::write(&huge, fixes_array("huge-", 70_000, 1)).unwrap();
    assert!(std::fs::metadata(&huge).unwrap().len() > 4_000_000);
    assert!(publish_file(port, &format!("gd/{run}/b"), &huge));
    // Six messages of 600 fixes: 3,600 together, at most one batch of 1,000 at a time.
    for m in 0..6 {
        let f = files.path().join(format!("m{m}.json"));
        std::fs::write(&f, fixes_array(&format!("m{m}-"), 600, 1)).unwrap();
        assert!(publish_file(port, &format!("gd/{run}/c"), &f));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let m = loop {
        let m = http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let taken = metric(&m, "geodwell_fixes_received_total{transport=\"mqtt\"}");
        if taken >= 3601.0 && metric(&m, "geodwell_mqtt_queued_messages") == 0.0 {
            break m;
        }
        assert!(Instant::now() < deadline, "only {taken} fixes arrived");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        metric(&m, "geodwell_fixes_received_total{transport=\"mqtt\"}"),
        3601.0,
        "the over-max_batch message is one rejected item, the six messages' fixes all arrive, the oversized one never reaches ingest"
    );
    assert_eq!(
        metric(&m, "geodwell_fixes_rejected_total{reason=\"invalid_fix\"}"),
        1.0
    );
    for m in 0..6 {
        assert_eq!(
            status(format!("{base}/v1/devices/m{m}-599")).await,
            200,
            "message {m}"
        );
    }
    assert_eq!(status(format!("{base}/v1/devices/big-0")).await, 404);
    assert_eq!(status(format!("{base}/v1/devices/huge-0")).await, 404);
    // Nothing made the connection drop and come back.
    assert_eq!(
        metric(&m, "geodwell_mqtt_connects_total{outcome=\"connected\"}"),
        1.0,
        "{m}"
    );
    drop(child);
    drop(broker);
}

/// MQTT messages hold the ingest memory budget from the moment they are read until they are
/// acknowledged, so forty 5 MB messages at QoS 1 (200 MB in all) that the broker sends at once
/// (they waited in geodwell's session while it was away) keep the server process's peak memory
/// within its baseline plus the budget plus 150 MB, and every fix still arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_ingest_stays_within_the_memory_budget() {
    let run = run_id("mm");
    let broker = Broker::start();
    let port = broker.port;
    let dir = temp_dir();
    let url = format!("mqtt://127.0.0.1:{port}");
    let budget: u64 = 64 << 20;
    let budget_s = budget.to_string();
    let topics = format!("gd/{run}/#");
    let env = [
        ("GEODWELL_MQTT_URL", url.as_str()),
        ("GEODWELL_MQTT_TOPICS", topics.as_str()),
        ("GEODWELL_MQTT_CLIENT_ID", run.as_str()),
        ("GEODWELL_MAX_QUEUED_BYTES", budget_s.as_str()),
        ("GEODWELL_DURABILITY", "none"),
    ];
    let http = reqwest::Client::new();
    // A first run subscribes (the broker keeps the session); the messages are published while
    // geodwell is away, so that the broker sends them all at once when it comes back.
    let (mut child, base) = spawn_bin(dir.path(), "0s", &env);
    wait_connected(&http, &base).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.0.kill().unwrap();
    let _ = child.0.wait();
    const MESSAGES: usize = 40;
    const PER: usize = 35_000;
    let files = temp_dir();
    // Long device ids: 5 MB a message with fewer fixes to apply. The same devices in every
    // message, a second apart, so that the devices' own state stays small beside the input.
    let pad = "x".repeat(80);
    for m in 0..MESSAGES {
        let f = files.path().join(format!("m{m}.json"));
        std::fs::write(&f, fixes_array(&format!("d-{pad}-"), PER, m as i64 + 1)).unwrap();
        assert!(publish_file(port, &format!("gd/{run}/x"), &f));
    }
    // The baseline: the same binary on an empty data dir, before any message.
    let (child, base) = spawn_bin(dir.path(), "0s", &env);
    let pid = child.id();
    let base_rss = rss(pid).0;
    let size = std::fs::metadata(files.path().join("m0.json"))
        .unwrap()
        .len();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let m = http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let taken = metric(&m, "geodwell_fixes_received_total{transport=\"mqtt\"}");
        if taken as usize >= MESSAGES * PER && metric(&m, "geodwell_mqtt_queued_messages") == 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "only {taken} fixes arrived");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let peak = rss(pid).1;
    eprintln!(
        "{MESSAGES} x {} MB over MQTT: RSS before {} MB, peak {} MB, budget {} MB",
        size >> 20,
        base_rss >> 20,
        peak >> 20,
        budget >> 20
    );
    let last: Value = get_value(&http, format!("{base}/v1/devices/d-{pad}-{}", PER - 1)).await;
    assert_eq!(
        last["last_fix_at"],
        format!("{}", fmt_ts(T0 + MESSAGES as i64 * 1000)),
        "the last message's fixes were applied: {last}"
    );
    // Beyond the budget: the MQTT client's own read-ahead (it parses up to 10 packets per read
    // from the socket before handing them over one at a time: 54 MB here), the devices' state
    // and the allocator's slack.
    let slack: u64 = 150 << 20;
    assert!(
        peak < base_rss + budget + slack,
        "peak RSS {} MB over the baseline {} MB + budget {} MB + {} MB",
        peak >> 20,
        base_rss >> 20,
        budget >> 20,
        slack >> 20
    );
    drop(child);
    drop(broker);
}

/// A process's resident and peak resident memory, bytes (from /proc).
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// `ts` (Unix ms) as the API writes it.
fn fmt_ts(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}
