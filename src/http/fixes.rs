//! `POST /v1/fixes`: one fix object, a JSON array, or NDJSON (`application/x-ndjson`).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;

use crate::http::auth::Refused;
use crate::http::body::{self, FixesBody, Read};
use crate::http::error::{ApiError, ErrorBody, ErrorDetails};
use crate::http::openapi::FixBody;
use crate::ingest::IngestReport;
use crate::state::AppState;

use crate::ingest::{Charge, ReadError};
use crate::wire::{BatchShapeError, Located, locate_batch, locate_ndjson};
use geodwell_core::fix::Fix;

/// Locates a body's items: NDJSON lines, array elements, or one object.
pub fn locate<'a>(headers: &HeaderMap, body: &'a [u8]) -> Result<Located<'a>, ApiError> {
    let ndjson = body::media_type(headers).is_some_and(|mt| body::is_ndjson(&mt));
    if ndjson {
        let text = std::str::from_utf8(body).map_err(|e| {
            ApiError::bad_request("malformed_ndjson", format!("body is not UTF-8: {e}"))
        })?;
        return Ok(locate_ndjson(text));
    }
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::bad_request("malformed_json", format!("body is not valid JSON: {e}"))
    })?;
    locate_batch(text).map_err(shape_error)
}

fn shape_error(e: BatchShapeError) -> ApiError {
    match e {
        BatchShapeError::NotJson(e) => {
            ApiError::bad_request("malformed_json", format!("body is not valid JSON: {e}"))
        }
        BatchShapeError::NotFixOrArray(kind) => ApiError::bad_request(
            "malformed_batch",
            format!("expected a fix object, an array of fixes, or NDJSON; got {kind}"),
        ),
    }
}

/// Reads a body's fixes within `ingest.max_batch` and the memory budget, then lets the body go:
/// its bytes are dropped and given back to the budget, which from then on holds what the fixes
/// hold ([`crate::ingest::Ingest::read_within`]) until the answer.
pub fn read_fixes(
    st: &AppState,
    headers: &HeaderMap,
    body: &mut body::ReadBody,
) -> Result<Vec<Result<Fix, crate::wire::ItemError>>, ApiError> {
    let located = locate(headers, &body.bytes)?;
    check_batch(located.len(), st.config().max_batch)?;
    let fixes = st
        .ingest()
        .read_within(located, &mut body.reservation, Charge::REQUEST)
        .map_err(|e| match e {
            ReadError::Shape(e) => shape_error(e),
            ReadError::Budget(_) => ApiError::budget_exhausted(),
            ReadError::NeverFits { need, total } => ApiError::too_large(
                "batch_too_large",
                format!(
                    "the batch's fixes would hold {need} bytes, more than the whole memory budget of {total} bytes (ingest.max_queued_bytes)"
                ),
            ),
        })?;
    body.release_bytes();
    Ok(fixes)
}

/// Applies a report's outcome to a status: 200 when anything was taken, 422 when every item was
/// rejected.
pub fn report_response(report: IngestReport) -> Result<Json<IngestReport>, ApiError> {
    if report.rejected > 0 && report.accepted + report.late + report.duplicate == 0 {
        let msg = format!("all {} fixes were rejected", report.rejected);
        return Err(ApiError::unprocessable("no_valid_fixes", msg)
            .with_details(ErrorDetails::Report(Box::new(report))));
    }
    Ok(Json(report))
}

/// Checks batch size bounds.
pub fn check_batch(n: usize, max: usize) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::bad_request(
            "empty_batch",
            "the batch holds no fixes",
        ));
    }
    if n > max {
        return Err(ApiError::too_large(
            "batch_too_large",
            format!("the batch holds {n} fixes; the limit is {max}"),
        ));
    }
    Ok(())
}

/// `POST /v1/fixes`.
#[utoipa::path(post, path = "/v1/fixes", tag = "ingest",
    description = "One fix, a JSON array, or NDJSON (`application/x-ndjson`). A batch with some bad items still applies the good ones; 422 only when every item is rejected. Scope: ingest.",
    request_body(content(
        (FixBody = "application/json"),
        (String = "application/x-ndjson"),
    )),
    responses(
        (status = 200, description = "Counts of accepted, late, duplicate and rejected fixes", body = crate::ingest::IngestReport),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 408, description = "The body did not arrive within `server.body_timeout`", body = ErrorBody),
        (status = 413, description = "Body or batch too large", body = ErrorBody),
        (status = 415, description = "Not JSON or NDJSON", body = ErrorBody),
        (status = 422, description = "Every item was rejected", body = ErrorBody),
        (status = 503, description = "Overloaded (queues or the memory budget full), store unavailable or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn post_fixes(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    // The reservation is held until the answer: the batch counts while it waits for the shards.
    Read(mut body, _): Read<FixesBody>,
) -> Result<Json<IngestReport>, ApiError> {
    let fixes = read_fixes(&st, &headers, &mut body)?;
    let report = st.ingest().submit("http", fixes).await?;
    drop(body);
    report_response(report)
}
