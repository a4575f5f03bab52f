//! The simulator's driver: sends a [`Fleet`]'s fixes to a running server and measures what
//! comes back.
//!
//! Owns: the pipeline generator thread -> batches -> sender tasks (HTTP NDJSON or WebSocket
//! ingest) -> server, the event subscription that times each event's arrival, pacing, progress
//! and the final [`SimReport`].
//!
//! Invariants:
//! - A batch's send time is recorded before its first byte is written, so measured latency
//!   includes every queue on the way (client socket, server parsing, shard queues, commit).
//! - Batches are released on a schedule fixed by the generator (`Pace`); a sender that falls
//!   behind sends at once and the slip is reported, so a run that cannot keep up shows it as a
//!   lower accepted rate rather than silently stretching time.
//! - Nothing here panics on server behaviour: refused connections, error statuses, error
//!   frames and closes are counted in the report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, Semaphore, mpsc};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::fleet::{Fleet, FleetSpec, feature_collection};
use crate::track::{FenceFacts, Kind, LatencySummary, Tracker, WatermarkModel};
use geodwell_core::fences::Fence;
use geodwell_core::time::Ts;

/// How fixes reach the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// `POST /v1/fixes` with NDJSON bodies, one request per batch.
    Http,
    /// `GET /v1/ingest/ws`, one JSON array per text frame, several frames in flight.
    Ws,
}

/// When batches are sent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pace {
    /// As fast as the server answers.
    Max,
    /// This many fixes per second, whatever their timestamps.
    Rate(f64),
    /// Event time runs this many times faster than the wall clock (1 = real time).
    Replay(f64),
}

/// What to do.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Base URL, e.g. `http://127.0.0.1:7878`.
    pub server: String,
    /// Transport.
    pub transport: Transport,
    /// Parallel connections.
    pub connections: usize,
    /// Most fixes per batch.
    pub batch: usize,
    /// Longest a batch collects before it is cut (wall time under the pace).
    pub linger: Duration,
    /// Pacing.
    pub pace: Pace,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Stop after this many fixes.
    pub max_fixes: Option<u64>,
    /// Post the fences first.
    pub upload_fences: bool,
    /// Subscribe to events and measure latency.
    pub measure: bool,
    /// Longest wait for trailing events after the last send.
    pub drain: Duration,
    /// Draw a progress line on stderr.
    pub progress: bool,
    /// WebSocket frames in flight per connection.
    pub ws_window: usize,
}

impl Default for SimOptions {
    fn default() -> SimOptions {
        SimOptions {
            server: "http://127.0.0.1:7878".into(),
            transport: Transport::Http,
            connections: 1,
            batch: 1000,
            linger: Duration::from_millis(10),
            pace: Pace::Replay(1.0),
            duration: Some(Duration::from_secs(30)),
            max_fixes: None,
            upload_fences: true,
            measure: true,
            drain: Duration::from_secs(5),
            progress: true,
            ws_window: 8,
        }
    }
}

