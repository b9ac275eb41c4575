//! Control-plane routes: warm targets (`GET`/`PUT`/`DELETE /v1/pool/targets`) and what can be
//! leased now (`GET /v1/capacity`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::body::decode_json;
use super::error::ApiError;
use super::state::ApiState;
use crate::page_size::PageSize;
use crate::policy::pool::{FlavorSpec, Percent, PoolPolicyError, TargetSpec};
use crate::pool::{Capacity, PoolError, TargetsError, TargetsReport};

/// A byte count in a request: an integer, or a string such as `"4G"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ByteCount {
    /// Bytes.
    Bytes(u64),
    /// A size with an optional unit (`K`, `M`, `G`, `T`).
    Text(String),
}

impl ByteCount {
    fn text(&self) -> String {
        match self {
            ByteCount::Bytes(n) => n.to_string(),
            ByteCount::Text(s) => s.clone(),
        }
    }
}

/// One flavor of `PUT /v1/pool/targets`: `count` warm files of `size`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlavorBody {
    /// Bytes per file, a whole number of pages.
    pub size: ByteCount,
    /// Files (1 to 4096).
    pub count: u32,
}

/// One target of `PUT /v1/pool/targets` (the keys of a `[[target]]` in `policies/pool.toml`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetBody {
    /// `2M` or `1G`; the daemon must serve it.
    pub page_size: PageSize,
    /// The node; absent: every node.
    #[serde(default)]
    pub node: Option<u32>,
    /// Bytes to keep warm; may be left out when `flavors` are given (then their sum).
    #[serde(default)]
    pub warm: Option<ByteCount>,
    /// File sizes to keep when there are no flavors and no demand to learn from.
    #[serde(default)]
    pub sizes: Vec<ByteCount>,
    /// VM sizes to keep warm as files of exactly that size.
    #[serde(default)]
    pub flavors: Vec<FlavorBody>,
    /// An adaptive target's warm-start goal, percent (50 to 100), with `ceiling`, in place
    /// of `warm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<Percent>,
    /// An adaptive target's ceiling: a positive whole number of pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<ByteCount>,
}

/// `PUT /v1/pool/targets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetsBody {
    /// The targets replacing those in force (an empty list keeps nothing warm).
    pub targets: Vec<TargetBody>,
}

impl From<&TargetBody> for TargetSpec {
    fn from(t: &TargetBody) -> TargetSpec {
        TargetSpec {
            page_size: t.page_size,
            node: t.node,
            warm: t.warm.as_ref().map(ByteCount::text).unwrap_or_default(),
            sizes: t.sizes.iter().map(ByteCount::text).collect(),
            flavors: t
                .flavors
                .iter()
                .map(|f| FlavorSpec {
                    size: f.size.text(),
                    count: f.count,
                })
                .collect(),
            goal: t.goal,
            ceiling: t.ceiling.as_ref().map(ByteCount::text),
        }
    }
}

/// Decodes `PUT /v1/pool/targets`; errors name the field (`targets[0].warm`). The targets are
/// validated against the daemon's mounts and nodes when applied.
pub fn parse_targets_body(body: &[u8]) -> Result<Vec<TargetSpec>, ApiError> {
    let body: TargetsBody = decode_json(body)?;
    Ok(body.targets.iter().map(TargetSpec::from).collect())
}

fn targets_error(err: TargetsError) -> ApiError {
    match err {
        TargetsError::Invalid(PoolPolicyError::Field { field, message }) => {
            ApiError::field(&field, format!("{field}: {message}"))
        }
        TargetsError::Invalid(e) => ApiError::BadRequest {
            field: None,
            message: e.to_string(),
        },
        TargetsError::Journal(e) => ApiError::Pool(PoolError::Journal(e)),
    }
}

pub(super) async fn get_targets(State(state): State<ApiState>) -> Json<TargetsReport> {
    Json(state.pool.targets())
}

/// `GET /v1/pool/adaptive`: each adaptive target's goal, ceiling, current target and why.
pub(super) async fn get_adaptive(State(state): State<ApiState>) -> Json<AdaptiveReport> {
    Json(AdaptiveReport {
        targets: state.pool.adaptive(),
        refill_rate: state.pool.refill_rate(),
    })
}

/// `GET /v1/pool/adaptive`.
#[derive(Debug, Clone, Serialize)]
pub struct AdaptiveReport {
    /// The adaptive targets in force.
    pub targets: Vec<crate::pool::adaptive::AdaptiveStatus>,
    /// The refill rate the looks use, bytes/s (measured, or the default until measured).
    pub refill_rate: f64,
}

pub(super) async fn put_targets(
    State(state): State<ApiState>,
    body: Bytes,
) -> Result<Json<TargetsReport>, ApiError> {
    let specs = parse_targets_body(&body)?;
    let pool = Arc::clone(&state.pool);
    let report = tokio::task::spawn_blocking(move || pool.set_targets(&specs))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(targets_error)?;
    tracing::info!(policy = %state.pool.policy().describe(), "warm targets set over the API");
    Ok(Json(report))
}

pub(super) async fn delete_targets(
    State(state): State<ApiState>,
) -> Result<Json<TargetsReport>, ApiError> {
    let pool = Arc::clone(&state.pool);
    let report = tokio::task::spawn_blocking(move || pool.clear_targets())
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(targets_error)?;
    tracing::info!(policy = %state.pool.policy().describe(), "API targets cleared: the configuration's apply");
    Ok(Json(report))
}

pub(super) async fn capacity(State(state): State<ApiState>) -> Json<Capacity> {
    Json(state.pool.capacity())
}

/// The request header that carries an idempotency key.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// The key of a lease request: the `Idempotency-Key` header or the body's `idempotency_key`;
/// both may be given only when they agree.
pub(super) fn idempotency_key(
    headers: &axum::http::HeaderMap,
    body_key: Option<String>,
) -> Result<Option<String>, ApiError> {
    let header = match headers.get(IDEMPOTENCY_HEADER) {
        None => None,
        Some(v) => Some(v.to_str().map(str::to_string).map_err(|_| {
            ApiError::field(
                "idempotency_key",
                "idempotency_key: the Idempotency-Key header must be visible ASCII",
            )
        })?),
    };
    match (header, body_key) {
        (Some(h), Some(b)) if h != b => Err(ApiError::field(
            "idempotency_key",
            format!(
                "idempotency_key: the body's {b:?} differs from the Idempotency-Key header's {h:?}"
            ),
        )),
        (Some(h), _) => Ok(Some(h)),
        (None, b) => Ok(b),
    }
}

/// The header a replayed lease answer carries (`Idempotent-Replayed: true`).
pub(super) fn replayed() -> axum::http::HeaderMap {
    let mut h = axum::http::HeaderMap::new();
    h.insert(
        "idempotent-replayed",
        axum::http::HeaderValue::from_static("true"),
    );
    h
}
