//! Operations endpoints: `/metrics`, `/healthz`, `/readyz`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::config::ClockMode;
use crate::state::AppState;
use crate::telemetry as t;
use geodwell_core::time::Ts;

/// `GET /healthz` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: HealthStatus,
}

/// The process is up.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// Up.
    Ok,
}

/// `GET /readyz` answer when ready.
// Fields in alphabetical order, the order it has always had (it used to be built as a
// `serde_json` map, which sorts its keys).
#[derive(Debug, Serialize, ToSchema)]
pub struct Ready {
    /// `live` or `event`.
    pub clock: ClockMode,
    /// Fences held.
    pub fences: u64,
    /// Configured lateness, ms.
    pub lateness_ms: i64,
    /// The MQTT ingest connection (absent when `[mqtt]` is off). Readiness does not wait for
    /// it: HTTP ingest works without the broker, and the connection is retried for ever.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mqtt: Option<crate::mqtt::MqttReady>,
    /// Engine shards.
    pub shards: u64,
    /// Always `ready`.
    pub status: ReadyStatus,
    /// The current watermark.
    #[schema(value_type = Option<String>, format = DateTime, required = true)]
    pub watermark: Option<Ts>,
}

/// Ready.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReadyStatus {
    /// Every shard runs and the service is not shutting down.
    Ready,
}

/// `GET /readyz` answer when not ready.
#[derive(Debug, Serialize, ToSchema)]
pub struct NotReady {
    /// Always `not_ready`.
    pub status: NotReadyStatus,
}

/// Not ready.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NotReadyStatus {
    /// A shard has stopped, or the service is shutting down.
    NotReady,
}

/// `GET /metrics`: Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "ops", security((), ("bearer" = [])),
    description = "Prometheus text format. Open unless `auth.open_metrics = false` (then scope read).",
    responses(
        (status = 200, description = "Metrics", body = String, content_type = "text/plain"),
        crate::http::auth::Refused,
    ))]
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    t::collect_process();
    metrics::gauge!(t::EVENT_LOG_EVENTS).set(st.log().len() as f64);
    st.deployment().gauges();
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
    responses((status = 200, description = "Up", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: HealthStatus::Ok,
    })
}

/// `GET /readyz`: every shard is running (a cluster node: connected, caught up, its partitions
/// live or none) and the service is not shutting down.
#[utoipa::path(get, path = "/readyz", tag = "ops", security(()),
    description = "Every shard runs (a cluster node: connected to NATS, its event log caught up, each partition it owns live, or it stands by) and the service is not shutting down. Always open.",
    responses(
        (status = 200, description = "Ready", body = Ready),
        (status = 503, description = "Not ready", body = NotReady),
    ))]
pub async fn readyz(
    State(st): State<Arc<AppState>>,
) -> Result<Json<Ready>, (StatusCode, Json<NotReady>)> {
    let up = st.deployment().ready() && st.shards().running();
    if up && !st.is_shutting_down() {
        Ok(Json(Ready {
            clock: st.config().clock,
            fences: st.fences().len() as u64,
            lateness_ms: st.config().lateness.0,
            mqtt: st.mqtt().map(|m| m.ready()),
            shards: st.shards().len() as u64,
            status: ReadyStatus::Ready,
            watermark: st.watermark(),
        }))
    } else {
        Err((
            StatusCode::SERVICE_UNAVAILABLE,
            Json(NotReady {
                status: NotReadyStatus::NotReady,
            }),
        ))
    }
}
