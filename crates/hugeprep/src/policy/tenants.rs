//! `[pool.limits]`: the most one principal (a unix uid, a token, a TLS identity) may hold,
//! per API role and per principal (see `docs/security.md`, "Limits per tenant").
//!
//! ```toml
//! [pool.limits.role.lease]            # each lease-role principal, on its own
//! leased_bytes = { "2M" = "16G", "1G" = "64G" }
//! leases = 64
//! descriptors = 64                    # pidfds (`pid`) and long-term pins (`pin`)
//! held_bytes = "4G"                   # released but still held by someone
//! [pool.limits.principal."libvirt-qemu"]   # a user name, a uid, "token:NAME", "cert:SUBJECT"
//! leases = 16
//! ```
//!
//! A principal's own table wins field by field over its role's, which wins over the
//! defaults ([`Limits::role_default`]): admin none, lease a share of the host's memory.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::pool_error::PoolPolicyError;
use crate::page_size::PageSize;
use crate::units::parse_bytes;

/// The most leases a lease-role principal may hold by default.
pub const DEFAULT_LEASES: u64 = 64;
/// The most descriptors (pidfds and pins) a lease-role principal may make the daemon hold.
pub const DEFAULT_DESCRIPTORS: u64 = 64;
/// The share of the host's memory (1/N) a lease-role principal may lease, per page size.
pub const DEFAULT_LEASED_SHARE: u64 = 4;
/// The share of the host's memory (1/N) a lease-role principal may leave released but held.
pub const DEFAULT_HELD_SHARE: u64 = 32;
/// The VM starts of one lease-role principal an adaptive target's forecast counts per clock
/// hour by default (`pool::adaptive::weigh`).
pub const DEFAULT_STARTS_PER_HOUR: u64 = 1;

/// One `[pool.limits.*]` table as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    /// Bytes leased at once, per page size (`"2M"`, `"1G"`), e.g. `"16G"` or `"none"`.
    #[serde(default)]
    pub leased_bytes: BTreeMap<String, String>,
    /// Leases at once.
    #[serde(default)]
    pub leases: Option<u64>,
    /// pidfds (`pid`) and long-term pins (`pin`) held for its leases.
    #[serde(default)]
    pub descriptors: Option<u64>,
    /// Bytes released but still held by someone, waiting aside (`"none"`: no limit).
    #[serde(default)]
    pub held_bytes: Option<String>,
    /// Its VM starts an adaptive target's forecast counts per clock hour (not a limit on
    /// leases: the further ones are served, not counted); `"none"`: all.
    #[serde(default)]
    pub starts_per_hour: Option<CountOrNone>,
}

/// A count, or `"none"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CountOrNone {
    /// A count.
    Count(u64),
    /// `"none"` (anything else is refused at validation, naming the field).
    Word(String),
}

/// `[pool.limits]` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantsSpec {
    /// Per API role (`lease`, `admin`).
    #[serde(default)]
    pub role: BTreeMap<String, LimitsSpec>,
    /// Per principal: a user name or uid (a unix peer), `token:NAME`, `cert:SUBJECT` (a
    /// client certificate under mutual TLS) or `token:NAME cert:SUBJECT`.
    #[serde(default)]
    pub principal: BTreeMap<String, LimitsSpec>,
}

/// One limit: `None` is none.
pub type Limit = Option<u64>;

/// What one principal may hold (`None` in a field: no limit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// Leased bytes per page size (a page size not listed: no limit).
    pub leased_bytes: BTreeMap<PageSize, Limit>,
    /// Leases.
    pub leases: Limit,
    /// pidfds and pins.
    pub descriptors: Limit,
    /// Released-but-held bytes.
    pub held_bytes: Limit,
    /// Starts counted per clock hour by the adaptive forecast (not an admission limit).
    pub starts_per_hour: Limit,
}

/// One table's fields, parsed: `None` where the table says nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Partial {
    leased_bytes: BTreeMap<PageSize, Limit>,
    leases: Option<Limit>,
    descriptors: Option<Limit>,
    held_bytes: Option<Limit>,
    starts_per_hour: Option<Limit>,
}

