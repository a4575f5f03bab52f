//! Webhook sinks over HTTP: `GET/POST /v1/webhooks`, `GET/DELETE /v1/webhooks/{id}`,
//! `GET/DELETE /v1/webhooks/{id}/dead-letters` and `POST /v1/webhooks/{id}/dead-letters/retry`.
//!
//! Invariants: a sink's secret is write-only (accepted by `POST`, never in any answer); every
//! failure is an [`ApiError`] (422 lists every invalid field at once, like the config loader).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::http::auth::Refused;
use crate::http::body::{JsonBody, Read};
use crate::http::error::{ApiError, ErrorBody, ErrorDetails, FieldProblem};
use crate::http::openapi::{EventKindOut, EventOut, WebhookIn};
use crate::state::AppState;
use crate::webhooks::{DeadLetter, SinkInfo, SinkSpec, SinkStatus, Source, WebhookError};
use geodwell_core::event::EventKind;
use geodwell_core::time::Ts;

// The answers' fields are in alphabetical order, the order they have always had (they used to
// be built as `serde_json` maps, which sort their keys).

/// A sink as the API shows it (never its secret).
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookOut {
    /// First retry delay.
    pub backoff_base: String,
    /// Largest retry delay.
    pub backoff_max: String,
    /// Fence globs (null: all).
    pub fences: Option<Vec<String>>,
    /// Sink id.
    pub id: String,
    /// Attempts before dead-lettering.
    pub max_attempts: u32,
    /// Store hold for a lagging sink, events.
    pub max_backlog: u64,
    /// Dead letters kept.
    pub max_dead_letters: u64,
    /// `config` or `api`.
    pub source: Source,
    /// Delivery state and counters.
    pub status: SinkStatus,
    /// Attempt timeout.
    pub timeout: String,
    /// Event kinds sent (null: all).
    #[schema(value_type = Option<Vec<EventKindOut>>)]
    pub types: Option<Vec<EventKind>>,
    /// Receiver URL.
    pub url: String,
}

impl From<SinkInfo> for WebhookOut {
    fn from(info: SinkInfo) -> WebhookOut {
        let url = info.spec.public_url();
        let SinkSpec {
            id,
            url: _,
            secret: _,
            types,
            fences,
            max_attempts,
            timeout,
            backoff_base,
            backoff_max,
            max_dead_letters,
            max_backlog,
        } = info.spec;
        WebhookOut {
            backoff_base: backoff_base.to_human(),
            backoff_max: backoff_max.to_human(),
            fences: (!fences.is_empty()).then_some(fences),
            id,
            max_attempts,
            max_backlog,
            max_dead_letters: max_dead_letters as u64,
            source: info.source,
            status: info.status,
            timeout: timeout.to_human(),
            types: (!types.is_empty()).then_some(types),
            url,
        }
    }
}

/// `GET /v1/webhooks` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookList {
    /// The sinks.
    pub webhooks: Vec<WebhookOut>,
}

/// `GET /v1/webhooks/{id}/dead-letters` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetters {
    /// Dead letters held.
    pub count: u64,
    /// The oldest `limit` of them.
    pub dead_letters: Vec<DeadLetterOut>,
    /// Sink id.
    pub webhook: String,
}

/// An event given up after `max_attempts`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterOut {
    /// Attempts made (all rounds together, API retries included).
    pub attempts: u32,
    /// When it was (last) given up (wall clock).
    #[schema(value_type = String, format = DateTime)]
    pub dead_lettered_at: Ts,
    /// The event as it was sent (shown with its keys sorted, as this answer always has).
    #[schema(value_type = EventOut)]
    pub event: Value,
    /// The event's fence.
    pub fence: String,
    /// The event's id (the `webhook-id` it was sent with).
    pub id: String,
    /// Why the last attempt failed.
    pub last_error: String,
    /// The event's `seq`.
    pub seq: u64,
    /// The event's type.
    #[serde(rename = "type")]
    #[schema(value_type = EventKindOut)]
    pub kind: EventKind,
}

impl From<DeadLetter> for DeadLetterOut {
    fn from(d: DeadLetter) -> DeadLetterOut {
        DeadLetterOut {
            attempts: d.attempts,
            dead_lettered_at: d.dead_lettered_at,
            // The stored text is JSON the sink sent; `Null` cannot happen but keeps this total.
            event: serde_json::from_str(d.event.get()).unwrap_or(Value::Null),
            fence: d.fence,
            id: d.id,
            last_error: d.last_error,
            seq: d.seq,
            kind: d.kind,
        }
    }
}

/// `POST /v1/webhooks/{id}/dead-letters/retry` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct RetryQueued {
    /// Dead letters queued for another round.
    pub queued: u64,
    /// Sink id.
    pub webhook: String,
}

/// `DELETE /v1/webhooks/{id}/dead-letters` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Cleared {
    /// Dead letters dropped.
    pub cleared: u64,
    /// Sink id.
    pub webhook: String,
}

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
            WebhookError::Target(e) => invalid(vec![("url".into(), e.to_string())]),
            WebhookError::ShuttingDown => ApiError::shutting_down(),
            WebhookError::Store(_) | WebhookError::Corrupt(_) | WebhookError::Shared(_) => {
                ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    code: "store_unavailable",
                    message: msg,
                    details: None,
                    retry_after: Some(1),
                }
            }
        }
    }
}

/// `GET /v1/webhooks`.
#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks",
    description = "Every sink with its delivery status. Scope: admin.",
    responses((status = 200, description = "The sinks", body = WebhookList), Refused))]
pub async fn list_webhooks(State(st): State<Arc<AppState>>) -> Json<WebhookList> {
    Json(WebhookList {
        webhooks: st
            .webhooks()
            .list()
            .into_iter()
            .map(WebhookOut::from)
            .collect(),
    })
}

