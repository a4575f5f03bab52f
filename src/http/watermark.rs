//! `POST /v1/watermark`: moves the event-time watermark by hand (event clock only), so that a
//! backfill can be finished: with `time.clock = "event"` the watermark follows the fixes and
//! stops at the last one's time minus the lateness, and deadlines after it would never fire.
//!
//! Invariants: the watermark never moves back (a time behind it is 409 `watermark_behind`); the
//! answer comes once the advance is durable and the events it fired are committed (see
//! [`crate::ingest::Ingest::advance_watermark`]).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use geodwell_core::time::Ts;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::http::auth::Refused;
use crate::http::body::{JsonBody, Read};
use crate::http::error::{ApiError, ErrorBody};
use crate::ingest::AdvanceError;
use crate::state::AppState;

/// `POST /v1/watermark` body.
// Schema only: the body is read as a `Value` so that each wrong shape gets its own message;
// the server refuses other members, which the schema says (`additionalProperties: false`).
#[derive(ToSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct WatermarkIn {
    /// The new watermark: RFC 3339 text or Unix milliseconds, 1970 to 9999.
    pub watermark: crate::http::openapi::FixTs,
}

/// `POST /v1/watermark` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct WatermarkOut {
    /// The watermark now.
    #[schema(value_type = String, format = DateTime)]
    pub watermark: Ts,
    /// The watermark before (null before the first fix).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub previous: Option<Ts>,
}

/// `POST /v1/watermark` with `{"watermark": TIME}`.
#[utoipa::path(post, path = "/v1/watermark", tag = "ops",
    description = "Event clock only: advances the event-time watermark to a time (the end of a backfill), durably; the DWELLs and expiries due before it fire before the answer. A time behind the watermark is refused. Scope: admin.",
    request_body(content((WatermarkIn = "application/json"))),
    responses(
        (status = 200, description = "Advanced (or already there)", body = WatermarkOut),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 408, description = "The body did not arrive within `server.body_timeout`", body = ErrorBody),
        (status = 409, description = "Live clock, or a time behind the watermark", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "Not a valid time", body = ErrorBody),
        (status = 503, description = "Store or cluster unavailable, or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn post_watermark(
    State(st): State<Arc<AppState>>,
    Read(body, _): Read<JsonBody>,
) -> Result<(StatusCode, Json<WatermarkOut>), ApiError> {
    let v: Value = serde_json::from_slice(&body.bytes)
        .map_err(|e| ApiError::bad_request("bad_body", format!("not JSON: {e}")))?;
    let to = parse_to(&v)?;
    match st.ingest().advance_watermark(to).await {
        Ok(previous) => Ok((
            StatusCode::OK,
            Json(WatermarkOut {
                watermark: to,
                previous,
            }),
        )),
        Err(e @ AdvanceError::LiveClock) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "live_clock",
            e.to_string(),
        )),
        Err(e @ AdvanceError::Behind { .. }) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "watermark_behind",
            e.to_string(),
        )),
        Err(AdvanceError::Query(e)) => Err(e.into()),
    }
}

/// The `watermark` member: Unix ms (an integer) or RFC 3339 text, in 1970..=9999.
fn parse_to(v: &Value) -> Result<Ts, ApiError> {
    let bad = |m: String| ApiError::unprocessable("invalid_watermark", m);
    let obj = v.as_object().ok_or_else(|| {
        ApiError::bad_request(
            "bad_body",
            format!(
                "the body must be an object {{\"watermark\": TIME}}, got {}",
                crate::wire::kind_of(v)
            ),
        )
    })?;
    if let Some(k) = obj.keys().find(|k| *k != "watermark") {
        return Err(bad(format!(
            "unknown member {k:?}: the body is {{\"watermark\": TIME}}"
        )));
    }
    match obj.get("watermark") {
        None => Err(bad("watermark is required".into())),
        Some(Value::Number(n)) => {
            let ms = crate::wire::integral(n).ok_or_else(|| {
                bad(format!(
                    "watermark must be whole Unix milliseconds, got {n}"
                ))
            })?;
            Ts::from_millis(ms).map_err(|e| bad(format!("watermark: {e}")))
        }
        Some(Value::String(s)) => Ts::parse_rfc3339(s).map_err(|e| bad(format!("watermark: {e}"))),
        Some(other) => Err(bad(format!(
            "watermark must be RFC 3339 text or Unix milliseconds, got {}",
            crate::wire::kind_of(other)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn times_are_read_in_both_forms_and_everything_else_is_refused() {
        assert_eq!(
            parse_to(&json!({"watermark": 1_767_225_600_000_i64})).unwrap(),
            Ts(1_767_225_600_000)
        );
        assert_eq!(
            parse_to(&json!({"watermark": "2026-01-01T00:00:00Z"})).unwrap(),
            Ts(1_767_225_600_000)
        );
        for (body, status) in [
            (json!([]), 400),
            (json!({}), 422),
            (json!({"watermark": 1.5}), 422),
            (json!({"watermark": -1}), 422),
            (json!({"watermark": "yesterday"}), 422),
            (json!({"watermark": null}), 422),
            (json!({"watermark": 1, "x": 2}), 422),
        ] {
            assert_eq!(
                parse_to(&body).unwrap_err().status.as_u16(),
                status,
                "{body}"
            );
        }
    }
}
