//! The pool policy: how much memory to keep warm per (node, page size), which file sizes to
//! keep, how fast to scrub in the background and how to verify. Parsed from TOML
//! (`policies/pool.toml`, embedded as the default, or the `[pool]` table of a config file).

use serde::{Deserialize, Serialize};

use crate::page_size::PageSize;
use crate::units::format_bytes;

pub use super::pool_error::PoolPolicyError;
use super::recycle;
pub use super::recycle::Recycle;
pub(crate) use super::target::default_file_size;
use super::target::{field_bytes, round_down};
pub use super::target::{
    AdaptiveGoal, Flavor, FlavorSpec, Percent, Target, TargetSpec, MAX_FLAVORS, MAX_FLAVOR_COUNT,
};

/// The embedded default policy (keeps nothing warm).
pub const EMBEDDED: &str = include_str!("../../../../policies/pool.toml");

/// How a scrubbed file is checked before it is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Verification {
    /// Random cache lines of every page (plus its first and last line).
    #[default]
    Sample,
    /// Every byte.
    Full,
}

/// How the pool chooses the sizes of its warm files (see `docs/pool.md`, "Shape").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// Flavors when given, else the sizes leased recently: released files of a size in demand
    /// are kept, files of other sizes are shrunk to one in demand or given back.
    #[default]
    Demand,
    /// The `sizes` mix only; a released file is kept only while the pool is below its target
    /// (hugeprep 0.1's behaviour, kept for comparison: `hugeprep bench trace`).
    Fixed,
}

/// The policy as written in TOML.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolPolicySpec {
    /// `sample` or `full`.
    #[serde(default)]
    pub verify: Verification,
    /// Background scrub cap in bytes per second, `"0"` for none.
    #[serde(default = "default_bandwidth")]
    pub scrub_bandwidth: String,
    /// Worker threads; 0 = every CPU of the node.
    #[serde(default)]
    pub threads: usize,
    /// Warm targets.
    #[serde(default, rename = "target")]
    pub targets: Vec<TargetSpec>,
    /// `demand` (default) or `fixed`: how warm file sizes are chosen.
    #[serde(default)]
    pub shape: Shape,
    /// Raise a node's kernel pool (`nr_hugepages`) by what its targets lack; `false` leaves
    /// the kernel's pools to the operator.
    #[serde(default = "default_true")]
    pub reserve: bool,
    /// The most hugeprep adds to one node's kernel pools (all page sizes together), e.g.
    /// `"64G"`; none by default (the margin still applies).
    #[serde(default)]
    pub reserve_limit: Option<String>,
    /// Memory every node keeps outside the hugepage pools when hugeprep raises them.
    #[serde(default = "default_margin")]
    pub reserve_margin: String,
    /// On a clean stop, delete the warm files and lower the pools by what hugeprep added
    /// (default: keep them for the next start).
    #[serde(default)]
    pub release_on_stop: bool,
    /// When the kernel gives fewer 1G pages than a raise asks, pull lazily initialised memory
    /// into the page allocator first and ask again (default: true).
    #[serde(default = "default_true")]
    pub reserve_pull_in: bool,
    /// Milliseconds after a lease or a release during which the worker starts no refill or
    /// background scrub, leaving the host to the VMM that starts on the lease (0: none).
    #[serde(default = "default_grace")]
    pub lessee_grace_ms: u64,
    /// How released memory comes back: `proven` (scrub in place once proven unreachable,
    /// the default) or `kernel` (always the kernel's path).
    #[serde(default)]
    pub recycle: Recycle,
    /// Per lease owner (user name): how that owner's released memory comes back.
    #[serde(default)]
    pub recycle_owners: std::collections::BTreeMap<String, Recycle>,
    /// Per API role of the client that makes the lease (`lease`, `admin`).
    #[serde(default)]
    pub recycle_roles: std::collections::BTreeMap<String, Recycle>,
    /// The most one principal may hold, per role and per principal (`[pool.limits]`).
    #[serde(default)]
    pub limits: super::tenants::TenantsSpec,
}

/// The longest lessee grace a policy may ask for, ms.
pub const MAX_LESSEE_GRACE_MS: u64 = 60_000;

fn default_grace() -> u64 {
    2000
}

fn default_bandwidth() -> String {
    "8G".to_string()
}

fn default_true() -> bool {
    true
}

fn default_margin() -> String {
    "1G".to_string()
}

