//! The TCP listener: TLS only (rustls, certificate and key from PEM files), optionally
//! requiring a client certificate signed by a CA. Handshakes run in their own tasks, so a
//! slow or hostile client never holds up the others.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::peer::Peer;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the HTTP server.
const ACCEPT_QUEUE: usize = 64;

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

/// A TCP listener that hands out only connections whose TLS handshake succeeded.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, Peer)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Binds `addr` and starts accepting; handshakes with `config`.
    pub async fn bind(addr: SocketAddr, config: Arc<ServerConfig>) -> Result<Self, TlsError> {
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|source| TlsError::Bind { addr, source })?;
        let local = tcp
            .local_addr()
            .map_err(|source| TlsError::Bind { addr, source })?;
        let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
        tokio::spawn(accept_loop(tcp, TlsAcceptor::from(config), tx));
        Ok(TlsListener { rx, local })
    }

    /// The bound address (the port chosen when `listen` named port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, Peer)>,
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
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let client_cert = tls.get_ref().1.peer_certificates().is_some();
                    let _ = tx.send((tls, Peer::Tls { addr, client_cert })).await;
                }
                Ok(Err(err)) => tracing::warn!(peer = %addr, %err, "tls handshake refused"),
                Err(_) => tracing::warn!(peer = %addr, "tls handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(Peer::Tls {
            addr: self.local,
            client_cert: false,
        })
    }
}
