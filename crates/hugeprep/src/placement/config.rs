//! `[placement]` of the configuration file: where Placement is, who the daemon is to it
//! (keystoneauth-style settings), and how often it updates the inventory.
//!
//! ```toml
//! [placement]
//! compute_node = "compute-1"      # the compute node's provider name (Nova's hypervisor_hostname)
//! endpoint = "http://placement:8778"
//! auth_type = "token"             # or "v3applicationcredential"
//! token_file = "/etc/hugeprep/placement-token"
//! ```

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The table as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementSpec {
    /// The name of the compute node's resource provider, which Nova names after the
    /// hypervisor host name; default: this host's name (`uname -n`).
    pub compute_node: Option<String>,
    /// Placement's URL (keystoneauth's `endpoint_override`); with an application credential it
    /// may be left out and found in Keystone's service catalog.
    pub endpoint: Option<String>,
    /// `token` (a fixed token: `token` or `token_file`) or `v3applicationcredential`.
    pub auth_type: Option<String>,
    /// A fixed token (with Placement's `noauth2`, any token; `admin` is an admin).
    pub token: Option<String>,
    /// A file holding the token (mode 0600 or 0640).
    pub token_file: Option<PathBuf>,
    /// Keystone's URL, with `/v3` (`v3applicationcredential`).
    pub auth_url: Option<String>,
    /// The application credential's id.
    pub application_credential_id: Option<String>,
    /// A file holding the application credential's secret (mode 0600 or 0640).
    pub application_credential_secret_file: Option<PathBuf>,
    /// The catalog region of Placement's endpoint (any when absent).
    pub region_name: Option<String>,
    /// The catalog interface: `internal` (default) or `public`, `admin`.
    pub interface: Option<String>,
    /// CA certificates (PEM) for https endpoints; default: the system's CA store
    /// (`rustls-native-certs`: `SSL_CERT_FILE`, `SSL_CERT_DIR`, else the distribution's).
    pub cafile: Option<PathBuf>,
    /// The shortest time between two inventory updates, ms (default 1000, at least 100).
    pub min_interval_ms: Option<u64>,
    /// Seconds between full refreshes (Placement's usage re-read, the inventory written
    /// even if unchanged; default 60).
    pub refresh_s: Option<u64>,
    /// Timeout of one HTTP request, ms (default 10000).
    pub timeout_ms: Option<u64>,
}

/// How the daemon authenticates.
#[derive(Clone, PartialEq, Eq)]
pub enum AuthConfig {
    /// A fixed token, sent as `X-Auth-Token`; from `token_file` when `file` is set, which is
    /// read again when Placement refuses the token (rotated meanwhile).
    Token {
        /// The token.
        token: String,
        /// The file it came from.
        file: Option<PathBuf>,
    },
    /// A Keystone v3 application credential, exchanged for a token (and the catalog).
    ApplicationCredential {
        /// Keystone's URL, ending in `/v3`.
        auth_url: String,
        /// The credential's id.
        id: String,
        /// Its secret.
        secret: String,
    },
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a secret in a log line.
        match self {
            AuthConfig::Token { file, .. } => f
                .debug_struct("Token")
                .field("file", file)
                .finish_non_exhaustive(),
            AuthConfig::ApplicationCredential { auth_url, id, .. } => f
                .debug_struct("ApplicationCredential")
                .field("auth_url", auth_url)
                .field("id", id)
                .finish_non_exhaustive(),
        }
    }
}

/// The validated table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementConfig {
    /// The compute node's provider name.
    pub compute_node: String,
    /// Placement's URL (without a trailing `/`); `None`: from the catalog.
    pub endpoint: Option<String>,
    /// Credentials.
    pub auth: AuthConfig,
    /// Catalog region.
    pub region_name: Option<String>,
    /// Catalog interface.
    pub interface: String,
    /// CA file for https.
    pub cafile: Option<PathBuf>,
    /// Shortest time between updates.
    pub min_interval: Duration,
    /// Time between full refreshes.
    pub refresh: Duration,
    /// Timeout of one request.
    pub timeout: Duration,
}

