//! Browser safety: which web pages may drive the API.
//!
//! A browser adds an `Origin` header to every cross-origin request, to every POST, and to every
//! WebSocket handshake, and a page cannot forge it. So the rule is simple and covers the
//! requests CORS cannot stop (a "simple" cross-origin POST is sent before any CORS check, and
//! WebSockets have no CORS at all): **a request that carries an `Origin` is served only when that
//! origin is the server's own (its host and port are the request's `Host`) or one of
//! `server.cors_origins`**; any other gets 403 `origin_not_allowed`. Requests without `Origin`
//! (curl, trackers, servers, same-origin GETs) are not browsers acting for a page and pass.
//!
//! For the listed origins, [`cors`] answers preflights and adds the CORS headers, so their pages
//! can call the API with `fetch`; the map page at `/` is same-origin and needs none of it.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::http::error::ApiError;
use crate::state::AppState;

/// Whether a request with these headers may be served (see the module docs). `allowed` holds
/// lower-case origins, or `*` for any.
pub fn allowed(headers: &HeaderMap, allowed: &[String]) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let origin = origin.trim().to_ascii_lowercase();
    if allowed.iter().any(|a| a == "*" || *a == origin) {
        return true;
    }
    same_origin(&origin, headers.get(header::HOST))
}

/// Whether `origin` (`scheme://host[:port]`) names the host and port of the request's `Host`.
fn same_origin(origin: &str, host: Option<&HeaderValue>) -> bool {
    let Some(host) = host.and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let host = host.trim().to_ascii_lowercase();
    let (scheme, authority) = match origin.split_once("://") {
        Some(x) => x,
        None => return false,
    };
    let default_port = match scheme {
        "http" => "80",
        "https" => "443",
        _ => return false,
    };
    with_port(authority, default_port) == with_port(&host, default_port)
}

/// `authority` with its port written out (`[::1]` and `[::1]:80` compare equal).
fn with_port(authority: &str, default_port: &str) -> String {
    let has_port = match authority.rfind(':') {
        Some(i) => !authority[i..].contains(']'),
        None => false,
    };
    if has_port {
        authority.to_string()
    } else {
        format!("{authority}:{default_port}")
    }
}

/// The middleware: 403 for a request from a page whose origin is not allowed.
pub async fn check(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if allowed(req.headers(), &st.config().cors_origins) {
        return next.run(req).await;
    }
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_string();
    metrics::counter!(crate::telemetry::HTTP_ORIGIN_REFUSED).increment(1);
    ApiError::new(
        StatusCode::FORBIDDEN,
        "origin_not_allowed",
        format!(
            "requests from pages at {origin} are not allowed; list the origin in server.cors_origins"
        ),
    )
    .into_response()
}

/// The CORS layer for `origins` (`None` when there are none: no CORS headers at all).
pub fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o).ok())
                .collect::<Vec<_>>(),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([
                Method::GET,
                Method::HEAD,
                Method::POST,
                Method::PUT,
                Method::DELETE,
            ])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .max_age(std::time::Duration::from_secs(3600)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(origin: Option<&str>, host: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(o) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(o).unwrap());
        }
        h.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        h
    }

    #[test]
    fn only_the_servers_own_and_listed_origins_pass() {
        let none: Vec<String> = Vec::new();
        assert!(
            allowed(&h(None, "127.0.0.1:7878"), &none),
            "no Origin: not a page"
        );
        assert!(allowed(
            &h(Some("http://127.0.0.1:7878"), "127.0.0.1:7878"),
            &none
        ));
        assert!(allowed(
            &h(Some("HTTP://LocalHost:7878"), "localhost:7878"),
            &none
        ));
        assert!(allowed(
            &h(Some("http://example.com"), "example.com:80"),
            &none
        ));
        assert!(allowed(
            &h(Some("https://example.com"), "example.com"),
            &none
        ));
        assert!(allowed(&h(Some("http://[::1]:7878"), "[::1]:7878"), &none));
        for bad in [
            "http://evil.example",
            "http://127.0.0.1:7879",
            "null",
            "file://",
        ] {
            assert!(!allowed(&h(Some(bad), "127.0.0.1:7878"), &none), "{bad}");
        }
        let listed = vec!["https://dash.example.com".to_string()];
        assert!(allowed(
            &h(Some("https://dash.example.com"), "api:7878"),
            &listed
        ));
        assert!(!allowed(
            &h(Some("https://evil.example"), "api:7878"),
            &listed
        ));
        let any = vec!["*".to_string()];
        assert!(allowed(&h(Some("https://evil.example"), "api:7878"), &any));
    }
}
