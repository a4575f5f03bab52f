//! The HTTP and WebSocket interface (DESIGN section 6): `router(state)` builds it; one file per
//! resource; every failure goes through [`error::ApiError`].

pub mod devices;
pub mod error;
pub mod events;
pub mod fences;
pub mod fixes;
pub mod ingest_ws;
pub mod ops;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::state::AppState;
use crate::telemetry as t;
use error::ApiError;

/// Builds the router over shared state.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.cfg.max_body_bytes;
    Router::new()
        .route("/v1/fixes", axum::routing::post(fixes::post_fixes))
        .route(
            "/v1/fences",
            get(fences::list_fences).post(fences::post_fences),
        )
        .route(
            "/v1/fences/{id}",
            get(fences::get_fence)
                .put(fences::put_fence)
                .delete(fences::delete_fence),
        )
        .route("/v1/devices/{id}", get(devices::get_device))
        .route("/v1/events", get(events::poll))
        .route("/v1/events/ws", get(events::subscribe))
        .route("/v1/ingest/ws", get(ingest_ws::ingest_ws))
        .route("/metrics", get(ops::metrics))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .with_state(state)
}

async fn method_not_allowed() -> Response {
    ApiError {
        status: axum::http::StatusCode::METHOD_NOT_ALLOWED,
        code: "method_not_allowed",
        message: "this endpoint does not take that method".into(),
        details: None,
        retry_after: None,
    }
    .into_response()
}

async fn not_found() -> Response {
    ApiError::not_found("no_route", "no such endpoint").into_response()
}

/// Counts requests by matched route (never the raw path: ids would explode the label set).
async fn track(State(_st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched".to_string(), |m| m.as_str().to_string());
    let method = req.method().as_str().to_string();
    let started = Instant::now();
    let resp = next.run(req).await;
    metrics::counter!(t::HTTP_REQUESTS, "route" => route.clone(), "method" => method, "status" => resp.status().as_u16().to_string())
        .increment(1);
    metrics::histogram!(t::HTTP_REQUEST_SECONDS, "route" => route)
        .record(started.elapsed().as_secs_f64());
    resp
}
