//! Fence CRUD: `PUT/GET/DELETE /v1/fences/{id}`, `GET /v1/fences`, `POST /v1/fences` (GeoJSON
//! Feature or FeatureCollection; all-or-nothing).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::events::publisher::{PublishError, Step};
use crate::http::error::ApiError;
use crate::http::fixes::body_or_error;
use crate::shard::ShardMsg;
use crate::state::AppState;
use crate::telemetry as t;
use geodwell_core::fences::{Fence, FenceError, FenceErrorKind, FenceErrors, parse_fences};
use tokio::sync::oneshot;

fn invalid(errs: FenceErrors) -> ApiError {
    let details: Vec<Value> = errs
        .errors()
        .iter()
        .map(|e| json!({"path": e.path, "message": e.kind.to_string()}))
        .collect();
    ApiError::unprocessable("invalid_fence", errs.to_string()).with_details(json!(details))
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

/// Makes a fence change durable (through the publisher, like every other state change) before
/// it is applied or acknowledged.
async fn persist(st: &AppState, mut step: Step) -> Result<(), ApiError> {
    let (tx, rx) = oneshot::channel();
    step.ack = Some(tx);
    st.publisher
        .send(step)
        .await
        .map_err(|_| ApiError::shutting_down())?;
    match rx.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(PublishError::Store(msg))) => {
            Err(crate::ingest::BatchError::StoreUnavailable(msg).into())
        }
        Ok(Err(PublishError::Closed)) | Err(_) => Err(ApiError::shutting_down()),
    }
}

/// Installs fences everywhere (API copy + every shard, in one serialized order). Returns how many
/// were new.
pub async fn install(st: &AppState, fences: Vec<Fence>) -> Result<usize, ApiError> {
    let _guard = st.fence_write.lock().await;
    let new = {
        let map = st.fences.read().unwrap_or_else(|p| p.into_inner());
        let new = fences.iter().filter(|f| !map.contains_key(&*f.id)).count();
        if map.len() + new > st.cfg.max_fences {
            return Err(ApiError::unprocessable(
                "too_many_fences",
                format!(
                    "{} fences would exceed the limit of {}",
                    map.len() + new,
                    st.cfg.max_fences
                ),
            ));
        }
        new
    };
    persist(
        st,
        Step {
            fences_put: fences
                .iter()
                .map(|f| {
                    let text = serde_json::to_string(&f.to_feature()).unwrap_or_default();
                    (f.id.to_string(), text)
                })
                .collect(),
            ..Step::default()
        },
    )
    .await?;
    for f in fences {
        let f = Arc::new(f);
        st.fences
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(f.id.to_string(), f.clone());
        for s in &st.shards {
            s.send(ShardMsg::UpsertFence(f.clone()))
                .await
                .map_err(|_| ApiError::shutting_down())?;
        }
    }
    metrics::gauge!(t::FENCES)
        .set(st.fences.read().unwrap_or_else(|p| p.into_inner()).len() as f64);
    Ok(new)
}

/// `PUT /v1/fences/{id}`: body is a GeoJSON Feature (its `id`, if any, must match).
#[utoipa::path(put, path = "/v1/fences/{id}", tag = "fences",
    description = "Creates or replaces one fence from a GeoJSON Feature. Scope: admin.",
    params(("id" = String, Path, description = "Fence id")),
    request_body(content((crate::http::openapi::FenceFeature = "application/json"))),
    responses(
        (status = 200, description = "Replaced; the normalized fence", body = crate::http::openapi::FenceFeature),
        (status = 201, description = "Created; the normalized fence", body = crate::http::openapi::FenceFeature),
        (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused,
        (status = 413, description = "Body too large", body = crate::http::openapi::ErrorBody),
        (status = 422, description = "Not a valid fence", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "Overloaded, store unavailable or shutting down (Retry-After)", body = crate::http::openapi::ErrorBody),
    ))]
pub async fn put_fence(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let body = body_or_error(body, st.cfg.max_body_bytes)?;
    let text =
        std::str::from_utf8(&body).map_err(|e| ApiError::bad_request("bad_body", e.to_string()))?;
    let feature = match parse_geojson(text)? {
        geojson::GeoJson::Feature(f) => f,
        _ => {
            return Err(ApiError::unprocessable(
                "invalid_fence",
                "PUT /v1/fences/{id} takes one GeoJSON Feature; use POST /v1/fences for a FeatureCollection",
            ));
        }
    };
    let fence = Fence::from_feature(&feature, Some(&id), &st.fence_limits).map_err(invalid)?;
    let body = fence.to_feature();
    let created = install(&st, vec![fence]).await? == 1;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(body)).into_response())
}

