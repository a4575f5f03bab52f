//! `GET /v1/devices/{id}`: a device's last fix and its pairs' states, asked of its shard.
//! `GET /v1/devices`: every device's position and the fences it is inside, paged.
//!
//! The listing's cursor is opaque to clients (`<shard>.<slot>`): shards are walked in order and
//! each in slot order, which is stable because slots are never reused, so a page costs O(limit)
//! on each shard it touches instead of a sort of every device, and paging never repeats or skips
//! a device that existed when the walk began.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::oneshot;

use crate::http::error::ApiError;
use crate::http::events::{check_known, parse_u64};
use crate::ingest::shard_of;
use crate::shard::ShardMsg;
use crate::state::AppState;

/// `GET /v1/devices/{id}`.
#[utoipa::path(get, path = "/v1/devices/{id}", tag = "devices",
    description = "A device's last fix and its pairs' states. Scope: read.",
    params(("id" = String, Path, description = "Device id")),
    responses(
        (status = 200, description = "The device", body = crate::http::openapi::DeviceOut),
        (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused,
        (status = 404, description = "No such device", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "Overloaded, store unavailable or shutting down (Retry-After)", body = crate::http::openapi::ErrorBody),
    ))]
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

/// Largest page `GET /v1/devices` answers.
pub const MAX_DEVICE_PAGE: usize = 10_000;

/// Parses `<shard>.<slot>`. A cursor past the end (a shard or slot that does not exist) is
/// valid and yields an empty last page, as paging past the end would.
fn parse_cursor(s: &str) -> Result<(usize, u32), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "bad_query",
            format!("after={s:?} is not a cursor from next_after"),
        )
    };
    let (a, b) = s.split_once('.').ok_or_else(bad)?;
    let digits = |x: &str| !x.is_empty() && x.bytes().all(|c| c.is_ascii_digit());
    if !digits(a) || !digits(b) {
        return Err(bad());
    }
    let shard = a
        .parse::<u64>()
        .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let slot = b
        .parse::<u64>()
        .map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX));
    Ok((shard, slot))
}

/// `GET /v1/devices?limit=N&after=CURSOR`: `{"devices": [{"device", "last_fix_at", "lon",
/// "lat", "inside": [fence ids]}], "next_after": cursor or null}`. `limit` defaults to 1000 (at
/// most 10,000); pass `next_after` back as `after` for the next page.
#[utoipa::path(get, path = "/v1/devices", tag = "devices",
    description = "Every device's position and the fences it is inside, paged. Scope: read.",
    params(
        ("limit" = Option<u64>, Query, minimum = 1, maximum = 10000, description = "Page length (default 1000)"),
        ("after" = Option<String>, Query, description = "`next_after` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page of devices", body = crate::http::openapi::DevicePage),
        (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused, (status = 503, description = "Overloaded, store unavailable or shutting down (Retry-After)", body = crate::http::openapi::ErrorBody),
    ))]
pub async fn list_devices(
    State(st): State<Arc<AppState>>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    check_known(&q, &["limit", "after"])?;
    let limit = parse_u64(&q, "limit")?.unwrap_or(1000);
    if limit == 0 || limit > MAX_DEVICE_PAGE as u64 {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("limit must be in 1..={MAX_DEVICE_PAGE}"),
        ));
    }
    let limit = limit as usize;
    let (mut shard, mut slot) = match q.get("after") {
        Some(c) => parse_cursor(c)?,
        None => (0, 0),
    };
    let mut devices = Vec::new();
    let mut next_after = None;
    while shard < st.shards.len() {
        let (tx, rx) = oneshot::channel();
        st.shards[shard]
            .send(ShardMsg::DevicePage {
                from: slot,
                limit: limit - devices.len(),
                reply: tx,
            })
            .await
            .map_err(|_| ApiError::shutting_down())?;
        let (page, next) = rx.await.map_err(|_| ApiError::shutting_down())?;
        devices.extend(page.into_iter().map(|d| {
            json!({
                "device": d.id,
                "last_fix_at": d.last_fix_at,
                "lat": d.last_position.map(|p| p.0),
                "lon": d.last_position.map(|p| p.1),
                "inside": d.inside,
            })
        }));
        match next {
            Some(n) => slot = n,
            None => {
                shard += 1;
                slot = 0;
            }
        }
        if devices.len() >= limit {
            if shard < st.shards.len() {
                next_after = Some(format!("{shard}.{slot}"));
            }
            break;
        }
    }
    Ok(Json(json!({ "devices": devices, "next_after": next_after })).into_response())
}
