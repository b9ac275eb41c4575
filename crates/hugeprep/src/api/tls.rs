//! The TCP listener: TLS only (rustls, certificate and key from PEM files), optionally
//! requiring a client certificate signed by a CA. Handshakes run in their own tasks, so a
//! slow or hostile client never holds up the others, and at most
//! [`Limits::tls_handshakes`](super::limits::Limits) of them (a quarter per address) at once;
//! a connection over a limit is closed before its handshake.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::limits::{AddrGate, Connections, Gate, Limits, Ticket};
use super::peer::Peer;

/// Handshaken connections waiting for the HTTP server.
const ACCEPT_QUEUE: usize = 64;

/// How often a connection waiting for a handshake place looks again.
const HANDSHAKE_POLL: Duration = Duration::from_millis(5);

/// The TLS configuration could not be built; names the `[access]` field and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("access.{field}: {path}: {message}")]
    File {
        /// The field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the certificates or key.
    #[error("access.{field}: {message}")]
    Rustls {
        /// The field at fault.
        field: &'static str,
        /// rustls's message.
        message: String,
    },
    /// The listener could not bind.
    #[error("access.listen: bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

fn certs(field: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |message: String| TlsError::File {
        field,
        path: path.to_path_buf(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no PEM certificate in the file".into()));
    }
    Ok(certs)
}

/// The rustls server configuration (TLS 1.2 and 1.3, HTTP/1.1) from the certificate chain
/// and key files, with client certificates required when `client_ca` is set.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certs("tls_cert", cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::File {
        field: "tls_key",
        path: key.to_path_buf(),
        message: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls {
            field: "tls_cert",
            message: e.to_string(),
        })?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs("tls_client_ca", ca)? {
                roots.add(c).map_err(|e| TlsError::Rustls {
                    field: "tls_client_ca",
                    message: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Rustls {
                    field: "tls_client_ca",
                    message: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Rustls {
            field: "tls_key",
            message: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A connection whose TLS handshake succeeded, with its place in the connection limit.
pub struct Handshaken {
    /// The stream.
    pub stream: TlsStream<TcpStream>,
    /// Who is on the other end.
    pub peer: Peer,
    /// Its place among the open TLS connections.
    pub ticket: Ticket<std::net::IpAddr>,
}

/// A TCP listener that hands out only connections whose TLS handshake succeeded.
pub struct TlsListener {
    tcp: TcpListener,
    config: Arc<ServerConfig>,
    local: SocketAddr,
}

impl TlsListener {
    /// Binds `addr`; handshakes with `config` once [`TlsListener::start`]ed.
    pub async fn bind(addr: SocketAddr, config: Arc<ServerConfig>) -> Result<Self, TlsError> {
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|source| TlsError::Bind { addr, source })?;
        let local = tcp
            .local_addr()
            .map_err(|source| TlsError::Bind { addr, source })?;
        Ok(TlsListener { tcp, config, local })
    }

    /// The bound address (the port chosen when `listen` named port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Starts accepting within `limits`; the handshaken connections arrive on the receiver.
    pub fn start(self, limits: Limits) -> mpsc::Receiver<Handshaken> {
        let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
        let gates = Gates {
            connections: Gate::new(
                "tls connection",
                limits.tls_connections,
                limits.tls_per_addr,
                0,
            ),
            handshakes: Gate::new(
                "tls handshake",
                limits.tls_handshakes,
                limits.tls_handshakes_per_addr,
                0,
            ),
            timeout: limits.handshake_timeout,
        };
        tokio::spawn(accept_loop(
            self.tcp,
            TlsAcceptor::from(self.config),
            gates,
            tx,
        ));
        rx
    }
}

struct Gates {
    connections: Arc<AddrGate>,
    handshakes: Arc<AddrGate>,
    timeout: Duration,
}

/// The subject of the first certificate a client presented, as `CN=...,O=...`.
fn cert_subject(tls: &TlsStream<TcpStream>) -> Option<Arc<str>> {
    let der = tls.get_ref().1.peer_certificates()?.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    Some(cert.subject().to_string().into())
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    gates: Gates,
    tx: mpsc::Sender<Handshaken>,
) {
    loop {
        let accepted = tokio::select! {
            a = tcp.accept() => a,
            () = tx.closed() => return,
        };
        let (stream, addr) = match accepted {
            Ok(a) => a,
            Err(err) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(%err, "tcp accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Over the connection limit the connection is dropped (closed) here, before any TLS
        // work; the descriptors the daemon holds for TLS stay within that limit.
        let Some(ticket) = gates.connections.enter(addr.ip(), false) else {
            continue;
        };
        // Latency only: a socket without it still works.
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        let handshakes = Arc::clone(&gates.handshakes);
        let deadline = tokio::time::Instant::now() + gates.timeout;
        tokio::spawn(async move {
            // A burst of a control plane's connections waits for handshake places; a
            // half-open flood holds at most its share of them, each until the deadline.
            let handshaking = match handshakes.enter(addr.ip(), false) {
                Some(t) => t,
                None => loop {
                    tokio::time::sleep(HANDSHAKE_POLL).await;
                    if let Ok(t) = handshakes.take(addr.ip(), false) {
                        break t;
                    }
                    if tokio::time::Instant::now() >= deadline {
                        handshakes
                            .note_refusal(&addr.ip(), "no handshake place before the deadline");
                        return;
                    }
                },
            };
            let done = tokio::time::timeout_at(deadline, acceptor.accept(stream)).await;
            drop(handshaking);
            match done {
                Ok(Ok(tls)) => {
                    let peer = Peer::Tls {
                        addr,
                        cert_subject: cert_subject(&tls),
                    };
                    // Fails only once the accept loop has stopped (shutdown).
                    let _ = tx
                        .send(Handshaken {
                            stream: tls,
                            peer,
                            ticket,
                        })
                        .await;
                }
                Ok(Err(err)) => {
                    handshakes.note_refusal(&addr.ip(), &format!("the handshake failed: {err}"))
                }
                Err(_) => handshakes.note_refusal(&addr.ip(), "handshake timed out"),
            }
        });
    }
}

/// Serves handshaken TLS connections from `rx` until `stop`; then waits for them to finish.
pub async fn serve_tls(
    mut rx: mpsc::Receiver<Handshaken>,
    app: Router,
    limits: Limits,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut conns = Connections::new(app, limits, stop);
    loop {
        let conn = tokio::select! {
            c = rx.recv() => match c { Some(c) => c, None => break },
            () = conns.stopping() => break,
        };
        let Handshaken {
            stream,
            peer,
            ticket,
        } = conn;
        conns.serve(stream, peer, ticket);
    }
    drop(rx);
    conns.finished().await;
    Ok(())
}