/// `POST /v1/fences`: a Feature or FeatureCollection; nothing is applied if any is invalid.
#[utoipa::path(post, path = "/v1/fences", tag = "fences",
    description = "Creates or replaces fences from a Feature or FeatureCollection; nothing is applied if any is invalid. Scope: admin.",
    request_body(content((crate::http::openapi::FenceBody = "application/json"))),
    responses(
        (status = 201, description = "Written", body = crate::http::openapi::FencesWritten),
        (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused,
        (status = 413, description = "Body too large", body = crate::http::openapi::ErrorBody),
        (status = 422, description = "Not valid fences, or too many", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "Overloaded, store unavailable or shutting down (Retry-After)", body = crate::http::openapi::ErrorBody),
    ))]
pub async fn post_fences(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(body, st.cfg.max_body_bytes)?;
    let text =
        std::str::from_utf8(&body).map_err(|e| ApiError::bad_request("bad_body", e.to_string()))?;
    let fences = parse_fences(&parse_geojson(text)?, &st.fence_limits).map_err(invalid)?;
    if fences.is_empty() {
        return Err(ApiError::bad_request(
            "empty_collection",
            "the FeatureCollection holds no features",
        ));
    }
    let ids: Vec<String> = fences.iter().map(|f| f.id.to_string()).collect();
    let n = fences.len();
    let created = install(&st, fences).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"created": created, "replaced": n - created, "ids": ids})),
    )
        .into_response())
}

/// `GET /v1/fences/{id}`.
#[utoipa::path(get, path = "/v1/fences/{id}", tag = "fences",
    description = "One fence, normalized. Scope: read.",
    params(("id" = String, Path, description = "Fence id")),
    responses(
        (status = 200, description = "The fence", body = crate::http::openapi::FenceFeature),
        (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused,
        (status = 404, description = "No such fence", body = crate::http::openapi::ErrorBody),
    ))]
pub async fn get_fence(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let f = st
        .fences
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found("fence_not_found", format!("no fence with id {id:?}"))
        })?;
    Ok(Json(f.to_feature()).into_response())
}

/// `GET /v1/fences`: all fences as a FeatureCollection, sorted by id.
#[utoipa::path(get, path = "/v1/fences", tag = "fences",
    description = "Every fence, sorted by id. Scope: read.",
    responses(
        (status = 200, description = "The fences", body = crate::http::openapi::FenceCollection),
        crate::http::openapi::Refused,
    ))]
pub async fn list_fences(State(st): State<Arc<AppState>>) -> Response {
    let features: Vec<geojson::Feature> = st
        .fences
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .map(|f| f.to_feature())
        .collect();
    Json(geojson::FeatureCollection {
        bbox: None,
        features,
        foreign_members: None,
    })
    .into_response()
}

/// `DELETE /v1/fences/{id}`: drops the fence, its pairs and their timers.
#[utoipa::path(delete, path = "/v1/fences/{id}", tag = "fences",
    description = "Drops the fence, its pairs and their timers. Scope: admin.",
    params(("id" = String, Path, description = "Fence id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Bad request", body = crate::http::openapi::ErrorBody), crate::http::openapi::Refused,
        (status = 404, description = "No such fence", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "Overloaded, store unavailable or shutting down (Retry-After)", body = crate::http::openapi::ErrorBody),
    ))]
pub async fn delete_fence(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let _guard = st.fence_write.lock().await;
    let exists = st
        .fences
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(&id);
    if exists {
        persist(
            &st,
            Step {
                fences_del: vec![id.clone()],
                ..Step::default()
            },
        )
        .await?;
    }
    let removed = st
        .fences
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id);
    if removed.is_none() {
        return Err(ApiError::not_found(
            "fence_not_found",
            format!("no fence with id {id:?}"),
        ));
    }
    let id: Arc<str> = Arc::from(id.as_str());
    for s in &st.shards {
        s.send(ShardMsg::RemoveFence(id.clone()))
            .await
            .map_err(|_| ApiError::shutting_down())?;
    }
    metrics::gauge!(t::FENCES)
        .set(st.fences.read().unwrap_or_else(|p| p.into_inner()).len() as f64);
    Ok(StatusCode::NO_CONTENT.into_response())
}
