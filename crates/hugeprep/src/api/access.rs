//! Who may do what: roles, the `[access]` configuration, bearer tokens and unix socket peer
//! rules (see `docs/api.md`, "Remote access").
//!
//! A request needs [`Role::Read`] for `GET`, [`Role::Lease`] to take or release a lease and
//! [`Role::Admin`] for everything else (targets, drain, resume). On the TCP listener the
//! role comes from the bearer token; on the unix socket from the peer's uid and groups
//! (`SO_PEERCRED`, `SO_PEERGROUPS`, taken when it connected).
//!
//! Besides its role a caller has a principal ([`Caller`]): leases belong to the principal
//! that made them (see `super::owner`).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use axum::http::Method;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

/// Who made a request, as the authorization middleware found it: attached to every
/// request that passed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The principal that owns what it makes: `uid:N` on the unix socket, `token:NAME`
    /// (plus ` cert:SUBJECT` with a client certificate) over TLS.
    pub principal: String,
    /// Its role.
    pub role: Role,
}

/// What a caller may do; each role includes the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// `GET` requests.
    Read,
    /// Take and release leases.
    Lease,
    /// Everything: targets, drain, resume.
    Admin,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Read => "read",
            Role::Lease => "lease",
            Role::Admin => "admin",
        })
    }
}

/// The role a request needs: `GET`/`HEAD` read, `POST`/`DELETE` under `/v1/leases` lease,
/// anything else admin (so a new route is admin-only until it is listed here).
pub fn required_role(method: &Method, path: &str) -> Role {
    if method == Method::GET || method == Method::HEAD {
        Role::Read
    } else if (path == "/v1/leases" && method == Method::POST)
        || (path.starts_with("/v1/leases/") && method == Method::DELETE)
    {
        Role::Lease
    } else {
        Role::Admin
    }
}

/// A unix socket peer rule as written in `[[access.unix_peer]]`: one of `uid`, `user`,
/// `gid`, `group`, and the role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRuleSpec {
    /// A user id.
    pub uid: Option<u32>,
    /// A user name.
    pub user: Option<String>,
    /// A group id (the peer's primary or a supplementary group).
    pub gid: Option<u32>,
    /// A group name.
    pub group: Option<String>,
    /// The role the peer gets.
    pub role: Option<Role>,
}

/// The `[access]` table of the configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessSpec {
    /// TCP address to serve the API on with TLS, e.g. `0.0.0.0:7443`; none: unix socket only.
    pub listen: Option<String>,
    /// The server certificate chain (PEM).
    pub tls_cert: Option<PathBuf>,
    /// The server's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// A CA (PEM): when set, TCP clients must present a certificate it signed.
    pub tls_client_ca: Option<PathBuf>,
    /// The bearer tokens file (TOML, `[[token]]` with `name`, `role`, `secret`).
    pub tokens: Option<PathBuf>,
    /// Unix socket peers and their roles; none: root and the daemon's user are admin, the
    /// socket's group may lease.
    #[serde(default)]
    pub unix_peer: Vec<PeerRuleSpec>,
}