/// What happened.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// Transport used.
    pub transport: Transport,
    /// Connections used.
    pub connections: usize,
    /// Largest batch.
    pub batch: usize,
    /// Pacing.
    pub pace: Pace,
    /// The server's clock mode.
    pub server_clock: String,
    /// The server's lateness, ms.
    pub server_lateness_ms: i64,
    /// Devices simulated.
    pub devices: u32,
    /// Fences driven between.
    pub fences: usize,
    /// Event time of the first fix.
    pub start: Ts,
    /// Seconds from the first send to the last answer.
    pub elapsed_s: f64,
    /// Fixes sent (retries not counted twice).
    pub sent: u64,
    /// Fixes the server accepted.
    pub accepted: u64,
    /// Fixes it called late.
    pub late: u64,
    /// Fixes it called duplicates.
    pub duplicate: u64,
    /// Fixes it rejected item by item.
    pub rejected: u64,
    /// Accepted fixes per second over `elapsed_s`.
    pub accepted_per_s: f64,
    /// Fixes lost to whole-batch errors, by HTTP status or WebSocket error code.
    pub errors: BTreeMap<String, u64>,
    /// Batches re-sent after 429 / 503.
    pub retries: u64,
    /// Largest delay of a batch behind its schedule, ms (a run that keeps up stays near 0).
    pub max_slip_ms: f64,
    /// Events received, by type.
    pub events: BTreeMap<String, u64>,
    /// Events per second over `elapsed_s`, by type.
    pub events_per_s: BTreeMap<String, f64>,
    /// Subscriber `lagged` / `gap` frames seen.
    pub subscriber_lagged: u64,
    /// Subscriber gap frames seen.
    pub subscriber_gaps: u64,
    /// Ingest-to-event latency by type (`enter`, `exit`, `dwell`) and over `all`.
    pub latency: BTreeMap<String, LatencySummary>,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The server could not be reached or answered unexpectedly.
    #[error("server {url}: {message}")]
    Server {
        /// What was asked.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The fleet could not be built.
    #[error(transparent)]
    Fleet(#[from] crate::fleet::FleetError),
    /// The options contradict each other.
    #[error("bad options: {0}")]
    Options(String),
}

fn server_err(url: &str, e: impl std::fmt::Display) -> SimError {
    SimError::Server {
        url: url.to_string(),
        message: e.to_string(),
    }
}

#[derive(Default, Debug)]
struct Counters {
    sent: AtomicU64,
    accepted: AtomicU64,
    late: AtomicU64,
    duplicate: AtomicU64,
    rejected: AtomicU64,
    retries: AtomicU64,
    events: [AtomicU64; 3],
    lagged: AtomicU64,
    gaps: AtomicU64,
    last_answer_us: AtomicU64,
    first_send_us: AtomicU64,
    max_slip_us: AtomicU64,
    errors: std::sync::Mutex<BTreeMap<String, u64>>,
}

impl Counters {
    fn error(&self, key: String, n: u64) {
        *self
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default() += n;
    }

    fn answer(&self, r: &Answer, now_us: u64) {
        self.accepted.fetch_add(r.accepted, Relaxed);
        self.late.fetch_add(r.late, Relaxed);
        self.duplicate.fetch_add(r.duplicate, Relaxed);
        self.rejected.fetch_add(r.rejected, Relaxed);
        self.last_answer_us.fetch_max(now_us, Relaxed);
    }
}

/// The server's per-batch answer (the fields the report uses).
#[derive(Debug, Default, Deserialize)]
struct Answer {
    #[serde(default)]
    accepted: u64,
    #[serde(default)]
    late: u64,
    #[serde(default)]
    duplicate: u64,
    #[serde(default)]
    rejected: u64,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: String,
}

/// One batch on its way.
#[derive(Debug)]
struct Batch {
    id: u64,
    body: Bytes,
    n: u64,
    max_ts: i64,
    release: Duration,
    /// (device, ts) of each fix, for latency attribution.
    fixes: Vec<(u32, i64, f32)>,
}

#[derive(Debug, Deserialize)]
struct Ready {
    clock: String,
    #[serde(default)]
    watermark: Option<Ts>,
    #[serde(default)]
    lateness_ms: Option<i64>,
}

fn ws_url(base: &str, path: &str) -> String {
    let rest = base
        .strip_prefix("http://")
        .map(|r| format!("ws://{r}"))
        .or_else(|| base.strip_prefix("https://").map(|r| format!("wss://{r}")))
        .unwrap_or_else(|| base.to_string());
    format!("{}{path}", rest.trim_end_matches('/'))
}

/// Runs the simulation against `opts.server` and returns the report. `spec.start` is moved
/// forward to the wall clock (live servers) or past the server's watermark (event servers) so
/// that the fixes are not late; pass the fences the fleet drives between.
pub async fn run(
    opts: &SimOptions,
    mut spec: FleetSpec,
    fences: Vec<Arc<Fence>>,
    cancel: CancellationToken,
) -> Result<SimReport, SimError> {
    if opts.connections == 0 || opts.batch == 0 || opts.ws_window == 0 {
        return Err(SimError::Options(
            "connections, batch and ws window must be at least 1".into(),
        ));
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(opts.connections.max(4))
        .tcp_nodelay(true)
        .build()
        .map_err(|e| server_err(&opts.server, e))?;
    let base = opts.server.trim_end_matches('/').to_string();
    let ready_url = format!("{base}/readyz");
    let ready: Ready = client
        .get(&ready_url)
        .send()
        .await
        .map_err(|e| server_err(&ready_url, e))?
        .json()
        .await
        .map_err(|e| server_err(&ready_url, format!("unexpected /readyz answer: {e}")))?;
    let lateness_ms = ready.lateness_ms.unwrap_or(0);
    let live = ready.clock == "live";
    let wall_now = Ts(chrono::Utc::now().timestamp_millis());
    if live {
        if !matches!(opts.pace, Pace::Replay(s) if (s - 1.0).abs() < 1e-9) {
            return Err(SimError::Options(
                "the server runs a live clock: fixes must be sent in real time (--replay-speed 1); \
                 run the server with --clock event to send faster"
                    .into(),
            ));
        }
        spec.start = wall_now;
    } else {
        let after_w = ready
            .watermark
            .map_or(i64::MIN, |w| w.0 + lateness_ms + 1000);
        spec.start = Ts(spec.start.0.max(after_w));
    }

    if opts.upload_fences {
        upload(&client, &base, &fences).await?;
    }
    let facts = fences
        .iter()
        .map(|f| {
            (
                f.id.to_string(),
                FenceFacts {
                    enter_confirm: f.settings.enter_confirm,
                    exit_confirm: f.settings.exit_confirm,
                    stale_after_ms: f.settings.stale_after.map(|d| d.0),
                    max_accuracy_m: f.settings.max_accuracy_m,
                },
            )
        })
        .collect();
    let model = if live {
        WatermarkModel::Live {
            lateness_ms,
            wall_ms_at_t0: 0,
        }
    } else {
        WatermarkModel::Event { lateness_ms }
    };
    let devices = spec.devices;
    let prefix = spec.prefix.clone();
    let start = spec.start;
    let fleet = Fleet::new(spec, &fences)?;
    let mut tracker = Tracker::new(devices, start.0, model, facts, prefix.clone());
    if live {
        // Re-anchor the live model now that t0 is fixed.
        let wall_ms_at_t0 =
            chrono::Utc::now().timestamp_millis() - tracker.t0().elapsed().as_millis() as i64;
        tracker = tracker.with_model(WatermarkModel::Live {
            lateness_ms,
            wall_ms_at_t0,
        });
    }
    let tracker = Arc::new(tracker);
    let counters = Arc::new(Counters::default());
    let stop = cancel.child_token();

    // Subscribe before the first send so no event is missed.
    let sub = if opts.measure {
        Some(subscribe(&base, tracker.clone(), counters.clone(), stop.clone()).await?)
    } else {
        None
    };

    // A short queue: the generator stays just ahead of the senders.
    let (tx, rx) = mpsc::channel::<Batch>(2 * opts.connections + 2);
    let generator = {
        let stop = stop.clone();
        let opts = opts.clone();
        std::thread::spawn(move || generate(fleet, &opts, tx, &stop, start.0))
    };
    let t0 = tracker.t0();
    if let Some(d) = opts.duration {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until((t0 + d).into()).await;
            stop.cancel();
        });
    }
    let progress = progress_bar(opts.progress, counters.clone(), tracker.clone());
    let rx = Arc::new(Mutex::new(rx));
    let mut senders = Vec::new();
    for _ in 0..opts.connections {
        let ctx = SendCtx {
            rx: rx.clone(),
            tracker: tracker.clone(),
            counters: counters.clone(),
            stop: stop.clone(),
            t0,
        };
        senders.push(match opts.transport {
            Transport::Http => tokio::spawn(send_http(ctx, client.clone(), base.clone())),
            Transport::Ws => {
                tokio::spawn(send_ws(ctx, ws_url(&base, "/v1/ingest/ws"), opts.ws_window))
            }
        });
    }
    for s in senders {
        let _ = s.await;
    }
    // Unblock the generator if the senders stopped first, then collect it.
    drop(rx);
    let _ = tokio::task::spawn_blocking(move || generator.join()).await;

    // Trailing events: wait until none has arrived for half a second, or the drain limit.
    if let Some(sub) = sub {
        let deadline = Instant::now() + opts.drain;
        let total = || counters.events.iter().map(|e| e.load(Relaxed)).sum::<u64>();
        let mut last = total();
        let mut quiet_since = Instant::now();
        while Instant::now() < deadline && !cancel.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = total();
            if now != last {
                last = now;
                quiet_since = Instant::now();
            } else if quiet_since.elapsed() >= Duration::from_millis(500) {
                break;
            }
        }
        sub.abort();
    }
    stop.cancel();
    if let Some(p) = progress {
        p.finish_and_clear();
    }
    Ok(report(
        opts,
        &ready.clock,
        lateness_ms,
        devices,
        fences.len(),
        start,
        &counters,
        &tracker,
    ))
}

