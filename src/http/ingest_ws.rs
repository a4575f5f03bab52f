//! `GET /v1/ingest/ws`: WebSocket ingest. Each text frame is one fix object or an array of fixes;
//! each gets one text frame back, in order, with the same report as `POST /v1/fixes`. Up to
//! [`WINDOW`] frames are in the pipeline at once: a frame is dispatched to the shards while
//! earlier ones wait for their commit, so one connection is not limited to one fsync per frame. A text frame that is
//! not JSON gets an error frame and close code 1007; a binary frame gets close code 1003;
//! overload (full queues, or a frame that does not fit the memory budget) closes with 1013
//! ("try again later"); shutdown with 1001. At most `ingest.max_ws_connections` are open.

use std::sync::Arc;

use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade, close_code};
use axum::response::Response;

use crate::http::auth::Refused;
use crate::http::error::{ApiError, ErrorBody};
use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;

use crate::budget::Reservation;
use crate::ingest::{BatchError, Dispatched, IngestReport};
use crate::ingest::{Charge, ReadError};
use crate::state::AppState;
use crate::wire::{BatchShapeError, locate_batch};

/// `GET /v1/ingest/ws`.
#[utoipa::path(get, path = "/v1/ingest/ws", tag = "ingest",
    description = "WebSocket ingest: fixes as JSON text frames (one fix or an array per frame); each frame is answered with its report. Scope: ingest.",
    responses(
        (status = 101, description = "Switching to WebSocket"),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 503, description = "As many ingest WebSockets as `ingest.max_ws_connections` allows are open (Retry-After)", body = ErrorBody),
    ))]
pub async fn ingest_ws(
    State(st): State<Arc<AppState>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let ws = ws.map_err(ApiError::from)?;
    let slot = st.ingest_socket_slot().ok_or_else(|| {
        ApiError::unavailable(
            "too_many_ingest_sockets",
            format!(
                "{} ingest WebSockets are open, the most allowed (ingest.max_ws_connections)",
                st.config().max_ws_connections
            ),
        )
    })?;
    let tasks = st.tasks().clone();
    let max = st.config().max_body_bytes;
    Ok(ws
        .max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| async move {
            let _slot = slot;
            tasks.spawn(run(st, socket)).await.ok();
        }))
}

/// An error frame: the error body of the HTTP answers.
fn error_frame(code: &'static str, message: &str) -> Message {
    let body = ErrorBody::new(code, message);
    Message::Text(serde_json::to_string(&body).unwrap_or_default().into())
}

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    }))
}

/// Frames a connection may have dispatched and not yet answered. Dispatch order is the order
/// the shards see, so pipelining keeps a connection's fixes in order while the store commits
/// earlier frames.
const WINDOW: usize = 16;

/// What one received frame asks for.
enum FrameAction {
    /// Dispatched to the shards, holding its share of the memory budget; its answer comes in
    /// order.
    Dispatched(Dispatched, Reservation),
    /// Answer at once (after the frames before it), keep the connection.
    Reply(Message),
    /// Answer at once and close.
    Fatal(Vec<Message>),
    /// Nothing to answer (ping, pong).
    Skip,
    /// The client is gone.
    Gone,
}

async fn run(st: Arc<AppState>, mut socket: WebSocket) {
    let mut inflight = FuturesOrdered::new();
    loop {
        let action = tokio::select! {
            biased;
            _ = st.shutdown_token().cancelled() => {
                // Batches already dispatched are applied by the shards whatever happens here;
                // answer them if they complete within the drain, then say goodbye.
                while let Some(r) = inflight.next().await {
                    if !answer(&mut socket, r).await {
                        return;
                    }
                }
                let _ = socket.send(close(close_code::AWAY, "server shutting down")).await;
                return;
            }
            Some(r) = inflight.next(), if !inflight.is_empty() => {
                if !answer(&mut socket, r).await {
                    return;
                }
                continue;
            }
            m = socket.recv(), if inflight.len() < WINDOW => frame(&st, m),
        };
        match action {
            FrameAction::Dispatched(p, held) => inflight.push_back(async move {
                let r = p.wait().await;
                drop(held);
                r
            }),
            FrameAction::Skip => {}
            FrameAction::Gone => {
                // Let dispatched batches finish before the task ends (their outcome is already
                // decided by the shards; nobody is left to tell).
                while inflight.next().await.is_some() {}
                return;
            }
            FrameAction::Reply(m) => {
                if !drain(&mut socket, &mut inflight).await || socket.send(m).await.is_err() {
                    return;
                }
            }
            FrameAction::Fatal(ms) => {
                if drain(&mut socket, &mut inflight).await {
                    for m in ms {
                        let _ = socket.send(m).await;
                    }
                }
                return;
            }
        }
    }
}

