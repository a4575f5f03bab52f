//! Operations endpoints: `/metrics`, `/healthz`, `/readyz`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::state::AppState;
use crate::telemetry as t;

/// `GET /metrics`: Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "ops", security((), ("bearer" = [])),
    description = "Prometheus text format. Open unless `auth.open_metrics = false` (then scope read).",
    responses(
        (status = 200, description = "Metrics", body = String, content_type = "text/plain"),
        crate::http::openapi::Refused,
    ))]
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    metrics::gauge!(t::EVENT_LOG_EVENTS).set(st.log().len() as f64);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.render_metrics(),
    )
        .into_response()
}

/// `GET /healthz`: the process is up.
#[utoipa::path(get, path = "/healthz", tag = "ops", security(()),
    description = "The process is up. Always open.",
    responses((status = 200, description = "Up", body = crate::http::openapi::Health)))]
pub async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// `GET /readyz`: every shard is running and the service is not shutting down.
#[utoipa::path(get, path = "/readyz", tag = "ops", security(()),
    description = "Every shard runs and the service is not shutting down. Always open.",
    responses(
        (status = 200, description = "Ready", body = crate::http::openapi::Ready),
        (status = 503, description = "Not ready", body = crate::http::openapi::Ready),
    ))]
pub async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    let shards_up = st.shards().running();
    if shards_up && !st.is_shutting_down() {
        Json(json!({
            "status": "ready",
            "shards": st.shards().len(),
            "clock": st.config().clock.to_string(),
            "watermark": st.watermark(),
            "lateness_ms": st.config().lateness.0,
            "fences": st.fences().len(),
        }))
        .into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not_ready"})),
        )
            .into_response()
    }
}
