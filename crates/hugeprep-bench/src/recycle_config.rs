//! What `hugeprep bench recycle` runs, how it fails, and the in-process daemon its latency
//! parts (quiet, `--hog`, `--churn`, floods) lease from.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::daemon::{BenchDaemon, BenchDaemonError};
use hugeprep::clear::{ClearError, ClearPlan, Method};
use hugeprep::client::ClientError;
use hugeprep::hugetlb::{FileError, MountError};
use hugeprep::page_size::PageSize;
use hugeprep::pool::{fault, PoolPolicy};
use hugeprep::scrub::ScrubError;

/// What to run.
#[derive(Debug, Clone)]
pub struct RecycleBenchConfig {
    /// Bytes per file for the throughput part.
    pub size: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Threads for both paths.
    pub threads: usize,
    /// Measured repetitions per path.
    pub reps: usize,
    /// Leases for the latency part (0 skips it).
    pub leases: usize,
    /// Bytes per lease.
    pub lease_size: u64,
    /// Clearing plan (the one in use: rule plus calibration).
    pub plan: ClearPlan,
    /// Methods timed clearing the same mapped file without the scrub's work around the
    /// clear, for the best clearing throughput at this thread count (goal b).
    pub methods: Vec<Method>,
    /// Directory for the journal of the latency part (fsync cost depends on it).
    pub state_dir: Option<PathBuf>,
    /// Also time warm leases with a busy-looping process on every CPU, against quiet
    /// (`--hog`, see [`crate::hog`]).
    pub hog: bool,
    /// Also time warm leases while another client leases and releases in a loop, so the
    /// worker journals, truncates and deletes meanwhile, against quiet (`--churn`, see
    /// [`crate::churn`]).
    pub churn: bool,
    /// Bytes per lease of the churning client (default: twice `lease_size`).
    pub churn_size: Option<u64>,
    /// Nice value of the benchmark's client thread during `--hog` (default: unchanged, i.e.
    /// an ordinary caller); `-10` times a caller that runs at the API's priority.
    pub client_nice: Option<i32>,
    /// Extra processes of a busy host the release proof is timed beside, after the quiet
    /// host (0: quiet only; see [`crate::host`]).
    pub host_processes: usize,
    /// Threads of one lessee's open floods, each timed against another tenant's opens and
    /// the daemon's ([`crate::flood`]); empty: none.
    pub flood: Vec<usize>,
}

/// A recycle benchmark failed; every variant keeps the failing layer's own error.
#[derive(Debug, thiserror::Error)]
pub enum RecycleBenchError {
    /// A setting is out of range.
    #[error("bench recycle: --{field}: {reason}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// Creating, mapping or removing a backing file failed.
    #[error("bench recycle: {0}")]
    File(#[from] FileError),
    /// The benchmark's own hugetlbfs could not be mounted.
    #[error("bench recycle: {0}")]
    Mount(#[from] MountError),
    /// The kernel's hugepage pool could not be read or raised.
    #[error("bench recycle: {0}")]
    KernelPool(#[from] hugeprep::hugetlb::PoolError),
    /// Faulting a file's pages failed.
    #[error("bench recycle: {0}")]
    Fault(#[from] fault::FaultError),
    /// Running the warm pool failed.
    #[error("bench recycle: {0}")]
    WarmPool(#[from] hugeprep::pool::PoolError),
    /// The clearing plan cannot run on this CPU.
    #[error("bench recycle: {0}")]
    Clear(#[from] ClearError),
    /// A scrub failed.
    #[error("bench recycle: {0}")]
    Scrub(#[from] ScrubError),
    /// A lease request over the API failed.
    #[error("bench recycle: {0}")]
    Client(#[from] ClientError),
    /// The benchmark's daemon failed to start or to refill its pool.
    #[error("bench recycle: {0}")]
    Daemon(#[from] BenchDaemonError),
    /// Timing the release proof failed (a lessee process or its cgroup).
    #[error("bench recycle: proof: {0}")]
    Proof(std::io::Error),
}

/// The in-process daemon of the latency parts: `warm_files` warm files of the lease size on
/// `mount`, its journal and socket under `base`, no scrub cap and no lessee grace (that would
/// make every settle wait for it; these parts time the lease alone).
pub(crate) fn lease_daemon(
    cfg: &RecycleBenchConfig,
    mount: &Path,
    base: &Path,
    warm_files: u64,
) -> Result<BenchDaemon, RecycleBenchError> {
    let mut policy = PoolPolicy::embedded();
    policy.set_warm(
        cfg.page_size,
        warm_files * cfg.lease_size,
        vec![cfg.lease_size],
    );
    policy.scrub_bandwidth = None;
    policy.threads = cfg.threads;
    let daemon = BenchDaemon::start(base, mount, policy, cfg.plan)?;
    daemon.pool().set_lessee_grace(Duration::ZERO);
    Ok(daemon)
}
