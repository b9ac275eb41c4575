//! The parts of [`Pool`](super::Pool), one concern each, and the one builder that puts them
//! together for the daemon ([`Pool::open`](super::Pool::open)) and for the driver's tests
//! (`Pool::with_host`).
//!
//! | part | owns |
//! |------|------|
//! | [`Settings`] | what the pool serves: mounts, topology, the policy, the API's targets |
//! | [`Table`] | the file table under the state lock, its condvar, shutdown, counters |
//! | [`KernelSide`] | pages added to the kernel's pools, the raise/drain gate, refusals |
//! | [`Tenants`] | per-principal limits, kept files, the scope key, long-term pins |
//! | [`Clearing`] | the scrubber, its control, the start gate, the release proof |
//!
//! The host (every effect) is the sixth field of `Pool` itself.

mod clearing;
mod kernel_side;
mod settings;
mod table;
mod tenants;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub(super) use clearing::Clearing;
pub(super) use kernel_side::KernelSide;
pub(super) use settings::Settings;
pub(super) use table::Table;
pub(super) use tenants::Tenants;

use super::{host, reach, reserve, targets, tenant, Pool, PoolMount, PoolPolicy, Result};
use crate::page_size::PageSize;
use crate::scrub::Scrubber;
use crate::topology::Topology;

/// The small state files beside the journal, opened before recovery so that a bad one
/// stops the start before the journal is touched.
pub(super) struct StateFiles {
    reservations: reserve::Reservations,
    scope_key: tenant::ScopeKey,
    api_targets: targets::ApiTargets,
}

impl StateFiles {
    /// Opens the reservations' ledger `pools` keep, and the tenants' key and the API's
    /// targets in `state_dir`.
    pub(super) fn open(
        state_dir: &Path,
        pools: Arc<dyn host::KernelPools>,
        mounts: &BTreeMap<PageSize, PoolMount>,
        topology: &Topology,
    ) -> Result<StateFiles> {
        let page_sizes = mounts.keys().copied().collect();
        Ok(StateFiles {
            reservations: reserve::Reservations::on(pools)?,
            scope_key: tenant::ScopeKey::open(state_dir)?,
            api_targets: targets::ApiTargets::open(state_dir, &page_sizes, topology)?,
        })
    }
}

/// Everything a pool is built from, once its journal is recovered.
pub(super) struct Build {
    pub(super) mounts: Arc<BTreeMap<PageSize, PoolMount>>,
    pub(super) topology: Topology,
    pub(super) policy: PoolPolicy,
    pub(super) host: Arc<dyn host::Host>,
    pub(super) scrubber: Arc<Scrubber>,
    pub(super) reach: Arc<reach::Reach>,
    pub(super) files: StateFiles,
    /// What recovery found: the files, the first free id, and whether the last stop was clean.
    pub(super) recovered: (super::core::Core, bool),
}

impl Build {
    /// The pool: the API's targets applied to the policy, the start gate on the proof.
    pub(super) fn finish(self) -> Arc<Pool> {
        let (core, clean_start) = self.recovered;
        let mut policy = self.policy;
        self.files.api_targets.apply(&mut policy);
        let clearing = Clearing::new(self.scrubber, self.reach, policy.lessee_grace);
        Arc::new(Pool {
            settings: Settings::new(self.mounts, self.topology, policy, self.files.api_targets),
            host: self.host,
            table: Table::new(core, clean_start),
            kernel: KernelSide::new(self.files.reservations),
            tenants: Tenants::new(self.files.scope_key),
            clearing,
        })
    }
}
