//! Harness for the TCP+TLS listener: a CA, server and client certificates made at test
//! time (rcgen), a tokens file, and a keep-alive HTTP/1.1 client over TLS or the unix socket
//! that shows the status, `Retry-After` and body.

#![allow(dead_code)]

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

pub const ADMIN: &str = "admin-secret-0123456789abcdef";
pub const LEASE: &str = "lease-secret-0123456789abcdef";
pub const READ: &str = "read-secret-0123456789abcdef";

/// PEM files of a test PKI.
pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A client certificate the CA did not sign.
    pub rogue_cert: PathBuf,
    pub rogue_key: PathBuf,
    pub tokens: PathBuf,
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

fn ca_params(name: &str) -> CertificateParams {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p
}

impl Pki {
    /// Makes a CA, a server certificate for 127.0.0.1 and localhost, a client certificate,
    /// a rogue client certificate (another CA) and a tokens file with one token per role.
    pub fn new(dir: &Path) -> Pki {
        fs::create_dir_all(dir).unwrap();
        let ca = CertifiedIssuer::self_signed(
            ca_params("hugeprep test ca"),
            KeyPair::generate().unwrap(),
        )
        .unwrap();
        let rogue_ca =
            CertifiedIssuer::self_signed(ca_params("rogue ca"), KeyPair::generate().unwrap())
                .unwrap();
        let leaf = |sans: Vec<String>, usage, issuer: &CertifiedIssuer<KeyPair>| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(sans).unwrap();
            p.extended_key_usages = vec![usage];
            (
                p.signed_by(&key, issuer).unwrap().pem(),
                key.serialize_pem(),
            )
        };
        let server = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
            &ca,
        );
        let client = leaf(vec![], ExtendedKeyUsagePurpose::ClientAuth, &ca);
        let rogue = leaf(vec![], ExtendedKeyUsagePurpose::ClientAuth, &rogue_ca);
        let pki = Pki {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
            rogue_cert: dir.join("rogue.pem"),
            rogue_key: dir.join("rogue.key"),
            tokens: dir.join("tokens.toml"),
        };
        write(&pki.ca, &ca.pem());
        write(&pki.server_cert, &server.0);
        write(&pki.server_key, &server.1);
        write(&pki.client_cert, &client.0);
        write(&pki.client_key, &client.1);
        write(&pki.rogue_cert, &rogue.0);
        write(&pki.rogue_key, &rogue.1);
        write(
            &pki.tokens,
            &format!(
                "[[token]]\nname = \"ops\"\nrole = \"admin\"\nsecret = \"{ADMIN}\"\n\
                 [[token]]\nname = \"control-plane\"\nrole = \"lease\"\nsecret = \"{LEASE}\"\n\
                 [[token]]\nname = \"monitor\"\nrole = \"read\"\nsecret = \"{READ}\"\n"
            ),
        );
        pki
    }

    /// `hugeprep serve` flags for the TLS listener on an ephemeral port of 127.0.0.1.
    pub fn serve_flags(&self, client_ca: bool) -> Vec<String> {
        let mut v: Vec<String> = vec![
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--tls-cert".into(),
            self.server_cert.display().to_string(),
            "--tls-key".into(),
            self.server_key.display().to_string(),
            "--tokens".into(),
            self.tokens.display().to_string(),
        ];
        if client_ca {
            v.push("--tls-client-ca".into());
            v.push(self.ca.display().to_string());
        }
        v
    }

    /// A TLS connector trusting the test CA, presenting `client` (cert, key) when given.
    pub fn connector(&self, client: Option<(&Path, &Path)>) -> tokio_rustls::TlsConnector {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&self.ca).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    CertificateDer::pem_file_iter(cert)
                        .unwrap()
                        .map(Result::unwrap)
                        .collect(),
                    PrivateKeyDer::from_pem_file(key).unwrap(),
                )
                .unwrap(),
        };
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

/// The TLS listener's address, from the daemon's log line `listening on tcp with tls`.
pub fn tls_addr(log: impl Fn() -> String) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = log();
        if let Some(addr) = text
            .lines()
            .filter(|l| l.contains("listening on tcp with tls"))
            .find_map(|l| l.split("tls=").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
        {
            return addr.parse().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "no tls address in the log\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An answer: status, `Retry-After` (seconds) and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<u64>,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// One keep-alive HTTP/1.1 connection.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    token: Option<String>,
}

impl Conn {
    async fn over<S>(io: S, token: Option<&str>) -> Result<Conn, String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(Conn {
            sender,
            token: token.map(str::to_string),
        })
    }

    /// A TLS connection to `addr` with `connector`, sending `token` as bearer token.
    pub async fn tls(
        addr: SocketAddr,
        connector: &tokio_rustls::TlsConnector,
        token: Option<&str>,
    ) -> Result<Conn, String> {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        Conn::over(tls, token).await
    }

    /// A connection to the unix socket.
    pub async fn unix(socket: &Path) -> Result<Conn, String> {
        let s = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| e.to_string())?;
        Conn::over(s, None).await
    }

    /// Sends one request on this connection.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<Answer, String> {
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json");
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(|e| e.to_string())?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Answer {
            status,
            retry_after,
            body,
        })
    }
}

/// Runs `fut` on a fresh runtime.
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(fut)
}
