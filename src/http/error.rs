//! `ApiError`: the one way HTTP handlers fail. Every error body is
//! `{"error": {"code": ..., "message": ..., "details"?: ...}}` with the matching status, and
//! overload answers carry `Retry-After`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

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
    pub details: Option<Value>,
    /// Seconds for `Retry-After`, for 429 / 503.
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
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
    pub fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut err = json!({"code": self.code, "message": self.message});
        if let Some(d) = self.details {
            err["details"] = d;
        }
        let mut resp = (self.status, Json(json!({ "error": err }))).into_response();
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

impl From<crate::ingest::BatchError> for ApiError {
    fn from(e: crate::ingest::BatchError) -> ApiError {
        match e {
            crate::ingest::BatchError::Overloaded => ApiError::overloaded(),
            crate::ingest::BatchError::ShuttingDown => ApiError::shutting_down(),
            crate::ingest::BatchError::StoreUnavailable(msg) => ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    format!("the batch was not acknowledged: {msg}"),
                )
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overloaded_batch_is_a_503_with_retry_after() {
        let resp = ApiError::from(crate::ingest::BatchError::Overloaded).into_response();
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()["retry-after"], "1");
    }
}
