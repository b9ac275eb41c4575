//! One storm's world, and starting its VMs through the chosen VMM.

use std::path::PathBuf;

use super::super::libvirt::LibvirtStarter;
use super::super::{Result, Vmm, SETTLE};
use super::StormCase;
use crate::daemon::BenchDaemon;
use hugeprep::page_size::PageSize;
use hugeprep::pool::PoolPolicy;
use hugeprep_testkit::cgroup::VmmCgroups;

/// One storm's world: scratch mount, pool mount, the daemon (and libvirtd, dropped first).
pub(super) struct StormWorld {
    pub(super) libvirt: Option<LibvirtStarter>,
    pub(super) count: usize,
    pub(super) size: u64,
    pub(super) ps: PageSize,
    pub(super) threads: usize,
    pub(super) qemu: PathBuf,
    pub(super) scratch: PathBuf,
    pub(super) tmp: PathBuf,
    pub(super) daemon: BenchDaemon,
    pub(super) policy: PoolPolicy,
    /// Where each QEMU the storm starts itself gets a cgroup of its own.
    pub(super) cgroups: Option<VmmCgroups>,
}

impl StormWorld {
    pub(super) fn set_warm(&self, vms: usize) -> Result<()> {
        let mut policy = self.policy.clone();
        policy.set_warm(self.ps, vms as u64 * self.size, vec![self.size]);
        Ok(self.daemon.set_policy_settled(policy, SETTLE)?)
    }

    /// Starts the storm's N VMs at once; returns each VM's seconds to ready (from the common
    /// start) with the VMs and leases given back.
    pub(super) fn storm(&self, vmm: Vmm, case: StormCase, tag: usize) -> Result<Vec<f64>> {
        match (vmm, &self.libvirt) {
            (Vmm::Libvirt, Some(lv)) => self.storm_libvirt(lv, case, tag),
            _ => self.storm_qemu(case, tag),
        }
    }
}
