//! The daemon's configuration file (`hugeprep serve --config FILE`), TOML:
//!
//! ```toml
//! socket = "/run/hugeprep/hugeprep.sock"
//! socket_group = "kvm"                # no default: without it, the daemon's group (root)
//! state_dir = "/var/lib/hugeprep"
//! run_dir = "/run/hugeprep"
//! mounts = ["/dev/hugepages"]
//! clearing_policy = "/etc/hugeprep/clearing.toml"   # default: the embedded policy
//! recalibrate = false   # true: re-measure at start instead of reusing the stored calibration
//!
//! [pool]
//! verify = "sample"
//! scrub_bandwidth = "8G"
//! [[pool.target]]
//! page_size = "2M"
//! warm = "4G"
//! sizes = ["1G", "2G"]
//!
//! [access]                      # see docs/api.md, "Remote access"
//! listen = "0.0.0.0:7443"       # TLS only: needs tls_cert, tls_key and tokens
//! tls_cert = "/etc/hugeprep/tls/server.pem"
//! tls_key = "/etc/hugeprep/tls/server.key"
//! tokens = "/etc/hugeprep/tokens.toml"
//! [[access.unix_peer]]
//! user = "libvirt-qemu"
//! role = "lease"
//!
//! [metrics]                     # see docs/operations.md, "Monitoring"
//! listen = "127.0.0.1:9733"     # plain HTTP, GET /metrics and GET /health only
//!
//! [placement]                   # see docs/openstack.md
//! endpoint = "http://placement:8778"
//! token_file = "/etc/hugeprep/placement-token"
//! ```
//!
//! Command-line options override the file.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::policy::pool::PoolPolicySpec;

/// The configuration file as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// API socket path.
    pub socket: Option<PathBuf>,
    /// Group that may use the socket (mode 0660).
    pub socket_group: Option<String>,
    /// Journal directory.
    pub state_dir: Option<PathBuf>,
    /// Runtime directory (own hugetlbfs mounts).
    pub run_dir: Option<PathBuf>,
    /// hugetlbfs mounts to use (one per page size); empty: find or mount them.
    #[serde(default)]
    pub mounts: Vec<PathBuf>,
    /// A clearing policy file replacing the embedded `policies/clearing.toml`.
    pub clearing_policy: Option<PathBuf>,
    /// The pool policy (same keys as `policies/pool.toml`).
    pub pool: Option<PoolPolicySpec>,
    /// Measure the clearing methods at start even when the state directory holds a
    /// calibration for this CPU, kernel and policy.
    #[serde(default)]
    pub recalibrate: bool,
    /// Roles and the TLS listener (`[access]`; see `docs/api.md`, "Remote access").
    pub access: Option<crate::api::access::AccessSpec>,
    /// The monitoring listener (`[metrics]`).
    pub metrics: Option<MetricsSpec>,
    /// Publishing warm capacity to OpenStack Placement (`[placement]`).
    pub placement: Option<crate::placement::PlacementSpec>,
}

/// `[metrics]`: the read-only monitoring listener.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSpec {
    /// `ADDR:PORT` to serve `GET /metrics` and `GET /health` on, plain HTTP; absent: off.
    pub listen: Option<String>,
}

/// Parses a listener address (`127.0.0.1:9733`, `[::1]:9733`); the error names `field`.
pub fn parse_listen(field: &str, text: &str) -> Result<std::net::SocketAddr, String> {
    text.parse().map_err(|_| {
        format!("{field}: {text:?} is not an address with a port (e.g. 127.0.0.1:9733)")
    })
}

/// A configuration file that cannot be read or parsed.
#[derive(Debug, thiserror::Error)]
#[error("config file {path}: {message}")]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub message: String,
}

impl ConfigFile {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
        let err = |message: String| ConfigError {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        toml::from_str(&text).map_err(|e| err(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_parses_and_unknown_keys_are_refused() {
        let c: ConfigFile = toml::from_str(
            "socket = \"/tmp/s\"\n[pool]\n[[pool.target]]\npage_size = \"2M\"\nwarm = \"64M\"\n",
        )
        .unwrap();
        let p = c.pool.unwrap().validate().unwrap();
        assert_eq!(p.target_bytes(0, crate::PageSize::Size2M), 64 << 20);
        assert!(toml::from_str::<ConfigFile>("sockets = 1\n").is_err());
    }
}
