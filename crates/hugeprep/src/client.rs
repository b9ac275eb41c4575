//! A small client for the daemon's API over its unix socket, used by the CLI and the
//! libvirt hook. No connection pooling: one request per connection, with a timeout.
//!
//! ```no_run
//! use hugeprep::client::Client;
//! let client = Client::new("/run/hugeprep/hugeprep.sock");
//! let pool = client.blocking(client.pool()).unwrap();
//! println!("{} kinds", pool.kinds.len());
//! ```

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;

use crate::api::{CpuReport, ErrorBody};
use crate::api::{ResumeRequest, VersionReport};
use crate::pool::{DrainReport, DrainRequest, LeaseInfo, LeaseRequest, PoolStatus};

/// The default socket path.
pub const DEFAULT_SOCKET: &str = "/run/hugeprep/hugeprep.sock";

/// A request to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached: the daemon is not running, or the caller may not
    /// connect (not in the socket's group).
    #[error("cannot connect to {socket}: {source} ({hint})")]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// The kernel's answer.
        source: std::io::Error,
        /// What to do about it, for this errno and this caller ([`connect_hint`]).
        hint: String,
    },
    /// The HTTP exchange failed.
    #[error("{method} {path}: {message}")]
    Http {
        /// Method.
        method: Method,
        /// Path.
        path: String,
        /// What failed.
        message: String,
    },
    /// The daemon answered with an error.
    #[error("{status}: {}{}", body.error, body.field.as_ref().map(|f| format!(" (field {f})")).unwrap_or_default())]
    Api {
        /// HTTP status.
        status: u16,
        /// The daemon's error body.
        body: ErrorBody,
    },
    /// No answer in time.
    #[error("no answer from {socket} within {timeout:?}")]
    Timeout {
        /// The socket.
        socket: PathBuf,
        /// The limit.
        timeout: Duration,
    },
    /// The runtime for blocking calls could not start.
    #[error("cannot start an I/O runtime: {0}")]
    Runtime(std::io::Error),
}

/// Result of client calls.
pub type Result<T> = std::result::Result<T, ClientError>;

/// A client for one daemon socket.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
    retry: Duration,
}

/// The longest a 503's `Retry-After` is honoured for at once (a longer one is cut to this,
/// and the window of [`Client::with_retry`] still bounds the whole).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);
/// The pause between connection attempts while the socket refuses (a restart).
const CONNECT_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Whether a failed connect means the daemon is between two lives: the socket is gone
/// (removed at its stop, not yet bound again), refuses (bound by no one), or its backlog is
/// full.
/// What to do when connecting to `socket` failed with `err`, for the caller as it is: a
/// permission error names the socket's group and whether the caller is in it (a user outside
/// the group is told how to join it, not to start a daemon that runs); a missing socket or
/// a refused connection says how to start the packaged daemon.
pub fn connect_hint(socket: &Path, err: &std::io::Error) -> String {
    use std::os::unix::fs::MetadataExt;
    match err.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            let meta = match std::fs::metadata(socket) {
                Ok(m) => m,
                Err(_) => {
                    return format!(
                        "a directory on the way to {} is not searchable by you: ask the host's \
                         administrator, or run as root",
                        socket.display()
                    )
                }
            };
            let gid = meta.gid();
            let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
                .ok()
                .flatten()
                .map_or_else(|| format!("gid {gid}"), |g| g.name);
            let member = nix::unistd::getegid().as_raw() == gid
                || nix::unistd::getgroups().is_ok_and(|gs| gs.iter().any(|g| g.as_raw() == gid));
            if gid == 0 {
                "the socket's group is root: only root may connect (the daemon's socket_group, \
                 or SocketGroup= of hugeprep.socket, gives a group access)"
                    .to_string()
            } else if member {
                format!(
                    "you are in the socket's group {group}, but the socket's mode (0{:o}) or a \
                     directory on the way denies you: `hugeprep doctor` checks the path",
                    meta.mode() & 0o7777
                )
            } else {
                let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
                    .ok()
                    .flatten()
                    .map_or_else(|| "USER".to_string(), |u| u.name);
                format!(
                    "only root and members of the socket's group {group} may connect, and you \
                     are not in {group}: `sudo usermod -aG {group} {user}`, then log in again \
                     (or run `newgrp {group}`)"
                )
            }
        }
        Some(libc::ENOENT) | Some(libc::ECONNREFUSED) => {
            "is the daemon running? start it with `systemctl start hugeprep.socket` (or run \
             `hugeprep serve`); --socket or HUGEPREP_SOCKET for another path"
                .to_string()
        }
        _ => "see `hugeprep doctor` and the daemon's log (journalctl -u hugeprep)".to_string(),
    }
}

