//! `GET /v1/devices/{id}`: a device's last fix and its pairs' states, asked of its shard.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::oneshot;

use crate::http::error::ApiError;
use crate::ingest::shard_of;
use crate::shard::ShardMsg;
use crate::state::AppState;

/// `GET /v1/devices/{id}`.
pub async fn get_device(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let (tx, rx) = oneshot::channel();
    let shard = &st.shards[shard_of(&id, st.shards.len())];
    shard
        .send(ShardMsg::Device {
            id: id.clone(),
            reply: tx,
        })
        .await
        .map_err(|_| ApiError::shutting_down())?;
    let view = rx
        .await
        .map_err(|_| ApiError::shutting_down())?
        .ok_or_else(|| {
            ApiError::not_found("device_not_found", format!("no device with id {id:?}"))
        })?;
    let pairs: Vec<_> = view
        .pairs
        .iter()
        .map(|(fence, p)| {
            let state = match (p.inside, p.votes) {
                (true, 0) => "inside",
                (true, _) => "exiting",
                (false, _) => "entering",
            };
            json!({
                "fence": fence,
                "state": state,
                "entered_at": p.entered_at,
                "votes": p.votes,
                "dwell_fired": p.fired.iter().map(|d| d.to_human()).collect::<Vec<_>>(),
                "dwell_waiting_stale": p.waiting_stale.iter().map(|d| d.to_human()).collect::<Vec<_>>(),
                "next_due": p.next_due,
            })
        })
        .collect();
    Ok(Json(json!({
        "device": view.id,
        "last_fix_at": view.last_fix_at,
        "last_position": view.last_position.map(|(lat, lon)| json!({"lat": lat, "lon": lon})),
        "buffered": view.buffered,
        "pairs": pairs,
    }))
    .into_response())
}
