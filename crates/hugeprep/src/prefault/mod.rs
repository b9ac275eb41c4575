//! Parallel, NUMA-pinned preallocation of hugetlbfs files: the cold path that gets kernel
//! hugepages into a file, on the right node, as fast as the kernel zeroes them, with every
//! page proven present before a VMM sees it.
//!
//! [`prefault`] maps a byte range of a [`BackingFile`] shared (without `MAP_NORESERVE`, so a
//! pool too small fails at `mmap` with `ENOMEM` before any page is touched), binds the mapping
//! to the node (`mbind`), splits the range into one disjoint contiguous chunk per worker (two
//! threads on one file's `fallocate` serialise on the inode lock), and has each worker, pinned
//! to one of the node's CPUs (a lone worker: to all of them), fault its chunk with
//! `MADV_POPULATE_WRITE` in large extents.
//! Kernels without `MADV_POPULATE_WRITE` (before 5.14, `EINVAL`) fall back to `mlock`, which
//! faults through the same get-user-pages path. Both report failure as an error, so a pool
//! that runs dry never sends `SIGBUS`. Then `mincore` proves every page present and the
//! mapping is locked (the bulk pin).
//!
//! [`prepare`] builds on it: validate the request, check the pool, create the file, fill it,
//! and remove the file again on any failure. [`grow`] extends a file and faults only the new
//! tail (shrinking back on failure).
//!
//! [`BackingFile`]: crate::hugetlb::BackingFile

mod engine;
mod prepare;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde::Serialize;

use crate::hugetlb::{FileError, PoolError};
use crate::page_size::PageSize;
use crate::sys::affinity::AffinityError;
use crate::sys::mmap::MmapError;
use crate::sys::numa::NumaError;
use crate::topology::TopologyError;

pub use engine::{prefault, prefault_mapped, Prefaulted};
pub use prepare::{grow, prepare, validate, PrepareError, PrepareSpec, Prepared, Target};

/// Bytes below which a request gets no extra worker thread: a thread costs more to start
/// and pin than it saves on less than this.
pub const MIN_BYTES_PER_THREAD: u64 = 256 << 20;

/// Default bytes per `MADV_POPULATE_WRITE` call: large enough that the system call cost
/// vanishes, small enough for progress and cancellation to stay responsive.
pub const DEFAULT_EXTENT: u64 = 128 << 20;

/// How pages are faulted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Populate {
    /// `MADV_POPULATE_WRITE`, falling back to `mlock` where the kernel lacks it.
    #[default]
    Auto,
    /// `MADV_POPULATE_WRITE` only (Linux 5.14+).
    PopulateWrite,
    /// `mlock`, which faults every page through get-user-pages (any kernel); the fallback.
    Mlock,
    /// `fallocate` on the file, by one worker bound to the node (`set_mempolicy`), without a
    /// mapping: it takes the file's inode lock only, never the process's `mmap_lock`, which
    /// a populate holds for its whole length and every `mmap`/`munmap` of another thread
    /// waits behind. For the daemon's many small concurrent faults (leases, refills); one
    /// worker because two threads on one file serialise on its inode lock. With
    /// [`PrefaultOptions::lock`] the range is mapped afterwards to prove and lock it.
    Fallocate,
}

/// How to prefault.
#[derive(Debug, Clone)]
pub struct PrefaultOptions {
    /// Worker threads; `None` picks [`default_threads`].
    pub threads: Option<usize>,
    /// The clearing policy's thread count for this CPU, used when `threads` is `None`.
    pub policy_threads: Option<usize>,
    /// NUMA node to take the pages from and run the workers on; `None`: no memory binding,
    /// workers on the CPUs this process may use.
    pub node: Option<u32>,
    /// Bytes per populate call (rounded to whole pages).
    pub extent: u64,
    /// Lock the mapping after populating it (the bulk pin; only lasts as long as the
    /// mapping, see [`prefault_mapped`]).
    pub lock: bool,
    /// How to fault pages.
    pub populate: Populate,
    /// The CPUs of `node` the workers may run on, where the caller knows them (the daemon's
    /// topology); `None` reads them from sysfs.
    pub cpus: Option<Vec<usize>>,
    /// Set to `true` (e.g. by [`crate::sys::signals::cancel_on_signals`]) to stop the workers between extents.
    pub cancel: Option<Arc<AtomicBool>>,
    /// What the workers wait on before each extent (the pool's start gate, for refills).
    pub yield_to: Option<Arc<dyn crate::background::Yield>>,
    /// Where the run records how much of the range the kernel's counters already show as
    /// taken (the pool subtracts the rest from what it may still promise).
    pub taken: Option<Arc<Taken>>,
}

