//! Fence CRUD: `PUT/GET/DELETE /v1/fences/{id}`, `GET /v1/fences`, `POST /v1/fences` (GeoJSON
//! Feature or FeatureCollection; all-or-nothing).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::openapi::{RefOr, schema::Schema};
use utoipa::{PartialSchema, ToSchema};

use std::collections::HashMap;

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;

use crate::fences::{FenceWriteError, Stored};
use crate::http::auth::Refused;
use crate::http::body::{JsonBody, Read};
use crate::http::error::{ApiError, ErrorBody, ErrorDetails, FenceProblem};
use crate::http::events::parse_u64;
use crate::http::openapi::{FenceBody, FenceCollection, FenceFeature};
use crate::ingest::BatchError;
use crate::state::AppState;
use geodwell_core::fences::{FenceError, FenceErrorKind, FenceErrors, Rect};

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
            FenceWriteError::Store(e) => BatchError::StoreUnavailable(e).into(),
            FenceWriteError::Conflict
            | FenceWriteError::Contended
            | FenceWriteError::NotApplied(_) => ApiError::store_unavailable(&e),
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
    body: Result<Read<JsonBody>, ApiError>,
) -> Result<(StatusCode, Json<FenceOut>), ApiError> {
    // A bad id is answered before a bad body.
    let Path(id) = path?;
    let Read(body, _) = body?;
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
    let created = st.fences().put(vec![fence], st.watermark()).await?.created == 1;
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
    Read(body, _): Read<JsonBody>,
) -> Result<(StatusCode, Json<FencesWritten>), ApiError> {
    let text = std::str::from_utf8(&body.bytes)
        .map_err(|e| ApiError::bad_request("bad_body", e.to_string()))?;
    let fences = st.fences().validate_geojson(&parse_geojson(text)?)?;
    let ids: Vec<String> = fences.iter().map(|f| f.id.to_string()).collect();
    let w = st.fences().put(fences, st.watermark()).await?;
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
    description = "One fence, normalized, with `inside`: how many devices are inside it now. Scope: read.",
    params(("id" = String, Path, description = "Fence id")),
    responses(
        (status = 200, description = "The fence", body = FenceOut),
        (status = 400, description = "Bad request", body = ErrorBody), Refused,
        (status = 404, description = "No such fence", body = ErrorBody),
        (status = 503, description = "A partition unavailable or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn get_fence(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let f = st.fences().get(&id).ok_or_else(|| {
        ApiError::not_found("fence_not_found", format!("no fence with id {id:?}"))
    })?;
    let inside = st.shards().inside(&id).await?;
    // The text rendered when the fence was written (what `Json(FenceOut(..))` would write),
    // with the count as a foreign member in front (the text is an object with members).
    let rest = f.json.strip_prefix('{').unwrap_or(&f.json);
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        format!("{{\"inside\":{inside},{rest}"),
    )
        .into_response())
}

/// Largest page `GET /v1/fences` answers.
pub const MAX_FENCE_PAGE: usize = 10_000;
/// Page length of `GET /v1/fences` without `limit`.
pub const DEFAULT_FENCE_PAGE: usize = 1_000;

/// Which fences `GET /v1/fences` lists.
#[derive(Debug, Clone, PartialEq)]
enum Filter {
    /// `contains=LAT,LON`.
    Contains { lat: f64, lon: f64 },
    /// `bbox=W,S,E,N` (a window across the antimeridian, `W > E`, is two rectangles).
    Window(Vec<Rect>),
}

/// A plain decimal, as the OpenAPI patterns of `contains` and `bbox` write it: an optional
/// `-`, an integer part without leading zeros, and an optional fraction (`12`, `-0.5`, `180.0`;
/// not `+1`, `1e2`, `05` or ` 1`), so that what the document allows and what is accepted agree.
fn number(v: &str) -> Option<f64> {
    let digits = v.strip_prefix('-').unwrap_or(v);
    let (int, frac) = match digits.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (digits, None),
    };
    let int_ok = !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && (int.len() == 1 || !int.starts_with('0'));
    let frac_ok = frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()));
    (int_ok && frac_ok)
        .then(|| v.parse::<f64>().ok())
        .flatten()
        .filter(|x| x.is_finite())
}