/// How the daemon raises the kernel's pools for its targets (see `docs/operations.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReservePolicy {
    /// Whether the daemon raises pools at all.
    pub enabled: bool,
    /// The most bytes it adds to one node's pools, all page sizes together.
    pub limit: Option<u64>,
    /// Bytes every node keeps available outside the pools.
    pub margin: u64,
    /// Give warm files and added pages back on a clean stop.
    pub release_on_stop: bool,
    /// When the kernel gives fewer gigantic (1G) pages than asked, pull lazily initialised
    /// memory in first (a 2M pool raise of the node's available memory less the margin,
    /// lowered again by exactly what it added) and ask again.
    pub pull_in: bool,
}

impl Default for ReservePolicy {
    fn default() -> Self {
        ReservePolicy {
            enabled: true,
            limit: None,
            margin: 1 << 30,
            release_on_stop: false,
            pull_in: true,
        }
    }
}

/// A validated pool policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolPolicy {
    /// How scrubbed files are verified.
    pub verify: Verification,
    /// Background scrub cap in bytes per second; `None` = no cap.
    pub scrub_bandwidth: Option<u64>,
    /// Worker threads; 0 = every CPU of the node.
    pub threads: usize,
    /// Warm targets.
    pub targets: Vec<Target>,
    /// Raising the kernel's pools for the targets.
    pub reserve: ReservePolicy,
    /// How warm file sizes are chosen.
    pub shape: Shape,
    /// After a lease or a release, the worker waits this long before refilling or scrubbing
    /// in the background (docs/pinning.md).
    pub lessee_grace: std::time::Duration,
    /// How released memory comes back, unless the owner or the lease says otherwise.
    pub recycle: Recycle,
    /// Per lease owner (user name or uid) as written.
    pub recycle_owners: std::collections::BTreeMap<String, Recycle>,
    /// `recycle_owners` resolved to uids at load: what a lease's uid is matched against.
    pub recycle_owner_uids: std::collections::BTreeMap<u32, Recycle>,
    /// Per API role of the client that makes the lease.
    pub recycle_roles: std::collections::BTreeMap<String, Recycle>,
    /// The most one principal may hold (`[pool.limits]`, resolved).
    #[serde(skip)]
    pub tenants: super::tenants::Tenants,
}

impl PoolPolicySpec {
    /// Validates sizes and fills defaults.
    pub fn validate(&self) -> Result<PoolPolicy, PoolPolicyError> {
        let bw = field_bytes("scrub_bandwidth".into(), &self.scrub_bandwidth)?;
        let mut targets = Vec::new();
        for (i, t) in self.targets.iter().enumerate() {
            targets.push(t.validate(&format!("target[{i}]"))?);
        }
        let recycle_owner_uids =
            recycle::resolve_names(self.recycle_roles.keys(), self.recycle_owners.iter())
                .map_err(|(field, message)| PoolPolicyError::Field { field, message })?;
        let limit = match &self.reserve_limit {
            Some(text) => Some(field_bytes("reserve_limit".into(), text)?),
            None => None,
        };
        Ok(PoolPolicy {
            verify: self.verify,
            scrub_bandwidth: (bw > 0).then_some(bw),
            threads: self.threads,
            targets,
            reserve: ReservePolicy {
                enabled: self.reserve,
                limit,
                margin: field_bytes("reserve_margin".into(), &self.reserve_margin)?,
                release_on_stop: self.release_on_stop,
                pull_in: self.reserve_pull_in,
            },
            shape: self.shape,
            lessee_grace: {
                if self.lessee_grace_ms > MAX_LESSEE_GRACE_MS {
                    return Err(PoolPolicyError::Field {
                        field: "lessee_grace_ms".into(),
                        message: format!(
                            "{} ms: at most {MAX_LESSEE_GRACE_MS}",
                            self.lessee_grace_ms
                        ),
                    });
                }
                std::time::Duration::from_millis(self.lessee_grace_ms)
            },
            recycle: self.recycle,
            recycle_owners: self.recycle_owners.clone(),
            recycle_owner_uids,
            recycle_roles: self.recycle_roles.clone(),
            tenants: self.limits.validate()?,
        })
    }
}

impl PoolPolicy {
    /// Parses and validates a policy from TOML text.
    ///
    /// ```
    /// use hugeprep::policy::PoolPolicy;
    /// let p = PoolPolicy::from_toml("[[target]]\npage_size = \"2M\"\nwarm = \"64M\"\n").unwrap();
    /// assert_eq!(p.target_bytes(0, hugeprep::PageSize::Size2M), 64 << 20);
    /// ```
    pub fn from_toml(text: &str) -> Result<PoolPolicy, PoolPolicyError> {
        toml::from_str::<PoolPolicySpec>(text)?.validate()
    }

