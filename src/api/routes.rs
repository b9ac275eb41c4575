//! One handler per route; each turns its request into one pool action.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, Uri};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::body::parse_lease_request;
use super::error::ApiError;
use super::pidwatch;
use crate::clear::{ClearPlan, Method as ClearMethod};
use crate::pool::{LeaseInfo, Pool, PoolStatus};

/// `GET /v1/cpu`: how memory is cleared and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CpuReport {
    /// The clearing method in use.
    pub method: ClearMethod,
    /// The plan (fence interval, minimum non-temporal extent).
    pub plan: ClearPlan,
    /// The policy rule that matched this CPU.
    pub rule: String,
    /// Where the rule's choice comes from (its `source` in the policy file).
    pub source: String,
    /// Whether the rule or the calibration run decided the method.
    pub decided_by: crate::policy::DecidedBy,
    /// The rule's confidence: `measured`, `published` or `guess`.
    #[serde(default)]
    pub confidence: crate::policy::Confidence,
    /// Why this method is in use: the rule alone, or what calibration measured and the
    /// margin it applied.
    #[serde(default)]
    pub reason: String,
    /// Calibration results, when a calibration ran.
    #[serde(default)]
    pub calibration: Option<serde_json::Value>,
}

/// Shared state of the handlers.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The pool.
    pub pool: Arc<Pool>,
    /// What `/v1/cpu` reports.
    pub cpu: Arc<CpuReport>,
}

/// The API's routes.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/leases", get(list_leases).post(create_lease))
        .route("/v1/leases/{id}", get(get_lease).delete(delete_lease))
        .route("/v1/pool", get(pool_status))
        .route("/v1/cpu", get(cpu))
        .fallback(no_route)
        .with_state(state)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
}

fn lease_id(text: &str) -> Result<u64, ApiError> {
    text.parse()
        .map_err(|_| ApiError::field("id", format!("{text:?} is not a lease id (an integer)")))
}

async fn create_lease(
    State(state): State<ApiState>,
    body: Bytes,
) -> Result<(StatusCode, Json<LeaseInfo>), ApiError> {
    let req = parse_lease_request(&body)?;
    let pool = Arc::clone(&state.pool);
    let info = blocking(move || Ok(pool.lease(&req)?)).await?;
    if let Some(pid) = info.pid {
        let start = state
            .pool
            .leases_with_pid()
            .into_iter()
            .find(|l| l.0 == info.id)
            .and_then(|l| l.2);
        pidwatch::watch(Arc::clone(&state.pool), info.id, pid, start);
    }
    tracing::info!(id = info.id, name = %info.name, size = info.size, source = info.source.name(), ready_ms = info.ready_ms, "leased");
    Ok((StatusCode::CREATED, Json(info)))
}

async fn list_leases(State(state): State<ApiState>) -> Json<Vec<LeaseInfo>> {
    Json(state.pool.leases())
}

async fn get_lease(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<LeaseInfo>, ApiError> {
    Ok(Json(state.pool.get(lease_id(&id)?)?))
}

async fn delete_lease(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<LeaseInfo>, ApiError> {
    let id = lease_id(&id)?;
    let pool = Arc::clone(&state.pool);
    Ok(Json(blocking(move || Ok(pool.release(id)?)).await?))
}

async fn pool_status(State(state): State<ApiState>) -> Json<PoolStatus> {
    Json(state.pool.status())
}

async fn cpu(State(state): State<ApiState>) -> Json<CpuReport> {
    Json((*state.cpu).clone())
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NoRoute {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}
