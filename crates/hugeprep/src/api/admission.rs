//! Back-pressure on `POST /v1/leases`: at most [`Admission::slots`] leases are worked on at
//! once (a cold lease faults with every CPU of its node; hundreds at once would only thrash),
//! and at most [`Admission::max_waiting`] wait for a slot, each for at most
//! [`Admission::max_wait`]. Beyond that the answer is 503 with `Retry-After`, before anything
//! is allocated, so a client knows to come back rather than that the host is full (422).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::error::ErrorBody;

/// Seconds a client is told to wait after a 503 from the admission limit.
pub const RETRY_AFTER_S: u64 = 1;

/// The lease admission limit.
#[derive(Debug)]
pub struct Admission {
    slots: Semaphore,
    waiting: AtomicUsize,
    /// Leases worked on at once.
    pub slots_total: usize,
    /// Leases that may wait for a slot.
    pub max_waiting: usize,
    /// How long one waits at most.
    pub max_wait: Duration,
}

impl Admission {
    /// A limit of `slots` leases at once, `max_waiting` waiting, each up to `max_wait`.
    pub fn new(slots: usize, max_waiting: usize, max_wait: Duration) -> Admission {
        Admission {
            slots: Semaphore::new(slots.max(1)),
            waiting: AtomicUsize::new(0),
            slots_total: slots.max(1),
            max_waiting,
            max_wait,
        }
    }

    /// The daemon's limit: four leases per CPU this process may use (at least 8) at once,
    /// 256 waiting, 10 s each.
    pub fn for_host() -> Admission {
        let cpus = crate::sys::affinity::allowed_cpus().len();
        Admission::new((4 * cpus).max(8), 256, Duration::from_secs(10))
    }
}

fn busy(message: String) -> Response {
    tracing::warn!(%message, "lease refused for back-pressure");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, RETRY_AFTER_S.to_string())],
        axum::Json(ErrorBody {
            error: message,
            field: None,
            limit: None,
        }),
    )
        .into_response()
}

/// The middleware: holds a lease request until a slot is free, or answers 503.
pub async fn admit(State(adm): State<Arc<Admission>>, req: Request, next: Next) -> Response {
    if !(req.method() == Method::POST && req.uri().path() == "/v1/leases") {
        return next.run(req).await;
    }
    let permit = match adm.slots.try_acquire() {
        Ok(p) => p,
        Err(_) => {
            if adm.waiting.fetch_add(1, Ordering::SeqCst) >= adm.max_waiting {
                adm.waiting.fetch_sub(1, Ordering::SeqCst);
                return busy(format!(
                    "{} leases in progress and {} waiting (the limit); retry after {RETRY_AFTER_S} s",
                    adm.slots_total, adm.max_waiting
                ));
            }
            let got = tokio::time::timeout(adm.max_wait, adm.slots.acquire()).await;
            adm.waiting.fetch_sub(1, Ordering::SeqCst);
            match got {
                Ok(Ok(p)) => p,
                _ => {
                    return busy(format!(
                        "no lease slot free within {} s ({} leases in progress); retry after {RETRY_AFTER_S} s",
                        adm.max_wait.as_secs(),
                        adm.slots_total
                    ))
                }
            }
        }
    };
    let resp = next.run(req).await;
    drop(permit);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;

    #[test]
    fn a_full_queue_answers_503_with_retry_after() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use tower::ServiceExt;
            let adm = Arc::new(Admission::new(1, 0, Duration::from_millis(10)));
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let rx = Arc::new(tokio::sync::Mutex::new(Some(rx)));
            let app = axum::Router::new()
                .route(
                    "/v1/leases",
                    post(move || {
                        let rx = Arc::clone(&rx);
                        async move {
                            if let Some(rx) = rx.lock().await.take() {
                                // An error is the sender dropped: the wait is over too.
                                let _ = rx.await;
                            }
                            "ok"
                        }
                    }),
                )
                .layer(axum::middleware::from_fn_with_state(
                    Arc::clone(&adm),
                    admit,
                ));
            let post = || {
                Request::builder()
                    .method("POST")
                    .uri("/v1/leases")
                    .body(axum::body::Body::empty())
                    .unwrap()
            };
            // The first holds the only slot; the second finds no room to wait.
            let first = tokio::spawn(app.clone().oneshot(post()));
            tokio::task::yield_now().await;
            let second = app.clone().oneshot(post()).await.unwrap();
            assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(second.headers()[header::RETRY_AFTER], "1");
            tx.send(()).unwrap();
            assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
            assert_eq!(app.oneshot(post()).await.unwrap().status(), StatusCode::OK);
        });
    }
}
