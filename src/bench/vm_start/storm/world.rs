//! One storm's world, and starting its VMs through the chosen VMM.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::super::libvirt::LibvirtStarter;
use super::super::{Result, Vmm, SETTLE};
use super::StormCase;
use crate::bench::cgroup::VmmCgroups;
use crate::bench::daemon::BenchDaemon;
use crate::page_size::PageSize;
use crate::pool::PoolPolicy;

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
        self.daemon.pool().set_policy(policy);
        self.daemon.settle(SETTLE)?;
        // A lowered target is met only once the worker trimmed the files above it.
        let pool = self.daemon.pool();
        let deadline = Instant::now() + SETTLE;
        while !(pool.is_idle()
            && pool
                .status()
                .kinds
                .iter()
                .all(|k| k.warm_bytes == k.target_bytes))
        {
            if Instant::now() > deadline {
                return Err(crate::bench::daemon::BenchDaemonError::Settle {
                    seconds: SETTLE.as_secs(),
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
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
