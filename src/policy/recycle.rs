//! How released lease memory comes back to the pool: scrubbed in place once proven out of
//! everyone else's reach, or always the kernel's path (`docs/security.md`). The rule comes
//! from the policy, the lease's owner, the API role that asks, and the lease; the strictest
//! wins.

use serde::{Deserialize, Serialize};

use super::pool::PoolPolicy;

/// How a released lease's memory comes back to the pool (see `docs/security.md`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Recycle {
    /// Scrubbed in place when the daemon proves that nobody else can reach the file's pages
    /// any more; otherwise the kernel's path.
    #[default]
    Proven,
    /// Always the kernel's path: the file is truncated (pages nobody holds go back to the
    /// kernel's free list) and deleted, and the refill faults new pages, zeroed by the kernel.
    Kernel,
}

impl Recycle {
    /// The name used in TOML, JSON and logs.
    pub fn name(self) -> &'static str {
        match self {
            Recycle::Proven => "proven",
            Recycle::Kernel => "kernel",
        }
    }
}

/// The API roles `[pool.recycle_roles]` may name (`crate::api::access::Role`).
pub const ROLES: [&str; 3] = ["read", "lease", "admin"];

/// Checks the names of `recycle_roles` and `recycle_owners`: a role outside [`ROLES`], or an
/// owner that is empty or names no user on this host, would silently leave `kernel` off for
/// the tenants it was written for. The error names the key, the value and what is known.
pub fn check_names<'a>(
    roles: impl IntoIterator<Item = &'a String>,
    owners: impl IntoIterator<Item = &'a String>,
) -> Result<(), (String, String)> {
    for role in roles {
        if !ROLES.contains(&role.as_str()) {
            return Err((
                format!("recycle_roles.{role:?}"),
                format!(
                    "{role:?} is no API role: the roles are {}",
                    ROLES.join(", ")
                ),
            ));
        }
    }
    for owner in owners {
        if owner.trim().is_empty() {
            return Err((
                format!("recycle_owners.{owner:?}"),
                "an empty owner names nobody: give a user name of this host".into(),
            ));
        }
        match nix::unistd::User::from_name(owner) {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err((
                    format!("recycle_owners.{owner:?}"),
                    format!(
                        "{owner:?} names no user on this host (owners are user names, as in `getent passwd`)"
                    ),
                ))
            }
            Err(e) => {
                return Err((
                    format!("recycle_owners.{owner:?}"),
                    format!("cannot look up user {owner:?}: {e}"),
                ))
            }
        }
    }
    Ok(())
}

impl PoolPolicy {
    /// A lease's own `recycle` made at least as strict as the rule for the API role that
    /// asks for it (see [`PoolPolicy::recycle_for`]).
    pub fn recycle_for_role(&self, role: &str, lease: Option<Recycle>) -> Option<Recycle> {
        match self.recycle_roles.get(role) {
            Some(Recycle::Kernel) => Some(Recycle::Kernel),
            _ => lease,
        }
    }

    /// How a lease's memory comes back: the lease's own choice, else its owner's, else the
    /// policy's. `kernel` anywhere wins: a lease cannot ask for less than its owner's rule.
    pub fn recycle_for(&self, owner: Option<&str>, lease: Option<Recycle>) -> Recycle {
        let by_owner = owner.and_then(|o| self.recycle_owners.get(o)).copied();
        [lease, by_owner, Some(self.recycle)]
            .into_iter()
            .flatten()
            .max_by_key(|r| *r == Recycle::Kernel)
            .unwrap_or_default()
    }
}
