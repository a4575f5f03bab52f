//! Fence CRUD: `PUT/GET/DELETE /v1/fences/{id}`, `GET /v1/fences`, `POST /v1/fences` (GeoJSON
//! Feature or FeatureCollection; all-or-nothing).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::openapi::{RefOr, schema::Schema};
use utoipa::{PartialSchema, ToSchema};

use crate::fences::FenceWriteError;
use crate::http::auth::Refused;
use crate::http::body::{self, Accept};
use crate::http::error::{ApiError, ErrorBody, ErrorDetails, FenceProblem};
use crate::http::openapi::{FenceBody, FenceCollection, FenceFeature};
use crate::ingest::BatchError;
use crate::state::AppState;
use geodwell_core::fences::{FenceError, FenceErrorKind, FenceErrors};

/// A fence as answered: a GeoJSON Feature. The `geojson` crate's types have no OpenAPI schema,
/// so this one borrows [`FenceFeature`]'s (name included: the document calls it `FenceFeature`).
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct FenceOut(pub geojson::Feature);

/// The fences as answered: a GeoJSON FeatureCollection, documented as [`FenceCollection`] (like
/// [`FenceOut`]).
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct FenceCollectionOut(pub geojson::FeatureCollection);

/// Gives a served wrapper the schema and the name of the type that describes it, so that the
/// document names one schema for both.
macro_rules! schema_of {
    ($served:ty => $described:ty) => {
        impl PartialSchema for $served {
            fn schema() -> RefOr<Schema> {
                <$described as PartialSchema>::schema()
            }
        }

        impl ToSchema for $served {
            fn name() -> std::borrow::Cow<'static, str> {
                <$described as ToSchema>::name()
            }

            fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
                <$described as ToSchema>::schemas(schemas)
            }
        }
    };
}

schema_of!(FenceOut => FenceFeature);
schema_of!(FenceCollectionOut => FenceCollection);

/// `POST /v1/fences` answer.
// Fields in alphabetical order, the order it has always had (it used to be built as a
// `serde_json` map, which sorts its keys).
#[derive(Debug, Serialize, ToSchema)]
pub struct FencesWritten {
    /// Fences that did not exist before.
    pub created: u64,
    /// The ids written, in request order.
    pub ids: Vec<String>,
    /// Fences replaced.
    pub replaced: u64,
}

fn invalid(errs: FenceErrors) -> ApiError {
    let details = errs
        .errors()
        .iter()
        .map(|e| FenceProblem {
            message: e.kind.to_string(),
            path: e.path.clone(),
        })
        .collect();
    ApiError::unprocessable("invalid_fence", errs.to_string())
        .with_details(ErrorDetails::Fence(details))
}

/// Body text -> GeoJSON: not JSON at all is 400 `malformed_json` (as for fixes); JSON that is not
/// GeoJSON (e.g. an unknown geometry type) is 422 `invalid_fence` with the reason as a detail.
fn parse_geojson(text: &str) -> Result<geojson::GeoJson, ApiError> {
    serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| {
        ApiError::bad_request("malformed_json", format!("body is not valid JSON: {e}"))
    })?;
    text.parse::<geojson::GeoJson>().map_err(|e| {
        invalid(FenceErrors(vec![FenceError {
            path: String::new(),
            kind: FenceErrorKind::Json(e.to_string()),
        }]))
    })
}

impl From<FenceWriteError> for ApiError {
    fn from(e: FenceWriteError) -> ApiError {
        match e {
            FenceWriteError::Invalid(errs) => invalid(errs),
            FenceWriteError::Empty => ApiError::bad_request("empty_collection", e.to_string()),
            FenceWriteError::TooMany { .. } => {
                ApiError::unprocessable("too_many_fences", e.to_string())
            }
            FenceWriteError::NotFound(_) => ApiError::not_found("fence_not_found", e.to_string()),
            FenceWriteError::Store(msg) => BatchError::StoreUnavailable(msg).into(),
            FenceWriteError::Conflict => BatchError::StoreUnavailable(e.to_string()).into(),
            FenceWriteError::ShuttingDown => ApiError::shutting_down(),
        }
    }
}

