//! `GET /v1/devices/{id}`: a device's last fix and its pairs' states, asked of its shard.
//! `GET /v1/devices`: every device's position and the fences it is inside, paged (the cursor
//! and its guarantees are [`crate::shard::DeviceCursor`]'s).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use std::collections::HashMap;

use crate::http::error::ApiError;
use crate::http::events::{check_known, parse_u64};
use crate::shard::DeviceCursor;
use crate::state::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::json;

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
    let view = st
        .shards()
        .device(&id)
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
    let after = match q.get("after") {
        Some(c) => c
            .parse::<DeviceCursor>()
            .map_err(|e| ApiError::bad_request("bad_query", format!("after={e}")))?,
        None => DeviceCursor::default(),
    };
    let (page, next) = st
        .shards()
        .device_page(after, limit)
        .await
        .map_err(|_| ApiError::shutting_down())?;
    let devices: Vec<serde_json::Value> = page
        .into_iter()
        .map(|d| {
            json!({
                "device": d.id,
                "last_fix_at": d.last_fix_at,
                "lat": d.last_position.map(|p| p.0),
                "lon": d.last_position.map(|p| p.1),
                "inside": d.inside,
            })
        })
        .collect();
    let next_after = next.map(|c| c.to_string());
    Ok(Json(json!({ "devices": devices, "next_after": next_after })).into_response())
}