#[allow(clippy::too_many_arguments)]
fn report(
    opts: &SimOptions,
    clock: &str,
    lateness_ms: i64,
    devices: u32,
    fences: usize,
    start: Ts,
    c: &Counters,
    tracker: &Tracker,
) -> SimReport {
    let first = c.first_send_us.load(Relaxed);
    let last = c.last_answer_us.load(Relaxed);
    let elapsed_s = (last.saturating_sub(first.saturating_sub(1))) as f64 / 1e6;
    let per_s = |n: u64| {
        if elapsed_s > 0.0 {
            n as f64 / elapsed_s
        } else {
            0.0
        }
    };
    let names = ["enter", "exit", "dwell"];
    let (by_type, all) = tracker.summaries();
    let mut latency: BTreeMap<String, LatencySummary> = names
        .iter()
        .zip(by_type)
        .map(|(n, s)| (n.to_string(), s))
        .collect();
    latency.insert("all".into(), all);
    let accepted = c.accepted.load(Relaxed);
    SimReport {
        transport: opts.transport,
        connections: opts.connections,
        batch: opts.batch,
        pace: opts.pace,
        server_clock: clock.to_string(),
        server_lateness_ms: lateness_ms,
        devices,
        fences,
        start,
        elapsed_s,
        sent: c.sent.load(Relaxed),
        accepted,
        late: c.late.load(Relaxed),
        duplicate: c.duplicate.load(Relaxed),
        rejected: c.rejected.load(Relaxed),
        accepted_per_s: per_s(accepted),
        errors: c.errors.lock().map(|e| e.clone()).unwrap_or_default(),
        retries: c.retries.load(Relaxed),
        max_slip_ms: c.max_slip_us.load(Relaxed) as f64 / 1000.0,
        events: names
            .iter()
            .zip(&c.events)
            .map(|(n, e)| (n.to_string(), e.load(Relaxed)))
            .collect(),
        events_per_s: names
            .iter()
            .zip(&c.events)
            .map(|(n, e)| (n.to_string(), per_s(e.load(Relaxed))))
            .collect(),
        subscriber_lagged: c.lagged.load(Relaxed),
        subscriber_gaps: c.gaps.load(Relaxed),
        latency,
    }
}