/// How much of a prefault in progress the kernel's hugepage counters already show as
/// taken. A shared mapping reserves every page of its range when it is made: the
/// machine's unreserved free pages and the mount's free blocks drop by the whole range at
/// once, and a node's free pages only as each page is allocated; `fallocate` takes both a
/// page at a time. Allocated pages are read from the file's block count, which the kernel
/// raises just after it took each page from its free pool: neither figure ever runs ahead
/// of the counters.
#[derive(Debug, Default)]
pub struct Taken {
    /// Bytes a mapping of the range reserved when it was made.
    mapped: AtomicU64,
    /// The file being faulted, and its bytes allocated before the run.
    file: OnceLock<(std::fs::File, u64)>,
}

impl Taken {
    /// The run begins on `file` (its descriptor is kept until this is dropped).
    fn begin(&self, file: &crate::hugetlb::BackingFile) {
        if let Ok(f) = file.file().try_clone() {
            let before = allocated_bytes(&f);
            // Set once per run: a second `begin` keeps the first's count.
            let _ = self.file.set((f, before));
        }
    }

    /// A mapping of `bytes` of the range was made (and reserved its pages).
    fn mapped(&self, bytes: u64) {
        self.mapped.fetch_max(bytes, Ordering::Relaxed);
    }

    /// [`Taken::mapped`], for the pool's unit tests.
    #[cfg(test)]
    pub(crate) fn mapped_for_test(&self, bytes: u64) {
        self.mapped(bytes);
    }

    /// Bytes the run allocated so far (gone from the node's free pages).
    pub fn allocated(&self) -> u64 {
        self.file
            .get()
            .map_or(0, |(f, before)| allocated_bytes(f).saturating_sub(*before))
    }

    /// Bytes the run reserved or allocated so far (gone from the machine's unreserved free
    /// pages and from the mount's free blocks).
    pub fn reserved(&self) -> u64 {
        self.mapped.load(Ordering::Relaxed).max(self.allocated())
    }
}

/// Bytes of pages in `file` (its block count; 0 where it cannot be read).
fn allocated_bytes(file: &std::fs::File) -> u64 {
    use std::os::unix::fs::MetadataExt;
    file.metadata().map_or(0, |m| m.blocks() * 512)
}

impl Default for PrefaultOptions {
    fn default() -> Self {
        PrefaultOptions {
            threads: None,
            policy_threads: None,
            node: None,
            extent: DEFAULT_EXTENT,
            lock: true,
            populate: Populate::Auto,
            cpus: None,
            cancel: None,
            yield_to: None,
            taken: None,
        }
    }
}

/// What a prefault did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefaultReport {
    /// Bytes faulted in (the range's length).
    pub bytes: u64,
    /// Page size of the file.
    pub page_size: PageSize,
    /// Worker threads used.
    pub threads: usize,
    /// The CPU each worker started on, by worker: pinned there when there are several; a
    /// lone worker may move among the node's CPUs (see `affinity`).
    pub cpus: Vec<usize>,
    /// The CPUs each worker's `sched_getaffinity` reported after pinning, by worker: the
    /// kernel's word for where the workers ran (a cpuset can refuse a pin silently).
    pub affinity: Vec<Vec<usize>>,
    /// Node the memory was bound to.
    pub node: Option<u32>,
    /// Seconds from mapping to proven present (and locked).
    pub seconds: f64,
    /// Throughput in GB/s (10^9 bytes).
    pub gbps: f64,
    /// How the pages were faulted (`populate-write` or `mlock`).
    pub method: Populate,
    /// Whether the mapping was locked.
    pub locked: bool,
}

