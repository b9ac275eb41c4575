//! One handler per route; each turns its request into one pool action.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::access::Caller;
use super::body::parse_lease_body;
use super::error::{ApiError, ErrorKind};
use super::metrics::events;
use super::pidwatch;
use super::state::{ApiState, CpuReport};
use crate::pool::{DrainReport, DrainRequest, LeaseInfo, PoolStatus};

/// The API's routes.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/leases", get(list_leases).post(create_lease))
        .route("/v1/leases/{id}", get(get_lease).delete(delete_lease))
        .route("/v1/pool", get(pool_status))
        .route("/v1/pool/drain", post(drain_pool))
        .route("/v1/pool/resume", post(resume_pool))
        .route("/v1/cpu", get(cpu))
        .route("/v1/version", get(version))
        .route(
            "/v1/pool/targets",
            get(super::control::get_targets)
                .put(super::control::put_targets)
                .delete(super::control::delete_targets),
        )
        .route("/v1/pool/adaptive", get(super::control::get_adaptive))
        .route("/v1/capacity", get(super::control::capacity))
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .fallback(no_route)
        .layer(axum::middleware::map_response(count_errors))
        .with_state(state)
}

/// Counts each error answer by its kind: the handlers' errors say their kind in the
/// response's extensions ([`ErrorKind`]).
async fn count_errors(response: axum::response::Response) -> axum::response::Response {
    if let Some(ErrorKind(kind)) = response.extensions().get::<ErrorKind>() {
        events().error(kind);
    }
    response
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
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, HeaderMap, Json<LeaseInfo>), ApiError> {
    let answer = make_lease(state, caller, headers, body).await;
    if let Err(e) = &answer {
        events().lease_error(e.kind());
    }
    answer
}

async fn make_lease(
    state: ApiState,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, HeaderMap, Json<LeaseInfo>), ApiError> {
    let (mut req, key) = parse_lease_body(&body)?;
    let key = super::control::idempotency_key(&headers, key)?;
    let pool = Arc::clone(&state.pool);
    req.recycle = pool
        .policy()
        .recycle_for_role(&caller.role.to_string(), req.recycle);
    let role = caller.role.to_string();
    let tenant = crate::pool::Tenant {
        principal: caller.principal.clone(),
        admin: caller.role == super::access::Role::Admin,
        limits: pool.policy().tenants.limits_for(&role, &caller.principal),
    };
    let (info, replayed) = blocking(move || match key {
        Some(key) => Ok(pool.lease_idempotent_as(&req, &key, Some(&tenant))?),
        None => Ok((pool.lease_as(&req, Some(&tenant))?, false)),
    })
    .await?;
    if replayed && !super::owner::may_touch(&caller, &info) {
        return Err(ApiError::field(
            "idempotency_key",
            "the key was used by another principal: a retry must come from the one that made the lease",
        ));
    }
    if replayed {
        tracing::info!(id = info.id, name = %info.name, "idempotent retry: the same lease");
        return Ok((StatusCode::OK, super::control::replayed(), Json(info)));
    }
    if let Some(pid) = info.pid {
        let start = state
            .pool
            .leases_with_pid()
            .into_iter()
            .find(|l| l.0 == info.id)
            .and_then(|l| l.2);
        pidwatch::watch(Arc::clone(&state.pool), info.id, pid, start);
    }
    events().lease(info.source, info.ready_ms);
    // `hugeprep bench trace-csv --daemon-log` reads these lines (and `released`) as a trace.
    tracing::info!(id = info.id, name = %info.name, size = info.size, page_size = %info.page_size, node = info.node, source = info.source.name(), ready_ms = info.ready_ms, "leased");
    Ok((StatusCode::CREATED, HeaderMap::new(), Json(info)))
}

async fn list_leases(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
) -> Json<Vec<LeaseInfo>> {
    Json(super::owner::visible(&caller, state.pool.leases()))
}

async fn get_lease(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<LeaseInfo>, ApiError> {
    Ok(Json(super::owner::owned(
        &state.pool,
        &caller,
        lease_id(&id)?,
    )?))
}

async fn delete_lease(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<LeaseInfo>, ApiError> {
    let id = lease_id(&id)?;
    super::owner::owned(&state.pool, &caller, id)?;
    let pool = Arc::clone(&state.pool);
    Ok(Json(blocking(move || Ok(pool.release(id)?)).await?))
}

async fn pool_status(State(state): State<ApiState>) -> Json<PoolStatus> {
    Json(state.pool.status())
}

/// How long a drain waits for files in flight (scrubs, refills, releases) to settle.
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Decodes an optional JSON body (empty: the default); errors name the field at fault.
fn json_body<T: Default + serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    super::body::decode_json(body)
}

async fn drain_pool(
    State(state): State<ApiState>,
    body: Bytes,
) -> Result<Json<DrainReport>, ApiError> {
    let req: DrainRequest = json_body(&body)?;
    let pool = Arc::clone(&state.pool);
    Ok(Json(
        blocking(move || Ok(pool.drain(&req, DRAIN_WAIT)?)).await?,
    ))
}

/// `POST /v1/pool/resume`: which drained kinds refill again.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeRequest {
    /// Only this node (default: every node).
    #[serde(default)]
    pub node: Option<u32>,
    /// Only this page size (default: every page size).
    #[serde(default)]
    pub page_size: Option<crate::PageSize>,
}

async fn resume_pool(
    State(state): State<ApiState>,
    body: Bytes,
) -> Result<Json<PoolStatus>, ApiError> {
    let req: ResumeRequest = json_body(&body)?;
    state.pool.resume(req.node, req.page_size)?;
    Ok(Json(state.pool.status()))
}

async fn cpu(State(state): State<ApiState>) -> Json<CpuReport> {
    Json((*state.cpu).clone())
}

/// `GET /v1/version`: the daemon's version, so a client can tell it from its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersionReport {
    /// The daemon's package version.
    pub version: String,
}

async fn version() -> Json<VersionReport> {
    Json(VersionReport {
        version: env!("CARGO_PKG_VERSION").to_string(),
    })
}

async fn metrics(State(state): State<ApiState>) -> Result<impl IntoResponse, ApiError> {
    let text = blocking(move || Ok(state.metrics_text())).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            super::metrics::CONTENT_TYPE,
        )],
        text,
    ))
}

async fn health(State(state): State<ApiState>) -> Result<impl IntoResponse, ApiError> {
    let health = blocking(move || Ok(state.health())).await?;
    Ok((super::health::http_status(&health), Json(health)))
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NoRoute {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}