impl SimReport {
    /// A human-readable summary.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "geodwell simulate: {} devices, {} fences, {:?} x{} batch {}, pace {:?}; server clock {} lateness {} ms",
            self.devices,
            self.fences,
            self.transport,
            self.connections,
            self.batch,
            self.pace,
            self.server_clock,
            self.server_lateness_ms
        );
        let _ = writeln!(
            s,
            "fixes: sent {} accepted {} late {} duplicate {} rejected {} in {:.2} s = {:.0} accepted/s (max slip {:.1} ms, retries {})",
            self.sent,
            self.accepted,
            self.late,
            self.duplicate,
            self.rejected,
            self.elapsed_s,
            self.accepted_per_s,
            self.max_slip_ms,
            self.retries
        );
        if !self.errors.is_empty() {
            let _ = writeln!(s, "errors (fixes): {:?}", self.errors);
        }
        let _ = writeln!(
            s,
            "events: {}",
            self.events
                .iter()
                .map(|(k, v)| format!(
                    "{k} {v} ({:.0}/s)",
                    self.events_per_s.get(k).unwrap_or(&0.0)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if self.subscriber_lagged + self.subscriber_gaps > 0 {
            let _ = writeln!(
                s,
                "subscriber: lagged {} gaps {}",
                self.subscriber_lagged, self.subscriber_gaps
            );
        }
        let _ = writeln!(
            s,
            "ingest-to-event latency (ms):   count      p50      p99    p99.9      max  unmatched"
        );
        for (k, l) in &self.latency {
            let _ = writeln!(
                s,
                "  {k:<28} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>10}",
                l.count,
                l.p50_us as f64 / 1000.0,
                l.p99_us as f64 / 1000.0,
                l.p999_us as f64 / 1000.0,
                l.max_us as f64 / 1000.0,
                l.unmatched
            );
        }
        s
    }
}

async fn upload(
    client: &reqwest::Client,
    base: &str,
    fences: &[Arc<Fence>],
) -> Result<(), SimError> {
    let url = format!("{base}/v1/fences");
    for chunk in fences.chunks(500) {
        let fc = feature_collection(chunk);
        let body = serde_json::to_vec(&fc).map_err(|e| server_err(&url, e))?;
        let r = client
            .post(&url)
            .header("content-type", "application/geo+json")
            .body(body)
            .send()
            .await
            .map_err(|e| server_err(&url, e))?;
        if !r.status().is_success() {
            let status = r.status();
            let text = r.text().await.unwrap_or_default();
            return Err(server_err(&url, format!("{status}: {text}")));
        }
    }
    Ok(())
}

/// The generator thread: cuts the fleet's fixes into batches with release times.
fn generate(
    mut fleet: Fleet,
    opts: &SimOptions,
    tx: mpsc::Sender<Batch>,
    stop: &CancellationToken,
    start: i64,
) {
    let prefix = fleet.spec().prefix.clone();
    let measure = opts.measure;
    let max_batch = match opts.pace {
        Pace::Rate(r) => ((r * opts.linger.as_secs_f64()).ceil() as usize).clamp(1, opts.batch),
        _ => opts.batch,
    };
    let span_ms = match opts.pace {
        Pace::Replay(s) => (opts.linger.as_secs_f64() * 1000.0 * s).max(1.0) as i64,
        _ => i64::MAX,
    };
    let ws = opts.transport == Transport::Ws;
    let mut total = 0u64;
    let mut id = 0u64;
    let limit = opts.max_fixes.unwrap_or(u64::MAX);
    let mut pending = fleet.next();
    while let Some(first) = pending {
        if stop.is_cancelled() || total >= limit {
            return;
        }
        let mut body = Vec::with_capacity(max_batch * 110 + 2);
        if ws {
            body.push(b'[');
        }
        let mut n = 0u64;
        let mut max_ts = i64::MIN;
        let mut fixes = Vec::with_capacity(if measure { max_batch } else { 0 });
        let mut fix = Some(first);
        while let Some(f) = fix {
            if n as usize >= max_batch || total >= limit || f.ts.0 - first.ts.0 >= span_ms {
                break;
            }
            if n > 0 {
                body.push(if ws { b',' } else { b'\n' });
            }
            f.write_json(&prefix, &mut body);
            if measure {
                fixes.push((f.device, f.ts.0, f.accuracy as f32));
            }
            max_ts = max_ts.max(f.ts.0);
            n += 1;
            total += 1;
            fix = fleet.next();
        }
        body.push(if ws { b']' } else { b'\n' });
        pending = fix;
        let release = match opts.pace {
            Pace::Max => Duration::ZERO,
            Pace::Rate(r) => Duration::from_secs_f64(total as f64 / r),
            Pace::Replay(s) => {
                Duration::from_secs_f64(((max_ts - start).max(0) as f64 / 1000.0) / s)
            }
        };
        if opts.duration.is_some_and(|d| release > d) {
            return;
        }
        let batch = Batch {
            id,
            body: Bytes::from(body),
            n,
            max_ts,
            release,
            fixes,
        };
        id += 1;
        if tx.blocking_send(batch).is_err() {
            return;
        }
    }
}

struct SendCtx {
    rx: Arc<Mutex<mpsc::Receiver<Batch>>>,
    tracker: Arc<Tracker>,
    counters: Arc<Counters>,
    stop: CancellationToken,
    t0: Instant,
}

impl SendCtx {
    /// The next batch once its release time has come; `None` when done or stopped.
    async fn next(&self) -> Option<Batch> {
        let b = tokio::select! {
            _ = self.stop.cancelled() => return None,
            b = async { self.rx.lock().await.recv().await } => b?,
        };
        let at = self.t0 + b.release;
        tokio::select! {
            _ = self.stop.cancelled() => return None,
            _ = tokio::time::sleep_until(at.into()) => {}
        }
        let slip = Instant::now().saturating_duration_since(at).as_micros() as u64;
        self.counters.max_slip_us.fetch_max(slip, Relaxed);
        Some(b)
    }

    fn sent(&self, b: &Batch) {
        for &(d, ts, acc) in &b.fixes {
            self.tracker.note_fix(d, ts, b.id, acc);
        }
        let us = self.tracker.note_send(b.id, b.max_ts);
        let c = &self.counters;
        c.sent.fetch_add(b.n, Relaxed);
        let _ = c
            .first_send_us
            .compare_exchange(0, us.max(1), Relaxed, Relaxed);
    }
}

async fn send_http(ctx: SendCtx, client: reqwest::Client, base: String) {
    let url = format!("{base}/v1/fixes");
    while let Some(b) = ctx.next().await {
        ctx.sent(&b);
        let mut attempts = 0;
        loop {
            let r = client
                .post(&url)
                .header("content-type", "application/x-ndjson")
                .body(b.body.clone())
                .send()
                .await;
            let now = ctx.tracker.now_us();
            match r {
                Ok(r) if r.status().is_success() => {
                    match r.json::<Answer>().await {
                        Ok(a) => ctx.counters.answer(&a, now),
                        Err(e) => ctx.counters.error(format!("bad answer: {e}"), b.n),
                    }
                    break;
                }
                Ok(r) => {
                    let status = r.status().as_u16();
                    if (status == 503 || status == 429)
                        && attempts < 100
                        && !ctx.stop.is_cancelled()
                    {
                        // Retry-After says 1 s; a load generator that waited that long would
                        // measure its own back-off, so it retries soon and counts the retry.
                        attempts += 1;
                        ctx.counters.retries.fetch_add(1, Relaxed);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    ctx.counters.error(status.to_string(), b.n);
                    ctx.counters.last_answer_us.fetch_max(now, Relaxed);
                    break;
                }
                Err(e) => {
                    let kind = if e.is_connect() {
                        "connect"
                    } else {
                        "transport"
                    };
                    ctx.counters.error(kind.to_string(), b.n);
                    break;
                }
            }
        }
    }
}

async fn send_ws(ctx: SendCtx, url: String, window: usize) {
    let (socket, _) = match tokio_tungstenite::connect_async(url.as_str()).await {
        Ok(s) => s,
        Err(e) => {
            ctx.counters.error(format!("ws connect: {e}"), 0);
            return;
        }
    };
    let (mut sink, mut stream) = socket.split();
    let permits = Arc::new(Semaphore::new(window));
    let (inflight_tx, mut inflight_rx) = mpsc::unbounded_channel::<u64>();
    let counters = ctx.counters.clone();
    let tracker = ctx.tracker.clone();
    let reader_permits = permits.clone();
    let reader = tokio::spawn(async move {
        while let Some(msg) = stream.next().await {
            let text = match msg {
                Ok(Message::Text(t)) => t,
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => continue,
            };
            let n = inflight_rx.recv().await.unwrap_or(0);
            reader_permits.add_permits(1);
            let now = tracker.now_us();
            match serde_json::from_str::<Answer>(&text) {
                Ok(Answer { error: Some(e), .. }) => counters.error(format!("ws:{}", e.code), n),
                Ok(a) => counters.answer(&a, now),
                Err(e) => counters.error(format!("bad answer: {e}"), n),
            }
        }
        // Whatever is still in flight got no answer.
        inflight_rx.close();
        while let Some(n) = inflight_rx.recv().await {
            counters.error("ws:no answer".into(), n);
        }
    });
    while let Some(b) = ctx.next().await {
        let Ok(permit) = permits.acquire().await else {
            break;
        };
        permit.forget();
        let text = match tokio_tungstenite::tungstenite::Utf8Bytes::try_from(b.body.clone()) {
            Ok(t) => t,
            Err(_) => {
                ctx.counters.error("ws:not utf-8".into(), b.n);
                continue;
            }
        };
        ctx.sent(&b);
        if inflight_tx.send(b.n).is_err() || sink.send(Message::Text(text)).await.is_err() {
            ctx.counters.error("ws:send failed".into(), b.n);
            break;
        }
        if reader.is_finished() {
            break;
        }
    }
    // Let the answers to frames in flight arrive, then close.
    let _ =
        tokio::time::timeout(Duration::from_secs(30), permits.acquire_many(window as u32)).await;
    drop(inflight_tx);
    let _ = sink.send(Message::Close(None)).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
}

#[derive(Debug, Deserialize)]
struct EventFrame<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(default)]
    device: &'a str,
    #[serde(default)]
    fence: &'a str,
    #[serde(default)]
    at: Option<&'a str>,
    #[serde(default)]
    resume_from: Option<u64>,
}