    /// The embedded default: keeps nothing warm.
    pub fn embedded() -> PoolPolicy {
        // The embedded file is tested to parse; fall back to an empty policy regardless.
        PoolPolicy::from_toml(EMBEDDED).unwrap_or(PoolPolicy {
            verify: Verification::Sample,
            scrub_bandwidth: Some(8 << 30),
            threads: 0,
            targets: Vec::new(),
            reserve: ReservePolicy::default(),
            shape: Shape::Demand,
            lessee_grace: std::time::Duration::from_millis(default_grace()),
            recycle: Recycle::default(),
            recycle_owners: Default::default(),
            recycle_owner_uids: Default::default(),
            recycle_roles: Default::default(),
            tenants: Default::default(),
        })
    }

    /// The target for `(node, page_size)`: a node-specific one wins over a catch-all.
    pub fn target(&self, node: u32, page_size: PageSize) -> Option<&Target> {
        self.targets
            .iter()
            .find(|t| t.page_size == page_size && t.node == Some(node))
            .or_else(|| {
                self.targets
                    .iter()
                    .find(|t| t.page_size == page_size && t.node.is_none())
            })
    }

    /// A lease's own `recycle` made at least as strict as the rule for the API role that
    /// asks for it (see [`PoolPolicy::recycle_for`]).
    pub fn recycle_for_role(&self, role: &str, lease: Option<Recycle>) -> Option<Recycle> {
        recycle::for_role(&self.recycle_roles, role, lease)
    }

    /// How a lease's memory comes back: the lease's own choice, else its owner's (by the
    /// lease's uid, resolved at load), else the policy's. `kernel` anywhere wins: a lease
    /// cannot ask for less than its owner's rule.
    pub fn recycle_for(&self, owner_uid: Option<u32>, lease: Option<Recycle>) -> Recycle {
        let by_owner = owner_uid
            .and_then(|uid| self.recycle_owner_uids.get(&uid))
            .copied();
        recycle::strictest(lease, by_owner, self.recycle)
    }

    /// Bytes to keep warm for `(node, page_size)`.
    pub fn target_bytes(&self, node: u32, page_size: PageSize) -> u64 {
        self.target(node, page_size).map_or(0, |t| t.warm)
    }

    /// Sets (or replaces) a catch-all target, as `hugeprep serve --warm 4G` does.
    pub fn set_warm(&mut self, page_size: PageSize, warm: u64, sizes: Vec<u64>) {
        self.targets
            .retain(|t| !(t.page_size == page_size && t.node.is_none()));
        let warm = round_down(warm, page_size);
        let sizes = if sizes.is_empty() {
            vec![default_file_size(warm, page_size)]
        } else {
            sizes
        };
        self.targets.push(Target {
            page_size,
            node: None,
            warm,
            sizes,
            flavors: Vec::new(),
            adaptive: None,
        });
    }