/// Errors from prefaulting; each names the file, range, node or page size involved.
#[derive(Debug, thiserror::Error)]
pub enum PrefaultError {
    /// The range is empty, not page-aligned or past the end of the file.
    #[error(
        "range {start}..{end} of {path} (size {file_size}) is not a non-empty range of whole \
         {page_size} pages inside the file"
    )]
    Range {
        /// The file.
        path: std::path::PathBuf,
        /// Range start.
        start: u64,
        /// Range end.
        end: u64,
        /// File size.
        file_size: u64,
        /// Page size.
        page_size: PageSize,
    },
    /// The thread count is zero.
    #[error("threads: must be at least 1")]
    Threads,
    /// The node does not exist.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// Too few free pages: checked before the file is mapped.
    #[error(
        "{scope}: {needed} free {page_size} pages needed for {path}, only {free} free \
         (raise the pool: hugeprep pool --set N --page-size {page_size})"
    )]
    Insufficient {
        /// Node or system.
        scope: crate::hugetlb::Scope,
        /// Page size.
        page_size: PageSize,
        /// Pages needed.
        needed: u64,
        /// Pages free and unreserved.
        free: u64,
        /// The file.
        path: std::path::PathBuf,
    },
    /// Reading the pool failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// Mapping the file failed; `ENOMEM` means the kernel could not reserve the pages.
    #[error("reserving {page_size} pages for {bytes} bytes of the file: {source}")]
    Reserve {
        /// Bytes mapped.
        bytes: u64,
        /// Page size.
        page_size: PageSize,
        /// The mapping error, with the path.
        source: FileError,
    },
    /// Binding the mapping to the node failed.
    #[error(transparent)]
    Bind(#[from] NumaError),
    /// Pinning a worker failed.
    #[error(transparent)]
    Pin(#[from] AffinityError),
    /// Faulting an extent failed (`ENOMEM`: the node ran out of pages).
    #[error("{path}: populating bytes {offset}..{end} on {scope}: {source}")]
    Populate {
        /// The file.
        path: std::path::PathBuf,
        /// File offset of the extent.
        offset: u64,
        /// End of the extent.
        end: u64,
        /// Node or system.
        scope: crate::hugetlb::Scope,
        /// The kernel's answer.
        source: MmapError,
    },
    /// `fallocate` of an extent failed.
    #[error("{path}: allocating bytes {offset}..{end} on {scope}: {source}")]
    Allocate {
        /// The file.
        path: std::path::PathBuf,
        /// File offset of the extent.
        offset: u64,
        /// End of the extent.
        end: u64,
        /// Node or system.
        scope: crate::hugetlb::Scope,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// A page was still missing after populating.
    #[error("{path}: the page at file offset {offset} is not present after populating")]
    Missing {
        /// The file.
        path: std::path::PathBuf,
        /// File offset of the first missing page.
        offset: u64,
    },
    /// Checking presence or locking failed.
    #[error("{path}: {source}")]
    Verify {
        /// The file.
        path: std::path::PathBuf,
        /// The failing call.
        source: MmapError,
    },
    /// The cancel flag was set.
    #[error("{path}: cancelled after {done} of {bytes} bytes")]
    Cancelled {
        /// The file.
        path: std::path::PathBuf,
        /// Bytes faulted before stopping.
        done: u64,
        /// Bytes asked for.
        bytes: u64,
    },
    /// Resizing the file failed.
    #[error(transparent)]
    File(#[from] FileError),
    /// A worker thread panicked.
    #[error("a prefault worker panicked")]
    WorkerPanicked,
}

/// The worker count for `size` bytes: the policy's count (or one per CPU of the node),
/// capped by the node's CPUs and by one thread per [`MIN_BYTES_PER_THREAD`].
///
/// ```
/// use hugeprep::prefault::default_threads;
/// assert_eq!(default_threads(64 << 30, 16, Some(4)), 4);
/// assert_eq!(default_threads(64 << 30, 2, Some(4)), 2);
/// assert_eq!(default_threads(300 << 20, 16, None), 1);
/// assert_eq!(default_threads(1 << 30, 16, None), 4);
/// ```
pub fn default_threads(size: u64, node_cpus: usize, policy_threads: Option<usize>) -> usize {
    let by_size = usize::try_from(size / MIN_BYTES_PER_THREAD).unwrap_or(usize::MAX);
    policy_threads
        .unwrap_or(node_cpus)
        .min(node_cpus)
        .min(by_size)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_caps() {
        assert_eq!(default_threads(0, 8, None), 1);
        assert_eq!(default_threads(256 << 20, 8, None), 1);
        assert_eq!(default_threads(512 << 20, 8, None), 2);
        assert_eq!(default_threads(1 << 40, 8, None), 8);
        assert_eq!(default_threads(1 << 40, 0, Some(3)), 1);
    }
}
