//! The HTTP side of a run: the client, the readiness probe, the fence upload and the NDJSON
//! sender (`POST /v1/fixes`, one request per batch).
//!
//! Owns: how HTTP answers are classified.
//! - 2xx: the answer's counts go to the counters (an unreadable body loses the batch as
//!   `bad answer: ...`).
//! - 429 / 503: retried after 20 ms, up to 100 times, each retry counted; then the batch is
//!   lost under its status.
//! - 401 / 403: the batch is lost under its status and the run stops with
//!   [`SimError::Refused`] (no later request would be taken).
//! - Any other status, or no answer (`connect`, `transport`): the batch is lost under it.
//!
//! Invariant: the API key, if any, is a default header of the one client, so every HTTP
//! request of the run carries it.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde::Deserialize;

use super::SimOptions;
use super::counters::Answer;
use super::pace::SendCtx;
use crate::error::{SimError, is_auth_refusal};
use crate::fleet::feature_collection;
use geodwell_core::fences::Fence;
use geodwell_core::time::Ts;

/// The client every HTTP request of the run goes through, with `auth` as a default header.
pub(super) fn client(
    opts: &SimOptions,
    auth: Option<HeaderValue>,
) -> Result<reqwest::Client, SimError> {
    let mut headers = HeaderMap::new();
    if let Some(v) = auth {
        headers.insert(AUTHORIZATION, v);
    }
    reqwest::Client::builder()
        .pool_max_idle_per_host(opts.connections.max(4))
        .tcp_nodelay(true)
        .default_headers(headers)
        .build()
        .map_err(|e| SimError::server(&opts.server, e))
}

/// What `/readyz` says about the server's clock.
#[derive(Debug, Deserialize)]
pub(super) struct Ready {
    /// `live` or `event`.
    pub(super) clock: String,
    /// The current watermark (event clock).
    #[serde(default)]
    pub(super) watermark: Option<Ts>,
    /// The configured lateness, ms.
    #[serde(default)]
    pub(super) lateness_ms: Option<i64>,
}

/// Asks `/readyz` (open to anyone) for the server's clock.
pub(super) async fn ready(client: &reqwest::Client, base: &str) -> Result<Ready, SimError> {
    let url = format!("{base}/readyz");
    client
        .get(&url)
        .send()
        .await
        .map_err(|e| SimError::server(&url, e))?
        .json()
        .await
        .map_err(|e| SimError::server(&url, format!("unexpected /readyz answer: {e}")))
}

/// Passes a 2xx answer through; turns a refusal (401/403) into the error that says which key
/// is missing, and any other status into a server error with the answer's text.
async fn check_answer(
    r: reqwest::Response,
    url: &str,
    what: &'static str,
    key_sent: bool,
) -> Result<reqwest::Response, SimError> {
    let status = r.status();
    if is_auth_refusal(status.as_u16()) {
        let body = r.bytes().await.unwrap_or_default();
        return Err(SimError::refused(status.as_u16(), what, &body, key_sent));
    }
    if !status.is_success() {
        let text = r.text().await.unwrap_or_default();
        return Err(SimError::server(url, format!("{status}: {text}")));
    }
    Ok(r)
}

/// Posts the fences, 500 per request (needs the `admin` scope).
pub(super) async fn upload(
    client: &reqwest::Client,
    base: &str,
    fences: &[Arc<Fence>],
    key_sent: bool,
) -> Result<(), SimError> {
    let url = format!("{base}/v1/fences");
    for chunk in fences.chunks(500) {
        let fc = feature_collection(chunk);
        let body = serde_json::to_vec(&fc).map_err(|e| SimError::server(&url, e))?;
        let r = client
            .post(&url)
            .header("content-type", "application/geo+json")
            .body(body)
            .send()
            .await
            .map_err(|e| SimError::server(&url, e))?;
        check_answer(r, &url, "POST /v1/fences", key_sent).await?;
    }
    Ok(())
}

/// Reads every fence of the server (`GET /v1/fences`, page by page; read scope).
pub(super) async fn server_fences(
    client: &reqwest::Client,
    base: &str,
    key_sent: bool,
) -> Result<Vec<Arc<Fence>>, SimError> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/fences?limit=10000");
        if let Some(a) = &after {
            url.push_str("&after=");
            url.push_str(&urlencode(a));
        }
        let r = client
            .get(&url)
            .send()
            .await
            .map_err(|e| SimError::server(&url, e))?;
        let r = check_answer(r, &url, "GET /v1/fences", key_sent).await?;
        let text = r.text().await.map_err(|e| SimError::server(&url, e))?;
        let page: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| SimError::server(&url, e))?;
        let fences = geodwell_core::fences::parse_fences_str(&text, &Default::default())
            .map_err(|e| SimError::server(&url, format!("the server's fences: {e}")))?;
        out.extend(fences.into_iter().map(Arc::new));
        match page["next_after"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => return Ok(out),
        }
    }
}

/// Percent-encodes a path or query component (fence and device ids may hold any character).
fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Moves the server's watermark to `to` (`POST /v1/watermark`); `None` when the server did not
/// take it (the key lacks admin, or the watermark is already past it), which the report shows.
pub(super) async fn finish_watermark(client: &reqwest::Client, base: &str, to: Ts) -> Option<Ts> {
    let url = format!("{base}/v1/watermark");
    let r = client
        .post(&url)
        .json(&serde_json::json!({ "watermark": to.0 }))
        .send()
        .await
        .ok()?;
    r.status().is_success().then_some(to)
}

/// Deletes `fences` and `devices` (`DELETE`, eight at a time; admin scope). "Not found" counts
/// as done and is not counted; other failures are counted by status.
pub(super) async fn cleanup(
    client: &reqwest::Client,
    base: &str,
    fences: &[String],
    devices: &[String],
) -> super::report::Cleanup {
    use futures_util::StreamExt;
    let mut c = super::report::Cleanup::default();
    let paths = fences
        .iter()
        .map(|id| (true, format!("{base}/v1/fences/{}", urlencode(id))))
        .chain(
            devices
                .iter()
                .map(|id| (false, format!("{base}/v1/devices/{}", urlencode(id)))),
        );
    let mut answers = futures_util::stream::iter(paths.map(|(fence, url)| async move {
        (fence, client.delete(&url).send().await.map(|r| r.status()))
    }))
    .buffer_unordered(8);
    while let Some((fence, r)) = answers.next().await {
        match r {
            Ok(s) if s.is_success() => {
                if fence {
                    c.fences += 1;
                } else {
                    c.devices += 1;
                }
            }
            Ok(s) if s.as_u16() == 404 => {}
            Ok(s) => *c.failed.entry(s.as_u16().to_string()).or_default() += 1,
            Err(_) => *c.failed.entry("transport".into()).or_default() += 1,
        }
    }
    c
}

/// One HTTP sender: posts each batch as NDJSON when it is due, until the run stops.
pub(super) async fn send(ctx: SendCtx, client: reqwest::Client, base: String, key_sent: bool) {
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
                    if is_auth_refusal(status) {
                        let body = r.bytes().await.unwrap_or_default();
                        let e = SimError::refused(status, "POST /v1/fixes", &body, key_sent);
                        ctx.counters.fail(e, &ctx.stop);
                    }
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
