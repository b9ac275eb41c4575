//! The warm pool and leases.
//!
//! Each pool file is one hugetlbfs file `p<id>` in the pool directory of its page size's
//! mount (`<mount>/hugeprep/pool/`), journaled in the state directory. A lease is one file:
//! a hard link `<mount>/hugeprep/leases/<name>` handed to the VMM, while hugeprep keeps its
//! own link so that deleting the lease path frees nothing.
//!
//! States and transitions (each journaled before it takes effect):
//!
//! ```text
//!   (refill) Filling ──fault──> Warm ──lease──> Leased ──release──> Dirty ──> Scrubbing ──> Warm
//!   (cold lease) Filling ──fault──> Leased              Dirty ──(above target, or held)──> deleted
//! ```
//!
//! A lease taken from a warm file is resized and linked before the lease is journaled; a
//! crash in between leaves a `Warm` record, which is only trusted after a clean shutdown
//! (and a clean shutdown waits for requests in flight), so the file is scrubbed, never
//! handed out unproven. See `docs/pool.md`.

use self::core::aside;
pub mod adaptive;
pub mod capacity;
pub mod core;
mod counters;
mod drain;
mod driver;
#[cfg(test)]
mod driver_tests;
mod error;
pub mod fault;
pub mod gate;
pub mod holes;
mod host;
pub mod idempotency;
mod jobs;
mod kept;
mod kernel;
mod kernel_path;
mod lease;
mod lock_stats;
mod locked;
pub mod on_node;
mod parts;
mod pin;
pub mod placement;
pub mod reach;
mod record;
mod recover;
mod release;
mod request;
pub mod reserve;
pub mod shape;
mod shortfall;
#[cfg(feature = "sim")]
pub mod simulated;
mod state;
mod status;
pub mod targets;
pub mod tenant;
mod worker;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::clear::ClearPlan;
use crate::hugetlb::Owner;
use crate::journal::Journal;
use crate::page_size::PageSize;
use crate::scrub::{ScrubReport, Scrubber};
use crate::topology::Topology;
/// The driver's tests (`use super::*`) call the host's methods on their simulated host.
#[cfg(test)]
use host::Host as _;
use state::State;

pub use crate::policy::pool as policy;
pub use crate::policy::pool::{PoolPolicy, Verification};
pub use capacity::{Capacity, KindCapacity};
pub use counters::{CounterSnapshot, ReleaseFailure};
pub use drain::{DrainReport, DrainRequest};
pub use error::{PoolError, Result};
pub use idempotency::{Idempotency, MAX_IDEMPOTENCY_KEY};
pub use lock_stats::LockSnapshot;
pub use record::{file_key, FileRecord, FileState, LeaseInfo, LeaseRecord, LeaseSource};
pub use recover::RecoveryReport;
pub use request::{check_name, LeaseRequest, ValidRequest, MAX_NAME};
pub use shortfall::{RefusedLease, REFUSAL_RECENT};
pub use status::{KindStatus, PoolStatus};
pub use targets::{TargetsError, TargetsReport, TargetsSource};
pub use tenant::{Tenant, Usage};

/// How long a lease waits for dirty memory to be scrubbed before giving up.
const LEASE_WAIT: Duration = Duration::from_secs(120);

/// How long after a lease or a release the worker leaves the CPUs, the memory bandwidth and
/// the kernel's hugetlb fault mutexes to the VMM that starts on it: its pin and its first
/// touches run within this window (see docs/pinning.md for what was measured).
/// The default; the policy's `lessee_grace_ms` sets it.
pub const LESSEE_GRACE: Duration = Duration::from_secs(2);

/// What the pool needs to start.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The journal directory.
    pub state_dir: PathBuf,
    /// hugetlbfs mounts to use, one per page size (the page size is read from the mount).
    pub mounts: Vec<PathBuf>,
    /// Targets, scrub cap, verification.
    pub policy: PoolPolicy,
    /// How to clear.
    pub plan: ClearPlan,
}

/// The directories hugeprep uses on one hugetlbfs mount.
#[derive(Debug, Clone, Serialize)]
pub struct PoolMount {
    /// Page size of the mount.
    pub page_size: PageSize,
    /// The mount point.
    pub root: PathBuf,
    /// hugeprep's own links (`<root>/hugeprep/pool`, mode 0700).
    pub pool_dir: PathBuf,
    /// Lease paths (`<root>/hugeprep/leases`, mode 0755).
    pub lease_dir: PathBuf,
    /// The pool directory's handle, opened and checked at start (see [`crate::hugetlb::dir`]).
    #[serde(skip)]
    pool_handle: crate::hugetlb::dir::DirHandle,
    /// The lease directory's handle.
    #[serde(skip)]
    lease_handle: crate::hugetlb::dir::DirHandle,
}

