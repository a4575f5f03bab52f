//! The simulator's driver: sends a [`Fleet`]'s fixes to a running server and measures what
//! comes back.
//!
//! Owns: the options of a run ([`SimOptions`]) and [`run`], which wires the pipeline: the
//! generator thread (`pace`) -> batches -> sender tasks (`http` NDJSON or `ws` ingest)
//! -> server, the event subscription that times each event's arrival (`subscribe`), and the
//! tallies and final [`SimReport`] (`counters`, `report`).
//!
//! Invariants:
//! - A batch's send time is recorded before its first byte is written, so measured latency
//!   includes every queue on the way (client socket, server parsing, shard queues, commit).
//! - Batches are released on a schedule fixed by the generator ([`Pace`]); a sender that falls
//!   behind sends at once and the slip is reported, so a run that cannot keep up shows it as a
//!   lower accepted rate rather than silently stretching time.
//! - Nothing here panics on server behaviour. Before the first fix, a failed readiness probe,
//!   fence upload or subscription is an error. Once fixes flow, refused connections, error
//!   statuses, error frames and closes are counted in the report, except a 401 / 403 (the API
//!   key is missing, not valid or lacks a scope): it stops the run at once and [`run`] returns
//!   [`SimError::Refused`], since no later request could succeed.
//! - With an [`ApiKey`], every request carries `Authorization: Bearer <key>`: the readiness
//!   probe, the fence upload, every fix batch, the WebSocket ingest upgrades and the event
//!   subscription (and its resumes).

mod counters;
mod http;
mod pace;
mod report;
mod subscribe;
mod ws;

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use reqwest::header::HeaderValue;
use serde::Serialize;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use crate::fleet::{Fleet, FleetSpec};
use crate::track::{FenceFacts, Tracker, WatermarkModel};
use counters::Counters;
use geodwell_core::fences::Fence;
use geodwell_core::time::Ts;
use pace::{Batch, SendCtx};

pub use crate::error::SimError;
pub use report::SimReport;

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

/// An API key, sent as `Authorization: Bearer <key>`. `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps the key's secret.
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The `Authorization` header's value, marked sensitive.
    fn header(&self) -> Result<HeaderValue, SimError> {
        let mut v = HeaderValue::from_str(&format!("Bearer {}", self.0)).map_err(|_| {
            SimError::Options("the API key may only hold visible ASCII characters".into())
        })?;
        v.set_sensitive(true);
        Ok(v)
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
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
    /// Sent with every request, if any.
    pub api_key: Option<ApiKey>,
    /// Drive between the server's own fences (read from `GET /v1/fences`) instead of the given
    /// ones; nothing is uploaded.
    pub server_fences: bool,
    /// Event clock: move the server's watermark to the last fix's time at the end (`POST
    /// /v1/watermark`, admin scope), so the deadlines up to it are judged.
    pub finish_watermark: bool,
    /// Delete the fences the run created (not those it replaced) and its devices afterwards
    /// (admin scope).
    pub cleanup: bool,
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
            api_key: None,
            server_fences: false,
            finish_watermark: true,
            cleanup: false,
        }
    }
}