fn parse_contains(v: &str) -> Result<Filter, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "bad_query",
            format!(
                "contains must be LAT,LON with -90 <= LAT <= 90 and -180 <= LON <= 180, got {v:?}"
            ),
        )
    };
    let (lat, lon) = v.split_once(',').ok_or_else(bad)?;
    let (lat, lon) = (number(lat).ok_or_else(bad)?, number(lon).ok_or_else(bad)?);
    if !(-90.0..=90.0).contains(&lat) || !(-180.0..=180.0).contains(&lon) {
        return Err(bad());
    }
    Ok(Filter::Contains { lat, lon })
}

fn parse_bbox(v: &str) -> Result<Filter, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "bad_query",
            format!(
                "bbox must be WEST,SOUTH,EAST,NORTH in degrees (longitudes in -180..=180, \
                 latitudes in -90..=90; WEST > EAST crosses the antimeridian), got {v:?}"
            ),
        )
    };
    let n: Vec<f64> = v
        .split(',')
        .map(number)
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    let [w, s, e, north] = n[..] else {
        return Err(bad());
    };
    let lon_ok = |x: f64| (-180.0..=180.0).contains(&x);
    let lat_ok = |x: f64| (-90.0..=90.0).contains(&x);
    if !(lon_ok(w) && lon_ok(e) && lat_ok(s) && lat_ok(north)) {
        return Err(bad());
    }
    if s > north {
        // An empty window: nothing shares a point with it.
        return Ok(Filter::Window(Vec::new()));
    }
    let rect = |min_lon, max_lon| Rect {
        min_lon,
        min_lat: s,
        max_lon,
        max_lat: north,
    };
    Ok(Filter::Window(if w <= e {
        vec![rect(w, e)]
    } else {
        vec![rect(w, 180.0), rect(-180.0, e)]
    }))
}

/// `GET /v1/fences`: a page of fences as a FeatureCollection, sorted by id, with `next_after`.
#[utoipa::path(get, path = "/v1/fences", tag = "fences",
    description = "Fences sorted by id, a page at a time: all of them, those containing a point (`contains`, the engine's own test: boundary inclusive, circles included), those sharing a point with a window (`bbox`), or both. The answer is a GeoJSON FeatureCollection with `next_after`: pass it back as `after` for the next page (null on the last, and then `has_more` is false). A filtered page examines a bounded number of fences, so it may hold fewer than `limit` fences, even none, while `has_more` is true: keep paging until it is false. Scope: read.",
    params(
        ("limit" = Option<u64>, Query, minimum = 1, maximum = 10000, description = "Page length (default 1000)"),
        ("after" = Option<String>, Query, description = "`next_after` of the previous page"),
        ("contains" = Option<String>, Query, pattern = r"^-?(90(\.0+)?|[1-8]?[0-9](\.[0-9]+)?),-?(180(\.0+)?|(1[0-7][0-9]|[1-9]?[0-9])(\.[0-9]+)?)$", description = "`LAT,LON`: only fences containing the point"),
        ("bbox" = Option<String>, Query, pattern = r"^-?(180(\.0+)?|(1[0-7][0-9]|[1-9]?[0-9])(\.[0-9]+)?),-?(90(\.0+)?|[1-8]?[0-9](\.[0-9]+)?),-?(180(\.0+)?|(1[0-7][0-9]|[1-9]?[0-9])(\.[0-9]+)?),-?(90(\.0+)?|[1-8]?[0-9](\.[0-9]+)?)$", description = "`WEST,SOUTH,EAST,NORTH` (degrees; WEST > EAST crosses the antimeridian; SOUTH > NORTH matches nothing): only fences sharing a point with the window"),
    ),
    responses(
        (status = 200, description = "A page of fences", body = FenceCollectionOut),
        (status = 400, description = "Bad request", body = ErrorBody),
        Refused,
    ))]