impl PoolMount {
    /// Opens (making them when missing) `<root>/hugeprep/{pool,leases}` without following a
    /// link below `root`, and refuses them unless they are directories owned by the daemon's
    /// user; then sets their modes through their handles.
    fn new(root: &Path, page_size: PageSize) -> Result<PoolMount> {
        let uid = nix::unistd::geteuid().as_raw();
        let mount = crate::hugetlb::dir::DirHandle::open(root)?;
        if let Ok(m) = fs::metadata(mount.fd_path()) {
            // Another user may rename names in a root it can write that has no sticky bit:
            // what hugeprep does goes through handles, but the lease paths it hands out are
            // names below that root.
            let others_write = m.mode() & 0o022 != 0 || (m.uid() != uid && m.uid() != 0);
            if others_write && m.mode() & 0o1000 == 0 {
                tracing::warn!(root = %root.display(), mode = format!("{:o}", m.mode() & 0o7777), "mount root writable by others without the sticky bit: they can rename hugeprep's directory under the lease paths it hands out");
            }
        }
        let base = mount.own_subdir("hugeprep", 0o755, uid)?;
        let pool_handle = base.own_subdir("pool", 0o700, uid)?;
        let lease_handle = base.own_subdir("leases", 0o755, uid)?;
        Ok(PoolMount {
            page_size,
            root: root.to_path_buf(),
            pool_dir: pool_handle.path().to_path_buf(),
            lease_dir: lease_handle.path().to_path_buf(),
            pool_handle,
            lease_handle,
        })
    }

    /// The pool file of `id`, named through the pool directory's handle
    /// (`/proc/self/fd/N/p<id>`), so no rename above it can send it elsewhere.
    pub fn file_path(&self, id: u64) -> PathBuf {
        self.pool_handle.fd_path().join(file_key(id))
    }

    /// The pool directory through its handle (for listing it).
    pub fn pool_dir_handle(&self) -> &crate::hugetlb::dir::DirHandle {
        &self.pool_handle
    }

    /// The lease directory through its handle (for listing and emptying it).
    pub fn lease_dir_handle(&self) -> &crate::hugetlb::dir::DirHandle {
        &self.lease_handle
    }
}

use self::core::{Entry, Released, Work};

/// The warm pool: files, leases, the journal and the background worker's shared state,
/// in parts of one concern each (see [`parts`]).
#[derive(Debug)]
pub struct Pool {
    /// What the pool serves: mounts, topology, policy, the API's targets.
    settings: parts::Settings,
    /// Every effect the driver performs: journal, files, free pages, clock (see [`host`]).
    host: Arc<dyn host::Host>,
    /// The file table under the state lock, its condvar, shutdown, counters.
    table: parts::Table,
    /// Pages added to the kernel's pools, the raise/drain gate, refusals.
    kernel: parts::KernelSide,
    /// Per-principal limits, kept files, the scope key, pins.
    tenants: parts::Tenants,
    /// The scrubber, its control, the start gate, the release proof.
    clearing: parts::Clearing,
}

/// The hugeprep directories of each mount, by the page size the mount serves.
fn open_mounts(roots: &[PathBuf]) -> Result<BTreeMap<PageSize, PoolMount>> {
    let mut mounts = BTreeMap::new();
    for root in roots {
        let ps = crate::hugetlb::hugetlbfs_page_size(root)
            .map_err(|source| PoolError::Io {
                op: "statfs",
                path: root.clone(),
                source,
            })?
            .ok_or_else(|| PoolError::Field {
                field: "mount",
                message: format!("{} is not a hugetlbfs mount", root.display()),
            })?;
        mounts.insert(ps, PoolMount::new(root, ps)?);
    }
    Ok(mounts)
}

