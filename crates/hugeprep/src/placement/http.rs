//! The HTTP client the publisher talks to Placement and Keystone with: one request per
//! connection (updates are rare and rate-limited), hyper's HTTP/1 client over a TCP stream,
//! wrapped in rustls for `https` with the configured CA file or the system's CA store (found
//! by `rustls-native-certs` as OpenSSL would: `SSL_CERT_FILE`, `SSL_CERT_DIR`, else the
//! distribution's bundle, on Debian, Fedora, RHEL and SUSE alike). Every request carries a
//! `User-Agent` and its own `X-Openstack-Request-Id` (`req-<uuid>`), which the services log.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

/// The `User-Agent` of every request: `hugeprep/VERSION`.
pub const USER_AGENT: &str = concat!("hugeprep/", env!("CARGO_PKG_VERSION"));

/// The largest answer read from Placement or Keystone: a provider's usages or allocations
/// are a few KiB; a larger answer (a compromised or broken service) is refused rather than
/// held in the daemon's memory.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The URL cannot be requested.
    #[error("{url}: {message}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// Connecting, the TLS handshake, or the exchange failed.
    #[error("{url}: {message}")]
    Io {
        /// The URL.
        url: String,
        /// What failed.
        message: String,
    },
    /// No answer within the timeout.
    #[error("{url}: no answer within {timeout:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// The limit.
        timeout: Duration,
    },
    /// The CA file or the system's CA store cannot be read.
    #[error("CA certificates of {path}: {message}")]
    Ca {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// An answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
    /// The `X-Openstack-Request-Id` it was asked with.
    pub request_id: String,
}

/// A client: timeouts and the TLS configuration.
#[derive(Clone)]
pub struct Http {
    timeout: Duration,
    tls: Option<Arc<rustls::ClientConfig>>,
    ca_error: Option<String>,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What the system's CA store is called in errors.
const SYSTEM_STORE: &str =
    "the system's CA store (rustls-native-certs: SSL_CERT_FILE, SSL_CERT_DIR or the distribution's bundle)";

fn roots(cafile: Option<&Path>) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    match cafile {
        Some(path) => {
            for cert in CertificateDer::pem_file_iter(path).map_err(|e| e.to_string())? {
                let cert = cert.map_err(|e| e.to_string())?;
                roots.add(cert).map_err(|e| e.to_string())?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let errors: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
                return Err(format!("no usable certificate ({})", errors.join("; ")));
            }
        }
    }
    if roots.is_empty() {
        return Err("no certificate in it".into());
    }
    Ok(roots)
}

fn tls_config(cafile: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let roots = roots(cafile)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A fresh request id as OpenStack services expect it: `req-` and a random UUID.
pub fn request_id() -> String {
    format!("req-{}", uuid::Uuid::new_v4())
}

impl Http {
    /// A client with `timeout` per request; https trusts `cafile` (default: the system's CA
    /// store). A CA file or store that cannot be read fails each https request, saying why.
    pub fn new(timeout: Duration, cafile: Option<&Path>) -> Http {
        let (tls, ca_error) = match tls_config(cafile) {
            Ok(c) => (Some(Arc::new(c)), None),
            Err(e) => (None, Some(e)),
        };
        Http {
            timeout,
            tls,
            ca_error: ca_error.map(|e| match cafile {
                Some(path) => format!("{}: {e}", path.display()),
                None => format!("{SYSTEM_STORE}: {e}"),
            }),
        }
    }

    /// Sends one request, with `headers` and a JSON `body` when given; `User-Agent` is
    /// `hugeprep/VERSION` unless `headers` name another.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Option<Vec<u8>>,
    ) -> Result<Answer, TransportError> {
        match tokio::time::timeout(self.timeout, self.exchange(method, url, headers, body)).await {
            Ok(r) => r,
            Err(_) => Err(TransportError::Timeout {
                url: url.to_string(),
                timeout: self.timeout,
            }),
        }
    }

    async fn exchange(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Option<Vec<u8>>,
    ) -> Result<Answer, TransportError> {
        let bad = |message: String| TransportError::Url {
            url: url.to_string(),
            message,
        };
        let io = |message: String| TransportError::Io {
            url: url.to_string(),
            message,
        };
        let uri: Uri = url.parse().map_err(|e| bad(format!("{e}")))?;
        let id = request_id();
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(bad("not an http or https URL".into())),
        };
        let host = uri
            .host()
            .ok_or_else(|| bad("no host".into()))?
            .trim_matches(|c| c == '[' || c == ']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let stream = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| io(format!("connect: {e}")))?;
        let path = uri
            .path_and_query()
            .map_or("/".to_string(), |p| p.as_str().to_string());
        let authority = uri
            .authority()
            .map_or(host.clone(), |a| a.as_str().to_string());
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(axum::http::header::HOST, authority)
            .header(axum::http::header::ACCEPT, "application/json")
            .header("x-openstack-request-id", id.as_str());
        if !headers
            .iter()
            .any(|(k, _)| k == axum::http::header::USER_AGENT)
        {
            req = req.header(axum::http::header::USER_AGENT, USER_AGENT);
        }
        for (k, v) in headers {
            req = req.header(k, v);
        }
        if body.is_some() {
            req = req.header(axum::http::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| bad(e.to_string()))?;
        if https {
            let Some(tls) = &self.tls else {
                return Err(TransportError::Ca {
                    path: self.ca_error.clone().unwrap_or_default(),
                    message: "no usable CA certificates".into(),
                });
            };
            let name = ServerName::try_from(host.clone()).map_err(|e| bad(e.to_string()))?;
            let stream = tokio_rustls::TlsConnector::from(Arc::clone(tls))
                .connect(name, stream)
                .await
                .map_err(|e| io(format!("TLS: {e}")))?;
            finish(TokioIo::new(stream), req, id).await.map_err(io)
        } else {
            finish(TokioIo::new(stream), req, id).await.map_err(io)
        }
    }
}

async fn finish<T>(io: T, req: Request<Full<Bytes>>, request_id: String) -> Result<Answer, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let driver = tokio::spawn(async move {
        // The connection ends with the exchange; its error, if any, is the request's.
        let _ = conn.await;
    });
    let result = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer (at most {MAX_ANSWER_BYTES} bytes): {e}"))?
            .to_bytes();
        Ok(Answer {
            status,
            headers,
            body,
            request_id,
        })
    }
    .await;
    driver.abort();
    result
}
