//! Test support: start the real server on 127.0.0.1:0 and talk to it over real HTTP and
//! WebSocket connections.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use geodwell::config::Config;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A running server plus an HTTP client pointed at it.
pub struct Srv {
    pub svc: geodwell::Service,
    pub base: String,
    pub http: reqwest::Client,
}

/// Config text merged over the defaults; `listen` is forced to an ephemeral loopback port and no
/// fences file is preloaded unless the text sets one.
pub fn config(extra: &str) -> Config {
    let mut text = String::from(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = 2\n[fences]\nfences_file = \"\"\n",
    );
    text.push_str(extra);
    // Later duplicate sections would be a TOML error, so callers pass whole sections only for
    // sections not above ([time], [ingest], [events]).
    let mut cfg =
        Config::load(Some(("test", &text)), &BTreeMap::new(), 2).expect("test config is valid");
    // Each server gets its own store (the default durability, `sync`, is what tests exercise).
    cfg.data_dir = temp_data_dir();
    cfg
}

/// A fresh, unique directory under the system temp dir.
pub fn temp_data_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let d = std::env::temp_dir().join(format!("geodwell-test-{}-{n}-{nanos}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

pub async fn start(extra: &str) -> Srv {
    start_cfg(config(extra)).await
}

pub async fn start_cfg(cfg: Config) -> Srv {
    let svc = geodwell::Service::start(cfg).await.expect("server starts");
    let base = format!("http://{}", svc.addr());
    Srv {
        svc,
        base,
        http: reqwest::Client::new(),
    }
}

impl Srv {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn put_fence(&self, id: &str, feature: Value) -> reqwest::Response {
        self.http
            .put(self.url(&format!("/v1/fences/{id}")))
            .json(&feature)
            .send()
            .await
            .unwrap()
    }

    pub async fn post_fixes(&self, fixes: Value) -> (u16, Value) {
        let r = self
            .http
            .post(self.url("/v1/fixes"))
            .json(&fixes)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn ws(&self, path: &str) -> Ws {
        let url = format!("ws://{}{}", self.svc.addr(), path);
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("websocket connects");
        ws
    }

    /// Polls the event log until `n` events are there (or 10 s pass).
    pub async fn events(&self, n: usize) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (_, v) = self.get("/v1/events?from_seq=0&limit=10000").await;
            let evs = v["events"].as_array().cloned().unwrap_or_default();
            if evs.len() >= n || tokio::time::Instant::now() > deadline {
                return evs;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) {
        let res = tokio::time::timeout(
            Duration::from_secs(15),
            self.svc.shutdown(Duration::from_secs(10)),
        )
        .await;
        assert!(matches!(res, Ok(Ok(()))), "server stops cleanly: {res:?}");
    }
}

/// Next text frame as JSON (None on close/timeout).
pub async fn next_json(ws: &mut Ws, wait: Duration) -> Option<Value> {
    loop {
        match tokio::time::timeout(wait, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => return serde_json::from_str(&t).ok(),
            Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Err(_) | Ok(Some(Err(_))) => return None,
            Ok(Some(Ok(_))) => continue,
        }
    }
}

/// Reads until a close frame; returns its code.
pub async fn close_code(ws: &mut Ws) -> Option<u16> {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(Message::Close(Some(f))))) => return Some(u16::from(f.code)),
            Ok(Some(Ok(Message::Close(None)))) | Ok(None) | Err(_) => return None,
            Ok(Some(Err(_))) => return None,
            Ok(Some(Ok(_))) => continue,
        }
    }
}

pub async fn send_text(ws: &mut Ws, text: &str) {
    ws.send(Message::Text(text.into())).await.unwrap();
}

/// The square 10.00..10.01 E, 50.00..50.01 N.
pub fn square(id: &str, props: Value) -> Value {
    json!({
        "type": "Feature",
        "id": id,
        "geometry": {"type": "Polygon", "coordinates": [[
            [10.0, 50.0], [10.01, 50.0], [10.01, 50.01], [10.0, 50.01], [10.0, 50.0]
        ]]},
        "properties": props,
    })
}

pub const T0: i64 = 1_767_225_600_000;

pub fn fix(dev: &str, secs: i64, inside: bool) -> Value {
    let (lat, lon) = if inside {
        (50.005, 10.005)
    } else {
        (50.05, 10.05)
    };
    json!({"device": dev, "ts": T0 + secs * 1000, "lat": lat, "lon": lon})
}

// ---- the real binary, for crash tests ------------------------------------------------------

pub const BIN: &str = env!("CARGO_BIN_EXE_geodwell");

/// Starts the real binary on `dir` (event clock, no preloaded fences) with `lateness` and extra
/// environment; returns it and its base URL once it listens.
pub fn spawn_bin(dir: &Path, lateness: &str, env: &[(&str, &str)]) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--clock",
            "event",
            "--lateness",
            lateness,
            "--shards",
            "2",
        ])
        .arg("--data-dir")
        .arg(dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .envs(env.iter().copied())
        .env("GEODWELL_FENCES_FILE", "")
        .env("GEODWELL_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("binary starts");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("server log line (did startup fail?)")
            .unwrap();
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, format!("http://{addr}"))
}