pub async fn list_fences(
    State(st): State<Arc<AppState>>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query?;
    let limit = parse_u64(&q, "limit")?.unwrap_or(DEFAULT_FENCE_PAGE as u64);
    if limit == 0 || limit > MAX_FENCE_PAGE as u64 {
        return Err(ApiError::bad_request(
            "bad_query",
            format!("limit must be in 1..={MAX_FENCE_PAGE}"),
        ));
    }
    let limit = limit as usize;
    let after = q.get("after").cloned();
    let contains = q.get("contains").map(|c| parse_contains(c)).transpose()?;
    let window = q.get("bbox").map(|b| parse_bbox(b)).transpose()?;
    // A filtered page is computed at once on the scan pool (bounded work: `PAGE_SCAN` fences
    // at most, `crate::fences::map`); the full listing is read from the registry a few fences at
    // a time as the client reads, since a page of large fences is tens of MB of text. Both
    // given: the fences containing the point that also share a point with the window.
    let query = match (contains, window) {
        (None, None) => None,
        (Some(Filter::Contains { lat, lon }), w) => {
            let mut windows = vec![Rect::point(lon, lat)];
            if lon.abs() == 180.0 {
                windows.push(Rect::point(-lon, lat));
            }
            let within = match w {
                Some(Filter::Window(w)) => Some(w),
                _ => None,
            };
            Some((windows, Some((lon, lat)), within))
        }
        (_, Some(Filter::Window(w))) => Some((w.clone(), None, Some(w))),
        _ => None,
    };
    let matches = match query {
        None => None,
        Some((windows, point, within)) => {
            let st = st.clone();
            let after = after.clone();
            Some(
                crate::http::scan::run(move || {
                    st.fences()
                        .filtered_page(&windows, after.as_deref(), limit, |f| {
                            point.is_none_or(|(lon, lat)| f.contains(lon, lat))
                                && within
                                    .as_ref()
                                    .is_none_or(|w| w.iter().any(|r| f.meets_rect(r)))
                        })
                })
                .await?,
            )
        }
    };
    /// Fences read from the registry per lock, for the unfiltered listing.
    const FETCH: usize = 64;
    struct List {
        st: Arc<AppState>,
        /// Fences to write next: the filter's matches from `after` on (at most `limit + 1`),
        /// or the last piece fetched from the registry.
        pending: std::vec::IntoIter<Stored>,
        /// Unfiltered: the id of the last fence fetched, to fetch the next piece after it.
        fetch_after: Option<Option<String>>,
        /// The id of the last fence written.
        after: Option<String>,
        /// Filtered: where the next page starts once `pending` is written.
        resume: Option<String>,
        left: usize,
        wrote_any: bool,
        started: bool,
        done: bool,
    }
    impl List {
        /// The next fence to write, if there is one.
        fn next(&mut self) -> Option<Stored> {
            if let Some(s) = self.pending.next() {
                return Some(s);
            }
            let from = self.fetch_after.as_ref()?;
            let piece = self.st.fences().page(from.as_deref(), FETCH);
            self.fetch_after = piece.last().map(|s| Some(s.fence.id.to_string()));
            self.pending = piece.into_iter();
            self.pending.next()
        }
    }
    let (pending, fetch_after, resume) = match matches {
        Some(m) => (m.fences, None, m.resume),
        None => (Vec::new(), Some(after.clone()), None),
    };
    let list = List {
        st,
        pending: pending.into_iter(),
        fetch_after,
        after,
        resume,
        left: limit,
        wrote_any: false,
        started: false,
        done: false,
    };
    Ok(crate::http::stream::json(list, |l| {
        if l.done {
            return None;
        }
        let mut piece = String::new();
        if !l.started {
            l.started = true;
            piece.push_str(r#"{"type":"FeatureCollection","features":["#);
        }
        while piece.len() < crate::http::stream::PIECE_BYTES {
            let Some(s) = l.next() else {
                l.done = true;
                piece.push_str(&page_tail(l.resume.as_deref()));
                break;
            };
            if l.left == 0 {
                // One more fence exists: the page ends at the last one written.
                l.done = true;
                piece.push_str(&page_tail(l.after.as_deref()));
                break;
            }
            if l.wrote_any {
                piece.push(',');
            }
            piece.push_str(&s.json);
            l.wrote_any = true;
            l.left -= 1;
            l.after = Some(s.fence.id.to_string());
        }
        Some(piece)
    }))
}

/// The text after a page's fences: `next_after` (null on the last page) and `has_more`.
fn page_tail(next_after: Option<&str>) -> String {
    let next = serde_json::to_string(&next_after).unwrap_or_else(|_| "null".into());
    format!(
        r#"],"next_after":{next},"has_more":{}}}"#,
        next_after.is_some()
    )
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
