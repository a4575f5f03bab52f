//! Webhook sinks over HTTP: `GET/POST /v1/webhooks`, `GET/DELETE /v1/webhooks/{id}`,
//! `GET/DELETE /v1/webhooks/{id}/dead-letters` and `POST /v1/webhooks/{id}/dead-letters/retry`.
//!
//! Invariants: a sink's secret is write-only (accepted by `POST`, never in any answer); every
//! failure is an [`ApiError`] (422 lists every invalid field at once, like the config loader).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::http::error::ApiError;
use crate::http::fixes::body_or_error;
use crate::state::AppState;
use crate::webhooks::{SinkInfo, SinkSpec, WebhookError};

impl From<WebhookError> for ApiError {
    fn from(e: WebhookError) -> ApiError {
        let msg = e.to_string();
        match e {
            WebhookError::NotFound(_) => ApiError::not_found("webhook_not_found", msg),
            WebhookError::Exists(_) => ApiError {
                status: StatusCode::CONFLICT,
                code: "webhook_exists",
                message: msg,
                details: None,
                retry_after: None,
            },
            WebhookError::FromConfig(_) => ApiError {
                status: StatusCode::CONFLICT,
                code: "webhook_from_config",
                message: msg,
                details: None,
                retry_after: None,
            },
            WebhookError::FromSeqAhead { .. } => ApiError::unprocessable("invalid_webhook", msg),
            WebhookError::TooMany => ApiError::unprocessable("too_many_webhooks", msg),
            WebhookError::ShuttingDown => ApiError::shutting_down(),
            WebhookError::Store(_) | WebhookError::Corrupt(_) => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "store_unavailable",
                message: msg,
                details: None,
                retry_after: Some(1),
            },
        }
    }
}

/// A sink as the API shows it: its definition (no secret) plus `source` and `status`.
pub fn sink_json(info: &SinkInfo) -> Value {
    let mut v = info.spec.public_json();
    v["source"] = json!(info.source);
    v["status"] = json!(info.status);
    v
}

/// `GET /v1/webhooks`.
#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks",
    description = "Every sink with its delivery status. Scope: admin.",
    responses((status = 200, description = "The sinks", body = crate::http::openapi::WebhookList), crate::http::openapi::Refused))]
pub async fn list_webhooks(State(st): State<Arc<AppState>>) -> Response {
    let sinks: Vec<Value> = st.webhooks().list().iter().map(sink_json).collect();
    Json(json!({ "webhooks": sinks })).into_response()
}

/// `POST /v1/webhooks`: a sink definition (`id`, `url`, `secret`, optional `types`, `fences`,
/// retry settings) plus an optional `from_seq` (default: only events published from now on).
#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks",
    description = "Creates a sink; it persists in the store. Scope: admin.",
    request_body(content((crate::http::openapi::WebhookIn = "application/json"))),
    responses(
        (status = 201, description = "Created", body = crate::http::openapi::WebhookOut),
        (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused,
        (status = 409, description = "A sink with this id exists", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "Body too large", body = crate::http::openapi::ErrorBody),
        (status = 422, description = "Invalid definition (every bad field listed) or too many sinks", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "Store unavailable or shutting down (Retry-After)", body = crate::http::openapi::ErrorBody),
    ))]
pub async fn create_webhook(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(body, st.config().max_body_bytes)?;
    let v: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request("malformed_json", format!("body is not valid JSON: {e}"))
    })?;
    let from_seq = match v.get("from_seq") {
        None | Some(Value::Null) => None,
        Some(x) => Some(x.as_u64().ok_or_else(|| {
            invalid(vec![(
                "from_seq".into(),
                format!("must be a non-negative integer, got {x}"),
            )])
        })?),
    };
    let spec = SinkSpec::from_json(&v, &["from_seq"]).map_err(invalid)?;
    let info = st.webhooks().create(spec, from_seq).await?;
    Ok((StatusCode::CREATED, Json(sink_json(&info))).into_response())
}

fn invalid(errs: Vec<(String, String)>) -> ApiError {
    let details: Vec<Value> = errs
        .iter()
        .map(|(field, message)| json!({"field": field, "message": message}))
        .collect();
    let summary = errs
        .iter()
        .map(|(f, m)| format!("{f}: {m}"))
        .collect::<Vec<_>>()
        .join("; ");
    ApiError::unprocessable("invalid_webhook", summary).with_details(json!(details))
}

