//! Authentication middleware: which scope each route needs, where the token comes from, and the
//! 401 / 403 answers.
//!
//! Invariants: a route not named in [`required_scope`] needs `admin` (fail closed, so a route
//! added later is never open by accident); the `access_token` query parameter is removed before
//! the request reaches its handler, so handlers that reject unknown parameters never see it and it
//! is never echoed back.

use std::sync::Arc;

use axum::Json;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

use crate::auth::{AuthError, Scope};
use crate::http::error::ErrorBody;
use crate::state::AppState;
use crate::telemetry as t;

/// What a route needs: `None` = open to anyone.
pub fn required_scope(method: &Method, route: &str, open_metrics: bool) -> Option<Scope> {
    let read = matches!(*method, Method::GET | Method::HEAD);
    match route {
        "/healthz" | "/readyz" | "/openapi.json" | "/" | "/ui/{*path}" => None,
        "/metrics" if open_metrics => None,
        "/metrics" => Some(Scope::Read),
        "/v1/fixes" | "/v1/ingest/ws" => Some(Scope::Ingest),
        r if r.starts_with("/v1/trackers/") => Some(Scope::Ingest),
        "/v1/fences" | "/v1/fences/{id}" if read => Some(Scope::Read),
        "/v1/fences" | "/v1/fences/{id}" => Some(Scope::Admin),
        "/v1/devices"
        | "/v1/devices/{id}"
        | "/v1/devices/{id}/visits"
        | "/v1/fences/{id}/devices"
        | "/v1/events"
        | "/v1/events/ws"
        | "/v1/cluster"
            if read =>
        {
            Some(Scope::Read)
        }
        _ => Some(Scope::Admin),
    }
}

/// The token a request presents: `Authorization: Bearer`, `Authorization: Basic` (the password;
/// OwnTracks), or the `access_token` query parameter (browsers' WebSockets, trackers that cannot
/// set headers).
pub fn token_of(req: &Request) -> Option<String> {
    if let Some(h) = req.headers().get(header::AUTHORIZATION)
        && let Ok(h) = h.to_str()
    {
        let (scheme, rest) = h.split_once(' ').unwrap_or((h, ""));
        if scheme.eq_ignore_ascii_case("bearer") {
            return Some(rest.trim().to_string());
        }
        if scheme.eq_ignore_ascii_case("basic")
            && let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(rest.trim())
            && let Ok(text) = String::from_utf8(raw)
        {
            return Some(
                text.split_once(':')
                    .map_or(text.clone(), |(_, p)| p.to_string()),
            );
        }
    }
    query_token(req.uri())
}

fn query_token(uri: &Uri) -> Option<String> {
    let q = uri.query()?;
    form_pairs(q).find_map(|(k, v)| (k == "access_token").then_some(v))
}

/// The decoded `name=value` pairs of a query string, in order (a name without `=` has an empty
/// value).
pub(crate) fn form_pairs(q: &str) -> impl Iterator<Item = (String, String)> + '_ {
    q.split('&').filter(|p| !p.is_empty()).map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        (decode(k), decode(v))
    })
}

/// Percent-decoding for query parts (`+` is a space in forms).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len()
                && s.is_char_boundary(i + 1)
                && s.is_char_boundary(i + 3) =>
            {
                match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `uri` without its `access_token` parameters.
fn strip_token(uri: &Uri) -> Option<Uri> {
    let q = uri.query()?;
    if !q
        .split('&')
        .any(|p| p == "access_token" || p.starts_with("access_token="))
    {
        return None;
    }
    let kept: Vec<&str> = q
        .split('&')
        .filter(|p| !(*p == "access_token" || p.starts_with("access_token=")))
        .collect();
    let path = uri.path();
    let pq = if kept.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", kept.join("&"))
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = pq.parse().ok();
    Uri::from_parts(parts).ok()
}

/// The middleware: checks the token against the route's scope, then strips it from the query.
pub async fn require(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string());
    let need = match &route {
        Some(r) => required_scope(req.method(), r, st.config().open_metrics),
        // Unmatched: the 404 / 405 fallbacks reveal nothing.
        None => None,
    };
    if let Some(need) = need {
        let token = token_of(&req);
        let keys = st.keys();
        if let Err(e) = keys.check(token.as_deref(), need) {
            let reason = match e {
                AuthError::Missing => "missing",
                AuthError::Invalid => "invalid",
                AuthError::Forbidden { .. } => "forbidden",
            };
            metrics::counter!(t::AUTH_FAILURES, "reason" => reason).increment(1);
            if matches!(e, AuthError::Missing)
                && let Some(hint) = route.as_deref().and_then(tracker_hint)
            {
                return Refused::Unauthorized(ErrorBody::new("unauthorized", hint)).into_response();
            }
            return refusal(e);
        }
    }
    if let Some(uri) = strip_token(req.uri()) {
        *req.uri_mut() = uri;
    }
    next.run(req).await
}

