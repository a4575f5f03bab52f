//! The live map page: `GET /` (the page), `GET /ui/{*path}` (its scripts, styles, the vendored
//! Leaflet and the vendored Natural Earth base layer), and `GET /ui/config.json` (the settings
//! the page needs from the server config, on the same route).
//!
//! Invariants: every asset is compiled into the binary from `assets/ui/` (the page works with no
//! network beyond this server, and the served files always match the binary's version); only the
//! files listed in `ASSETS` are served, looked up by exact path, so no request can reach the
//! file system; an unknown asset is a 404 JSON error like any other route. Answers carry an
//! `ETag` (a hash of the bytes) and `Cache-Control: no-cache`, so a browser revalidates with a
//! cheap 304 and never runs a stale script against a newer server.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::config::ClockMode;
use crate::http::error::ApiError;
use crate::state::AppState;

/// One embedded file.
struct Asset {
    /// Path below `/ui/` (and below `assets/ui/` in the source tree).
    path: &'static str,
    /// The bytes.
    body: &'static [u8],
    /// Its `Content-Type`.
    content_type: &'static str,
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const HTML: &str = "text/html; charset=utf-8";
const PNG: &str = "image/png";
const SVG: &str = "image/svg+xml";
const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

macro_rules! asset {
    ($path:literal, $ct:expr) => {
        Asset {
            path: $path,
            body: include_bytes!(concat!("../../assets/ui/", $path)),
            content_type: $ct,
        }
    };
}

/// Every file the page may load. `tests/ui.rs` checks that each file under `assets/ui/` is here.
static ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("style.css", CSS),
    asset!("favicon.svg", SVG),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("map.js", JS),
    asset!("feed.js", JS),
    asset!("panels.js", JS),
    asset!("util.js", JS),
    asset!("track.js", JS),
    asset!("vendor/leaflet/leaflet.js", JS),
    asset!("vendor/leaflet/leaflet.css", CSS),
    asset!("vendor/leaflet/LICENSE", TEXT),
    asset!("vendor/leaflet/images/layers.png", PNG),
    asset!("vendor/leaflet/images/layers-2x.png", PNG),
    asset!("vendor/leaflet/images/marker-icon.png", PNG),
    asset!("vendor/leaflet/images/marker-icon-2x.png", PNG),
    asset!("vendor/leaflet/images/marker-shadow.png", PNG),
    // The offline base layer: Natural Earth 1:50m land and country borders (public domain), as
    // GeoJSON converted from the npm package world-atlas (its README says how).
    asset!("vendor/world-atlas/land.json", JSON),
    asset!("vendor/world-atlas/borders.json", JSON),
    asset!("vendor/world-atlas/LICENSE", TEXT),
    asset!("vendor/world-atlas/README.md", TEXT),
];

/// The page's Content-Security-Policy without a tile layer: everything from this server only.
/// Leaflet styles elements through the CSSOM (allowed); `data:` images are its 1x1 placeholders.
const CSP_OFFLINE: &str = "default-src 'self'; img-src 'self' data:; \
     connect-src 'self' ws: wss:; style-src 'self'; object-src 'none'; base-uri 'none'; \
     frame-ancestors 'none'";

/// With a configured tile URL the browser must also load images from that (templated, possibly
/// `{s}`-subdomained) host, which CSP cannot name exactly, so images may come from any http(s)
/// origin; scripts and connections stay same-origin.
const CSP_TILES: &str = "default-src 'self'; img-src 'self' data: http: https:; \
     connect-src 'self' ws: wss:; style-src 'self'; object-src 'none'; base-uri 'none'; \
     frame-ancestors 'none'";

fn etags() -> &'static HashMap<&'static str, String> {
    static ETAGS: OnceLock<HashMap<&'static str, String>> = OnceLock::new();
    ETAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let h = xxhash_rust::xxh3::xxh3_64(a.body);
                (a.path, format!("\"{h:016x}\""))
            })
            .collect()
    })
}

/// Serves `path` from `ASSETS`, answering 304 when the browser already holds these bytes.
/// HTML gets the page's security headers, whichever path it is asked by.
fn serve(st: &AppState, path: &str, req: &HeaderMap) -> Result<Response, ApiError> {
    let asset = ASSETS
        .iter()
        .find(|a| a.path == path)
        .ok_or_else(|| ApiError::not_found("asset_not_found", format!("no UI asset {path:?}")))?;
    let csp = (asset.content_type == HTML).then(|| {
        if st.config().map_tile_url.is_some() {
            CSP_TILES
        } else {
            CSP_OFFLINE
        }
    });
    let etag = etags().get(asset.path).cloned().unwrap_or_default();
    let fresh = req
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(header::CONTENT_TYPE, asset.content_type)],
            asset.body.to_vec(),
        )
            .into_response()
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if let Some(csp) = csp {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(csp),
        );
        // The page URL may carry `?key=`; never hand it to a tile server in a Referer.
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
    Ok(resp)
}

/// `GET /`: the map page.
pub async fn index(State(st): State<Arc<AppState>>, req: HeaderMap) -> Result<Response, ApiError> {
    serve(&st, "index.html", &req)
}

/// `GET /ui/{*path}`: one embedded asset, or `config.json`.
///
/// `config.json` is answered here rather than by a route of its own so that everything under
/// `/ui/` is one route: the auth layer leaves that route open (the page must load before the
/// browser has a key to send), and a separate route would fall under its "unknown routes need
/// admin" default.
pub async fn asset(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    req: HeaderMap,
) -> Result<Response, ApiError> {
    let Path(path) = path?;
    if path == "config.json" {
        return Ok(config(&st));
    }
    serve(&st, &path, &req)
}

/// `GET /ui/config.json` answer. Not in the OpenAPI document, like the rest of the page's files.
// Fields in alphabetical order, the order it has always had (it used to be built as a
// `serde_json` map, which sorts its keys).
#[derive(Debug, Serialize)]
pub struct UiConfig<'a> {
    /// `live` or `event`.
    pub clock: ClockMode,
    /// The largest `limit` of `GET /v1/events`.
    pub max_poll_limit: usize,
    /// The tile layer's attribution, if a tile layer is configured.
    pub tile_attribution: Option<&'a str>,
    /// The tile URL template, if any.
    pub tile_url: Option<&'a str>,
    /// The service version.
    pub version: &'static str,
}

/// `GET /ui/config.json`: what the page needs from the server configuration (the optional tile
/// layer) and the service version; nothing secret, since it is served without a key.
fn config(st: &AppState) -> Response {
    let cfg = st.config();
    let mut resp = Json(UiConfig {
        clock: cfg.clock,
        max_poll_limit: cfg.max_poll_limit,
        tile_attribution: cfg.map_tile_attribution.as_deref(),
        tile_url: cfg.map_tile_url.as_deref(),
        version: env!("CARGO_PKG_VERSION"),
    })
    .into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}
