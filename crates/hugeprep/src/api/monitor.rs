//! The monitoring listener (`--metrics-listen ADDR`, `[metrics] listen`): plain HTTP on a TCP
//! address for Prometheus and health checks, read-only. It answers `GET /metrics` and
//! `GET /health` and refuses everything else: any other path is 404, any other method on
//! those two paths (HEAD included) is 405 with `Allow: GET`. It reads the pool's counts,
//! never a lease's name, path or owner, and changes nothing, so it needs no token; bind it
//! to an address only the monitoring network reaches.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections (more are closed at once), one request per
//! connection, a request header within [`HEADER_TIMEOUT`], and a whole connection within
//! [`CONNECTION_TIMEOUT`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use super::ApiState;

/// Connections served at once; more are closed when accepted.
pub const MAX_CONNECTIONS: usize = 32;
/// Time for a client to send its request header.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for a whole connection, request to last byte of the answer.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);

/// What the listener answers for one request: the status, and the body for GET of its paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics`.
    Metrics,
    /// `GET /health`.
    Health,
    /// One of the two paths with another method: 405.
    MethodNotAllowed,
    /// Any other path: 404.
    NotFound,
}

/// Routes a request by method and path (the query string is ignored).
pub fn route(method: &Method, path: &str) -> Route {
    let known = match path {
        "/metrics" => Route::Metrics,
        "/health" => Route::Health,
        _ => return Route::NotFound,
    };
    if method == Method::GET {
        known
    } else {
        Route::MethodNotAllowed
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn answer(state: ApiState, req: Request<Incoming>) -> Response<Full<Bytes>> {
    match route(req.method(), req.uri().path()) {
        Route::NotFound => text(
            StatusCode::NOT_FOUND,
            "not found: this listener serves GET /metrics and GET /health only\n",
        ),
        Route::MethodNotAllowed => {
            let mut r = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed: this listener is read-only (GET)\n",
            );
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET"));
            r
        }
        Route::Metrics => match tokio::task::spawn_blocking(move || state.metrics_text()).await {
            Ok(body) => {
                let mut r = Response::new(Full::new(Bytes::from(body)));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(super::metrics::CONTENT_TYPE),
                );
                r
            }
            Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "metrics failed\n"),
        },
        Route::Health => match tokio::task::spawn_blocking(move || state.health()).await {
            Ok(health) => {
                let body = serde_json::to_vec(&health).unwrap_or_default();
                let mut r = Response::new(Full::new(Bytes::from(body)));
                *r.status_mut() = super::health::http_status(&health);
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                r
            }
            Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "health failed\n"),
        },
    }
}

/// The bound listener.
#[derive(Debug)]
pub struct MonitorListener {
    listener: TcpListener,
}

impl MonitorListener {
    /// Binds `addr`.
    pub async fn bind(addr: SocketAddr) -> std::io::Result<MonitorListener> {
        Ok(MonitorListener {
            listener: TcpListener::bind(addr).await?,
        })
    }

    /// The address it listens on (the port, when `addr` asked for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `stop` turns true.
    pub async fn serve(self, state: ApiState, mut stop: watch::Receiver<bool>) {
        let places = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let accepted = tokio::select! {
                a = self.listener.accept() => a,
                _ = stop.wait_for(|s| *s) => return,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(err) => {
                    // EMFILE and friends: wait a little rather than spin.
                    tracing::warn!(%err, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(place) = Arc::clone(&places).try_acquire_owned() else {
                tracing::debug!(%peer, "metrics listener: connection limit reached, closed");
                continue;
            };
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(answer(state, req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service);
                if let Ok(Err(err)) = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                    tracing::debug!(%peer, %err, "metrics listener: connection ended");
                }
                drop(place);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_of_the_two_paths_is_served() {
        assert_eq!(route(&Method::GET, "/metrics"), Route::Metrics);
        assert_eq!(route(&Method::GET, "/health"), Route::Health);
        for m in [
            Method::HEAD,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
            Method::OPTIONS,
        ] {
            assert_eq!(route(&m, "/metrics"), Route::MethodNotAllowed, "{m}");
        }
        for p in ["/", "/v1/leases", "/metrics/", "/healthz", "//metrics"] {
            assert_eq!(route(&Method::GET, p), Route::NotFound, "{p}");
        }
    }
}
