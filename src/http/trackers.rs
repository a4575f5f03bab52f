//! Tracker protocols over HTTP: `/v1/trackers/osmand` (OsmAnd / Traccar Client, GET or POST)
//! and `/v1/trackers/owntracks` (OwnTracks HTTP mode, POST). See `docs/trackers.md`.
//!
//! The protocols are read by [`crate::wire::trackers`] (pure); this module takes the requests
//! apart and answers them. Every mapped fix goes through [`crate::ingest::Ingest::submit`], the
//! path `POST /v1/fixes` takes, so it gets the same validation, watermark stamping, shard routing
//! and metrics (`transport` is `osmand` or `owntracks` on `geodwell_fixes_received_total`).
//!
//! Invariants:
//! - A request is answered 200 when its fix was accepted, late or a duplicate (as `/v1/fixes`
//!   reports them); 400 with the item's error when it was rejected; 503 with `Retry-After` when
//!   ingest is overloaded (queue or reorder buffer full), so clients that retry on failure retry
//!   then and only then.
//! - OwnTracks messages other than `_type: location` are answered 200 `[]` and ignored.

use std::sync::Arc;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::Value;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AnyOf, KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::config::ClockMode;
use crate::http::auth::Refused;
use crate::http::body::{JsonBody, Read, TrackerBody};
use crate::http::error::{ApiError, ErrorBody, ErrorDetails};
use crate::http::fixes::check_batch;
use crate::http::openapi::OwnTracksMessage as OwnTracksBody;
use crate::ingest::IngestReport;
use crate::state::AppState;
use crate::wire::trackers::{
    BodyError, OwnTracksIdentity, OwnTracksMessage, TrackerFix, osmand_from_json,
    osmand_from_params, owntracks_from_json, parse_form,
};
use crate::wire::{ItemCode, ItemError};
use geodwell_core::fix::Fix;
use geodwell_core::time::Ts;

/// The time to give a location that carries none: the arrival time in `live` mode (what Traccar
/// does), nothing in `event` mode, where only the fixes' own times may move the watermark.
fn arrival_time(st: &AppState) -> Option<Ts> {
    match st.config().clock {
        ClockMode::Live => Some(st.ingest().now()),
        ClockMode::Event => None,
    }
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> ApiError {
        ApiError::bad_request(e.code, e.message)
    }
}

/// Whether an OsmAnd POST body is Traccar Client's JSON: by content type, or, without a form
/// content type, by its first character.
fn is_json_body(headers: &HeaderMap, body: &[u8]) -> bool {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if ct.starts_with("application/json") || ct.contains("+json") {
        return true;
    }
    if ct.starts_with("application/x-www-form-urlencoded") {
        return false;
    }
    matches!(
        body.iter().find(|b| !b.is_ascii_whitespace()),
        Some(b'{' | b'[')
    )
}

/// An optional OsmAnd number (`speed`, `bearing`), as a parameter schema: a number, or blank,
/// which means "unknown" as Traccar reads it (`speed=`, or only white space as Rust's `trim`
/// sees it).
pub struct BlankOrNumber;

/// An optional OsmAnd `accuracy`: like [`BlankOrNumber`], but never negative.
pub struct BlankOrNonNegative;

/// `number`'s schema or a blank string (white space as `str::trim` sees it).
fn blank_or(number: ObjectBuilder) -> RefOr<Schema> {
    let blank = "^[\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]*$";
    AnyOf::builder()
        .item(
            number
                .schema_type(Type::Number)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Double))),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(blank)),
        )
        .into()
}

impl PartialSchema for BlankOrNumber {
    fn schema() -> RefOr<Schema> {
        blank_or(ObjectBuilder::new())
    }
}

impl ToSchema for BlankOrNumber {}

impl PartialSchema for BlankOrNonNegative {
    fn schema() -> RefOr<Schema> {
        blank_or(ObjectBuilder::new().minimum(Some(0.0)))
    }
}

impl ToSchema for BlankOrNonNegative {}

/// `GET|POST /v1/trackers/osmand`: the OsmAnd protocol as Traccar Client and the OsmAnd app
/// speak it. Parameters come from the query and, for a form body, from the body too (body
/// values win); a JSON body (Traccar Client 9+) is read instead of parameters.
#[utoipa::path(method(get, post), path = "/v1/trackers/osmand", tag = "ingest",
    description = "OsmAnd / Traccar Client protocol: parameters in the query (and, for POST, a form body), or Traccar Client 9+ JSON. `timestamp` is Unix seconds or ms, or a date-time; `speed` is knots. Trackers that cannot send headers pass the key as `access_token`. Scope: ingest. See docs/trackers.md.",
    params(
        ("id" = String, Query, pattern = r"^[^\u0000-\u001F\u007F-\u009F]*[^\u0000-\u0020\u007F-\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000][^\u0000-\u001F\u007F-\u009F]*$", description = "Device id (`deviceid` is also read); a value of only white space counts as absent"),
        ("lat" = f64, Query, minimum = -90.0, maximum = 90.0, description = "Latitude (or `location=lat,lon`)"),
        ("lon" = f64, Query, minimum = -180.0, maximum = 180.0, description = "Longitude"),
        ("timestamp" = String, Query, pattern = r"^([0-9]{10}|[0-9]{13})$", description = "Fix time: Unix seconds or milliseconds (a date-time is also read). Optional in live mode (arrival time is used)"),
        ("accuracy" = inline(Option<BlankOrNonNegative>), Query, description = "Accuracy, metres"),
        ("speed" = inline(Option<BlankOrNumber>), Query, description = "Speed, knots"),
        ("bearing" = inline(Option<BlankOrNumber>), Query, description = "Bearing, degrees"),
    ),
    responses(
        (status = 200, description = "Taken (accepted, late or duplicate)", body = crate::ingest::IngestReport),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 408, description = "The body did not arrive within `server.body_timeout`", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "A body that is neither JSON nor (OsmAnd) a form", body = ErrorBody),
        (status = 503, description = "Overloaded or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn osmand(
    State(st): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    Read(read, _): Read<TrackerBody>,
) -> Result<Json<IngestReport>, ApiError> {
    let body = &read.bytes;
    let arrival = arrival_time(&st);
    let fixes = if !body.is_empty() && is_json_body(&headers, body) {
        let v: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request("malformed_json", format!("body is not valid JSON: {e}"))
        })?;
        osmand_from_json(&v, arrival).map_err(|m| ApiError::bad_request("malformed_body", m))?
    } else {
        let mut params = query.as_deref().map(parse_form).unwrap_or_default();
        let text = std::str::from_utf8(body).map_err(|e| {
            ApiError::bad_request("bad_body", format!("form body is not UTF-8: {e}"))
        })?;
        params.extend(parse_form(text));
        vec![osmand_from_params(&params, arrival)]
    };
    check_batch(fixes.len(), st.config().max_batch)?;
    let report = st.ingest().submit("osmand", to_fixes(&st, fixes)).await?;
    answer(report, Json)
}

