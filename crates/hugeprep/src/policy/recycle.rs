//! How released lease memory comes back to the pool: scrubbed in place once proven out of
//! everyone else's reach, or always the kernel's path (`docs/security.md`). The rule comes
//! from the policy, the lease's owner, the API role that asks, and the lease; the strictest
//! wins.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
    /// The stricter of the two (`kernel` wins).
    pub fn max_strict(self, other: Recycle) -> Recycle {
        if self == Recycle::Kernel || other == Recycle::Kernel {
            Recycle::Kernel
        } else {
            Recycle::Proven
        }
    }

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

/// Checks the names of `recycle_roles` and resolves the keys of `recycle_owners` to uids:
/// a role outside [`ROLES`], or an owner that is empty or names no user on this host, would
/// silently leave `kernel` off for the tenants it was written for. An owner is a user name
/// or a uid (as the libvirt hook sends it); the lease's uid is what the rule is matched
/// against, whichever way the request named its owner. The error names the key, the value
/// and what is known.
pub fn resolve_names<'a>(
    roles: impl IntoIterator<Item = &'a String>,
    owners: impl IntoIterator<Item = (&'a String, &'a Recycle)>,
) -> Result<BTreeMap<u32, Recycle>, (String, String)> {
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
    let mut by_uid = BTreeMap::new();
    for (owner, rule) in owners {
        let key = || format!("recycle_owners.{owner:?}");
        if owner.trim().is_empty() {
            return Err((
                key(),
                "an empty owner names nobody: give a user name of this host".into(),
            ));
        }
        let uid = match owner.parse::<u32>() {
            Ok(uid) => uid,
            Err(_) => match nix::unistd::User::from_name(owner) {
                Ok(Some(u)) => u.uid.as_raw(),
                Ok(None) => {
                    return Err((
                        key(),
                        format!(
                            "{owner:?} names no user on this host (owners are user names, as in `getent passwd`, or uids)"
                        ),
                    ))
                }
                Err(e) => return Err((key(), format!("cannot look up user {owner:?}: {e}"))),
            },
        };
        // A name and its uid both listed: the strictest rule wins.
        let e = by_uid.entry(uid).or_insert(*rule);
        if *rule == Recycle::Kernel {
            *e = Recycle::Kernel;
        }
    }
    Ok(by_uid)
}

/// A lease's own `recycle` made at least as strict as the rule in `roles` (the pool
/// policy's `recycle_roles`) for the API role that asks for it.
pub fn for_role(
    roles: &BTreeMap<String, Recycle>,
    role: &str,
    lease: Option<Recycle>,
) -> Option<Recycle> {
    match roles.get(role) {
        Some(Recycle::Kernel) => Some(Recycle::Kernel),
        _ => lease,
    }
}

/// How a lease's memory comes back: the lease's own choice, else its owner's rule, else
/// the policy's. `kernel` anywhere wins: a lease cannot ask for less than its owner's rule.
pub fn strictest(lease: Option<Recycle>, by_owner: Option<Recycle>, policy: Recycle) -> Recycle {
    [lease, by_owner, Some(policy)]
        .into_iter()
        .flatten()
        .max_by_key(|r| *r == Recycle::Kernel)
        .unwrap_or_default()
}
