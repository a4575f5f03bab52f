//! `GET /v1/fences/{id}/devices`: the devices inside a fence now, with when they entered, the
//! dwell thresholds already fired and the next due time, asked of every shard and paged (the
//! cursor is a shard and a pair slot; see [`crate::shard::Shards::occupants`]).
//!
//! Invariants: a page holds only devices whose pair is inside (committed ENTER, no EXIT yet) at
//! the moment its shard answered; a device that stays inside during the walk is listed exactly
//! once; one that enters or leaves during it may or may not be. Each page is bounded work per
//! shard, so a page can be shorter than `limit` while `next_after` is not null.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use geodwell_core::engine::Occupant;
use geodwell_core::time::Ts;
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::auth::Refused;
use crate::http::devices::PairState;
use crate::http::error::{ApiError, ErrorBody};
use crate::state::AppState;

/// Largest page `GET /v1/fences/{id}/devices` answers.
pub const MAX_OCCUPANT_PAGE: usize = 10_000;
/// Page length without `limit`.
pub const DEFAULT_OCCUPANT_PAGE: usize = 1_000;

/// A device inside the fence.
#[derive(Debug, Serialize, ToSchema)]
pub struct OccupantOut {
    /// Device id.
    #[schema(value_type = String)]
    pub device: Arc<str>,
    /// Dwell thresholds already emitted in this visit.
    pub dwell_fired: Vec<String>,
    /// Thresholds whose deadline passed while the device was STALE (they wait for a fix).
    pub dwell_waiting_stale: Vec<String>,
    /// Visit start: the event time of the ENTER.
    #[schema(value_type = String, format = DateTime)]
    pub entered_at: Ts,
    /// The device's latest applied fix time.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_fix_at: Option<Ts>,
    /// The pair's next internal event: the next dwell deadline, or when a pending EXIT run
    /// expires; null when nothing is due.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_due: Option<Ts>,
    /// `inside`, or `exiting` while an EXIT run is pending.
    pub state: PairState,
}

impl From<Occupant> for OccupantOut {
    fn from(o: Occupant) -> OccupantOut {
        let p = o.pair;
        OccupantOut {
            device: o.device,
            dwell_fired: p.fired.iter().map(|d| d.to_human()).collect(),
            dwell_waiting_stale: p.waiting_stale.iter().map(|d| d.to_human()).collect(),
            entered_at: p.entered_at,
            last_fix_at: o.last_fix_at,
            next_due: p.next_due,
            state: if p.votes == 0 {
                PairState::Inside
            } else {
                PairState::Exiting
            },
        }
    }
}

/// `GET /v1/fences/{id}/devices` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct OccupantPage {
    /// Devices inside the fence.
    pub devices: Vec<OccupantOut>,
    /// Fence id.
    pub fence: String,
    /// Pass as `after` for the next page; null at the end.
    pub next_after: Option<String>,
}

/// `GET /v1/fences/{id}/devices?limit=N&after=CURSOR`.
#[utoipa::path(get, path = "/v1/fences/{id}/devices", tag = "fences",
    description = "The devices inside a fence now: when each entered, the dwell thresholds already fired, the next due time. Paged; a page may be shorter than `limit` before the end (each page is bounded work). Scope: read.",
    params(
        ("id" = String, Path, description = "Fence id"),
        ("limit" = Option<u64>, Query, minimum = 1, maximum = 10000, description = "Page length (default 1000)"),
        ("after" = Option<String>, Query, pattern = r"^[0-9]{1,9}\.[0-9]{1,18}$", description = "`next_after` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page of the fence's occupants", body = OccupantPage),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 404, description = "No such fence", body = ErrorBody),
        (status = 503, description = "Overloaded, a partition unavailable or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn list_occupants(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Json<OccupantPage>, ApiError> {
    let Path(id) = path?;
    let Query(q) = query?;
    let (limit, after) =
        crate::http::devices::device_paging(&q, DEFAULT_OCCUPANT_PAGE, MAX_OCCUPANT_PAGE)?;
    if st.fences().get(&id).is_none() {
        return Err(ApiError::not_found(
            "fence_not_found",
            format!("no fence with id {id:?}"),
        ));
    }
    let (page, next) = st.shards().occupants(&id, after, limit).await?;
    Ok(Json(OccupantPage {
        devices: page.into_iter().map(OccupantOut::from).collect(),
        fence: id,
        next_after: next.map(|c| c.to_string()),
    }))
}
