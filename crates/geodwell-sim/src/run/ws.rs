//! The WebSocket side of a run: connecting (with the API key), and the ingest sender
//! (`GET /v1/ingest/ws`, one JSON array per text frame, up to `window` frames in flight).
//!
//! Owns: WebSocket URLs and connections, and how ingest answers are classified.
//! - An answer frame's counts go to the counters; an error frame (`{"error": {"code"}}`) loses
//!   its frame's fixes as `ws:<code>`; an unreadable one as `bad answer: ...`.
//! - Frames still in flight when the socket closes are lost as `ws:no answer`.
//! - A connection that cannot be made is counted as `ws connect: ...` (no fixes), except a
//!   401 / 403 upgrade answer, which stops the run with [`SimError::Refused`].
//!
//! Invariants: answers arrive in frame order (the server handles one socket in order), so the
//! reader pairs each answer with the oldest frame in flight; the key, if any, goes in the
//! upgrade request's `Authorization` header (not the `access_token` query, which would put it in
//! URLs and logs).

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use reqwest::header::{AUTHORIZATION, HeaderValue};
use tokio::sync::{Semaphore, mpsc};
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest};

use super::counters::Answer;
use super::pace::SendCtx;
use crate::error::{SimError, is_auth_refusal};

/// A client WebSocket.
pub(super) type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// `base` (`http://` or `https://`) as a `ws://` / `wss://` URL for `path`.
pub(super) fn url(base: &str, path: &str) -> String {
    let rest = base
        .strip_prefix("http://")
        .map(|r| format!("ws://{r}"))
        .or_else(|| base.strip_prefix("https://").map(|r| format!("wss://{r}")))
        .unwrap_or_else(|| base.to_string());
    format!("{}{path}", rest.trim_end_matches('/'))
}

/// Opens a WebSocket to `url`, sending `auth` as the `Authorization` header.
pub(super) async fn connect(
    url: &str,
    auth: Option<&HeaderValue>,
) -> Result<Socket, tungstenite::Error> {
    let mut req = url.into_client_request()?;
    if let Some(v) = auth {
        req.headers_mut().insert(AUTHORIZATION, v.clone());
    }
    let (socket, _) = tokio_tungstenite::connect_async(req).await?;
    Ok(socket)
}

/// The [`SimError::Refused`] for a connection error that was a 401 / 403 upgrade answer to
/// `request` (e.g. `GET /v1/ingest/ws`).
pub(super) fn refusal(e: &tungstenite::Error, request: &str, key_sent: bool) -> Option<SimError> {
    match e {
        tungstenite::Error::Http(resp) if is_auth_refusal(resp.status().as_u16()) => {
            Some(SimError::refused(
                resp.status().as_u16(),
                request,
                resp.body().as_deref().unwrap_or_default(),
                key_sent,
            ))
        }
        _ => None,
    }
}

/// One WebSocket ingest sender: one connection, frames sent when due, at most `window`
/// unanswered.
pub(super) async fn send(ctx: SendCtx, url: String, auth: Option<HeaderValue>, window: usize) {
    let socket = match connect(&url, auth.as_ref()).await {
        Ok(s) => s,
        Err(e) => {
            match refusal(&e, "GET /v1/ingest/ws", auth.is_some()) {
                Some(refused) => ctx.counters.fail(refused, &ctx.stop),
                None => ctx.counters.error(format!("ws connect: {e}"), 0),
            }
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
        let text = match tungstenite::Utf8Bytes::try_from(b.body.clone()) {
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