/// Runs the simulation against `opts.server` and returns the report. `spec.start` is moved
/// forward to the wall clock (live servers) or past the server's watermark (event servers) so
/// that the fixes are not late; pass the fences the fleet drives between.
///
/// A report is returned whatever the server answered to the fixes (see
/// [`SimReport::refusal`]), except for a 401 / 403 anywhere, which ends the run at once with
/// [`SimError::Refused`].
pub async fn run(
    opts: &SimOptions,
    mut spec: FleetSpec,
    mut fences: Vec<Arc<Fence>>,
    cancel: CancellationToken,
) -> Result<SimReport, SimError> {
    if opts.connections == 0 || opts.batch == 0 || opts.ws_window == 0 {
        return Err(SimError::Options(
            "connections, batch and ws window must be at least 1".into(),
        ));
    }
    let auth = opts.api_key.as_ref().map(ApiKey::header).transpose()?;
    let client = http::client(opts, auth.clone())?;
    let base = opts.server.trim_end_matches('/').to_string();
    let ready = http::ready(&client, &base).await?;
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

    if opts.server_fences {
        fences = http::server_fences(&client, &base, auth.is_some()).await?;
        if fences.is_empty() {
            return Err(SimError::Options(
                "--around-server-fences: the server holds no fences".into(),
            ));
        }
    }
    let uploaded = opts.upload_fences && !opts.server_fences;
    // What the cleanup may delete: the fences this run creates, not those it replaces.
    let mut created: Vec<String> = Vec::new();
    if uploaded {
        if opts.cleanup {
            let held: std::collections::HashSet<String> =
                http::server_fences(&client, &base, auth.is_some())
                    .await?
                    .iter()
                    .map(|f| f.id.to_string())
                    .collect();
            created = fences
                .iter()
                .map(|f| f.id.to_string())
                .filter(|id| !held.contains(id))
                .collect();
        }
        http::upload(&client, &base, &fences, auth.is_some()).await?;
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
                    confirm_within_ms: f.settings.confirm_within.0,
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
        Some(
            subscribe::subscribe(
                &base,
                auth.clone(),
                tracker.clone(),
                counters.clone(),
                stop.clone(),
            )
            .await?,
        )
    } else {
        None
    };

    // A short queue: the generator stays just ahead of the senders.
    let (tx, rx) = mpsc::channel::<Batch>(2 * opts.connections + 2);
    let generator = {
        let stop = stop.clone();
        let opts = opts.clone();
        std::thread::spawn(move || pace::generate(fleet, &opts, tx, &stop, start.0))
    };
    let t0 = tracker.t0();
    if let Some(d) = opts.duration {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until((t0 + d).into()).await;
            stop.cancel();
        });
    }
    let progress = report::progress_bar(opts.progress, counters.clone(), tracker.clone());
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
            Transport::Http => tokio::spawn(http::send(
                ctx,
                client.clone(),
                base.clone(),
                auth.is_some(),
            )),
            Transport::Ws => tokio::spawn(ws::send(
                ctx,
                ws::url(&base, "/v1/ingest/ws"),
                auth.clone(),
                opts.ws_window,
            )),
        });
    }
    for s in senders {
        let _ = s.await;
    }
    // Unblock the generator if the senders stopped first, then collect it.
    drop(rx);
    let _ = tokio::task::spawn_blocking(move || generator.join()).await;

    // The end of the input: on an event clock the watermark stops at the last fix's time minus
    // the lateness; move it to the last fix's time so that every deadline up to it is judged.
    let mut finished_watermark = None;
    if !live
        && opts.finish_watermark
        && !counters.has_failed()
        && let Some(ts) = tracker.max_sent_ts()
    {
        finished_watermark = http::finish_watermark(&client, &base, Ts(ts)).await;
    }
    // Trailing events: wait until none has arrived for half a second, or the drain limit (not
    // after a refusal: there is nothing to wait for).
    if let Some(sub) = sub {
        let deadline = Instant::now() + opts.drain;
        let total = || counters.events.iter().map(|e| e.load(Relaxed)).sum::<u64>();
        let mut last = total();
        let mut quiet_since = Instant::now();
        while Instant::now() < deadline && !cancel.is_cancelled() && !counters.has_failed() {
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
    if let Some(e) = counters.take_failure() {
        return Err(e);
    }
    let mut report = report::report(
        opts,
        &ready.clock,
        lateness_ms,
        devices,
        fences.len(),
        start,
        &counters,
        &tracker,
    );
    report.finished_watermark = finished_watermark;
    if opts.cleanup {
        let device_ids: Vec<String> = (0..devices).map(|i| format!("{prefix}{i}")).collect();
        report.cleanup = Some(http::cleanup(&client, &base, &created, &device_ids).await);
    }
    Ok(report)
}