/// A `[placement]` table that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("[placement] {field}: {message}")]
pub struct PlacementConfigError {
    /// The key at fault.
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

fn err(field: &'static str, message: impl Into<String>) -> PlacementConfigError {
    PlacementConfigError {
        field,
        message: message.into(),
    }
}

/// Reads a secret from `path`, refusing a file other users can read.
pub(crate) fn secret(field: &'static str, path: &Path) -> Result<String, PlacementConfigError> {
    let meta =
        std::fs::metadata(path).map_err(|e| err(field, format!("{}: {e}", path.display())))?;
    let mode = meta.permissions().mode();
    if mode & 0o004 != 0 {
        return Err(err(
            field,
            format!(
                "{} is readable by every user (mode {:o}); chmod 0600 or 0640",
                path.display(),
                mode & 0o777
            ),
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| err(field, format!("{}: {e}", path.display())))?;
    let text = text.trim().to_string();
    if text.is_empty() {
        return Err(err(field, format!("{} is empty", path.display())));
    }
    Ok(text)
}

fn url(field: &'static str, value: &str) -> Result<String, PlacementConfigError> {
    let u: axum::http::Uri = value
        .parse()
        .map_err(|e| err(field, format!("{value:?} is not a URL: {e}")))?;
    match u.scheme_str() {
        Some("http") | Some("https") if u.host().is_some() => {}
        _ => {
            return Err(err(
                field,
                format!("{value:?}: an http:// or https:// URL with a host"),
            ))
        }
    }
    Ok(value.trim_end_matches('/').to_string())
}

/// This host's name, as `uname -n` prints it (the UTS namespace's, from procfs).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

impl PlacementSpec {
    /// Validates the table and reads its secret files.
    pub fn validate(&self) -> Result<PlacementConfig, PlacementConfigError> {
        let compute_node = match &self.compute_node {
            Some(n) if n.trim().is_empty() || n.len() > 200 => {
                return Err(err("compute_node", "1-200 characters"))
            }
            Some(n) => n.clone(),
            None => host_name(),
        };
        let endpoint = self
            .endpoint
            .as_deref()
            .map(|e| url("endpoint", e))
            .transpose()?;
        let auth = match self.auth_type.as_deref().unwrap_or("token") {
            "token" => {
                let (token, file) = match (&self.token, &self.token_file) {
                    (Some(t), None) if !t.is_empty() => (t.clone(), None),
                    (None, Some(p)) => (secret("token_file", p)?, Some(p.clone())),
                    (Some(_), Some(_)) => {
                        return Err(err("token", "give token or token_file, not both"))
                    }
                    _ => {
                        return Err(err(
                            "token",
                            "auth_type = \"token\" needs token or token_file",
                        ))
                    }
                };
                if endpoint.is_none() {
                    return Err(err(
                        "endpoint",
                        "auth_type = \"token\" needs endpoint (no catalog without Keystone)",
                    ));
                }
                AuthConfig::Token { token, file }
            }
            "v3applicationcredential" => {
                let auth_url = self
                    .auth_url
                    .as_deref()
                    .ok_or_else(|| err("auth_url", "v3applicationcredential needs auth_url"))?;
                let id = self.application_credential_id.clone().ok_or_else(|| {
                    err(
                        "application_credential_id",
                        "v3applicationcredential needs application_credential_id",
                    )
                })?;
                let path = self
                    .application_credential_secret_file
                    .as_deref()
                    .ok_or_else(|| {
                        err(
                            "application_credential_secret_file",
                            "v3applicationcredential needs application_credential_secret_file",
                        )
                    })?;
                AuthConfig::ApplicationCredential {
                    auth_url: url("auth_url", auth_url)?,
                    id,
                    secret: secret("application_credential_secret_file", path)?,
                }
            }
            other => {
                return Err(err(
                    "auth_type",
                    format!("{other:?}: token or v3applicationcredential"),
                ))
            }
        };
        let interface = self.interface.clone().unwrap_or_else(|| "internal".into());
        if !["internal", "public", "admin"].contains(&interface.as_str()) {
            return Err(err("interface", "internal, public or admin"));
        }
        let min_interval = self.min_interval_ms.unwrap_or(1000);
        if !(100..=600_000).contains(&min_interval) {
            return Err(err("min_interval_ms", "100 to 600000"));
        }
        let refresh = self.refresh_s.unwrap_or(60);
        if !(1..=86_400).contains(&refresh) {
            return Err(err("refresh_s", "1 to 86400"));
        }
        let timeout = self.timeout_ms.unwrap_or(10_000);
        if !(100..=120_000).contains(&timeout) {
            return Err(err("timeout_ms", "100 to 120000"));
        }
        Ok(PlacementConfig {
            compute_node,
            endpoint,
            auth,
            region_name: self.region_name.clone(),
            interface,
            cafile: self.cafile.clone(),
            min_interval: Duration::from_millis(min_interval),
            refresh: Duration::from_secs(refresh),
            timeout: Duration::from_millis(timeout),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mistake_names_its_key() {
        let spec = |t: &str| toml::from_str::<PlacementSpec>(t).unwrap().validate();
        let ok = spec(
            "endpoint = \"http://127.0.0.1:8778/\"\ntoken = \"admin\"\ncompute_node = \"a\"\n",
        )
        .unwrap();
        assert_eq!(ok.endpoint.as_deref(), Some("http://127.0.0.1:8778"));
        assert_eq!(ok.min_interval, Duration::from_secs(1));
        assert!(
            !format!("{ok:?}").contains("admin"),
            "the token is never printed"
        );
        for (text, field) in [
            ("token = \"admin\"\n", "endpoint"),
            ("endpoint = \"http://x\"\n", "token"),
            ("endpoint = \"ftp://x\"\ntoken = \"a\"\n", "endpoint"),
            (
                "endpoint = \"http://x\"\ntoken = \"a\"\nauth_type = \"password\"\n",
                "auth_type",
            ),
            ("auth_type = \"v3applicationcredential\"\n", "auth_url"),
            (
                "endpoint = \"http://x\"\ntoken = \"a\"\nmin_interval_ms = 1\n",
                "min_interval_ms",
            ),
            (
                "endpoint = \"http://x\"\ntoken = \"a\"\ninterface = \"x\"\n",
                "interface",
            ),
        ] {
            let e = spec(text).unwrap_err();
            assert_eq!(e.field, field, "{text}: {e}");
        }
        assert!(toml::from_str::<PlacementSpec>("endpoints = 1\n").is_err());
    }
}
