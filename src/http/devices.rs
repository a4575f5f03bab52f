//! `GET /v1/devices/{id}`: a device's last fix and its pairs' states, asked of its shard.
//! `DELETE /v1/devices/{id}`: forgets a device (its pairs, timers and buffered fixes; no EXIT
//! is emitted), durably, as a record of its shard's input.
//! `GET /v1/devices`: every device's position and the fences it is inside, paged (the cursor
//! and its guarantees are [`crate::shard::DeviceCursor`]'s).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use std::collections::HashMap;

use crate::http::auth::Refused;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::events::parse_u64;
use crate::shard::DeviceCursor;
use crate::state::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use geodwell_core::engine::DeviceSummary;
use geodwell_core::pairs::PairView;
use geodwell_core::time::Ts;
use serde::Serialize;
use utoipa::ToSchema;

// The answers' fields are in alphabetical order, the order they have always had (they used to
// be built as `serde_json` maps, which sort their keys).

/// `GET /v1/devices/{id}` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeviceOut {
    /// How far behind the watermark the device's latest applied fix arrived, seconds (0: on
    /// time, or no longer remembered).
    pub arrival_lag_s: f64,
    /// Fixes waiting for the watermark.
    pub buffered: u64,
    /// The device's latest fixes that arrived behind the watermark, newest first (at most 8,
    /// while the shard still remembers them), applied or late.
    pub delayed: Vec<DelayedOut>,
    /// Device id.
    #[schema(value_type = String)]
    pub device: Arc<str>,
    /// The device's frontier: the latest event time of anything decided for it (its latest
    /// applied fix, its events, its run expiries). A fix at or before it is late
    /// (`behind_device`); a later one is applied, even behind the watermark.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub frontier: Option<Ts>,
    /// While the device's delay hold is on: the watermark at which it ends (its dwell
    /// deadlines and run expiries wait at its latest fix until then). Absent otherwise.
    #[schema(value_type = Option<String>, format = DateTime, nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<Ts>,
    /// Latest applied fix time.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_fix_at: Option<Ts>,
    /// Latest applied position.
    pub last_position: Option<Position>,
    /// Pairs by fence.
    pub pairs: Vec<PairOut>,
}

/// A fix that arrived behind the watermark.
#[derive(Debug, Serialize, ToSchema)]
pub struct DelayedOut {
    /// How far behind the watermark it arrived, seconds.
    pub behind_s: f64,
    /// `applied`, or why it was late: `too_old`, `behind_device`.
    #[schema(value_type = String, example = "applied")]
    pub outcome: &'static str,
    /// Its time.
    #[schema(value_type = String, format = DateTime)]
    pub ts: Ts,
}

/// A position.
#[derive(Debug, Serialize, ToSchema)]
pub struct Position {
    /// Latitude.
    pub lat: f64,
    /// Longitude.
    pub lon: f64,
}

/// A pair's state in a device view.
#[derive(Debug, Serialize, ToSchema)]
pub struct PairOut {
    /// Thresholds emitted in this visit.
    pub dwell_fired: Vec<String>,
    /// Thresholds whose deadline passed while the device was STALE.
    pub dwell_waiting_stale: Vec<String>,
    /// Visit start (or pending run start).
    #[schema(value_type = String, format = DateTime)]
    pub entered_at: Ts,
    /// Fence id.
    #[schema(value_type = String)]
    pub fence: Arc<str>,
    /// Next internal event time.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_due: Option<Ts>,
    /// `inside`, `entering` (pending ENTER run) or `exiting` (pending EXIT run).
    pub state: PairState,
    /// Length of the pending run.
    pub votes: u32,
}

/// Where a pair stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PairState {
    /// Inside, no EXIT run pending.
    Inside,
    /// Outside, an ENTER run pending.
    Entering,
    /// Inside, an EXIT run pending.
    Exiting,
}

impl PairOut {
    fn new(fence: Arc<str>, p: PairView) -> PairOut {
        PairOut {
            dwell_fired: p.fired.iter().map(|d| d.to_human()).collect(),
            dwell_waiting_stale: p.waiting_stale.iter().map(|d| d.to_human()).collect(),
            entered_at: p.entered_at,
            fence,
            next_due: p.next_due,
            state: match (p.inside, p.votes) {
                (true, 0) => PairState::Inside,
                (true, _) => PairState::Exiting,
                (false, _) => PairState::Entering,
            },
            votes: u32::from(p.votes),
        }
    }
}

/// A device in `GET /v1/devices`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeviceSummaryOut {
    /// Device id.
    #[schema(value_type = String)]
    pub device: Arc<str>,
    /// Fences the device is inside.
    #[schema(value_type = Vec<String>)]
    pub inside: Vec<Arc<str>>,
    /// Latest applied fix time.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_fix_at: Option<Ts>,
    /// Latest applied latitude.
    pub lat: Option<f64>,
    /// Latest applied longitude.
    pub lon: Option<f64>,
}

