//! Test support: start the real server on 127.0.0.1:0 and talk to it over real HTTP and
//! WebSocket connections ([`Srv`]), or send requests through its router in process ([`App`]);
//! run the real binary ([`spawn_bin`], [`Proc`]). Every directory a test makes is a
//! [`tempfile::TempDir`], removed when the test is done with it.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::Request;
use futures_util::{SinkExt, StreamExt};
use geodwell::config::Config;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio_tungstenite::tungstenite::Message;
use tower::ServiceExt;

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A fresh directory under the system temp dir, removed (with everything in it) when dropped.
pub fn temp_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("geodwell-test-")
        // KEEP_TEST_DIRS=1 keeps every test's directory (logs, stores) for a post-mortem.
        .disable_cleanup(std::env::var_os("KEEP_TEST_DIRS").is_some())
        .tempdir()
        .expect("a temp dir")
}

/// A test server's configuration and, unless the caller provides the data directory, the
/// temp dir holding its store (moved into the [`Srv`], removed when the server is dropped).
pub struct TestConfig {
    pub cfg: Config,
    dir: Option<TempDir>,
}

impl TestConfig {
    /// Stores in `dir`, which the caller owns (to keep it across a restart, say); the config's
    /// own temp dir is removed.
    pub fn with_data_dir(mut self, dir: &Path) -> TestConfig {
        self.cfg.data_dir = dir.to_path_buf();
        self.dir = None;
        self
    }

    /// The configuration alone (the caller keeps the data directory alive).
    pub fn into_parts(self) -> (Config, Option<TempDir>) {
        (self.cfg, self.dir)
    }
}

impl Deref for TestConfig {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.cfg
    }
}

impl DerefMut for TestConfig {
    fn deref_mut(&mut self) -> &mut Config {
        &mut self.cfg
    }
}

/// A running server plus an HTTP client pointed at it.
pub struct Srv {
    pub svc: geodwell::Service,
    pub base: String,
    pub http: reqwest::Client,
    /// The service's router for [`App`], built on first use.
    router: OnceLock<axum::Router>,
    /// The store's temp dir when the server owns it; removed when the `Srv` is dropped (after
    /// [`Srv::stop`], or when a failing test unwinds).
    _dir: Option<TempDir>,
}

/// Config text merged over the defaults; `listen` is forced to an ephemeral loopback port, no
/// fences file is preloaded unless the text sets one, and webhook receivers may live on loopback
/// (`allow_private_targets`, which the SSRF tests switch off again).
pub fn config(extra: &str) -> TestConfig {
    let mut text = String::from(
        "[server]\nlisten = \"127.0.0.1:0\"\nshards = 2\nallow_private_targets = true\n[fences]\nfences_file = \"\"\n",
    );
    text.push_str(extra);
    // Later duplicate sections would be a TOML error, so callers pass whole sections only for
    // sections not above ([time], [ingest], [events]).
    let mut cfg =
        Config::load(Some(("test", &text)), &BTreeMap::new(), 2).expect("test config is valid");
    // Each server gets its own store (the default durability, `sync`, is what tests exercise).
    let dir = temp_dir();
    cfg.data_dir = dir.path().to_path_buf();
    TestConfig {
        cfg,
        dir: Some(dir),
    }
}

pub async fn start(extra: &str) -> Srv {
    start_cfg(config(extra)).await
}

pub async fn start_cfg(cfg: TestConfig) -> Srv {
    let (cfg, dir) = cfg.into_parts();
    let svc = geodwell::Service::start(cfg).await.expect("server starts");
    let base = format!("http://{}", svc.addr());
    Srv {
        svc,
        base,
        http: reqwest::Client::new(),
        router: OnceLock::new(),
        _dir: dir,
    }
}

impl Srv {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// The same server, reached through its router in process: no socket, no HTTP client.
    pub fn app(&self) -> App<'_> {
        App {
            router: self.router.get_or_init(|| self.svc.router()),
        }
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

    /// DELETE `path`; the response as it came.
    pub async fn delete(&self, path: &str) -> reqwest::Response {
        self.http.delete(self.url(path)).send().await.unwrap()
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
        events_of(self, n).await
    }

    pub async fn stop(self) {
        // The router holds the service's state: let go of it before the service stops. The
        // temp dir (in `..`) goes when this function returns, after the service has stopped.
        let Srv { svc, router, .. } = self;
        drop(router);
        let res = tokio::time::timeout(
            Duration::from_secs(15),
            svc.shutdown(Duration::from_secs(10)),
        )
        .await;
        assert!(matches!(res, Ok(Ok(()))), "server stops cleanly: {res:?}");
    }
}

// ---- in process: the router, `tower::ServiceExt::oneshot` ----------------------------------

