//! What the pool serves: its mounts, the machine's topology, the policy in force and the
//! targets set over the API.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::page_size::PageSize;
use crate::pool::{adaptive, targets, PoolError, PoolMount, PoolPolicy, Result};
use crate::topology::Topology;

/// The pool's settings (see the module).
#[derive(Debug)]
pub(in crate::pool) struct Settings {
    /// Shared with the host, which names files on them.
    pub(in crate::pool) mounts: Arc<BTreeMap<PageSize, PoolMount>>,
    pub(in crate::pool) topology: Topology,
    /// Replaced whole by `Pool::set_policy` (a reload); readers take a snapshot.
    policy: RwLock<Arc<PoolPolicy>>,
    /// Warm targets set over the API, persisted; they win over the configuration's.
    pub(in crate::pool) api_targets: targets::ApiTargets,
    /// The adaptive targets' forecasts; their warm bytes go into every policy set.
    pub(in crate::pool) adaptive: adaptive::Adaptive,
}

impl Settings {
    pub(super) fn new(
        mounts: Arc<BTreeMap<PageSize, PoolMount>>,
        topology: Topology,
        mut policy: PoolPolicy,
        api_targets: targets::ApiTargets,
    ) -> Settings {
        let adaptive = adaptive::Adaptive::default();
        adaptive.apply(&mut policy.targets);
        Settings {
            mounts,
            topology,
            policy: RwLock::new(Arc::new(policy)),
            api_targets,
            adaptive,
        }
    }

    /// The policy in force (a snapshot).
    pub(in crate::pool) fn policy(&self) -> Arc<PoolPolicy> {
        Arc::clone(&self.policy.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Replaces the policy, the API's targets applied over it, then the adaptive targets'
    /// current sizes.
    pub(in crate::pool) fn set_policy(&self, mut policy: PoolPolicy) {
        // Under the policy's lock, as every change of it: a change that reads the policy
        // in force and writes it back ([`Settings::reapply_targets`]) cannot then undo a
        // reload that lands in between.
        let mut guard = self.policy.write().unwrap_or_else(|e| e.into_inner());
        self.api_targets.apply(&mut policy);
        self.adaptive.apply(&mut policy.targets);
        *guard = Arc::new(policy);
    }

    /// Puts the configuration's targets back into the policy in force, with the API's
    /// targets and the adaptive sizes over them (after the API's targets changed), under
    /// the policy's lock, so a reload meanwhile is never undone.
    pub(in crate::pool) fn reapply_targets(&self) {
        let mut guard = self.policy.write().unwrap_or_else(|e| e.into_inner());
        let mut policy = (**guard).clone();
        policy.targets = self.api_targets.config_targets();
        self.api_targets.apply(&mut policy);
        self.adaptive.apply(&mut policy.targets);
        *guard = Arc::new(policy);
    }

    /// Puts the adaptive targets' current sizes into the policy in force, under its lock (a
    /// reload or an API change meanwhile is never undone).
    pub(in crate::pool) fn reapply_adaptive(&self) {
        let mut guard = self.policy.write().unwrap_or_else(|e| e.into_inner());
        let mut policy = (**guard).clone();
        self.adaptive.apply(&mut policy.targets);
        *guard = Arc::new(policy);
    }

    /// The mount serving `ps`, or an error naming the page sizes served.
    pub(in crate::pool) fn mount(&self, ps: PageSize) -> Result<&PoolMount> {
        self.mounts.get(&ps).ok_or_else(|| PoolError::Field {
            field: "page_size",
            message: format!(
                "no hugetlbfs mount for {ps} pages: this daemon serves {}",
                self.mounts
                    .keys()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }

    /// The CPUs that fault and scrub memory of `node`.
    pub(in crate::pool) fn cpus(&self, node: u32) -> Vec<usize> {
        let mut cpus = self
            .topology
            .node(node)
            .map(|n| n.cpus.clone())
            .unwrap_or_default();
        if cpus.is_empty() {
            cpus = crate::sys::affinity::allowed_cpus();
        }
        let threads = self.policy().threads;
        if threads > 0 {
            cpus.truncate(threads);
        }
        cpus
    }
}