/// An `[access]` setting that cannot be used; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// A field is missing, malformed or contradicts another.
    #[error("access.{field}: {message}")]
    Field {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A file could not be read.
    #[error("access.{field}: {path}: {source}")]
    Read {
        /// The field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

fn field(field: impl Into<String>, message: impl Into<String>) -> AccessError {
    AccessError::Field {
        field: field.into(),
        message: message.into(),
    }
}

/// A bearer token from the tokens file.
#[derive(Clone)]
pub struct Token {
    /// Its name: what the log shows instead of the secret.
    pub name: String,
    /// Its role.
    pub role: Role,
    secret: Vec<u8>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// The shortest secret accepted (a guessable token is no protection).
pub const MIN_SECRET_LEN: usize = 16;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<TokenSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenSpec {
    name: String,
    role: Role,
    secret: String,
}

/// Parses a tokens file's text: `[[token]]` tables with `name`, `role` and `secret`.
pub fn parse_tokens(text: &str) -> Result<Vec<Token>, AccessError> {
    let file: TokensFile =
        toml::from_str(text).map_err(|e| field("tokens", e.to_string().replace('\n', " ")))?;
    let mut out: Vec<Token> = Vec::new();
    for (i, t) in file.token.into_iter().enumerate() {
        if t.secret.trim().len() < MIN_SECRET_LEN {
            return Err(field(
                format!("tokens: token[{i}].secret"),
                format!(
                    "{} characters; at least {MIN_SECRET_LEN} are needed",
                    t.secret.trim().len()
                ),
            ));
        }
        if t.name.is_empty() || out.iter().any(|o| o.name == t.name) {
            return Err(field(
                format!("tokens: token[{i}].name"),
                format!("{:?} is empty or used twice", t.name),
            ));
        }
        out.push(Token {
            name: t.name,
            role: t.role,
            secret: t.secret.trim().as_bytes().to_vec(),
        });
    }
    if out.is_empty() {
        return Err(field("tokens", "the file holds no [[token]]"));
    }
    Ok(out)
}

/// Reads the tokens file; refuses one that other users can read.
pub fn load_tokens(path: &Path) -> Result<Vec<Token>, AccessError> {
    let read = |source| AccessError::Read {
        field: "tokens",
        path: path.to_path_buf(),
        source,
    };
    let mode = std::fs::metadata(path).map_err(read)?.permissions().mode();
    if mode & 0o007 != 0 {
        return Err(field(
            "tokens",
            format!(
                "{} is open to other users (mode {:o}); chmod 0600 or 0640",
                path.display(),
                mode & 0o777
            ),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(read)?;
    parse_tokens(&text).map_err(|e| match e {
        AccessError::Field { field, message } => AccessError::Field {
            field,
            message: format!("{}: {message}", path.display()),
        },
        other => other,
    })
}

/// Which unix socket peers a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerMatch {
    /// A user id.
    Uid(u32),
    /// A group id: the peer's primary or a supplementary group.
    Gid(u32),
}

/// A unix socket peer rule, names resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerRule {
    /// Whom it matches.
    pub matches: PeerMatch,
    /// The role they get.
    pub role: Role,
}

impl PeerRuleSpec {
    fn resolve(&self, i: usize) -> Result<PeerRule, AccessError> {
        let name = |f: &str| format!("unix_peer[{i}].{f}");
        let role = self
            .role
            .ok_or_else(|| field(name("role"), "missing (read, lease or admin)"))?;
        let set = [
            self.uid.is_some(),
            self.user.is_some(),
            self.gid.is_some(),
            self.group.is_some(),
        ];
        if set.iter().filter(|s| **s).count() != 1 {
            return Err(field(
                name("uid"),
                "give exactly one of uid, user, gid and group",
            ));
        }
        let matches = if let Some(uid) = self.uid {
            PeerMatch::Uid(uid)
        } else if let Some(gid) = self.gid {
            PeerMatch::Gid(gid)
        } else if let Some(user) = &self.user {
            let u = nix::unistd::User::from_name(user)
                .ok()
                .flatten()
                .ok_or_else(|| field(name("user"), format!("{user:?}: no such user")))?;
            PeerMatch::Uid(u.uid.as_raw())
        } else {
            let group = self.group.as_deref().unwrap_or_default();
            let g = nix::unistd::Group::from_name(group)
                .ok()
                .flatten()
                .ok_or_else(|| field(name("group"), format!("{group:?}: no such group")))?;
            PeerMatch::Gid(g.gid.as_raw())
        };
        Ok(PeerRule { matches, role })
    }
}

/// The TLS listener's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Server certificate chain.
    pub cert: PathBuf,
    /// Server key.
    pub key: PathBuf,
    /// CA for client certificates.
    pub client_ca: Option<PathBuf>,
}

/// The validated `[access]` configuration.
#[derive(Debug, Clone, Default)]
pub struct AccessConfig {
    /// The TCP listener (always with TLS) and its files.
    pub listen: Option<(SocketAddr, TlsFiles)>,
    /// Bearer tokens (TCP only).
    pub tokens: Vec<Token>,
    /// Unix peer rules; `None`: the default (root and the daemon's user are admin, the
    /// socket's group may lease).
    pub unix_peers: Option<Vec<PeerRule>>,
}

impl AccessSpec {
    /// Checks the fields against each other, resolves user and group names and reads the
    /// tokens file. A TCP listener without TLS or without tokens is refused.
    pub fn validate(&self) -> Result<AccessConfig, AccessError> {
        let listen = match &self.listen {
            None => {
                for (name, set) in [
                    ("tls_cert", self.tls_cert.is_some()),
                    ("tls_key", self.tls_key.is_some()),
                    ("tls_client_ca", self.tls_client_ca.is_some()),
                ] {
                    if set {
                        return Err(field(name, "set without access.listen (no TCP listener)"));
                    }
                }
                None
            }
            Some(text) => {
                let addr: SocketAddr = text.parse().map_err(|_| {
                    field(
                        "listen",
                        format!("{text:?} is not an address and port (e.g. 0.0.0.0:7443)"),
                    )
                })?;
                let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
                    let missing = if self.tls_cert.is_none() {
                        "tls_cert"
                    } else {
                        "tls_key"
                    };
                    return Err(field(
                        missing,
                        format!(
                            "required with access.listen = {text:?}: \
                             hugeprep never serves TCP without TLS"
                        ),
                    ));
                };
                if self.tokens.is_none() {
                    return Err(field(
                        "tokens",
                        format!("required with access.listen = {text:?}: every TCP request needs a bearer token"),
                    ));
                }
                Some((
                    addr,
                    TlsFiles {
                        cert: cert.clone(),
                        key: key.clone(),
                        client_ca: self.tls_client_ca.clone(),
                    },
                ))
            }
        };
        let tokens = match &self.tokens {
            Some(path) => load_tokens(path)?,
            None => Vec::new(),
        };
        let unix_peers = if self.unix_peer.is_empty() {
            None
        } else {
            Some(
                self.unix_peer
                    .iter()
                    .enumerate()
                    .map(|(i, r)| r.resolve(i))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        };
        Ok(AccessConfig {
            listen,
            tokens,
            unix_peers,
        })
    }
}

/// A unix socket peer: its credentials as the kernel recorded them when it connected
/// (`SO_PEERCRED`, `SO_PEERGROUPS`), taken once per connection and never re-read from
/// `/proc` (a pid can name another process by the time a request arrives).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixPeer {
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
    /// Process id at connect time, when the kernel knows it (for logs only).
    pub pid: Option<i32>,
    /// Supplementary groups at connect time.
    pub groups: std::sync::Arc<[u32]>,
    /// The user who controls the peer's user namespace when that is not the daemon's (and
    /// not root's: see [`crate::sys::peercred::peer_userns_owner`]).
    pub userns_owner: Option<u32>,
}

impl UnixPeer {
    /// The uid the peer is counted as (its principal, its connection limits): the owner of
    /// its user namespace when a user made one (each of that user's subordinate uids is that
    /// user), else its own.
    pub fn principal_uid(&self) -> u32 {
        self.userns_owner.unwrap_or(self.uid)
    }
}

/// Decides roles: [`AccessConfig`] plus what the daemon learns at start (the socket's group,
/// its own uid).
#[derive(Debug, Clone)]
pub struct Access {
    tokens: Vec<Token>,
    unix_peers: Vec<PeerRule>,
}

impl Access {
    /// The roles in force: `config`'s unix peer rules, or (none given) the socket's group
    /// `socket_gid` with role `lease`; root and the daemon's own user are always admin.
    /// Admin is never given to a group by default: on a libvirt host the socket's group
    /// (`kvm`) is the group every QEMU runs in.
    pub fn new(config: &AccessConfig, socket_gid: Option<u32>) -> Access {
        let mut unix_peers = vec![
            PeerRule {
                matches: PeerMatch::Uid(0),
                role: Role::Admin,
            },
            PeerRule {
                matches: PeerMatch::Uid(nix::unistd::geteuid().as_raw()),
                role: Role::Admin,
            },
        ];
        match &config.unix_peers {
            Some(rules) => unix_peers.extend(rules.iter().copied()),
            None => unix_peers.extend(socket_gid.map(|gid| PeerRule {
                matches: PeerMatch::Gid(gid),
                role: Role::Lease,
            })),
        }
        Access {
            tokens: config.tokens.clone(),
            unix_peers,
        }
    }

    /// The token whose secret is `presented`, compared in constant time against every token
    /// (no early exit, so timing tells nothing about which one or how much matched).
    pub fn token(&self, presented: &[u8]) -> Option<&Token> {
        let mut found = None;
        for t in &self.tokens {
            if bool::from(t.secret.as_slice().ct_eq(presented)) {
                found = Some(t);
            }
        }
        found
    }

    /// The highest role of the rules that match `peer`, if any.
    pub fn unix_role(&self, peer: &UnixPeer) -> Option<Role> {
        let mut best = None;
        for rule in &self.unix_peers {
            let hit = match rule.matches {
                PeerMatch::Uid(uid) => uid == peer.uid,
                PeerMatch::Gid(gid) => gid == peer.gid || peer.groups.contains(&gid),
            };
            if hit {
                best = best.max(Some(rule.role));
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {

    /// A rule naming a role, a user or a group this host does not know is refused with the
    /// key and the value, and what is allowed.
    #[test]
    fn a_misspelt_role_user_or_group_is_refused_by_name() {
        for (text, words) in [
            (
                "[[unix_peer]]\nuid = 0\nrole = \"admn\"\n",
                &["admn", "read", "lease", "admin"][..],
            ),
            (
                "[[unix_peer]]\nuser = \"libvirt-qmeu\"\nrole = \"lease\"\n",
                &["unix_peer[0].user", "\"libvirt-qmeu\": no such user"][..],
            ),
            (
                "[[unix_peer]]\ngroup = \"kvmm\"\nrole = \"lease\"\n",
                &["unix_peer[0].group", "\"kvmm\": no such group"][..],
            ),
        ] {
            let err = toml::from_str::<AccessSpec>(text)
                .map_err(|e| e.to_string())
                .and_then(|spec| spec.validate().map(|_| ()).map_err(|e| e.to_string()))
                .unwrap_err();
            for w in words {
                assert!(err.contains(w), "{text:?}: {err:?} lacks {w:?}");
            }
        }
    }

    use super::*;

    #[test]
    fn routes_need_the_documented_roles() {
        assert_eq!(required_role(&Method::GET, "/v1/pool"), Role::Read);
        assert_eq!(required_role(&Method::POST, "/v1/leases"), Role::Lease);
        assert_eq!(required_role(&Method::DELETE, "/v1/leases/3"), Role::Lease);
        assert_eq!(required_role(&Method::POST, "/v1/pool/drain"), Role::Admin);
        assert_eq!(required_role(&Method::PUT, "/v1/pool/targets"), Role::Admin);
    }

    #[test]
    fn tokens_parse_and_match_by_secret() {
        let t = parse_tokens(
            "[[token]]\nname = \"cp\"\nrole = \"lease\"\nsecret = \"0123456789abcdef\"\n",
        )
        .unwrap();
        let access = Access::new(
            &AccessConfig {
                tokens: t,
                ..AccessConfig::default()
            },
            None,
        );
        assert_eq!(access.token(b"0123456789abcdef").unwrap().name, "cp");
        assert!(access.token(b"0123456789abcdeX").is_none());
        assert!(access.token(b"").is_none());
        let short = parse_tokens("[[token]]\nname = \"a\"\nrole = \"read\"\nsecret = \"x\"\n");
        assert!(short.unwrap_err().to_string().contains("token[0].secret"));
    }

    #[test]
    fn tcp_without_tls_is_refused_naming_the_field() {
        let spec = AccessSpec {
            listen: Some("127.0.0.1:7443".into()),
            tokens: Some("/nonexistent".into()),
            ..AccessSpec::default()
        };
        let err = spec.validate().unwrap_err().to_string();
        assert!(err.contains("access.tls_cert"), "{err}");
        assert!(err.contains("never serves TCP without TLS"), "{err}");
    }

    #[test]
    fn the_socket_group_may_lease_but_is_not_admin() {
        let access = Access::new(&AccessConfig::default(), Some(4242));
        let peer = |uid, gid, groups: &[u32]| UnixPeer {
            uid,
            gid,
            pid: None,
            groups: groups.into(),
            userns_owner: None,
        };
        assert_eq!(access.unix_role(&peer(0, 0, &[])), Some(Role::Admin));
        assert_eq!(access.unix_role(&peer(1234, 4242, &[])), Some(Role::Lease));
        assert_eq!(
            access.unix_role(&peer(1234, 1234, &[4242])),
            Some(Role::Lease)
        );
        assert_eq!(access.unix_role(&peer(1234, 1234, &[])), None);
    }
}