/// Answers every dispatched frame, in order; false when the connection ended.
async fn drain<F>(socket: &mut WebSocket, inflight: &mut FuturesOrdered<F>) -> bool
where
    F: std::future::Future<Output = Result<IngestReport, BatchError>>,
{
    while let Some(r) = inflight.next().await {
        if !answer(socket, r).await {
            return false;
        }
    }
    true
}

/// Sends one frame's answer; false when the connection must end.
async fn answer(socket: &mut WebSocket, r: Result<IngestReport, BatchError>) -> bool {
    match r {
        Ok(report) => {
            let body = serde_json::to_string(&report).unwrap_or_default();
            socket.send(Message::Text(body.into())).await.is_ok()
        }
        Err(e) => {
            for m in batch_error(e) {
                let _ = socket.send(m).await;
            }
            false
        }
    }
}

/// The frames that answer a batch that could not be taken, ending with a close.
fn batch_error(e: BatchError) -> Vec<Message> {
    match e {
        BatchError::Overloaded => vec![
            error_frame("overloaded", "ingest queues are full; reconnect and retry"),
            close(close_code::AGAIN, "overloaded"),
        ],
        BatchError::StoreUnavailable(e) => vec![
            error_frame("store_unavailable", &e.to_string()),
            close(close_code::AGAIN, "state store unavailable"),
        ],
        BatchError::ShuttingDown => vec![close(close_code::AWAY, "server shutting down")],
    }
}

/// Reads one received message into a [`FrameAction`].
fn frame(st: &AppState, msg: Option<Result<Message, axum::Error>>) -> FrameAction {
    let text = match msg {
        Some(Ok(Message::Text(t))) => t,
        Some(Ok(Message::Binary(_))) => {
            return FrameAction::Fatal(vec![
                error_frame("binary_frame", "send fixes as JSON text frames"),
                close(close_code::UNSUPPORTED, "binary frames are not supported"),
            ]);
        }
        Some(Err(e)) => {
            // The only receive errors a live client can cause are protocol violations and
            // frames over the size limit; tell it which before the socket goes.
            let text = e.to_string();
            let too_big = text.contains("too long") || text.contains("Space limit");
            let (code, reason, err) = if too_big {
                (
                    close_code::SIZE,
                    "frame larger than max_body_bytes",
                    "frame_too_large",
                )
            } else {
                (
                    close_code::PROTOCOL,
                    "WebSocket protocol error",
                    "protocol_error",
                )
            };
            return FrameAction::Fatal(vec![error_frame(err, &text), close(code, reason)]);
        }
        Some(Ok(Message::Close(_))) | None => return FrameAction::Gone,
        Some(Ok(_)) => return FrameAction::Skip,
    };
    // The frame is in memory already; it counts from here until its answer.
    let Ok(mut held) = st.budget().try_reserve(text.len()) else {
        return FrameAction::Fatal(batch_error(BatchError::Overloaded));
    };
    let located = match locate_batch(&text) {
        Ok(located) => located,
        Err(e) => return FrameAction::Fatal(shape_frames(e)),
    };
    if located.is_empty() || located.len() > st.config().max_batch {
        return FrameAction::Reply(error_frame(
            "bad_batch_size",
            &format!("a frame must hold 1..={} fixes", st.config().max_batch),
        ));
    }
    let fixes = match st.ingest().read_within(located, &mut held, Charge::REQUEST) {
        Ok(fixes) => fixes,
        Err(ReadError::Budget(_)) => {
            return FrameAction::Fatal(batch_error(BatchError::Overloaded));
        }
        Err(ReadError::NeverFits { .. }) => {
            return FrameAction::Reply(error_frame(
                "bad_batch_size",
                "the frame's fixes would hold more than the whole ingest memory budget",
            ));
        }
        Err(ReadError::Shape(e)) => return FrameAction::Fatal(shape_frames(e)),
    };
    // The frame's text is not needed any more.
    held.release(text.len());
    drop(text);
    match st.ingest().dispatch("ws", fixes) {
        Ok(p) => FrameAction::Dispatched(p, held),
        Err(e) => FrameAction::Fatal(batch_error(e)),
    }
}

/// The last frames for a frame that is not a batch.
fn shape_frames(e: BatchShapeError) -> Vec<Message> {
    match e {
        BatchShapeError::NotFixOrArray(_) => vec![
            error_frame(
                "malformed_batch",
                "a frame must be a fix object or an array of fixes",
            ),
            close(close_code::INVALID, "frame is not a fix or an array"),
        ],
        BatchShapeError::NotJson(e) => vec![
            error_frame("malformed_json", &format!("frame is not JSON: {e}")),
            close(close_code::INVALID, "frame is not JSON"),
        ],
    }
}