impl Partial {
    fn over(&self, base: &mut Limits) {
        for (ps, l) in &self.leased_bytes {
            base.leased_bytes.insert(*ps, *l);
        }
        if let Some(l) = self.leases {
            base.leases = l;
        }
        if let Some(l) = self.descriptors {
            base.descriptors = l;
        }
        if let Some(l) = self.held_bytes {
            base.held_bytes = l;
        }
        if let Some(l) = self.starts_per_hour {
            base.starts_per_hour = l;
        }
    }
}

fn bytes_or_none(field: &str, text: &str) -> Result<Limit, PoolPolicyError> {
    if text.trim() == "none" {
        return Ok(None);
    }
    parse_bytes(text)
        .map(Some)
        .map_err(|e| PoolPolicyError::Field {
            field: field.to_string(),
            message: format!("{e} (a size such as \"16G\", or \"none\")"),
        })
}

fn count_or_none(field: &str, c: &CountOrNone) -> Result<Limit, PoolPolicyError> {
    match c {
        CountOrNone::Count(n) => Ok(Some(*n)),
        CountOrNone::Word(w) if w.trim() == "none" => Ok(None),
        CountOrNone::Word(w) => Err(PoolPolicyError::Field {
            field: field.to_string(),
            message: format!("{w:?} is no count (a count such as 4, or \"none\")"),
        }),
    }
}

impl LimitsSpec {
    fn parse(&self, at: &str) -> Result<Partial, PoolPolicyError> {
        let mut leased_bytes = BTreeMap::new();
        for (ps, text) in &self.leased_bytes {
            let field = format!("{at}.leased_bytes.{ps:?}");
            let page: PageSize = ps.parse().map_err(|_| PoolPolicyError::Field {
                field: field.clone(),
                message: format!("{ps:?} is no page size (2M or 1G)"),
            })?;
            leased_bytes.insert(page, bytes_or_none(&field, text)?);
        }
        Ok(Partial {
            leased_bytes,
            leases: self.leases.map(Some),
            descriptors: self.descriptors.map(Some),
            held_bytes: match &self.held_bytes {
                None => None,
                Some(t) => Some(bytes_or_none(&format!("{at}.held_bytes"), t)?),
            },
            starts_per_hour: match &self.starts_per_hour {
                None => None,
                Some(t) => Some(count_or_none(&format!("{at}.starts_per_hour"), t)?),
            },
        })
    }
}

/// `[pool.limits]` validated: role tables by role name, principal tables by principal
/// (`uid:N` for a user name or uid, `token:NAME` as written).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenants {
    roles: BTreeMap<String, Partial>,
    principals: BTreeMap<String, Partial>,
    /// The host's memory, for the defaults.
    host_bytes: u64,
}

/// The principal a `[pool.limits.principal]` key names: a user name or uid is `uid:N`;
/// `token:NAME` and other principals are as written.
fn principal_key(key: &str) -> Result<String, String> {
    if key.contains(':') {
        return Ok(key.to_string());
    }
    if let Ok(uid) = key.parse::<u32>() {
        return Ok(format!("uid:{uid}"));
    }
    match nix::unistd::User::from_name(key) {
        Ok(Some(u)) => Ok(format!("uid:{}", u.uid.as_raw())),
        Ok(None) => Err(format!(
            "{key:?} names no user on this host (a user name, a uid, or token:NAME)"
        )),
        Err(e) => Err(format!("cannot look up user {key:?}: {e}")),
    }
}

/// The `[pool.limits.principal]` keys that apply to `principal`, weakest first: for
/// `token:NAME cert:SUBJECT` (mutual TLS) `token:NAME`, `cert:SUBJECT` and the whole; for
/// any other principal itself. The token's name is cut at the first `" cert:"`: the API
/// writes the certificate's part last, and only the operator names tokens.
fn principal_tables(principal: &str) -> Vec<&str> {
    match principal
        .strip_prefix("token:")
        .and_then(|rest| rest.find(" cert:"))
    {
        Some(at) => {
            let cut = "token:".len() + at;
            vec![&principal[..cut], &principal[cut + 1..], principal]
        }
        None => vec![principal],
    }
}

