//! `ApiError`: the one way HTTP handlers fail. Every error body is an [`ErrorBody`],
//! `{"error": {"code": ..., "details"?: ..., "message": ...}}`, with the matching status, and
//! overload answers carry `Retry-After`. [`ErrorBody`] is both what is serialized and what the
//! OpenAPI document says an error is.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::ingest::IngestReport;

/// Every error answer.
// Also the error frames of `GET /v1/ingest/ws`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// An error's code and message.
// Fields in alphabetical order, the order error bodies have always had (they used to be built as
// `serde_json` maps, which sort their keys).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable code, e.g. `bad_query`, `fence_not_found`, `overloaded`.
    pub code: &'static str,
    /// Structured detail (per-item or per-field errors), when there is any.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub details: Option<ErrorDetails>,
    /// What went wrong, for people.
    pub message: String,
}

impl ErrorBody {
    /// An error body without details.
    pub fn new(code: &'static str, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code,
                details: None,
                message: message.into(),
            },
        }
    }
}

/// The structured detail of an error.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ErrorDetails {
    /// `no_valid_fixes` (`POST /v1/fixes`) and the item errors of the tracker endpoints: the
    /// whole ingest report.
    #[serde(serialize_with = "sorted_keys")]
    Report(Box<IngestReport>),
    /// `invalid_fence`: one entry per problem, in document order.
    Fence(Vec<FenceProblem>),
    /// `invalid_webhook`: one entry per invalid field.
    Fields(Vec<FieldProblem>),
}

/// The report inside an error has always been written with its keys sorted (it went through a
/// `serde_json::Value`), unlike the report of a 200 answer; kept so, byte for byte.
fn sorted_keys<S: serde::Serializer>(report: &IngestReport, s: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(report)
        .map_err(serde::ser::Error::custom)?
        .serialize(s)
}

/// One problem with a fence (`invalid_fence`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FenceProblem {
    /// What is wrong.
    pub message: String,
    /// Where, e.g. `features[1].properties.dwell` (empty: the whole body).
    pub path: String,
}

/// One invalid field of a webhook definition (`invalid_webhook`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FieldProblem {
    /// The field.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// An HTTP error answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Machine-readable code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Extra structured detail (per-item errors, field errors).
    pub details: Option<ErrorDetails>,
    /// Seconds for `Retry-After`, for 429 / 503.
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// 400.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 401: no valid API key.
    pub fn unauthorized(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, code, message)
    }

    /// 403: the key lacks a scope.
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, code, message)
    }

    /// 404.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, code, message)
    }

    /// 413.
    pub fn too_large(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, code, message)
    }

    /// 500: a fault of the server's own (a task that failed), never of the request.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// 422.
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    /// 503 with `Retry-After: 1`: a queue is full.
    pub fn overloaded() -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "ingest queues are full; retry after the indicated delay",
            )
        }
    }

    /// 503 with `Retry-After: 1`: the ingest memory budget is in use by other requests.
    pub fn budget_exhausted() -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "the memory budget for queued input is in use; retry after the indicated delay",
            )
        }
    }

    /// 503 with `Retry-After: 5`: a bounded resource (subscribers, sockets) is all in use.
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(5),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
        }
    }

    /// 503 `store_unavailable`: the durable log did not take the request; nothing of it is
    /// acknowledged.
    pub fn store_unavailable(why: &dyn std::fmt::Display) -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                format!("the request was not acknowledged: {why}"),
            )
        }
    }

    /// 503: shutting down.
    pub fn shutting_down() -> ApiError {
        ApiError {
            retry_after: Some(5),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the service is shutting down",
            )
        }
    }

    /// Attaches structured details.
    pub fn with_details(mut self, details: ErrorDetails) -> ApiError {
        self.details = Some(details);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                details: self.details,
                message: self.message,
            },
        };
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

impl From<axum::extract::ws::rejection::WebSocketUpgradeRejection> for ApiError {
    fn from(e: axum::extract::ws::rejection::WebSocketUpgradeRejection) -> ApiError {
        ApiError::bad_request(
            "websocket_required",
            format!("this endpoint speaks WebSocket: {}", e.body_text()),
        )
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(e: axum::extract::rejection::PathRejection) -> ApiError {
        ApiError::bad_request("bad_path", e.body_text())
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(e: axum::extract::rejection::QueryRejection) -> ApiError {
        ApiError::bad_request("bad_query", e.body_text())
    }
}

impl From<crate::shard::QueryError> for ApiError {
    fn from(e: crate::shard::QueryError) -> ApiError {
        match e {
            crate::shard::QueryError::Closed => ApiError::shutting_down(),
            crate::shard::QueryError::Log(e) => ApiError::store_unavailable(&e),
            crate::shard::QueryError::NoOwner { .. }
            | crate::shard::QueryError::BadAnswer(_)
            | crate::shard::QueryError::WatermarkPending => {
                ApiError::unavailable("partition_unavailable", e.to_string())
            }
        }
    }
}

impl From<crate::ingest::BatchError> for ApiError {
    fn from(e: crate::ingest::BatchError) -> ApiError {
        match e {
            crate::ingest::BatchError::Overloaded => ApiError::overloaded(),
            crate::ingest::BatchError::ShuttingDown => ApiError::shutting_down(),
            crate::ingest::BatchError::StoreUnavailable(e) => ApiError::store_unavailable(&e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_text(e: ApiError) -> String {
        let body = e.into_response().into_body();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn error_bodies_keep_their_bytes() {
        let plain = ApiError::not_found("no_route", "no such endpoint");
        assert_eq!(
            body_text(plain).await,
            r#"{"error":{"code":"no_route","message":"no such endpoint"}}"#
        );
        let fence = ApiError::unprocessable("invalid_fence", "1 fence error").with_details(
            ErrorDetails::Fence(vec![FenceProblem {
                message: "bad".into(),
                path: "id".into(),
            }]),
        );
        assert_eq!(
            body_text(fence).await,
            r#"{"error":{"code":"invalid_fence","details":[{"message":"bad","path":"id"}],"message":"1 fence error"}}"#
        );
        let fields = ApiError::unprocessable("invalid_webhook", "url: bad").with_details(
            ErrorDetails::Fields(vec![FieldProblem {
                field: "url".into(),
                message: "bad".into(),
            }]),
        );
        assert_eq!(
            body_text(fields).await,
            r#"{"error":{"code":"invalid_webhook","details":[{"field":"url","message":"bad"}],"message":"url: bad"}}"#
        );
        // The report inside an error lists its keys sorted, as it always has (the 200 answer
        // lists them in declaration order).
        let report = IngestReport {
            rejected: 1,
            errors: vec![crate::ingest::RejectedItem {
                index: 0,
                code: crate::wire::ItemCode::MissingField,
                message: "lat is required".into(),
            }],
            ..IngestReport::default()
        };
        let e = ApiError::unprocessable("no_valid_fixes", "all 1 fixes were rejected")
            .with_details(ErrorDetails::Report(Box::new(report)));
        assert_eq!(
            body_text(e).await,
            r#"{"error":{"code":"no_valid_fixes","details":{"accepted":0,"duplicate":0,"errors":[{"code":"missing_field","index":0,"message":"lat is required"}],"late":0,"rejected":1},"message":"all 1 fixes were rejected"}}"#
        );
    }

    #[test]
    fn an_overloaded_batch_is_a_503_with_retry_after() {
        let resp = ApiError::from(crate::ingest::BatchError::Overloaded).into_response();
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()["retry-after"], "1");
    }
}