fn header_text(headers: &HeaderMap, name: &str) -> Result<Option<String>, ApiError> {
    headers
        .get(name)
        .map(|v| {
            v.to_str().map(str::to_string).map_err(|_| {
                ApiError::bad_request("bad_header", format!("{name} is not visible ASCII text"))
            })
        })
        .transpose()
}

/// OwnTracks' answer on success: a JSON array of messages for the app (none).
fn owntracks_ok() -> Json<Vec<Value>> {
    Json(Vec::new())
}

/// `POST /v1/trackers/owntracks`: OwnTracks HTTP mode. Answers 200 `[]` (the array of messages
/// the app expects back) for a location taken and for every message that is not a location.
#[utoipa::path(post, path = "/v1/trackers/owntracks", tag = "ingest",
    description = "OwnTracks HTTP mode. The device is `X-Limit-U`/`X-Limit-D` (or `?u=&d=`), else the topic, else `tid`. OwnTracks may send the key as the Basic-auth password. Scope: ingest. See docs/trackers.md.",
    request_body(content((OwnTracksBody = "application/json"))),
    responses(
        (status = 200, description = "Taken or ignored: an empty array of messages for the app", body = Vec<serde_json::Value>),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 408, description = "The body did not arrive within `server.body_timeout`", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "A body that is neither JSON nor (OsmAnd) a form", body = ErrorBody),
        (status = 503, description = "Overloaded or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn owntracks(
    State(st): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    Read(read, _): Read<JsonBody>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let body = &read.bytes;
    // The app POSTs a zero-length payload when a friend is deleted; the booklet says to ignore
    // it. A body of white space is not that message and is not JSON either: 400, like any other
    // body that is not JSON (schemathesis found it answered 200).
    if body.is_empty() {
        return Ok(owntracks_ok());
    }
    let params = query.as_deref().map(parse_form).unwrap_or_default();
    let param = |k: &str| {
        params
            .iter()
            .rev()
            .find(|(pk, _)| pk == k)
            .map(|(_, v)| v.clone())
    };
    let ident = OwnTracksIdentity {
        user: header_text(&headers, "x-limit-u")?.or_else(|| param("u")),
        device: header_text(&headers, "x-limit-d")?.or_else(|| param("d")),
    };
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request("malformed_json", format!("body is not valid JSON: {e}"))
    })?;
    match owntracks_from_json(&v, &ident)? {
        OwnTracksMessage::Ignored(kind) => {
            tracing::debug!(kind, "OwnTracks message ignored (not a location)");
            Ok(owntracks_ok())
        }
        OwnTracksMessage::Location(fix) => {
            let report = st
                .ingest()
                .submit("owntracks", to_fixes(&st, vec![fix]))
                .await?;
            answer(report, |_| owntracks_ok())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared

/// The mapped locations as validated fixes (or the item error of each that is not one).
fn to_fixes(
    st: &AppState,
    fixes: Vec<Result<TrackerFix, ItemError>>,
) -> Vec<Result<Fix, ItemError>> {
    let (limits, now) = (st.ingest().limits(), st.ingest().now());
    fixes
        .into_iter()
        .map(|f| f.and_then(|f| f.into_fix(limits, now)))
        .collect()
}

/// Turns an ingest report into the tracker answer: `ok` when anything was taken (accepted, late
/// or duplicate); else 503 + `Retry-After` when only full reorder buffers stood in the way, else
/// 400 carrying the first item's code and message (the whole report under `details`).
fn answer<T>(report: IngestReport, ok: impl FnOnce(IngestReport) -> T) -> Result<T, ApiError> {
    if report.accepted + report.late + report.duplicate > 0 || report.errors.is_empty() {
        return Ok(ok(report));
    }
    let (code, message) = (report.errors[0].code, report.errors[0].message.clone());
    let buffer_full = report.errors.iter().all(|e| e.code == ItemCode::BufferFull);
    let details = ErrorDetails::Report(Box::new(report));
    if buffer_full {
        return Err(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: ItemCode::BufferFull.as_str(),
            message,
            details: Some(details),
            retry_after: Some(1),
        });
    }
    Err(ApiError::bad_request(code.as_str(), message).with_details(details))
}