/// A running server's router, called in process with `oneshot` (as axum's `testing` example
/// does): the same handlers and state as the socket serves, without a connection. For
/// request/answer cases; WebSocket, shutdown and anything about the connection need [`Srv`].
#[derive(Clone, Copy)]
pub struct App<'a> {
    router: &'a axum::Router,
}

/// An answer from [`App::request`].
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON (`Null` when it is not JSON, as the socket helpers answer).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The body as JSON, or as a JSON string holding the text when it is not JSON.
    pub fn json_or_text(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&self.body).into_owned()))
    }
}

impl App<'_> {
    /// Sends `req` through the router.
    pub async fn oneshot(&self, req: Request<Body>) -> Reply {
        let resp = self
            .router
            .clone()
            .oneshot(req)
            .await
            .expect("the router is infallible");
        let status = resp.status().as_u16();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("the body is read");
        Reply { status, body }
    }

    /// `method path` with these headers and, when given, this body (with its `content-length`,
    /// as an HTTP client sends it).
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Reply {
        let mut req = Request::builder().method(method).uri(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = match body {
            Some(b) => req
                .header("content-length", b.len().to_string())
                .body(Body::from(b)),
            None => req.body(Body::empty()),
        }
        .expect("a valid request");
        self.oneshot(req).await
    }

    /// `method path` with a body of this content type: (status, JSON body or `Null`).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<Vec<u8>>,
    ) -> (u16, Value) {
        let headers: Vec<(&str, &str)> = content_type
            .map(|c| ("content-type", c))
            .into_iter()
            .collect();
        let r = self
            .request(method, path, &headers, Some(body.into()))
            .await;
        (r.status, r.json())
    }

    /// `method path` with `body` as JSON (`None`: no body).
    pub async fn json(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        match body {
            Some(b) => {
                self.send(
                    method,
                    path,
                    Some("application/json"),
                    serde_json::to_vec(b).unwrap(),
                )
                .await
            }
            None => {
                let r = self.request(method, path, &[], None).await;
                (r.status, r.json())
            }
        }
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.json("GET", path, None).await
    }

    pub async fn post_fixes(&self, fixes: Value) -> (u16, Value) {
        self.json("POST", "/v1/fixes", Some(&fixes)).await
    }

    pub async fn put_fence(&self, id: &str, feature: Value) -> (u16, Value) {
        self.json("PUT", &format!("/v1/fences/{id}"), Some(&feature))
            .await
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let r = self.request("GET", "/metrics", &[], None).await;
        String::from_utf8(r.body.to_vec()).expect("metrics are text")
    }

    /// Polls the event log until `n` events are there (or 10 s pass).
    pub async fn events(&self, n: usize) -> Vec<Value> {
        events_of(self, n).await
    }
}

/// One HTTP request, over a socket ([`Srv`], reqwest) or in process ([`App`], `oneshot`): for
/// helpers and checks written once for both.
pub trait Http {
    /// `method path` with these headers and, when given, this body (and its `content-length`).
    fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> impl Future<Output = Reply>;

    /// GET `path`: (status, JSON body or `Null`).
    fn get_json(&self, path: &str) -> impl Future<Output = (u16, Value)> {
        async move {
            let r = self.call("GET", path, &[], None).await;
            (r.status, r.json())
        }
    }
}

impl Http for Srv {
    fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> impl Future<Output = Reply> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        let mut req = self.http.request(method, self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let body = r.bytes().await.unwrap();
            Reply { status, body }
        }
    }
}

impl Http for App<'_> {
    fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> impl Future<Output = Reply> {
        self.request(method, path, headers, body)
    }
}

/// Polls the event log until `n` events are there (or 10 s pass).
pub async fn events_of(api: &impl Http, n: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, v) = api.get_json("/v1/events?from_seq=0&limit=10000").await;
        let evs = v["events"].as_array().cloned().unwrap_or_default();
        if evs.len() >= n || tokio::time::Instant::now() > deadline {
            return evs;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---- WebSocket -------------------------------------------------------------------------------

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

// ---- test data -------------------------------------------------------------------------------

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

// ---- the real binary -------------------------------------------------------------------------

pub const BIN: &str = env!("CARGO_BIN_EXE_geodwell");

/// A child process that is killed (SIGKILL) and reaped when dropped, so that a failing test
/// leaves no server behind. Declare it after the temp dir it uses: locals drop in reverse
/// order, so the child is reaped before its directory is removed.
#[derive(Debug)]
pub struct Proc(pub Child);

impl Deref for Proc {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Both fail harmlessly once the child has been reaped.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads the child's log (stderr) until the "listening" line and returns its `addr=` value;
/// then keeps draining stderr on a thread (so the child never blocks on a full pipe), into
/// `rest` when given.
pub fn listening_addr(child: &mut Child, rest: Option<std::sync::mpsc::Sender<String>>) -> String {
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let addr = loop {
        let line = match lines.next() {
            Some(Ok(l)) => l,
            _ => panic!("no listening line in the server log (did startup fail?): {seen:#?}"),
        };
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
        seen.push(line);
    };
    // The lines before the listening line belong to the log too (a cluster node takes
    // partitions before it listens).
    if let Some(tx) = &rest {
        for l in seen {
            let _ = tx.send(l);
        }
    }
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            if let Some(tx) = &rest {
                let _ = tx.send(l);
            }
        }
    });
    addr
}