/// `GET /v1/webhooks/{id}`.
#[utoipa::path(get, path = "/v1/webhooks/{id}", tag = "webhooks",
    description = "One sink. Scope: admin.", params(("id" = String, Path, description = "Sink id")),
    responses((status = 200, description = "The sink", body = crate::http::openapi::WebhookOut), (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused, (status = 404, description = "No such sink", body = crate::http::openapi::ErrorBody)))]
pub async fn get_webhook(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let info = st
        .webhooks()
        .get(&id)
        .ok_or(WebhookError::NotFound(id.clone()))?;
    Ok(Json(sink_json(&info)).into_response())
}

/// `DELETE /v1/webhooks/{id}`: API sinks only (409 for config sinks).
#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks",
    description = "Deletes an API-created sink (config sinks: 409). Scope: admin.", params(("id" = String, Path, description = "Sink id")),
    responses(
        (status = 204, description = "Deleted"), (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused, (status = 404, description = "No such sink", body = crate::http::openapi::ErrorBody),
        (status = 409, description = "The sink comes from the config file", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "Store unavailable or shutting down (Retry-After)", body = crate::http::openapi::ErrorBody),
    ))]
pub async fn delete_webhook(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    st.webhooks().delete(&id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1/webhooks/{id}/dead-letters?limit=N`: oldest first (default and largest limit:
/// `max_poll_limit`).
#[utoipa::path(get, path = "/v1/webhooks/{id}/dead-letters", tag = "webhooks",
    description = "Events given up after max_attempts, oldest first. Scope: admin.",
    params(("id" = String, Path, description = "Sink id"), ("limit" = Option<u64>, Query, minimum = 1, description = "Most shown (default and largest: max_poll_limit)")),
    responses((status = 200, description = "Dead letters", body = crate::http::openapi::DeadLetters), (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused, (status = 404, description = "No such sink", body = crate::http::openapi::ErrorBody)))]
pub async fn list_dead_letters(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let Query(q) = query?;
    if let Some(k) = q.keys().find(|k| k.as_str() != "limit") {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("unknown query parameter {k:?}; known: limit"),
        ));
    }
    let max = st.config().max_poll_limit;
    let limit = match q.get("limit") {
        None => max,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(
                    "bad_query",
                    format!("limit must be an integer in 1..={max}, got {v:?}"),
                ));
            }
        },
    };
    let all = st.webhooks().dead_letters(&id)?;
    let count = all.len();
    let shown: Vec<_> = all.into_iter().take(limit).collect();
    Ok(Json(json!({"webhook": id, "count": count, "dead_letters": shown})).into_response())
}

/// `POST /v1/webhooks/{id}/dead-letters/retry`: re-sends every dead letter (202; delivered ones
/// leave the list, failed ones stay with their attempts added up).
#[utoipa::path(post, path = "/v1/webhooks/{id}/dead-letters/retry", tag = "webhooks",
    description = "Sends every dead letter again, ahead of new events. Scope: admin.", params(("id" = String, Path, description = "Sink id")),
    responses((status = 202, description = "Queued", body = crate::http::openapi::RetryQueued), (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused, (status = 404, description = "No such sink", body = crate::http::openapi::ErrorBody), (status = 503, description = "Store unavailable or shutting down (Retry-After)", body = crate::http::openapi::ErrorBody)))]
pub async fn retry_dead_letters(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let n = st.webhooks().retry_dead_letters(&id)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"webhook": id, "queued": n})),
    )
        .into_response())
}

/// `DELETE /v1/webhooks/{id}/dead-letters`: drops every dead letter.
#[utoipa::path(delete, path = "/v1/webhooks/{id}/dead-letters", tag = "webhooks",
    description = "Drops every dead letter. Scope: admin.", params(("id" = String, Path, description = "Sink id")),
    responses((status = 200, description = "Dropped", body = crate::http::openapi::Cleared), (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused, (status = 404, description = "No such sink", body = crate::http::openapi::ErrorBody), (status = 503, description = "Store unavailable or shutting down (Retry-After)", body = crate::http::openapi::ErrorBody)))]
pub async fn clear_dead_letters(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let n = st.webhooks().clear_dead_letters(&id)?;
    Ok(Json(json!({"webhook": id, "cleared": n})).into_response())
}
