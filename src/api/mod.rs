//! The HTTP/JSON API, served on a unix socket (see `docs/api.md` and `docs/openapi.yaml`).
//!
//! | route | action |
//! |---|---|
//! | `POST /v1/leases` | take a lease ([`LeaseRequest`](crate::pool::LeaseRequest)) |
//! | `GET /v1/leases` | list leases |
//! | `GET /v1/leases/{id}` | one lease |
//! | `DELETE /v1/leases/{id}` | release a lease |
//! | `GET /v1/pool` | pool counts per node and page size, and why a target is not met |
//! | `POST /v1/pool/drain` | delete warm files, hold them at zero, optionally lower the kernel's pools ([`DrainRequest`](crate::pool::DrainRequest)) |
//! | `POST /v1/pool/resume` | let drained kinds refill ([`ResumeRequest`]) |
//! | `GET /v1/cpu` | the clearing method and which rule chose it |
//! | `GET /v1/version` | the daemon's version |
//! | `GET /v1/pool/targets` | the warm targets in force and where they come from |
//! | `PUT /v1/pool/targets` | set warm targets, persisted ([`TargetsBody`]) |
//! | `DELETE /v1/pool/targets` | return to the configuration's targets |
//! | `GET /v1/capacity` | what can be leased now, warm and in total |
//! | `GET /metrics` | Prometheus metrics ([`metrics`]) |
//!
//! Errors are `{"error": "...", "field": "..."}` with a status from [`status_of`].

mod body;
mod control;
mod error;
pub mod metrics;
pub mod pidwatch;
mod routes;

pub use body::{decode_json, parse_lease_body, parse_lease_request, LEASE_FIELDS};
pub use control::{parse_targets_body, ByteCount, FlavorBody, TargetBody, TargetsBody};
pub use error::{status_of, ApiError, ErrorBody};
pub use routes::{router, ApiState, CpuReport, ResumeRequest, VersionReport};

use std::future::Future;

/// Serves the API on `listener` until `shutdown` completes, then waits for requests in
/// flight.
pub async fn serve(
    listener: tokio::net::UnixListener,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
