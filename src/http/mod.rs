//! The HTTP and WebSocket interface (`docs/api.md`; the OpenAPI document it serves at
//! `/openapi.json`): `router(state)` builds it; one file per resource; every answer is a typed
//! value its handler returns, and every failure goes through [`error::ApiError`].

pub mod auth;
pub mod body;
pub mod cluster;
pub mod devices;
pub mod error;
pub mod events;
pub mod fences;
pub mod fixes;
pub mod ingest_ws;
pub mod occupancy;
pub mod openapi;
pub mod ops;
pub mod origin;
pub mod query;
pub mod scan;
pub mod server;
pub mod stream;
pub mod tls;
pub mod trackers;
pub mod ui;
pub mod visits;
pub mod watermark;
pub mod webhooks;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::state::AppState;
use crate::telemetry as t;
use error::ApiError;

/// Builds the router over shared state.
pub fn router(state: Arc<AppState>) -> Router {
    let (documented, mut api) = documented_routes().split_for_parts();
    openapi::tune(&mut api, state.config());
    let known_params = Arc::new(query::KnownParams::of(&api));
    // Through a `Value`, whose maps sort their keys: the text keeps one order whatever utoipa's
    // own map types are.
    let api_json: Arc<str> = serde_json::to_value(&api)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_default()
        .into();
    let router = documented
        .route(
            "/openapi.json",
            get(move || {
                let body = api_json.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "application/json")],
                        body.to_string(),
                    )
                }
            }),
        )
        .route("/", get(ui::index))
        .route("/ui/{*path}", get(ui::asset))
        .route_layer(middleware::from_fn_with_state(known_params, query::strict))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), auth::require));
    // Outermost last: every request is counted (`track`), then pages from other origins are turned away before CORS and authentication see them.
    let router = match origin::cors(&state.config().cors_origins) {
        Some(cors) => router.layer(cors),
        None => router,
    };
    router
        .layer(middleware::from_fn_with_state(state.clone(), origin::check))
        .layer(middleware::from_fn(method_not_allowed))
        .layer(middleware::from_fn(track))
        .with_state(state)
}

/// The documented API: each handler is registered under the path and method of its
/// `#[utoipa::path]` attribute, so what is served and what `/openapi.json` says are one list.
pub fn documented_routes() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(fixes::post_fixes))
        .routes(routes!(fences::list_fences, fences::post_fences))
        .routes(routes!(
            fences::get_fence,
            fences::put_fence,
            fences::delete_fence
        ))
        .routes(routes!(occupancy::list_occupants))
        .routes(routes!(devices::list_devices))
        .routes(routes!(devices::get_device, devices::delete_device))
        .routes(routes!(visits::list_visits))
        .routes(routes!(events::poll))
        .routes(routes!(events::subscribe))
        .routes(routes!(ingest_ws::ingest_ws))
        .routes(routes!(watermark::post_watermark))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(cluster::get_cluster))
        .routes(routes!(trackers::osmand))
        .routes(routes!(trackers::owntracks))
        .routes(routes!(webhooks::list_webhooks, webhooks::create_webhook))
        .routes(routes!(webhooks::get_webhook, webhooks::delete_webhook))
        .routes(routes!(
            webhooks::list_dead_letters,
            webhooks::clear_dead_letters
        ))
        .routes(routes!(webhooks::retry_dead_letters))
}

/// The OpenAPI 3.1 document served at `/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    documented_routes().into_openapi()
}

/// Gives axum's bare 405 answers the error JSON body, keeping their `Allow` header (which a
/// `method_not_allowed_fallback` would lose).
async fn method_not_allowed(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if resp.status() != axum::http::StatusCode::METHOD_NOT_ALLOWED
        || resp.headers().contains_key(header::CONTENT_TYPE)
    {
        return resp;
    }
    let allow = resp.headers().get(header::ALLOW).cloned();
    let mut out = ApiError {
        status: axum::http::StatusCode::METHOD_NOT_ALLOWED,
        code: "method_not_allowed",
        message: "this endpoint does not take that method".into(),
        details: None,
        retry_after: None,
    }
    .into_response();
    if let Some(allow) = allow {
        out.headers_mut().insert(header::ALLOW, allow);
    }
    out
}

async fn not_found() -> Response {
    ApiError::not_found("no_route", "no such endpoint").into_response()
}

/// The methods HTTP defines (RFC 9110, plus PATCH), each its own metric label. A route answers
/// any method it does not take, defined or made up, 405 with `Allow`.
const KNOWN_METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::OPTIONS,
    Method::PATCH,
    Method::TRACE,
    Method::CONNECT,
];

/// The method as a metric label: one of [`KNOWN_METHODS`] or `other`, so that no request can
/// add a series.
fn method_label(m: &Method) -> &'static str {
    KNOWN_METHODS
        .iter()
        .find(|k| *k == m)
        .map_or("other", |k| k.as_str())
}

/// The status as a metric label: its class (`2xx` ... `5xx`).
fn status_label(s: StatusCode) -> &'static str {
    match s.as_u16() / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}

/// Counts requests by route template, method and status class: every label comes from a closed
/// set (never the raw path, whose ids would explode the label set, nor the raw method).
async fn track(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched".to_string(), |m| m.as_str().to_string());
    let method = method_label(req.method());
    let started = Instant::now();
    let resp = next.run(req).await;
    metrics::counter!(t::HTTP_REQUESTS, "route" => route.clone(), "method" => method, "status" => status_label(resp.status()))
        .increment(1);
    metrics::histogram!(t::HTTP_REQUEST_SECONDS, "route" => route)
        .record(started.elapsed().as_secs_f64());
    resp
}