impl From<DeviceSummary> for DeviceSummaryOut {
    fn from(d: DeviceSummary) -> DeviceSummaryOut {
        DeviceSummaryOut {
            device: d.id,
            inside: d.inside,
            last_fix_at: d.last_fix_at,
            lat: d.last_position.map(|p| p.0),
            lon: d.last_position.map(|p| p.1),
        }
    }
}

/// `GET /v1/devices` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct DevicePage {
    /// Devices.
    pub devices: Vec<DeviceSummaryOut>,
    /// Pass as `after` for the next page; null at the end.
    pub next_after: Option<String>,
}

/// `GET /v1/devices/{id}`.
#[utoipa::path(get, path = "/v1/devices/{id}", tag = "devices",
    description = "A device's last fix, its pairs' states, its frontier (a fix at or before it is late) and delay hold, and its latest fixes that arrived behind the watermark. Scope: read.",
    params(("id" = String, Path, description = "Device id")),
    responses(
        (status = 200, description = "The device", body = DeviceOut),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 404, description = "No such device", body = ErrorBody),
        (status = 503, description = "Overloaded, store unavailable or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn get_device(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<DeviceOut>, ApiError> {
    let Path(id) = path?;
    let view = st.shards().device(&id).await?.ok_or_else(|| {
        ApiError::not_found("device_not_found", format!("no device with id {id:?}"))
    })?;
    let arrival_lag_s = view
        .delayed
        .iter()
        .find(|f| f.late.is_none() && Some(f.ts) == view.last_fix_at)
        .map_or(0.0, |f| f.behind.millis() as f64 / 1000.0);
    Ok(Json(DeviceOut {
        arrival_lag_s,
        buffered: view.buffered as u64,
        delayed: view
            .delayed
            .iter()
            .map(|f| DelayedOut {
                behind_s: f.behind.millis() as f64 / 1000.0,
                outcome: f.late.map_or("applied", |r| r.as_str()),
                ts: f.ts,
            })
            .collect(),
        device: view.id,
        frontier: view.frontier,
        hold_until: view.hold_until,
        last_fix_at: view.last_fix_at,
        last_position: view.last_position.map(|(lat, lon)| Position { lat, lon }),
        pairs: view
            .pairs
            .into_iter()
            .map(|(fence, p)| PairOut::new(fence, p))
            .collect(),
    }))
}

/// The `limit` (default `default`, at most `max`) and `after` cursor of a list paged by device
/// slot (`GET /v1/devices`, a fence's occupants).
pub(crate) fn device_paging(
    q: &HashMap<String, String>,
    default: usize,
    max: usize,
) -> Result<(usize, DeviceCursor), ApiError> {
    let limit = parse_u64(q, "limit")?.unwrap_or(default as u64);
    if limit == 0 || limit > max as u64 {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("limit must be in 1..={max}"),
        ));
    }
    let after = match q.get("after") {
        Some(c) => c
            .parse::<DeviceCursor>()
            .map_err(|e| ApiError::bad_request("bad_query", format!("after={e}")))?,
        None => DeviceCursor::default(),
    };
    Ok((limit as usize, after))
}

/// `DELETE /v1/devices/{id}`.
#[utoipa::path(delete, path = "/v1/devices/{id}", tag = "devices",
    description = "Forgets a device: its pairs, pending timers and buffered fixes are dropped and no EXIT is emitted (an open visit stays open in the event history). A later fix of the same id starts a new device; a delayed fix from before the removal is late (behind_device). Durable before the answer. Scope: admin.",
    params(("id" = String, Path, description = "Device id")),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 404, description = "No such device", body = ErrorBody),
        (status = 503, description = "Store or partition unavailable, or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn delete_device(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<axum::http::StatusCode, ApiError> {
    let Path(id) = path?;
    if st.shards().remove_device(&id).await? {
        Ok(axum::http::StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(
            "device_not_found",
            format!("no device with id {id:?}"),
        ))
    }
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
        ("after" = Option<String>, Query, pattern = r"^[0-9]{1,9}\.[0-9]{1,18}$", description = "`next_after` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page of devices", body = DevicePage),
        (status = 400, description = "Bad request", body = ErrorBody), Refused, (status = 503, description = "Overloaded, store unavailable or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn list_devices(
    State(st): State<Arc<AppState>>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Json<DevicePage>, ApiError> {
    let Query(q) = query?;
    let (limit, after) = device_paging(&q, 1000, MAX_DEVICE_PAGE)?;
    let (page, next) = st.shards().device_page(after, limit).await?;
    Ok(Json(DevicePage {
        devices: page.into_iter().map(DeviceSummaryOut::from).collect(),
        next_after: next.map(|c| c.to_string()),
    }))
}
