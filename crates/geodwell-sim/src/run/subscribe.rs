//! The event subscription: `GET /v1/events/ws`, read for the whole run, each event counted and
//! handed to the [`Tracker`] for its latency.
//!
//! Owns: the subscriber task and what it makes of frames: `enter` / `exit` / `dwell` are
//! counted and timed; `lagged` is counted and the subscription resumed from the sequence the
//! server names (so counts stay whole); `gap` is counted; anything else is skipped.
//!
//! Invariants: the first connection is made before any fix is sent (so no event is missed) and
//! a refusal of it (401 / 403) is [`SimError::Refused`]; resumes carry the same key; the task
//! ends when the run stops, when the server closes without naming a resume point, or when a
//! resume cannot connect.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use futures_util::StreamExt;
use reqwest::header::HeaderValue;
use serde::Deserialize;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::counters::Counters;
use super::ws;
use crate::error::SimError;
use crate::track::{Kind, Tracker};
use geodwell_core::time::Ts;

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
pub(super) async fn subscribe(
    base: &str,
    auth: Option<HeaderValue>,
    tracker: Arc<Tracker>,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, SimError> {
    let url = ws::url(base, "/v1/events/ws");
    let first = ws::connect(&url, auth.as_ref()).await.map_err(|e| {
        ws::refusal(&e, "GET /v1/events/ws", auth.is_some())
            .unwrap_or_else(|| SimError::server(&url, e))
    })?;
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
            match ws::connect(&format!("{url}?from_seq={from}"), auth.as_ref()).await {
                Ok(s) => socket = s,
                Err(_) => return,
            }
        }
    }))
}
