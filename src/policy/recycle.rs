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
