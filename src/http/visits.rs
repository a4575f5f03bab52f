//! `GET /v1/devices/{id}/visits`: a device's visits of fences, rebuilt from the event log.
//!
//! A visit is the ENTER, DWELLs and EXIT of one (fence, `entered_at`): the events of one pair
//! share its visit start, so grouping the device's held events by it gives every visit the log
//! still covers, whatever order they were published in. Nothing is stored for this: the answer
//! lasts as long as the log's retention holds the events (`events.log_capacity`, `max_age`), and
//! a visit whose ENTER was already trimmed is marked `complete: false`.
//!
//! Cost: one pass over the held log (at most `events.log_capacity` compact entries, read in
//! chunks of 4,096 under the log's lock) per page, on the scan pool ([`crate::http::scan`]); visits are sorted by (`entered_at`, fence) and paged
//! with an `after` cursor naming the last visit of the previous page.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::auth::Refused;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::events::parse_u64;
use crate::state::AppState;
use geodwell_core::event::EventKind;
use geodwell_core::time::Ts;

/// Largest page of visits.
pub const MAX_VISIT_PAGE: usize = 1_000;
/// Default page of visits.
pub const DEFAULT_VISIT_PAGE: usize = 100;
/// Log entries read per chunk of the scan.
const SCAN_CHUNK: usize = 4_096;

/// One visit of a fence by the device.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VisitOut {
    /// Fence id.
    #[schema(value_type = String)]
    pub fence: Arc<str>,
    /// The fence's name, when its events carry one.
    #[schema(value_type = Option<String>, nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<Arc<str>>,
    /// Visit start (the ENTER's `at`).
    #[schema(value_type = String, format = DateTime)]
    pub entered_at: Ts,
    /// The EXIT's `at`; absent while the visit is open (as far as the log knows).
    #[schema(value_type = Option<String>, format = DateTime, nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exited_at: Option<Ts>,
    /// `exited_at - entered_at` in seconds, for a closed visit.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// The dwell thresholds the visit reached (seconds), ascending.
    pub dwell_reached_s: Vec<f64>,
    /// Whether the log still holds the visit's ENTER (false: retention trimmed the start, and
    /// thresholds reached before the first held event are missing).
    pub complete: bool,
    /// `seq` of the visit's events held, in order.
    pub seqs: Vec<u64>,
}

/// `GET /v1/devices/{id}/visits` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct VisitPage {
    /// Visits, oldest start first.
    pub visits: Vec<VisitOut>,
    /// Pass as `after` for the next page; null on the last.
    pub next_after: Option<String>,
    /// The oldest `seq` the log holds: events (and visits) before it are gone.
    pub first_seq: u64,
}

/// A visit's place in the order: (`entered_at` ms, fence id), written `<ms>:<fence>`.
fn cursor(v: &VisitOut) -> String {
    format!("{}:{}", v.entered_at.0, v.fence)
}

fn parse_cursor(c: &str) -> Result<(i64, String), ApiError> {
    // Exactly the OpenAPI pattern: 1 to 15 digits, then `:`.
    c.split_once(':')
        .filter(|(ms, _)| (1..=15).contains(&ms.len()) && ms.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|(ms, fence)| Some((ms.parse::<i64>().ok()?, fence.to_string())))
        .ok_or_else(|| {
            ApiError::bad_request(
                "bad_query",
                format!("after={c:?} is not a cursor from next_after"),
            )
        })
}

fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// `GET /v1/devices/{id}/visits?limit=N&after=CURSOR`.
#[utoipa::path(get, path = "/v1/devices/{id}/visits", tag = "devices",
    description = "The device's visits of fences (enter, exit, duration, dwell thresholds reached), rebuilt from the event log: as far back as its retention holds them. Oldest start first, paged. Scope: read.",
    params(
        ("id" = String, Path, description = "Device id"),
        ("limit" = Option<u64>, Query, minimum = 1, maximum = 1000, description = "Page length (default 100)"),
        ("after" = Option<String>, Query, pattern = r"^[0-9]{1,15}:", description = "`next_after` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page of visits (empty for a device the log holds no event of)", body = VisitPage),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
    ))]
pub async fn list_visits(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Json<VisitPage>, ApiError> {
    let Path(id) = path?;
    let Query(q) = query?;
    let limit = parse_u64(&q, "limit")?.unwrap_or(DEFAULT_VISIT_PAGE as u64);
    if limit == 0 || limit > MAX_VISIT_PAGE as u64 {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("limit must be in 1..={MAX_VISIT_PAGE}"),
        ));
    }
    let after = q.get("after").map(|c| parse_cursor(c)).transpose()?;
    let log = st.log().clone();
    // One pass over the held log, on the scan pool; only the device's own events are expanded
    // (a compact entry's device id is compared in place), about a millisecond per 100,000
    // entries.
    let (visits, first_seq) = crate::http::scan::run(move || {
        let mut visits: BTreeMap<(i64, Arc<str>), VisitOut> = BTreeMap::new();
        let held = log.read(0, 0);
        let (first_seq, head) = (held.first_seq, held.next_seq);
        let mut next = first_seq;
        while next < head {
            let r = log.read(next, SCAN_CHUNK);
            let Some(last) = r.events.last() else { break };
            next = last.seq + 1;
            for e in r.events.iter().filter(|e| e.event.device() == id) {
                let ev = e.event.to_event(e.seq);
                let v = visits
                    .entry((ev.entered_at.0, ev.fence.clone()))
                    .or_insert_with(|| VisitOut {
                        fence: ev.fence.clone(),
                        name: None,
                        entered_at: ev.entered_at,
                        exited_at: None,
                        duration_s: None,
                        dwell_reached_s: Vec::new(),
                        complete: false,
                        seqs: Vec::new(),
                    });
                v.seqs.push(e.seq);
                if ev.name.is_some() {
                    v.name = ev.name.clone();
                }
                match ev.kind {
                    EventKind::Enter => v.complete = true,
                    EventKind::Exit => {
                        v.exited_at = Some(ev.at);
                        v.duration_s = Some(secs(ev.at.since(ev.entered_at).millis()));
                    }
                    EventKind::Dwell => {
                        if let Some(d) = ev.dwell_s {
                            v.dwell_reached_s.push(secs(d.0.millis()));
                        }
                    }
                }
            }
        }
        let mut visits: Vec<VisitOut> = visits.into_values().collect();
        for v in &mut visits {
            v.dwell_reached_s.sort_by(f64::total_cmp);
        }
        (visits, first_seq)
    })
    .await?;
    let from = match &after {
        Some((ms, fence)) => {
            visits.partition_point(|v| (v.entered_at.0, &*v.fence) <= (*ms, fence.as_str()))
        }
        None => 0,
    };
    let limit = limit as usize;
    let page: Vec<VisitOut> = visits[from..].iter().take(limit).cloned().collect();
    let next_after = (visits.len() > from + limit)
        .then(|| page.last().map(cursor))
        .flatten();
    Ok(Json(VisitPage {
        visits: page,
        next_after,
        first_seq,
    }))
}
