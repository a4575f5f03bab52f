//! `GET /v1/cluster`: the cluster as the node asked sees it: nodes, and every partition with its
//! owner, epoch, input position, lag and last checkpoint. 404 `not_a_cluster` on a node running
//! on its embedded store.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;

use crate::cluster::status::ClusterOut;
use crate::http::auth::Refused;
use crate::http::error::{ApiError, ErrorBody};
use crate::state::{AppState, ClusterStatusError};

/// `GET /v1/cluster`.
#[utoipa::path(get, path = "/v1/cluster", tag = "ops",
    description = "Nodes, and every partition with its owner, epoch, input position, lag and last checkpoint (cluster mode; docs/cluster.md). Scope: read.",
    responses(
        (status = 200, description = "The cluster", body = ClusterOut), Refused,
        (status = 404, description = "Not a cluster node", body = ErrorBody),
        (status = 503, description = "NATS unreachable or shutting down (Retry-After)", body = ErrorBody),
    ))]
pub async fn get_cluster(State(st): State<Arc<AppState>>) -> Result<Json<ClusterOut>, ApiError> {
    match st.deployment().cluster().await {
        Ok(out) => Ok(Json(out)),
        Err(e @ ClusterStatusError::NotACluster) => {
            Err(ApiError::not_found("not_a_cluster", e.to_string()))
        }
        Err(ClusterStatusError::Unavailable(e)) => {
            Err(ApiError::unavailable("cluster_unavailable", e.to_string()))
        }
    }
}
