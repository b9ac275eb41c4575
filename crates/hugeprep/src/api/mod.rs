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
//! | `GET /v1/pool/adaptive` | the adaptive targets: goal, ceiling, current target and why |
//! | `GET /v1/capacity` | what can be leased now, warm and in total |
//! | `GET /metrics` | Prometheus metrics ([`metrics`]) |
//! | `GET /health` | ready, or degraded with reasons ([`health`]) |
//!
//! Errors are `{"error": "...", "field": "..."}` with a status from [`status_of`].
//!
//! Every request passes [`peer::authorize`]: the unix socket's peers get a role by uid and
//! groups, the optional TCP listener ([`tls`], TLS only) by bearer token ([`access`]).

pub mod access;
pub mod admission;
mod body;
mod control;
mod error;
pub mod health;
pub mod limits;
pub mod metrics;
pub mod monitor;
pub mod owner;
pub mod peer;
pub mod pidwatch;
mod routes;
mod state;
pub mod tls;

pub use body::{decode_json, parse_lease_body, parse_lease_request, LEASE_FIELDS};
pub use control::{parse_targets_body, ByteCount, FlavorBody, TargetBody, TargetsBody};
pub use error::{status_of, ApiError, ErrorBody, ErrorKind, LimitBody};
pub use routes::{router, ResumeRequest, VersionReport};
pub use state::{ApiState, CpuReport};

use std::future::Future;

/// Serves the API on the unix socket `listener` and, when given, the TLS listener `tls`,
/// every request checked against `access`, every connection within `limits`, until
/// `shutdown` completes; then waits for requests in flight. `activated`: systemd passed
/// `listener` and keeps it listening across a restart (see [`limits::serve_unix`]).
pub async fn serve(
    listener: tokio::net::UnixListener,
    activated: bool,
    tls: Option<tls::TlsListener>,
    state: ApiState,
    access: std::sync::Arc<access::Access>,
    limits: limits::Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Outermost first: who may ask, then whether there is room for another lease.
    let app = router(state)
        .layer(axum::middleware::from_fn_with_state(
            std::sync::Arc::new(admission::Admission::for_host()),
            admission::admit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            access,
            peer::authorize,
        ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        // No receiver left: every listener has stopped already.
        let _ = stop_tx.send(true);
    });
    tracing::info!(?limits, "connection limits");
    let gate = limits::Gate::new(
        "unix connection",
        limits.unix_connections,
        limits.unix_per_uid,
        limits.unix_root_reserve,
    );
    let unix = limits::serve_unix(
        listener,
        activated,
        app.clone(),
        limits,
        gate,
        stop_rx.clone(),
    );
    match tls {
        None => unix.await,
        Some(tls) => {
            let tcp = tls::serve_tls(tls.start(limits), app, limits, stop_rx);
            let (a, b) = tokio::join!(unix, tcp);
            a.and(b)
        }
    }
}