/// The answers of the authentication layer, which every operation but the open ones can give;
/// each operation's `responses` names this type, and [`refusal`] builds it.
#[derive(Debug, utoipa::IntoResponses)]
pub enum Refused {
    /// 401, with `WWW-Authenticate`.
    #[response(status = 401, description = "No valid API key")]
    Unauthorized(ErrorBody),
    /// 403.
    #[response(status = 403, description = "The key lacks the scope")]
    Forbidden(ErrorBody),
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Unauthorized(body) => (
                StatusCode::UNAUTHORIZED,
                [(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"geodwell\""),
                )],
                Json(body),
            )
                .into_response(),
            Refused::Forbidden(body) => (StatusCode::FORBIDDEN, Json(body)).into_response(),
        }
    }
}

/// What a tracker app can do about a missing key: the apps cannot all set headers.
fn tracker_hint(route: &str) -> Option<String> {
    match route {
        "/v1/trackers/osmand" => Some(
            "this endpoint needs an API key with the ingest scope: Traccar Client and OsmAnd cannot set headers, so put it in the server URL as `?access_token=<key>` (e.g. http://host:7878/v1/trackers/osmand?access_token=KEY)"
                .to_string(),
        ),
        "/v1/trackers/owntracks" => Some(
            "this endpoint needs an API key with the ingest scope: in OwnTracks, turn on authentication and enter the key as the password (any user name), or add `?access_token=<key>` to the URL"
                .to_string(),
        ),
        _ => None,
    }
}

/// 401 (with `WWW-Authenticate`) or 403, as error JSON.
pub fn refusal(e: AuthError) -> Response {
    let message = e.to_string();
    match e {
        AuthError::Missing => Refused::Unauthorized(ErrorBody::new("unauthorized", message)),
        AuthError::Invalid => Refused::Unauthorized(ErrorBody::new("invalid_key", message)),
        AuthError::Forbidden { .. } => Refused::Forbidden(ErrorBody::new("forbidden", message)),
    }
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_map_to_scopes_and_unknown_routes_need_admin() {
        let g = Method::GET;
        assert_eq!(required_scope(&g, "/healthz", false), None);
        assert_eq!(required_scope(&g, "/metrics", true), None);
        assert_eq!(required_scope(&g, "/metrics", false), Some(Scope::Read));
        assert_eq!(
            required_scope(&Method::POST, "/v1/fixes", true),
            Some(Scope::Ingest)
        );
        assert_eq!(
            required_scope(&g, "/v1/fences/{id}", true),
            Some(Scope::Read)
        );
        assert_eq!(
            required_scope(&Method::PUT, "/v1/fences/{id}", true),
            Some(Scope::Admin)
        );
        assert_eq!(
            required_scope(&Method::DELETE, "/v1/fences/{id}", true),
            Some(Scope::Admin)
        );
        assert_eq!(required_scope(&g, "/v1/events/ws", true), Some(Scope::Read));
        assert_eq!(
            required_scope(&g, "/v1/devices/{id}/visits", true),
            Some(Scope::Read)
        );
        assert_eq!(
            required_scope(&g, "/v1/trackers/osmand", true),
            Some(Scope::Ingest)
        );
        assert_eq!(
            required_scope(&g, "/v1/fences/{id}/devices", true),
            Some(Scope::Read)
        );
        assert_eq!(required_scope(&g, "/v1/webhooks", true), Some(Scope::Admin));
        assert_eq!(
            required_scope(&g, "/v1/something-new", true),
            Some(Scope::Admin)
        );
    }

    fn req(uri: &str, auth: Option<&str>) -> Request {
        let mut b = axum::http::Request::builder().uri(uri);
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn tokens_come_from_bearer_basic_or_query() {
        assert_eq!(
            token_of(&req("/x", Some("Bearer abc"))).as_deref(),
            Some("abc")
        );
        assert_eq!(
            token_of(&req("/x", Some("bearer  abc "))).as_deref(),
            Some("abc")
        );
        // "user:secret-key" in base64.
        let basic = base64::engine::general_purpose::STANDARD.encode("user:secret-key");
        assert_eq!(
            token_of(&req("/x", Some(&format!("Basic {basic}")))).as_deref(),
            Some("secret-key")
        );
        assert_eq!(
            token_of(&req("/x?a=1&access_token=k%2Dy&b=2", None)).as_deref(),
            Some("k-y")
        );
        assert_eq!(token_of(&req("/x?a=1", None)), None);
        assert_eq!(
            token_of(&req("/x?a=%zz&access_token=%4", None)).as_deref(),
            Some("%4")
        );
    }

    #[test]
    fn the_token_is_stripped_from_the_query() {
        let u: Uri = "/v1/events?from_seq=3&access_token=abc&limit=2"
            .parse()
            .unwrap();
        assert_eq!(strip_token(&u).unwrap(), "/v1/events?from_seq=3&limit=2");
        let u: Uri = "/v1/events?access_token=abc".parse().unwrap();
        assert_eq!(strip_token(&u).unwrap(), "/v1/events");
        let u: Uri = "/v1/events?from_seq=3".parse().unwrap();
        assert_eq!(strip_token(&u), None);
    }
}