/// The previous release's binary for the upgrade tests: `TEST_PREVIOUS_GEODWELL`, which
/// `.ci/run` builds from the release named in docs/upgrading.md.
pub fn previous_bin() -> String {
    match std::env::var("TEST_PREVIOUS_GEODWELL") {
        Ok(b) if std::path::Path::new(&b).is_file() => b,
        _ => panic!(
            "the upgrade tests need the previous release's binary in TEST_PREVIOUS_GEODWELL (.ci/run builds it)"
        ),
    }
}

/// `geodwell serve` on an ephemeral loopback port with its store in `data_dir`, run from the
/// crate's directory, logging at info to a piped stderr (for [`listening_addr`]); callers add
/// the flags and environment of their case.
pub fn serve_cmd(data_dir: &Path) -> Command {
    serve_cmd_of(BIN, data_dir)
}

/// [`serve_cmd`] with another binary of geodwell (an earlier release's, in the upgrade tests).
pub fn serve_cmd_of(bin: &str, data_dir: &Path) -> Command {
    let mut c = Command::new(bin);
    c.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("GEODWELL_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    c
}

/// Starts the real binary on `dir` (event clock, no preloaded fences) with `lateness` and extra
/// environment; returns it and its base URL once it listens.
pub fn spawn_bin(dir: &Path, lateness: &str, env: &[(&str, &str)]) -> (Proc, String) {
    spawn_bin_of(BIN, dir, lateness, env)
}

/// [`spawn_bin`] with another binary of geodwell.
pub fn spawn_bin_of(bin: &str, dir: &Path, lateness: &str, env: &[(&str, &str)]) -> (Proc, String) {
    let child = serve_cmd_of(bin, dir)
        .args(["--clock", "event", "--lateness", lateness, "--shards", "2"])
        .env("GEODWELL_ALLOW_PRIVATE_TARGETS", "true")
        .envs(env.iter().copied())
        .env("GEODWELL_FENCES_FILE", "")
        .spawn()
        .expect("binary starts");
    let mut child = Proc(child);
    let addr = listening_addr(&mut child, None);
    (child, format!("http://{addr}"))
}

/// The value of one metric line (`name{labels} value`) in a scrape, summed over matching lines.
pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// GET `url` and its JSON body (panics on a transport error or a body that is not JSON).
pub async fn get_value(http: &reqwest::Client, url: impl reqwest::IntoUrl) -> Value {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

/// Every event the server at `base` holds (up to 10,000), oldest first.
pub async fn all_events(http: &reqwest::Client, base: &str) -> Vec<Value> {
    let v: Value = get_value(http, format!("{base}/v1/events?from_seq=0&limit=10000")).await;
    v["events"].as_array().cloned().unwrap_or_default()
}

/// A free loopback port for a server the test starts: bound, then released.
///
/// Taken from outside the kernel's ephemeral range, never from port 0: an outgoing connection
/// (a NATS route dialling out, a client) draws its source port from the ephemeral range and can
/// take a port handed out from there between its release and the server's bind, and then that
/// server dies at start, or at its restart on the same port. Outside the range only another
/// listener can take it, and the process-wide counter keeps this process's own tests from
/// choosing a port twice.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (lo, hi) = outside_ephemeral_range();
    let span = u32::from(hi - lo);
    // Start somewhere different per process (pids started together are close: spread them), so
    // that two test processes rarely probe the same ports.
    let start = (u64::from(std::process::id()) * 40_503 % u64::from(span)) as u32 + 1;
    let _ = NEXT.compare_exchange(0, start, SeqCst, SeqCst);
    for _ in 0..span {
        let n = NEXT.fetch_add(1, SeqCst);
        let port = lo + (n % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {lo}..{hi}");
}

/// The ports the tests' servers use, outside the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`; 32768-60999 if it cannot be read): from 10000 up
/// to its start, or, when that leaves fewer than 2,000 ports, from its end up; if neither side
/// has 2,000, 10000-12000 (inside the range: the old risk, not a failure).
fn outside_ephemeral_range() -> (u16, u16) {
    let range: Vec<u16> = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let (start, end) = match range[..] {
        [a, b] => (a, b),
        _ => (32768, 60999),
    };
    if start >= 12_000 {
        (10_000, start)
    } else if end <= 63_535 {
        (end + 1, 65_535)
    } else {
        (10_000, 12_000)
    }
}
