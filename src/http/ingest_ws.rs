//! `GET /v1/ingest/ws`: WebSocket ingest. Each text frame is one fix object or an array of fixes;
//! each gets one text frame back with the same report as `POST /v1/fixes`. A text frame that is
//! not JSON gets an error frame and close code 1007; a binary frame gets close code 1003;
//! overload closes with 1013 ("try again later"); shutdown with 1001.

use std::sync::Arc;

use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade, close_code};
use axum::response::Response;
use serde_json::{Value, json};

use crate::http::error::ApiError;
use crate::ingest::{BatchError, RawItem, read_array, read_item, submit};
use crate::state::AppState;

/// `GET /v1/ingest/ws`.
pub async fn ingest_ws(
    State(st): State<Arc<AppState>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let ws = ws.map_err(ApiError::from)?;
    let tasks = st.tasks.clone();
    let max = st.cfg.max_body_bytes;
    Ok(ws
        .max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| async move {
            tasks.spawn(run(st, socket)).await.ok();
        }))
}

fn error_frame(code: &str, message: &str) -> Message {
    Message::Text(
        json!({"error": {"code": code, "message": message}})
            .to_string()
            .into(),
    )
}

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    }))
}

async fn run(st: Arc<AppState>, mut socket: WebSocket) {
    loop {
        let msg = tokio::select! {
            _ = st.shutdown.cancelled() => {
                let _ = socket.send(close(close_code::AWAY, "server shutting down")).await;
                return;
            }
            m = socket.recv() => m,
        };
        let text = match msg {
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Binary(_))) => {
                let _ = socket
                    .send(error_frame(
                        "binary_frame",
                        "send fixes as JSON text frames",
                    ))
                    .await;
                let _ = socket
                    .send(close(
                        close_code::UNSUPPORTED,
                        "binary frames are not supported",
                    ))
                    .await;
                return;
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
                let _ = socket.send(error_frame(err, &text)).await;
                let _ = socket.send(close(code, reason)).await;
                return;
            }
            Some(Ok(Message::Close(_))) | None => return,
            Some(Ok(_)) => continue,
        };
        let parsed = match read_array(&text) {
            Some(items) => Ok::<_, serde_json::Error>(items),
            None => serde_json::from_str::<Value>(&text).map(|v| match v {
                Value::Array(items) => items.into_iter().map(|v| Ok(RawItem::Json(v))).collect(),
                Value::Object(_) => vec![read_item(&text, "frame")],
                _ => Vec::new(),
            }),
        };
        let items = match parsed {
            Ok(items) if !items.is_empty() || text.trim_start().starts_with('[') => items,
            Ok(_) => {
                let _ = socket
                    .send(error_frame(
                        "malformed_batch",
                        "a frame must be a fix object or an array of fixes",
                    ))
                    .await;
                let _ = socket
                    .send(close(close_code::INVALID, "frame is not a fix or an array"))
                    .await;
                return;
            }
            Err(e) => {
                let _ = socket
                    .send(error_frame(
                        "malformed_json",
                        &format!("frame is not JSON: {e}"),
                    ))
                    .await;
                let _ = socket
                    .send(close(close_code::INVALID, "frame is not JSON"))
                    .await;
                return;
            }
        };
        if items.is_empty() || items.len() > st.cfg.max_batch {
            let _ = socket
                .send(error_frame(
                    "bad_batch_size",
                    &format!("a frame must hold 1..={} fixes", st.cfg.max_batch),
                ))
                .await;
            continue;
        }
        match submit(&st, "ws", items).await {
            Ok(report) => {
                let body = serde_json::to_string(&report).unwrap_or_default();
                if socket.send(Message::Text(body.into())).await.is_err() {
                    return;
                }
            }
            Err(BatchError::Overloaded) => {
                let _ = socket
                    .send(error_frame(
                        "overloaded",
                        "ingest queues are full; reconnect and retry",
                    ))
                    .await;
                let _ = socket.send(close(close_code::AGAIN, "overloaded")).await;
                return;
            }
            Err(BatchError::StoreUnavailable(msg)) => {
                let _ = socket.send(error_frame("store_unavailable", &msg)).await;
                let _ = socket
                    .send(close(close_code::AGAIN, "state store unavailable"))
                    .await;
                return;
            }
            Err(BatchError::ShuttingDown) => {
                let _ = socket
                    .send(close(close_code::AWAY, "server shutting down"))
                    .await;
                return;
            }
        }
    }
}