    /// A one-line description for logs.
    pub fn describe(&self) -> String {
        if self.targets.is_empty() {
            return "no warm targets".into();
        }
        self.targets
            .iter()
            .map(|t| {
                format!(
                    "{} of {} pages on {}",
                    format_bytes(t.warm),
                    t.page_size,
                    t.node.map_or("every node".into(), |n| format!("node {n}"))
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_strictest_recycle_rule_wins() {
        let p = PoolPolicy::from_toml(
            "recycle = \"proven\"\n[recycle_owners]\nnobody = \"kernel\"\n[recycle_roles]\nlease = \"kernel\"\n",
        )
        .unwrap();
        assert_eq!(p.recycle_for(None, None), Recycle::Proven);
        assert_eq!(
            p.recycle_for(Some(65534), Some(Recycle::Proven)),
            Recycle::Kernel
        );
        assert_eq!(
            p.recycle_for(Some(1), Some(Recycle::Kernel)),
            Recycle::Kernel
        );
        assert_eq!(
            p.recycle_for_role("lease", Some(Recycle::Proven)),
            Some(Recycle::Kernel)
        );
        assert_eq!(p.recycle_for_role("admin", None), None);
        assert!(PoolPolicy::from_toml("recycle = \"maybe\"\n").is_err());
    }

    /// Every key that names a role, an owner or a method refuses a name it does not know,
    /// and says which key, which value, and what it knows.
    #[test]
    fn a_misspelt_role_owner_or_method_is_refused_by_name() {
        for (text, words) in [
            (
                "[recycle_roles]\nleese = \"kernel\"\n",
                &[
                    "recycle_roles.\"leese\"",
                    "\"leese\" is no API role",
                    "read, lease, admin",
                ][..],
            ),
            (
                "[recycle_owners]\n\"\" = \"kernel\"\n",
                &["recycle_owners.\"\"", "empty owner"][..],
            ),
            (
                "[recycle_owners]\nlibvirt-qmeu = \"kernel\"\n",
                &[
                    "recycle_owners.\"libvirt-qmeu\"",
                    "names no user on this host",
                ][..],
            ),
            (
                "[recycle_roles]\nlease = \"kernal\"\n",
                &["kernal", "proven", "kernel"][..],
            ),
            ("recycle = \"maybe\"\n", &["maybe", "proven", "kernel"][..]),
            ("verify = \"some\"\n", &["some", "sample", "full"][..]),
            ("shape = \"round\"\n", &["round"][..]),
        ] {
            let err = PoolPolicy::from_toml(text).unwrap_err().to_string();
            for w in words {
                assert!(err.contains(w), "{text:?}: {err:?} lacks {w:?}");
            }
        }
        // Each known role is a role of the API.
        for role in recycle::ROLES {
            serde_json::from_str::<crate::api::access::Role>(&format!("\"{role}\"")).unwrap();
        }
    }

    #[test]
    fn embedded_default_keeps_nothing_warm() {
        let p = PoolPolicy::from_toml(EMBEDDED).unwrap();
        assert!(p.targets.is_empty());
        assert_eq!(p.target_bytes(0, PageSize::Size2M), 0);
        assert_eq!(p.verify, Verification::Sample);
    }

    #[test]
    fn targets_parse_and_node_specific_wins() {
        let p = PoolPolicy::from_toml(
            r#"
            verify = "full"
            scrub_bandwidth = "0"
            [[target]]
            page_size = "2M"
            warm = "1G"
            sizes = ["256M", "512M"]
            [[target]]
            page_size = "2M"
            node = 1
            warm = "2G"
            "#,
        )
        .unwrap();
        assert_eq!(p.verify, Verification::Full);
        assert_eq!(p.scrub_bandwidth, None);
        assert_eq!(p.target_bytes(0, PageSize::Size2M), 1 << 30);
        assert_eq!(p.target_bytes(1, PageSize::Size2M), 2 << 30);
        assert_eq!(
            p.target(0, PageSize::Size2M).unwrap().sizes,
            vec![256 << 20, 512 << 20]
        );
        assert_eq!(p.target(1, PageSize::Size2M).unwrap().sizes, vec![2 << 30]);
        assert!(p.reserve.enabled);
        assert_eq!(p.reserve.margin, 1 << 30);
    }

    #[test]
    fn reserve_is_on_by_default_and_configurable() {
        let p = PoolPolicy::from_toml(
            "reserve = false\nreserve_limit = \"8G\"\nreserve_margin = \"512M\"\nrelease_on_stop = true\n\
             reserve_pull_in = false\n",
        )
        .unwrap();
        assert_eq!(
            p.reserve,
            ReservePolicy {
                enabled: false,
                limit: Some(8 << 30),
                margin: 512 << 20,
                release_on_stop: true,
                pull_in: false,
            }
        );
        assert!(PoolPolicy::embedded().reserve.pull_in);
        let err = PoolPolicy::from_toml("reserve_margin = \"lots\"\n").unwrap_err();
        assert!(err.to_string().contains("reserve_margin"), "{err}");
    }

    #[test]
    fn bad_fields_are_named() {
        let err = PoolPolicy::from_toml(
            "[[target]]\npage_size = \"2M\"\nwarm = \"1G\"\nsizes = [\"3M\"]\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("target[0].sizes[0]"), "{err}");
        let err = PoolPolicy::from_toml("colour = 1\n").unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    /// The hook names its owner by uid, a client by name: both match a rule written by name.
    #[test]
    fn an_owner_rule_matches_the_uid_whichever_way_it_was_named() {
        let root = "root".to_string();
        let zero = "0".to_string();
        let owners = [(&root, &Recycle::Kernel)];
        let uids = recycle::resolve_names([], owners).unwrap();
        assert_eq!(uids.get(&0), Some(&Recycle::Kernel));
        let mut policy = PoolPolicy::embedded();
        policy.recycle_owner_uids = uids;
        assert_eq!(policy.recycle_for(Some(0), None), Recycle::Kernel);
        assert_eq!(
            policy.recycle_for(Some(0), Some(Recycle::Proven)),
            Recycle::Kernel
        );
        assert_eq!(policy.recycle_for(Some(65534), None), Recycle::Proven);
        // A rule written by uid.
        let by_number = recycle::resolve_names([], [(&zero, &Recycle::Kernel)]).unwrap();
        assert_eq!(by_number.get(&0), Some(&Recycle::Kernel));
        // The strictest of a name and its uid.
        let both =
            recycle::resolve_names([], [(&root, &Recycle::Proven), (&zero, &Recycle::Kernel)])
                .unwrap();
        assert_eq!(both.get(&0), Some(&Recycle::Kernel));
    }
}
