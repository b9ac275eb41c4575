//! Who is on the other end of a connection, attached to every request, and the check of
//! the role a request needs against what the peer has (see [`super::access`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::access::{required_role, Access, Caller, Role, UnixPeer};
use super::error::ErrorBody;

/// The peer of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A unix socket peer; `None` when `SO_PEERCRED` or `SO_PEERGROUPS` failed.
    Unix(Option<UnixPeer>),
    /// A TLS client.
    Tls {
        /// Its address.
        addr: SocketAddr,
        /// The subject of its (verified) client certificate, when it presented one.
        cert_subject: Option<Arc<str>>,
    },
}

impl Peer {
    /// The credentials of a unix socket's peer, as the kernel recorded them at `connect`.
    pub fn of_unix(stream: &tokio::net::UnixStream) -> Peer {
        let groups = match crate::sys::peercred::peer_groups(stream) {
            Ok(g) => g,
            Err(err) => {
                tracing::warn!(%err, "SO_PEERGROUPS: the peer gets no role");
                return Peer::Unix(None);
            }
        };
        let userns_owner = match crate::sys::peercred::peer_userns_owner(stream) {
            Ok(owner) => owner,
            Err(err) => {
                // Before Linux 6.11: counted by its own uid, as before.
                tracing::debug!(%err, "the peer's user namespace is unknown");
                None
            }
        };
        Peer::Unix(stream.peer_cred().ok().map(|c| UnixPeer {
            uid: c.uid(),
            gid: c.gid(),
            pid: c.pid(),
            groups: groups.into(),
            userns_owner,
        }))
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Unix(Some(p)) => write!(f, "unix uid {} gid {}", p.uid, p.gid),
            Peer::Unix(None) => f.write_str("unix peer without credentials"),
            Peer::Tls { addr, .. } => write!(f, "tls {addr}"),
        }
    }
}

/// A refused request: 401 (no or unknown credentials) or 403 (role too low).
fn refuse(status: StatusCode, peer: &Peer, request: &str, error: String) -> Response {
    // The token itself is never logged: only the peer, the request and the reason.
    tracing::warn!(%peer, %request, status = status.as_u16(), reason = %error, "request refused");
    let body = axum::Json(ErrorBody {
        error,
        field: None,
        limit: None,
    });
    if status == StatusCode::UNAUTHORIZED {
        (status, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response()
    } else {
        (status, body).into_response()
    }
}

/// The middleware: lets a request through when its peer's role is at least the one the
/// route needs.
pub async fn authorize(State(access): State<Arc<Access>>, req: Request, next: Next) -> Response {
    let need = required_role(req.method(), req.uri().path());
    let request = format!("{} {}", req.method(), req.uri().path());
    let Some(peer) = req
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map(|c| c.0.clone())
    else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            &Peer::Unix(None),
            &request,
            "no peer identity".into(),
        );
    };
    let (who, role): (String, Role) = match &peer {
        Peer::Unix(None) => {
            return refuse(
                StatusCode::FORBIDDEN,
                &peer,
                &request,
                "the unix socket peer's credentials (SO_PEERCRED) are unknown".into(),
            )
        }
        Peer::Unix(Some(p)) => match access.unix_role(p) {
            Some(role) => (format!("uid:{}", p.principal_uid()), role),
            None => {
                return refuse(
                    StatusCode::FORBIDDEN,
                    &peer,
                    &request,
                    format!(
                        "unix peer uid {} gid {} has no role (access.unix_peer)",
                        p.uid, p.gid
                    ),
                )
            }
        },
        Peer::Tls { cert_subject, .. } => {
            let presented = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
            let Some(presented) = presented else {
                return refuse(
                    StatusCode::UNAUTHORIZED,
                    &peer,
                    &request,
                    "missing bearer token (Authorization: Bearer ...)".into(),
                );
            };
            match access.token(presented.trim_ascii()) {
                Some(t) => match cert_subject {
                    Some(subject) => (format!("token:{} cert:{subject}", t.name), t.role),
                    None => (format!("token:{}", t.name), t.role),
                },
                None => {
                    return refuse(
                        StatusCode::UNAUTHORIZED,
                        &peer,
                        &request,
                        "unknown bearer token".into(),
                    )
                }
            }
        }
    };
    if role < need {
        return refuse(
            StatusCode::FORBIDDEN,
            &peer,
            &request,
            format!("{who} has role {role}; {request} needs role {need}"),
        );
    }
    tracing::trace!(%peer, %who, %role, %request, "authorized");
    let mut req = req;
    req.extensions_mut().insert(Caller {
        principal: who,
        role,
    });
    next.run(req).await
}