/// Connects the event subscription and returns the task reading it.
async fn subscribe(
    base: &str,
    tracker: Arc<Tracker>,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, SimError> {
    let url = ws_url(base, "/v1/events/ws");
    let (first, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .map_err(|e| server_err(&url, e))?;
    Ok(tokio::spawn(async move {
        let mut socket = first;
        loop {
            let mut resume = None;
            loop {
                let msg = tokio::select! {
                    _ = stop.cancelled() => return,
                    m = socket.next() => m,
                };
                let text = match msg {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => continue,
                };
                let Ok(ev) = serde_json::from_str::<EventFrame>(&text) else {
                    continue;
                };
                let kind = match ev.kind {
                    "enter" => Kind::Enter,
                    "exit" => Kind::Exit,
                    "dwell" => Kind::Dwell,
                    "lagged" => {
                        counters.lagged.fetch_add(1, Relaxed);
                        resume = ev.resume_from;
                        continue;
                    }
                    "gap" => {
                        counters.gaps.fetch_add(1, Relaxed);
                        continue;
                    }
                    _ => continue,
                };
                counters.events[kind as usize].fetch_add(1, Relaxed);
                let at = ev
                    .at
                    .and_then(|a| Ts::parse_rfc3339(a).ok())
                    .map_or(i64::MIN, |t| t.0);
                tracker.record(kind, ev.device, ev.fence, at);
            }
            // Lagged (or dropped): resume from where the server said, so counts stay whole.
            let Some(from) = resume else { return };
            match tokio_tungstenite::connect_async(format!("{url}?from_seq={from}").as_str()).await
            {
                Ok((s, _)) => socket = s,
                Err(_) => return,
            }
        }
    }))
}

fn progress_bar(
    enabled: bool,
    counters: Arc<Counters>,
    tracker: Arc<Tracker>,
) -> Option<indicatif::ProgressBar> {
    if !enabled {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}") {
        bar.set_style(style);
    }
    let b = bar.clone();
    tokio::spawn(async move {
        let mut last = (0u64, Instant::now());
        while !b.is_finished() {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let accepted = counters.accepted.load(Relaxed);
            let rate = (accepted - last.0) as f64 / last.1.elapsed().as_secs_f64();
            last = (accepted, Instant::now());
            let ev: Vec<u64> = counters.events.iter().map(|e| e.load(Relaxed)).collect();
            let (_, all) = tracker.summaries();
            b.set_message(format!(
                "sent {} accepted {} ({:.0}/s) late {} | enter {} exit {} dwell {} | p99 {:.2} ms",
                counters.sent.load(Relaxed),
                accepted,
                rate,
                counters.late.load(Relaxed),
                ev[0],
                ev[1],
                ev[2],
                all.p99_us as f64 / 1000.0
            ));
            b.tick();
        }
    });
    Some(bar)
}