/// `PUT /v1/fences/{id}`: body is a GeoJSON Feature (its `id`, if any, must match).
#[utoipa::path(put, path = "/v1/fences/{id}", tag = "fences",
    description = "Creates or replaces one fence from a GeoJSON Feature. Scope: admin.",
    params(("id" = String, Path, description = "Fence id")),
    request_body(content((FenceFeature = "application/json"))),
    responses(
        (status = 200, description = "Replaced; the normalized fence", body = FenceOut),
        (status = 201, description = "Created; the normalized fence", body = FenceOut),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 408, description = "The body did not arrive within `server.body_timeout`", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "Not a valid fence", body = ErrorBody),
        (status = 503, description = "Overloaded, store unavailable or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn put_fence(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<FenceOut>), ApiError> {
    let Path(id) = path?;
    let body = body::read(&headers, body, Accept::Json, &body::BodyLimits::of(&st)).await?;
    let text = std::str::from_utf8(&body.bytes)
        .map_err(|e| ApiError::bad_request("bad_body", e.to_string()))?;
    let feature = match parse_geojson(text)? {
        geojson::GeoJson::Feature(f) => f,
        _ => {
            return Err(ApiError::unprocessable(
                "invalid_fence",
                "PUT /v1/fences/{id} takes one GeoJSON Feature; use POST /v1/fences for a FeatureCollection",
            ));
        }
    };
    let fence = st.fences().validate_feature(&feature, &id)?;
    let body = FenceOut(fence.to_feature());
    let created = st.fences().put(vec![fence]).await?.created == 1;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(body)))
}

/// `POST /v1/fences`: a Feature or FeatureCollection; nothing is applied if any is invalid.
#[utoipa::path(post, path = "/v1/fences", tag = "fences",
    description = "Creates or replaces fences from a Feature or FeatureCollection; nothing is applied if any is invalid. Scope: admin.",
    request_body(content((FenceBody = "application/json"))),
    responses(
        (status = 201, description = "Written", body = FencesWritten),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 408, description = "The body did not arrive within `server.body_timeout`", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "Not valid fences, or too many", body = ErrorBody),
        (status = 503, description = "Overloaded, store unavailable or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn post_fences(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<FencesWritten>), ApiError> {
    let body = body::read(&headers, body, Accept::Json, &body::BodyLimits::of(&st)).await?;
    let text = std::str::from_utf8(&body.bytes)
        .map_err(|e| ApiError::bad_request("bad_body", e.to_string()))?;
    let fences = st.fences().validate_geojson(&parse_geojson(text)?)?;
    let ids: Vec<String> = fences.iter().map(|f| f.id.to_string()).collect();
    let w = st.fences().put(fences).await?;
    Ok((
        StatusCode::CREATED,
        Json(FencesWritten {
            created: w.created as u64,
            ids,
            replaced: w.replaced as u64,
        }),
    ))
}

/// `GET /v1/fences/{id}`.
#[utoipa::path(get, path = "/v1/fences/{id}", tag = "fences",
    description = "One fence, normalized. Scope: read.",
    params(("id" = String, Path, description = "Fence id")),
    responses(
        (status = 200, description = "The fence", body = FenceOut),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 404, description = "No such fence", body = ErrorBody),
    ))]
pub async fn get_fence(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let f = st.fences().get(&id).ok_or_else(|| {
        ApiError::not_found("fence_not_found", format!("no fence with id {id:?}"))
    })?;
    // The text rendered when the fence was written (what `Json(FenceOut(..))` would write).
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        f.json.to_string(),
    )
        .into_response())
}

/// `GET /v1/fences`: all fences as a FeatureCollection, sorted by id.
#[utoipa::path(get, path = "/v1/fences", tag = "fences",
    description = "Every fence, sorted by id. Scope: read.",
    responses(
        (status = 200, description = "The fences", body = FenceCollectionOut),
        Refused,
    ))]
pub async fn list_fences(State(st): State<Arc<AppState>>) -> Response {
    // Streamed a few fences at a time, in id order, as the client reads: 100,000 fences are
    // tens of MB of text, which a client that reads slowly would otherwise hold in memory. A
    // fence written while the answer is being read is in it if its id comes after the last one
    // written out.
    struct List {
        st: Arc<AppState>,
        after: Option<String>,
        started: bool,
        done: bool,
    }
    let list = List {
        st,
        after: None,
        started: false,
        done: false,
    };
    crate::http::stream::json(list, |l| {
        if l.done {
            return None;
        }
        let mut piece = String::new();
        if !l.started {
            l.started = true;
            piece.push_str(r#"{"type":"FeatureCollection","features":["#);
        }
        while piece.len() < crate::http::stream::PIECE_BYTES {
            let page = l.st.fences().page(l.after.as_deref(), 64);
            for s in &page {
                if l.after.is_some() {
                    piece.push(',');
                }
                piece.push_str(&s.json);
                l.after = Some(s.fence.id.to_string());
            }
            if page.len() < 64 {
                l.done = true;
                piece.push_str("]}");
                break;
            }
        }
        Some(piece)
    })
}

/// `DELETE /v1/fences/{id}`: drops the fence, its pairs and their timers.
#[utoipa::path(delete, path = "/v1/fences/{id}", tag = "fences",
    description = "Drops the fence, its pairs and their timers. Scope: admin.",
    params(("id" = String, Path, description = "Fence id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 404, description = "No such fence", body = ErrorBody),
        (status = 503, description = "Overloaded, store unavailable or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn delete_fence(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path(id) = path?;
    st.fences().delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}