/// `POST /v1/webhooks`: a sink definition (`id`, `url`, `secret`, optional `types`, `fences`,
/// retry settings) plus an optional `from_seq` (default: only events published from now on).
#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks",
    description = "Creates a sink; it persists in the store. Scope: admin.",
    request_body(content((WebhookIn = "application/json"))),
    responses(
        (status = 201, description = "Created", body = WebhookOut),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 409, description = "A sink with this id exists", body = ErrorBody),
        (status = 408, description = "The body did not arrive within `server.body_timeout`", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "Invalid definition (every bad field listed), too many sinks, or a target address that is not public", body = ErrorBody),
        (status = 503, description = "Store unavailable or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn create_webhook(
    State(st): State<Arc<AppState>>,
    Read(body, _): Read<JsonBody>,
) -> Result<(StatusCode, Json<WebhookOut>), ApiError> {
    let v: Value = serde_json::from_slice(&body.bytes).map_err(|e| {
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
    Ok((StatusCode::CREATED, Json(WebhookOut::from(info))))
}

fn invalid(errs: Vec<(String, String)>) -> ApiError {
    let summary = errs
        .iter()
        .map(|(f, m)| format!("{f}: {m}"))
        .collect::<Vec<_>>()
        .join("; ");
    let details = errs
        .into_iter()
        .map(|(field, message)| FieldProblem { field, message })
        .collect();
    ApiError::unprocessable("invalid_webhook", summary).with_details(ErrorDetails::Fields(details))
}

/// `GET /v1/webhooks/{id}`.
#[utoipa::path(get, path = "/v1/webhooks/{id}", tag = "webhooks",
    description = "One sink. Scope: admin.", params(("id" = String, Path, description = "Sink id")),
    responses((status = 200, description = "The sink", body = WebhookOut), (status = 400, description = "Bad request", body = ErrorBody), Refused, (status = 404, description = "No such sink", body = ErrorBody)))]
pub async fn get_webhook(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<WebhookOut>, ApiError> {
    let Path(id) = path?;
    let info = st
        .webhooks()
        .get(&id)
        .ok_or(WebhookError::NotFound(id.clone()))?;
    Ok(Json(WebhookOut::from(info)))
}

/// `DELETE /v1/webhooks/{id}`: API sinks only (409 for config sinks).
#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks",
    description = "Deletes an API-created sink (config sinks: 409). Scope: admin.", params(("id" = String, Path, description = "Sink id")),
    responses(
        (status = 204, description = "Deleted"), (status = 400, description = "Bad request", body = ErrorBody), Refused, (status = 404, description = "No such sink", body = ErrorBody),
        (status = 409, description = "The sink comes from the config file", body = ErrorBody),
        (status = 503, description = "Store unavailable or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn delete_webhook(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path(id) = path?;
    st.webhooks().delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/webhooks/{id}/dead-letters?limit=N`: oldest first (default and largest limit:
/// `max_poll_limit`).
#[utoipa::path(get, path = "/v1/webhooks/{id}/dead-letters", tag = "webhooks",
    description = "Events given up after max_attempts, oldest first. Scope: admin.",
    params(("id" = String, Path, description = "Sink id"), ("limit" = Option<u64>, Query, minimum = 1, description = "Most shown (default and largest: max_poll_limit)")),
    responses((status = 200, description = "Dead letters", body = DeadLetters), (status = 400, description = "Bad request", body = ErrorBody), Refused, (status = 404, description = "No such sink", body = ErrorBody)))]
pub async fn list_dead_letters(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Json<DeadLetters>, ApiError> {
    let Path(id) = path?;
    let Query(q) = query?;
    // Unknown parameters were refused by `crate::http::query`.
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
    Ok(Json(DeadLetters {
        count: all.len() as u64,
        dead_letters: all
            .into_iter()
            .take(limit)
            .map(DeadLetterOut::from)
            .collect(),
        webhook: id,
    }))
}

/// `POST /v1/webhooks/{id}/dead-letters/retry`: re-sends every dead letter (202; delivered ones
/// leave the list, failed ones stay with their attempts added up).
#[utoipa::path(post, path = "/v1/webhooks/{id}/dead-letters/retry", tag = "webhooks",
    description = "Sends every dead letter again, ahead of new events. Scope: admin.", params(("id" = String, Path, description = "Sink id")),
    responses((status = 202, description = "Queued", body = RetryQueued), (status = 400, description = "Bad request", body = ErrorBody), Refused, (status = 404, description = "No such sink", body = ErrorBody), (status = 503, description = "Store unavailable or shutting down (Retry-After)", body = ErrorBody)))]
pub async fn retry_dead_letters(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Json<RetryQueued>), ApiError> {
    let Path(id) = path?;
    let n = st.webhooks().retry_dead_letters(&id)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(RetryQueued {
            queued: n as u64,
            webhook: id,
        }),
    ))
}

/// `DELETE /v1/webhooks/{id}/dead-letters`: drops every dead letter.
#[utoipa::path(delete, path = "/v1/webhooks/{id}/dead-letters", tag = "webhooks",
    description = "Drops every dead letter. Scope: admin.", params(("id" = String, Path, description = "Sink id")),
    responses((status = 200, description = "Dropped", body = Cleared), (status = 400, description = "Bad request", body = ErrorBody), Refused, (status = 404, description = "No such sink", body = ErrorBody), (status = 503, description = "Store unavailable or shutting down (Retry-After)", body = ErrorBody)))]
pub async fn clear_dead_letters(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Cleared>, ApiError> {
    let Path(id) = path?;
    let n = st.webhooks().clear_dead_letters(&id)?;
    Ok(Json(Cleared {
        cleared: n as u64,
        webhook: id,
    }))
}