fn restarting(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ECONNREFUSED) | Some(libc::EAGAIN)
    )
}

/// `Retry-After` in seconds (the HTTP-date form is not used by the daemon: 1 s).
fn retry_after(value: Option<&hyper::header::HeaderValue>) -> Duration {
    value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(1), Duration::from_secs)
        .min(MAX_RETRY_AFTER)
}

impl Client {
    /// A client for `socket`, with a 60 s timeout (a cold lease of a large VM faults all of
    /// its memory before answering).
    pub fn new(socket: impl AsRef<Path>) -> Client {
        Client {
            socket: socket.as_ref().to_path_buf(),
            timeout: Duration::from_secs(60),
            retry: Duration::ZERO,
        }
    }

    /// Keeps retrying, for at most `window` in all, a request the daemon could not take
    /// yet: a connection refused or a socket missing (the daemon restarts) and a 503
    /// (shutting down, or its admission queue is full), after the `Retry-After` it asks for.
    /// Nothing else is retried: a request that reached the daemon and failed another way
    /// may have taken effect. Zero (the default): no retry.
    pub fn with_retry(mut self, window: Duration) -> Client {
        self.retry = window;
        self
    }

    /// Sets the timeout per request.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// Runs one of this client's futures to completion on a private runtime, for callers
    /// that are not async (the CLI, the libvirt hook).
    pub fn blocking<T>(&self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ClientError::Runtime)?
            .block_on(fut)
    }

    /// Sends one request; returns the status and body.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes)> {
        self.request_once(method, path, body)
            .await
            .map(|(status, _, bytes)| (status, bytes))
    }

    /// One attempt within the timeout: status, `Retry-After` and body.
    async fn request_once(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Duration, Bytes)> {
        let fut = self.exchange(method.clone(), path, body);
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| ClientError::Timeout {
                socket: self.socket.clone(),
                timeout: self.timeout,
            })?
    }

    /// [`Client::request_once`], retried as [`Client::with_retry`] says.
    async fn request_retried(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes)> {
        let deadline = tokio::time::Instant::now() + self.retry;
        loop {
            let attempt = self.request_once(method.clone(), path, body.clone()).await;
            let pause = match &attempt {
                Err(ClientError::Connect { source, .. }) if restarting(source) => {
                    CONNECT_RETRY_PAUSE
                }
                Ok((503, after, _)) => *after,
                _ => Duration::ZERO,
            };
            let now = tokio::time::Instant::now();
            if pause.is_zero() || now >= deadline {
                return attempt.map(|(status, _, bytes)| (status, bytes));
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Duration, Bytes)> {
        let http = |message: String| ClientError::Http {
            method: method.clone(),
            path: path.to_string(),
            message,
        };
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| ClientError::Connect {
                hint: connect_hint(&self.socket, &source),
                socket: self.socket.clone(),
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| http(e.to_string()))?;
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| http(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| http(e.to_string()))?;
        let status = resp.status().as_u16();
        let after = retry_after(resp.headers().get(hyper::header::RETRY_AFTER));
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| http(e.to_string()))?
            .to_bytes();
        Ok((status, after, bytes))
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T> {
        let (status, bytes) = self.request_retried(method.clone(), path, body).await?;
        if !(200..300).contains(&status) {
            let body = serde_json::from_slice::<ErrorBody>(&bytes).unwrap_or(ErrorBody {
                error: String::from_utf8_lossy(&bytes).into_owned(),
                field: None,
                limit: None,
            });
            return Err(ClientError::Api { status, body });
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Http {
            method,
            path: path.to_string(),
            message: format!("undecodable answer: {e}"),
        })
    }

    /// `POST /v1/leases`.
    pub async fn lease(&self, req: &LeaseRequest) -> Result<LeaseInfo> {
        let body = serde_json::to_vec(req).unwrap_or_default();
        self.call(Method::POST, "/v1/leases", Some(body)).await
    }

    /// `DELETE /v1/leases/{id}`.
    pub async fn release(&self, id: u64) -> Result<LeaseInfo> {
        self.call(Method::DELETE, &format!("/v1/leases/{id}"), None)
            .await
    }

    /// `GET /v1/leases/{id}`.
    pub async fn get_lease(&self, id: u64) -> Result<LeaseInfo> {
        self.call(Method::GET, &format!("/v1/leases/{id}"), None)
            .await
    }

    /// `GET /v1/leases`.
    pub async fn leases(&self) -> Result<Vec<LeaseInfo>> {
        self.call(Method::GET, "/v1/leases", None).await
    }

    /// `GET /v1/pool`.
    pub async fn pool(&self) -> Result<PoolStatus> {
        self.call(Method::GET, "/v1/pool", None).await
    }

    /// `POST /v1/pool/drain`.
    pub async fn drain(&self, req: &DrainRequest) -> Result<DrainReport> {
        let body = serde_json::to_vec(req).unwrap_or_default();
        self.call(Method::POST, "/v1/pool/drain", Some(body)).await
    }

    /// `POST /v1/pool/resume`.
    pub async fn resume(&self, req: &ResumeRequest) -> Result<PoolStatus> {
        let body = serde_json::to_vec(req).unwrap_or_default();
        self.call(Method::POST, "/v1/pool/resume", Some(body)).await
    }

    /// `GET /v1/version`.
    pub async fn version(&self) -> Result<VersionReport> {
        self.call(Method::GET, "/v1/version", None).await
    }

    /// `GET /v1/cpu`.
    pub async fn cpu(&self) -> Result<CpuReport> {
        self.call(Method::GET, "/v1/cpu", None).await
    }

    /// `POST /v1/leases` with an idempotency key: a retry with the same key and request gets
    /// the same lease back, never a second one.
    pub async fn lease_idempotent(&self, req: &LeaseRequest, key: &str) -> Result<LeaseInfo> {
        let mut body = serde_json::to_value(req).unwrap_or_default();
        if let Some(obj) = body.as_object_mut() {
            obj.insert("idempotency_key".into(), key.into());
        }
        let body = serde_json::to_vec(&body).unwrap_or_default();
        self.call(Method::POST, "/v1/leases", Some(body)).await
    }

    /// `GET /v1/pool/targets`.
    pub async fn targets(&self) -> Result<crate::pool::TargetsReport> {
        self.call(Method::GET, "/v1/pool/targets", None).await
    }

    /// `PUT /v1/pool/targets`: replaces the warm targets (persisted by the daemon).
    pub async fn set_targets(
        &self,
        targets: &[crate::policy::pool::TargetSpec],
    ) -> Result<crate::pool::TargetsReport> {
        let body =
            serde_json::to_vec(&serde_json::json!({ "targets": targets })).unwrap_or_default();
        self.call(Method::PUT, "/v1/pool/targets", Some(body)).await
    }

    /// `DELETE /v1/pool/targets`: back to the configuration's targets.
    pub async fn clear_targets(&self) -> Result<crate::pool::TargetsReport> {
        self.call(Method::DELETE, "/v1/pool/targets", None).await
    }

    /// `GET /v1/capacity`.
    pub async fn capacity(&self) -> Result<crate::pool::Capacity> {
        self.call(Method::GET, "/v1/capacity", None).await
    }
}