impl TenantsSpec {
    /// Parses sizes, checks role names and resolves user names to uids.
    pub fn validate(&self) -> Result<Tenants, PoolPolicyError> {
        let mut roles = BTreeMap::new();
        for (role, spec) in &self.role {
            let at = format!("limits.role.{role:?}");
            if !super::recycle::ROLES.contains(&role.as_str()) {
                return Err(PoolPolicyError::Field {
                    field: at,
                    message: format!(
                        "{role:?} is no API role: the roles are {}",
                        super::recycle::ROLES.join(", ")
                    ),
                });
            }
            roles.insert(role.clone(), spec.parse(&at)?);
        }
        let mut principals = BTreeMap::new();
        for (key, spec) in &self.principal {
            let at = format!("limits.principal.{key:?}");
            let principal = principal_key(key).map_err(|message| PoolPolicyError::Field {
                field: at.clone(),
                message,
            })?;
            principals.insert(principal, spec.parse(&at)?);
        }
        Ok(Tenants {
            roles,
            principals,
            host_bytes: host_memory(),
        })
    }
}

/// The host's memory (`MemTotal`), 0 when unknown.
fn host_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

impl Limits {
    /// Whether no limit a lease is checked against is set (`held_bytes` is kept where
    /// released files wait aside, not at the lease).
    pub fn admits_anything(&self) -> bool {
        self.leased_bytes.values().all(Option::is_none)
            && self.leases.is_none()
            && self.descriptors.is_none()
    }

    /// The defaults of a role: admin (root, the daemon's user, the libvirt hook) none; a
    /// lease-role principal 1/[`DEFAULT_LEASED_SHARE`] of the host's memory leased per page
    /// size, [`DEFAULT_LEASES`] leases, [`DEFAULT_DESCRIPTORS`] descriptors,
    /// 1/[`DEFAULT_HELD_SHARE`] of the host's memory released but held, and
    /// [`DEFAULT_STARTS_PER_HOUR`] starts an hour counted by the adaptive forecast.
    pub fn role_default(role: &str, host_bytes: u64) -> Limits {
        if role == "admin" {
            return Limits::default();
        }
        let share = |n: u64| (host_bytes > 0).then(|| host_bytes / n);
        Limits {
            leased_bytes: [PageSize::Size2M, PageSize::Size1G]
                .into_iter()
                .map(|ps| {
                    (
                        ps,
                        share(DEFAULT_LEASED_SHARE).map(|b| b / ps.bytes() * ps.bytes()),
                    )
                })
                .collect(),
            leases: Some(DEFAULT_LEASES),
            descriptors: Some(DEFAULT_DESCRIPTORS),
            held_bytes: share(DEFAULT_HELD_SHARE),
            starts_per_hour: Some(DEFAULT_STARTS_PER_HOUR),
        }
    }
}

impl Tenants {
    /// The limits of `principal` with `role`: its own tables over its role's over the role's
    /// defaults. Under mutual TLS a principal is `token:NAME cert:SUBJECT`; its tables apply
    /// field by field in this order, each over the one before: `token:NAME`, then
    /// `cert:SUBJECT` (the certificate names the client, the token only what it may do),
    /// then the whole `token:NAME cert:SUBJECT`.
    pub fn limits_for(&self, role: &str, principal: &str) -> Limits {
        let mut l = Limits::role_default(role, self.host_bytes);
        if let Some(p) = self.roles.get(role) {
            p.over(&mut l);
        }
        for key in principal_tables(principal) {
            if let Some(p) = self.principals.get(key) {
                p.over(&mut l);
            }
        }
        l
    }