/// Reconciles the journal with the files `host` keeps and clears the clean mark: the file
/// table (ids from `first_id` up at least) and whether the last stop was clean.
fn recover_core(host: &dyn host::Host, first_id: u64) -> Result<(self::core::Core, bool)> {
    let clean_start = host.journal_was_clean();
    let (files, max_id, report) = recover::reconcile(host, clean_start)?;
    // From here on a crash means warm records must be proven again.
    host.journal_clear_clean()?;
    tracing::info!(
        clean = clean_start,
        kept_leases = report.leases,
        warm = report.warm,
        dirty = report.dirty,
        deleted = report.deleted_files,
        "pool recovered from journal"
    );
    let next_id = (max_id + 1).max(first_id);
    Ok((self::core::Core::with_files(files, next_id), clean_start))
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Removes `link` only when it is still the inode `(dev, ino)`: a user may have replaced
/// the lease path with something else, which is not ours to delete.
fn unlink_if_same(link: &Path, dev: u64, ino: u64) {
    if let Ok(m) = fs::symlink_metadata(link) {
        if m.dev() == dev && m.ino() == ino {
            // A lease path that stays names a file the daemon has taken back (mode 0600, the
            // daemon's); recovery removes it at the next start.
            if let Err(err) = fs::remove_file(link) {
                tracing::warn!(path = %link.display(), %err, "cannot remove a lease path");
            }
        }
    }
}

impl Pool {
    /// Opens the journal, reconciles it with the files on the mounts (see
    /// [`recover`](RecoveryReport)) and returns the pool. Start the worker with
    /// [`Pool::spawn_worker`].
    pub fn open(config: PoolConfig) -> Result<Arc<Pool>> {
        let topology = Topology::detect().map_err(|e| PoolError::Io {
            op: "reading topology",
            path: "/sys/devices/system/node".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let mounts = Arc::new(open_mounts(&config.mounts)?);
        let journal = Journal::open_boot(&config.state_dir)?;
        let pools = Arc::new(host::RealPools::open(&config.state_dir)?);
        let files = parts::StateFiles::open(
            &config.state_dir,
            Arc::clone(&pools) as Arc<dyn host::KernelPools>,
            &mounts,
            &topology,
        )?;
        let supply = kernel::Supply::open(&topology.node_ids(), mounts.keys().copied());
        let scrubber = Arc::new(Scrubber::new(config.plan).map_err(|e| PoolError::Field {
            field: "method",
            message: e.to_string(),
        })?);
        let host = Arc::new(host::RealHost::new(
            Arc::clone(&mounts),
            journal,
            supply,
            pools,
            Arc::clone(&scrubber),
        ));
        let (core, clean_start) = recover_core(host.as_ref(), now_unix() << 20)?;
        // Watching opens starts after recovery, as it always has.
        let reach = reach::Reach::new();
        host.set_reach(Arc::clone(&reach));
        let pool = parts::Build {
            mounts,
            topology,
            policy: config.policy,
            host,
            scrubber,
            reach,
            files,
            recovered: (core, clean_start),
        }
        .finish();
        pool.adopt_kept();
        Pool::spawn_keeper(&pool);
        Ok(pool)
    }

    #[track_caller]
    fn lock(&self) -> locked::Locked<'_> {
        self.table.lock()
    }

    /// The mounts in use, by page size.
    pub fn mounts(&self) -> &BTreeMap<PageSize, PoolMount> {
        &self.settings.mounts
    }

    /// The policy in force (a snapshot: a reload replaces it for later readers).
    pub fn policy(&self) -> Arc<PoolPolicy> {
        self.settings.policy()
    }

    /// Replaces the policy (targets, sizes, verification, scrub bandwidth, reserve limits) of a
    /// running pool, as `systemctl reload` does: leases and warm files are untouched; the
    /// worker fills to or trims to the new targets from its next round. `threads` keeps its
    /// value from the start (the workers' CPU sets are fixed then).
    ///
    /// Targets set over the API ([`Pool::set_targets`]) stay in force in place of the new
    /// policy's, which become the configuration's targets that `DELETE /v1/pool/targets`
    /// returns to.
    pub fn set_policy(&self, mut policy: PoolPolicy) {
        policy.threads = self.policy().threads;
        self.set_lessee_grace(policy.lessee_grace);
        self.settings.set_policy(policy);
        self.table.notify();
    }

    /// The ledger of pages the daemon added to the kernel's pools.
    pub fn reservations(&self) -> &reserve::Reservations {
        &self.kernel.reservations
    }

    /// Bytes faulted since start, on the lease path and by the refill worker.
    pub fn counters(&self) -> CounterSnapshot {
        self.table.counters.snapshot()
    }

    /// Released files that took the kernel's path since start, by reason.
    pub fn kernel_path_by_reason(&self) -> Vec<(&'static str, u64)> {
        self.table.counters.kernel_path_by_reason()
    }

    /// Released files whose recycling failed since start, by stage.
    pub fn failed_releases_by_stage(&self) -> Vec<(&'static str, u64)> {
        self.table.counters.failed_by_stage()
    }

    /// The scrubber (clearing method).
    pub fn scrubber(&self) -> &Scrubber {
        &self.clearing.scrubber
    }

    fn mount(&self, ps: PageSize) -> Result<&PoolMount> {
        self.settings.mount(ps)
    }

    /// The CPUs that fault and scrub memory of `node`.
    fn cpus(&self, node: u32) -> Vec<usize> {
        self.settings.cpus(node)
    }

    /// The lease with `id`.
    pub fn get(&self, lease_id: u64) -> Result<LeaseInfo> {
        self.leases()
            .into_iter()
            .find(|l| l.id == lease_id)
            .ok_or(PoolError::NotFound { id: lease_id })
    }

    /// Every live lease, by id.
    pub fn leases(&self) -> Vec<LeaseInfo> {
        let st = self.lock();
        let mut out: Vec<LeaseInfo> = st
            .core
            .files()
            .filter_map(|e| match &e.rec().state {
                FileState::Leased(l) => Some(LeaseInfo::of(e.rec(), l)),
                _ => None,
            })
            .collect();
        drop(st);
        self.mark_pinned(&mut out);
        out.sort_by_key(|l| l.id);
        out
    }

    /// The leases that name a process, with the process's start time.
    pub fn leases_with_pid(&self) -> Vec<(u64, u32, Option<u64>)> {
        let st = self.lock();
        st.core
            .files()
            .filter_map(|e| match &e.rec().state {
                FileState::Leased(l) => l.pid.map(|p| (l.id, p, l.pid_start)),
                _ => None,
            })
            .collect()
    }

    /// Whether every file is settled: nothing dirty, scrubbing, filling or in flight, and
    /// every target met as far as the kernel allows.
    pub fn is_idle(&self) -> bool {
        let st = self.lock();
        let idle = st.core.files().all(|e| {
            e.busy().is_none() && matches!(e.rec().state, FileState::Warm | FileState::Leased(_))
        });
        idle
    }

    /// Sets how long the worker leaves a new lessee alone (zero: not at all, as before
    /// [`LESSEE_GRACE`] existed; benchmarks compare both).
    pub fn set_lessee_grace(&self, grace: Duration) {
        self.clearing.gate.set_grace(grace);
    }

    /// Turns the start gate on (the default) or off: off, refills and background scrubs run
    /// while VMs start on leases just taken, as before the gate (benchmarks compare both;
    /// see [`gate`]).
    pub fn set_start_gate(&self, enabled: bool) {
        self.clearing.gate.set_enabled(enabled);
        self.table.changed.notify_all();
    }

    /// How released leases are proven (see [`reach::Method`]).
    pub fn proof_method(&self) -> reach::Method {
        self.clearing.reach.method()
    }

    /// Why every release takes the kernel's path, when one thing makes them all do so (see
    /// [`reach::Reach::fallback`]).
    pub fn proof_fallback(&self) -> Option<String> {
        self.clearing.reach.fallback()
    }

    /// Compactions of node memory made for raises of the kernel's pools, since start.
    pub fn compaction_counts(&self) -> reserve::CompactionCounts {
        self.kernel.reservations.compaction_counts()
    }

    /// Proofs whose file system had more mounts than the kernel counts' walk reads (see
    /// [`reach::Reach::proofs_beyond_mount_bound`]).
    pub fn proofs_beyond_mount_bound(&self) -> u64 {
        self.clearing.reach.proofs_beyond_mount_bound()
    }

    /// How long the open watch's reader has been stalled, if it is (see
    /// [`reach::Reach::reader_stalled`]).
    pub fn reader_stalled(&self) -> Option<Duration> {
        self.clearing.reach.reader_stalled()
    }

    /// Stops the worker and running scrubs; requests fail with `ShuttingDown`.
    pub fn shutdown(&self) {
        self.table.shut_down();
        self.clearing.control.cancel();
        self.unpin_all();
        self.table.notify();
    }

    /// After [`Pool::shutdown`] and the worker has exited: records that every warm record
    /// is true, so the next start trusts them.
    pub fn mark_clean_shutdown(&self) -> Result<()> {
        // The journal writes run under the lock on purpose: at a stop, after the worker
        // exited and requests drained, nobody waits for it, and no file may become busy
        // between the check and the clean mark.
        let st = self.lock();
        if st.core.any_busy() {
            tracing::warn!("work still in flight: not marking a clean shutdown");
            return Ok(());
        }
        for action in st.core.prepare_clean_shutdown() {
            if let Err(err) = self.perform(&action) {
                tracing::warn!(%err, "cannot journal a dirty file: not marking a clean shutdown");
                return Ok(());
            }
        }
        Ok(self.host.journal_mark_clean()?)
    }
}
