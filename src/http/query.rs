//! One rule for query parameters, in one place: a documented route takes exactly the query
//! parameters its operation in `/openapi.json` lists, and a request with any other is refused
//! with 400 `bad_query` naming it and the known ones, before the handler runs. The table is
//! read from the OpenAPI document itself, so what is documented and what is accepted cannot
//! drift apart.
//!
//! Not checked: the routes outside the document (the map page and its assets, which take
//! `?key=` for the page's own script, and `/openapi.json`), and the tracker protocols
//! ([`OPEN_ROUTES`]), whose clients send parameters geodwell does not read (battery, altitude,
//! ...), which are ignored. `access_token` is taken out by authentication before this check.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::{OpenApi, RefOr};

use crate::http::auth::form_pairs;
use crate::http::error::ApiError;

/// Routes whose protocols define parameters geodwell does not read: those are ignored there.
pub const OPEN_ROUTES: [&str; 2] = ["/v1/trackers/osmand", "/v1/trackers/owntracks"];

/// The query parameters each documented operation takes, by route template and method.
#[derive(Debug, Default)]
pub struct KnownParams {
    by_route: HashMap<(String, Method), Vec<String>>,
}

impl KnownParams {
    /// The table of `api`'s operations (every documented path and method, with the names of
    /// its `in: query` parameters), except [`OPEN_ROUTES`].
    pub fn of(api: &OpenApi) -> KnownParams {
        let mut by_route = HashMap::new();
        for (path, item) in &api.paths.paths {
            if OPEN_ROUTES.contains(&path.as_str()) {
                continue;
            }
            let ops = [
                (Method::GET, &item.get),
                (Method::PUT, &item.put),
                (Method::POST, &item.post),
                (Method::DELETE, &item.delete),
                (Method::PATCH, &item.patch),
                (Method::HEAD, &item.head),
                (Method::OPTIONS, &item.options),
            ];
            for (method, op) in ops {
                let Some(op) = op else { continue };
                let names: Vec<String> = op
                    .parameters
                    .iter()
                    .flatten()
                    .filter_map(|p| match p {
                        RefOr::T(p) if p.parameter_in == ParameterIn::Query => Some(p.name.clone()),
                        _ => None,
                    })
                    .collect();
                by_route.insert((path.clone(), method), names);
            }
        }
        KnownParams { by_route }
    }

    /// Why `query` does not fit the operation `(route, method)`, if it does not; `None` for an
    /// operation outside the table.
    pub fn refuse(&self, route: &str, method: &Method, query: &str) -> Option<ApiError> {
        // HEAD is answered by the GET handler.
        let method = if method == Method::HEAD {
            &Method::GET
        } else {
            method
        };
        let known = self.by_route.get(&(route.to_string(), method.clone()))?;
        let unknown = form_pairs(query)
            .map(|(k, _)| k)
            .find(|k| !known.iter().any(|n| n == k))?;
        let message = if known.is_empty() {
            format!("unknown query parameter {unknown:?}: {method} {route} takes none")
        } else {
            format!(
                "unknown query parameter {unknown:?}; {method} {route} takes: {}",
                known.join(", ")
            )
        };
        Some(ApiError::bad_request("bad_query", message))
    }
}

/// The middleware: refuses a request to a documented route whose query holds a parameter the
/// route does not take.
pub async fn strict(State(known): State<Arc<KnownParams>>, req: Request, next: Next) -> Response {
    if let (Some(route), Some(query)) = (req.extensions().get::<MatchedPath>(), req.uri().query())
        && let Some(e) = known.refuse(route.as_str(), req.method(), query)
    {
        return e.into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> KnownParams {
        KnownParams::of(&crate::http::openapi())
    }

    #[test]
    fn a_route_takes_what_its_operation_documents_and_nothing_else() {
        let k = known();
        assert!(
            k.refuse("/v1/devices", &Method::GET, "limit=3&after=1.2")
                .is_none()
        );
        let e = k
            .refuse("/v1/devices", &Method::GET, "limit=3&colour=red")
            .unwrap();
        assert_eq!(e.code, "bad_query");
        assert!(
            e.message.contains("\"colour\"") && e.message.contains("limit, after"),
            "{}",
            e.message
        );
        let e = k.refuse("/v1/fences/{id}", &Method::GET, "x=1").unwrap();
        assert!(e.message.contains("takes none"), "{}", e.message);
        assert!(k.refuse("/v1/fences/{id}", &Method::HEAD, "x=1").is_some());
        assert!(
            k.refuse("/v1/fences", &Method::GET, "contains=1,2&limit=5&after=a")
                .is_none()
        );
        // Percent-encoded names are decoded first.
        assert!(k.refuse("/v1/fences", &Method::GET, "li%6dit=5").is_none());
    }

    #[test]
    fn tracker_protocols_and_undocumented_routes_are_not_checked() {
        let k = known();
        assert!(
            k.refuse("/v1/trackers/osmand", &Method::GET, "id=a&batt=50")
                .is_none()
        );
        assert!(
            k.refuse("/v1/trackers/owntracks", &Method::POST, "u=a&d=b&x=1")
                .is_none()
        );
        assert!(k.refuse("/ui/{*path}", &Method::GET, "key=abc").is_none());
    }
}