    /// The defaults alone, on a host of `host_bytes` (for tests and the embedded policy).
    pub fn defaults(host_bytes: u64) -> Tenants {
        Tenants {
            host_bytes,
            ..Tenants::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn a_principal_table_wins_over_its_role_over_the_defaults() {
        let spec: TenantsSpec = toml::from_str(
            "[role.lease]\nleases = 8\nleased_bytes = { \"2M\" = \"4G\" }\n\
             [principal.\"0\"]\nleases = 2\nheld_bytes = \"none\"\n\
             [principal.\"token:cp\"]\ndescriptors = 1\nstarts_per_hour = \"none\"\n\
             [principal.\"token:few\"]\nstarts_per_hour = 3\n",
        )
        .unwrap();
        let mut t = spec.validate().unwrap();
        t.host_bytes = 64 * G;
        let lease = t.limits_for("lease", "uid:1000");
        assert_eq!(lease.leases, Some(8));
        assert_eq!(lease.leased_bytes[&PageSize::Size2M], Some(4 * G));
        assert_eq!(lease.leased_bytes[&PageSize::Size1G], Some(16 * G));
        assert_eq!(lease.descriptors, Some(DEFAULT_DESCRIPTORS));
        assert_eq!(lease.held_bytes, Some(2 * G));
        let root = t.limits_for("lease", "uid:0");
        assert_eq!((root.leases, root.held_bytes), (Some(2), None));
        assert_eq!(t.limits_for("lease", "token:cp").descriptors, Some(1));
        assert_eq!(lease.starts_per_hour, Some(DEFAULT_STARTS_PER_HOUR));
        assert_eq!(t.limits_for("lease", "token:cp").starts_per_hour, None);
        assert_eq!(t.limits_for("lease", "token:few").starts_per_hour, Some(3));
        assert_eq!(t.limits_for("admin", "uid:1000"), Limits::default());
        assert!(t.limits_for("admin", "uid:1000").admits_anything());
        assert!(!lease.admits_anything());
    }

    #[test]
    fn under_mutual_tls_the_token_then_the_certificate_then_the_whole_apply() {
        let spec: TenantsSpec = toml::from_str(
            "[role.lease]\nleases = 8\n\
             [principal.\"token:nova\"]\nleases = 512\ndescriptors = 9\nheld_bytes = \"1G\"\n\
             [principal.\"cert:CN=compute-1\"]\ndescriptors = 3\n\
             [principal.\"token:nova cert:CN=compute-1\"]\nheld_bytes = \"none\"\n",
        )
        .unwrap();
        let t = spec.validate().unwrap();
        let both = t.limits_for("lease", "token:nova cert:CN=compute-1");
        assert_eq!(both.leases, Some(512), "the token's table applies");
        assert_eq!(
            both.descriptors,
            Some(3),
            "the certificate's wins over the token's"
        );
        assert_eq!(
            both.held_bytes, None,
            "the whole principal's wins over both"
        );
        let other_cert = t.limits_for("lease", "token:nova cert:CN=compute-2");
        assert_eq!(
            (
                other_cert.leases,
                other_cert.descriptors,
                other_cert.held_bytes
            ),
            (Some(512), Some(9), Some(G))
        );
        // Another token with the same certificate: the certificate's table, not nova's.
        let other_token = t.limits_for("lease", "token:ci cert:CN=compute-1");
        assert_eq!(
            (other_token.leases, other_token.descriptors),
            (Some(8), Some(3))
        );
        // A subject that names a token gains nothing of that token's.
        let forged = t.limits_for("lease", "token:ci cert:token:nova");
        assert_eq!(forged.leases, Some(8));
        assert_eq!(
            principal_tables("token:a cert:CN=x cert:y"),
            ["token:a", "cert:CN=x cert:y", "token:a cert:CN=x cert:y"]
        );
        assert_eq!(principal_tables("uid:7"), ["uid:7"]);
        assert_eq!(principal_tables("token:a"), ["token:a"]);
    }

    #[test]
    fn bad_tables_are_refused_by_name() {
        for (text, words) in [
            (
                "[role.leese]\nleases = 1\n",
                &["limits.role.\"leese\"", "no API role"][..],
            ),
            (
                "[role.lease]\nleased_bytes = { \"3M\" = \"1G\" }\n",
                &["leased_bytes.\"3M\"", "no page size"][..],
            ),
            (
                "[role.lease]\nheld_bytes = \"lots\"\n",
                &["limits.role.\"lease\".held_bytes"][..],
            ),
            (
                "[role.lease]\nstarts_per_hour = \"many\"\n",
                &["limits.role.\"lease\".starts_per_hour", "no count"][..],
            ),
            (
                "[principal.\"libvirt-qmeu\"]\nleases = 1\n",
                &["limits.principal.\"libvirt-qmeu\"", "no user"][..],
            ),
        ] {
            let err = toml::from_str::<TenantsSpec>(text)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            for w in words {
                assert!(err.contains(w), "{text:?}: {err} lacks {w:?}");
            }
        }
    }
}
