//! One size's world per page size: the pages the run borrows, a scratch mount for the files
//! the VMMs make themselves, hugeprep's pool on a mount of its own with its daemon, and the
//! run's directory.

use std::path::PathBuf;

use super::{mem_available, vmm_cgroup, Result, VmStartBenchConfig, VmStartBenchError, SETTLE};
use crate::daemon::BenchDaemon;
use hugeprep::hugetlb::{MountOptions, OwnedMount, PoolTopUp};
use hugeprep::page_size::PageSize;
use hugeprep::pool::{LeaseRequest, PoolPolicy, Verification};
use hugeprep_testkit::cgroup::{VmmCgroup, VmmCgroups};

/// One size's world: fresh files on `scratch`, hugeprep's pool on its own mount.
pub(crate) struct World {
    /// Guest memory size.
    pub size: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Threads.
    pub threads: usize,
    /// A mount for the files QEMU alone creates itself.
    pub scratch: PathBuf,
    /// hugeprep's pool mount (libvirt's `hugetlbfs_mount` and `memory_backing_dir` too:
    /// the hook's hard links cannot cross file systems).
    pub pool_mount: PathBuf,
    /// A directory on an ordinary file system for sockets, XML and configuration.
    pub tmp: PathBuf,
    /// hugeprep's daemon, its pool warm with one file of `size`.
    pub daemon: BenchDaemon,
    /// Where each VMM the run starts itself gets a cgroup of its own (`None`: no cgroup v2).
    pub cgroups: Option<VmmCgroups>,
    /// The machine holds one copy of the VM's memory in these pages, not two: the pool is
    /// emptied (untimed) before each fresh-file case and refilled after it.
    pub one_copy: bool,
    /// The pool policy the world's daemon started with.
    pub policy: PoolPolicy,
}

impl World {
    /// A fresh cgroup for one VMM, when the host has cgroup v2.
    pub fn vmm_cgroup(&self, tag: &str) -> Result<Option<VmmCgroup>> {
        vmm_cgroup(self.cgroups.as_ref(), tag)
    }

    /// The lease of one case: the world's size and page size, named `name`, the rest the
    /// daemon's defaults.
    pub fn lease_request(&self, name: String) -> LeaseRequest {
        LeaseRequest {
            name,
            size: self.size,
            page_size: Some(self.page_size),
            ..LeaseRequest::default()
        }
    }

    /// Waits until the pool is warm again (between starts, untimed).
    pub fn settle(&self) -> Result<()> {
        Ok(self.daemon.settle(SETTLE)?)
    }

    /// Sets the pool's target to `bytes` of files of the run's size (`policy` otherwise)
    /// and waits until the pool holds exactly that: filled up, or trimmed down so that a
    /// fresh file can have the pages (untimed).
    pub fn set_warm(&self, policy: &PoolPolicy, bytes: u64) -> Result<()> {
        let mut p = policy.clone();
        p.set_warm(self.page_size, bytes, vec![self.size]);
        Ok(self.daemon.set_policy_settled(p, SETTLE)?)
    }
}

/// The run's journal and socket directory on an ordinary file system; removed on drop.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn named(tag: &str) -> Result<TempDir> {
        let dir = std::env::temp_dir().join(format!(
            "hugeprep-bench-vm-start-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|source| VmStartBenchError::Io {
            op: "create the run's directory",
            source,
        })?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How many copies of a VM of `pages` pages of `ps` the machine holds for the run (2: the
/// warm pool and a fresh file; 1: the pool is emptied for the fresh-file cases), with the
/// pages topped up; `Err` with the reason when not even one.
pub(super) fn top_up(
    cfg: &VmStartBenchConfig,
    size: u64,
    ps: PageSize,
) -> std::result::Result<(PoolTopUp, bool), String> {
    let pages = size / ps.bytes();
    // Pages a raise would take from the rest of the machine: the pool's free pages are
    // already set aside.
    let free = hugeprep::hugetlb::pool::available(None, ps).unwrap_or(0);
    let fits = |copies: u64| {
        let taken = copies.saturating_mul(pages).saturating_sub(free) * ps.bytes();
        taken == 0 || !mem_available().is_some_and(|m| m < taken + cfg.headroom)
    };
    let mut why = format!(
        "needs {} of {ps} hugepages, more than the pool's free pages and the memory available \
         less the headroom",
        hugeprep::units::format_bytes(size)
    );
    for copies in [2, 1] {
        if !fits(copies) {
            continue;
        }
        match PoolTopUp::ensure_free(None, ps, copies * pages) {
            Ok(top_up) => return Ok((top_up, copies == 1)),
            Err(e) => why = e.to_string(),
        }
    }
    Err(why)
}

/// One page size's world for `size`: its pages, mounts, directory and daemon, settled.
pub(super) struct PageWorld {
    // Dropped in order: the world (its daemon and files), the mounts, then the pages.
    pub(super) world: World,
    _pool_mount: OwnedMount,
    _scratch: OwnedMount,
    _tmp: TempDir,
    _top_up: PoolTopUp,
}

pub(super) fn page_world(
    cfg: &VmStartBenchConfig,
    size: u64,
    ps: PageSize,
    top_up: PoolTopUp,
    one_copy: bool,
    cgroups: Option<&VmmCgroups>,
) -> Result<PageWorld> {
    // The pages (the warm pool's and one fresh file's) stay in the kernel's hugetlb pool for
    // the whole size: pages handed back to the buddy allocator between starts would come back
    // cold.
    let scratch = OwnedMount::new_temp(&std::env::temp_dir(), &MountOptions::new(ps))?;
    let pool_mount = OwnedMount::new_temp(&std::env::temp_dir(), &MountOptions::new(ps))?;
    let tmp = TempDir::named(&format!("{size}-{}", ps.name()))?;
    let mut policy = PoolPolicy::embedded();
    policy.set_warm(ps, size, vec![size]);
    policy.scrub_bandwidth = None;
    policy.threads = cfg.threads;
    policy.verify = Verification::Sample;
    let daemon = BenchDaemon::start(&tmp.0, pool_mount.path(), policy.clone(), cfg.plan)?;
    let world = World {
        size,
        page_size: ps,
        threads: cfg.threads,
        scratch: scratch.path().to_path_buf(),
        pool_mount: pool_mount.path().to_path_buf(),
        tmp: tmp.0.clone(),
        daemon,
        cgroups: cgroups.cloned(),
        one_copy,
        policy,
    };
    world.settle()?;
    Ok(PageWorld {
        world,
        _pool_mount: pool_mount,
        _scratch: scratch,
        _tmp: tmp,
        _top_up: top_up,
    })
}
