//! The pool driver's one I/O boundary: every effect the lease path, the worker's jobs and
//! the driver perform on the host (the journal, files on the hugetlbfs mounts, the kernel's
//! free pages, the clock) goes through [`Host`], so the code that performs a transition is
//! the same whether the host is real ([`RealHost`]) or simulated.
//!
//! The trait is shaped by what the driver does, not by syscalls: "journal this record",
//! "cut file `id` to `size`", "create and fault file `id`", "how many bytes can a new file
//! of this kind still get". Files are named by page size and id ([`FileAt`]); the host
//! resolves them on its mounts.
//!
//! The kernel's pools (`nr_hugepages`, compaction, the reservations' ledger) are the
//! supertrait [`KernelPools`]; the files kept past a release (a read lease or a pin holds
//! them: `kept`, and the pin check before a released file's truncate in `kernel_path`) the
//! supertrait [`Keeper`].

mod keeper;
mod pools;
mod real;
mod real_keeper;
mod real_pools;
// The simulated host: the driver's unit tests, and the `sim` feature's replays in simulated
// time (`pool::simulated`, for `hugeprep bench trace`); never in the daemon's code paths.
#[cfg(any(test, feature = "sim"))]
#[cfg_attr(not(test), allow(dead_code))]
pub(super) mod sim;
#[cfg(any(test, feature = "sim"))]
mod sim_pool;

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::background::Yield;
use crate::hugetlb::{BackingFile, Owner};
use crate::journal::JournalError;
use crate::page_size::PageSize;
use crate::prefault::Taken;
use crate::scrub::{ScrubControl, ScrubError, ScrubOptions, ScrubReport};

use super::core::recovery::{Facts, Step};
use super::fault::FaultError;
use super::holes::{HoleError, Refill};
use super::on_node::{OnNodeError, Stray};
use super::reach::{Proof, Unproven};
use super::record::FileRecord;
use super::state::Promised;

pub(crate) use keeper::{Keeper, KeptAt, Opened};
#[cfg(test)]
pub(crate) use pools::ledger_key;
pub(crate) use pools::{KernelPools, RealPools};
pub(super) use real::RealHost;

/// One pool file, as the host names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileAt {
    /// The page size, which picks the mount.
    pub(super) page_size: PageSize,
    /// The file's id (`p<id>` in the mount's pool directory).
    pub(super) id: u64,
}

impl FileAt {
    /// The file of `rec`.
    pub(super) fn of(rec: &FileRecord) -> FileAt {
        FileAt {
            page_size: rec.page_size,
            id: rec.id,
        }
    }
}

/// A pool file the host opened or created for the driver: kept open while the driver works
/// on it (the release proof and the lease's watch name this open file).
#[derive(Debug)]
pub(super) struct Handle {
    at: FileAt,
    size: u64,
    /// The real host's open file; `None` on a simulated host.
    backing: Option<BackingFile>,
}

impl Handle {
    /// A handle on `at` of `size`, open as `backing` on a real host.
    pub(super) fn new(at: FileAt, size: u64, backing: Option<BackingFile>) -> Handle {
        Handle { at, size, backing }
    }

    /// Which file.
    pub(super) fn at(&self) -> FileAt {
        self.at
    }

    /// The file's length.
    pub(super) fn size(&self) -> u64 {
        self.backing.as_ref().map_or(self.size, BackingFile::size)
    }

    /// What the file takes from the host: its length, or (on a real host) the larger of
    /// its length and its allocated pages ([`BackingFile::extent`]).
    pub(super) fn extent(&self) -> u64 {
        self.backing.as_ref().map_or(self.size, BackingFile::extent)
    }

    /// The real host's open file.
    pub(super) fn backing(&self) -> Option<&BackingFile> {
        self.backing.as_ref()
    }

    /// The real host's open file, for resizing.
    pub(super) fn backing_mut(&mut self) -> Option<&mut BackingFile> {
        self.backing.as_mut()
    }

    /// Records a new length (a simulated host's resize).
    #[cfg(any(test, feature = "sim"))]
    pub(super) fn set_size(&mut self, size: u64) {
        self.size = size;
    }
}

/// The long-term pin of a `pin: true` lease's file, held until its release.
#[derive(Debug)]
pub(super) struct Pin {
    id: u64,
    took: Duration,
    /// The real host's pin (dropping it unpins); `None` on a simulated host.
    real: Option<crate::sys::pin::LongTermPin>,
}

impl Pin {
    /// The pin of file `id`, made in `took`, the real host's `real`.
    pub(super) fn new(id: u64, took: Duration, real: Option<crate::sys::pin::LongTermPin>) -> Pin {
        Pin { id, took, real }
    }

    /// The pinned file's id.
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// How long pinning took.
    pub(super) fn took(&self) -> Duration {
        self.took
    }

    /// The real host's pin.
    pub(super) fn into_real(self) -> Option<crate::sys::pin::LongTermPin> {
        self.real
    }
}

/// An effect on a pool file that the host could not perform.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// No mount serves the file's page size.
    #[error("no hugetlbfs mount for {0} pages")]
    NoMount(PageSize),
    /// The file could not be opened, created or resized.
    #[error(transparent)]
    File(#[from] crate::hugetlb::FileError),
    /// Faulting the file's pages failed (the kernel had too few, or a worker failed).
    #[error(transparent)]
    Fault(#[from] super::fault::FaultError),
    /// A lease path could not be linked, or a tenant's directory made.
    #[error(transparent)]
    Dir(#[from] crate::hugetlb::dir::DirError),
    /// The file's pages could not be pinned.
    #[error(transparent)]
    Pin(#[from] crate::sys::pin::PinError),
    /// The handle is not one of this host's.
    #[error("pool file {0}: the handle is not this host's")]
    Foreign(u64),
    /// The kernel refused a call on the file.
    #[error("pool file {id}: {source}")]
    Io {
        /// The file's id.
        id: u64,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

/// How a background fault yields and reports its progress.
pub(super) struct Background {
    /// Asked between extents whether to go on (the start gate).
    pub(super) gate: Arc<dyn Yield>,
    /// Where the fault records what the kernel's counters show of it.
    pub(super) taken: Arc<Taken>,
}

/// Every effect the pool's driver performs on its host.
pub(super) trait Host: KernelPools + Keeper {
    /// The host's clock.
    fn now(&self) -> Instant;

    /// Writes (or replaces) the journal record of a pool file; durable when this returns.
    fn journal_write(&self, rec: &FileRecord) -> Result<(), JournalError>;

    /// Removes the journal record of pool file `id`.
    fn journal_remove(&self, id: u64) -> Result<(), JournalError>;

    /// Records that every warm record is true (a clean shutdown).
    fn journal_mark_clean(&self) -> Result<(), JournalError>;

    /// The length of a pool file on its mount.
    fn file_size(&self, file: FileAt) -> Result<u64, HostError>;

    /// Cuts (or grows without faulting) a pool file to `size`.
    fn cut(&self, file: FileAt, size: u64) -> Result<(), HostError>;

    /// Creates a pool file of `size` and faults it on `node` with `cpus` in the background
    /// (yielding to `background.gate` between extents).
    fn fill(
        &self,
        file: FileAt,
        size: u64,
        node: u32,
        cpus: &[usize],
        background: Background,
    ) -> Result<(), HostError>;

    /// Bytes of new pages a file of `page_size` on `node` can get now, less what faults in
    /// progress were `promised` and the kernel's counters do not show yet.
    fn available_after(&self, node: u32, page_size: PageSize, promised: &Promised) -> u64;

    /// Bytes of new pages a file of `page_size` on `node` can get now.
    fn available_bytes(&self, node: u32, page_size: PageSize) -> u64;

    /// Opens an existing pool file.
    fn open(&self, file: FileAt) -> Result<Handle, HostError>;

    /// Creates a pool file of `size` (no page faulted yet).
    fn create(&self, file: FileAt, size: u64) -> Result<Handle, HostError>;

    /// Resizes an open pool file (a cut frees every page past the new end).
    fn resize(&self, handle: &mut Handle, size: u64) -> Result<(), HostError>;

    /// Faults `range` of a lease's file on `node` with `cpus` (one worker `beside_others`),
    /// recording in `taken` what the kernel's counters show of it.
    fn fault_lease(
        &self,
        handle: &Handle,
        range: Range<u64>,
        node: u32,
        cpus: &[usize],
        beside_others: bool,
        taken: Arc<Taken>,
    ) -> Result<(), FaultError>;

    /// Starts watching who opens file `id` (from before anyone else can, until its release).
    fn watch(&self, id: u64, handle: &Handle);

    /// Stops watching file `id` (it is gone, or kept outside the pool).
    fn forget(&self, id: u64);

    /// Hands an open file to `owner`.
    fn chown(&self, handle: &Handle, owner: Owner) -> Result<(), HostError>;

    /// Whether something already has the name `lease_path` (`lstat`).
    fn lease_path_taken(&self, lease_path: &Path) -> bool;

    /// Makes (or opens) a tenant's directory `dir` of the lease directory of `page_size`,
    /// mode 0711, the daemon's.
    fn tenant_dir(&self, page_size: PageSize, dir: &str) -> Result<(), HostError>;

    /// Links the lease path to the open file.
    fn link_lease(&self, handle: &Handle, lease_path: &Path) -> Result<(), HostError>;

    /// Removes `lease_path` when it still names pool file `file` (a user may have replaced
    /// it with something that is not the daemon's to delete).
    fn unlink_lease(&self, file: FileAt, lease_path: &Path);

    /// Gives a pool file back to the daemon's user, mode 0600, so that its last lessee
    /// cannot open it again. `Err`: the file may still be its lessee's, owner and mode as
    /// the lessee left them; it must not be recycled (the caller sends it down the kernel's
    /// path). A file already gone is `Ok`: there is nothing left to hand out.
    fn take_back(&self, file: FileAt) -> Result<(), HostError>;

    /// Pins the first `len` bytes of a lease's open file until [`Host::unpin`] (`pin: true`).
    fn pin(&self, handle: &Handle, len: usize) -> Result<Pin, HostError>;

    /// Drops a pin (at the lease's release, before the scrub): how long it took.
    fn unpin(&self, pin: Pin) -> Duration;

    /// Proves that the released file `id` is out of everyone else's reach.
    fn prove(&self, id: u64, handle: &Handle) -> Result<Proof, Unproven>;

    /// Faults the holes of a released file (pages a lessee punched out) on `node`; the
    /// ranges that were present.
    fn refill_holes(&self, handle: &Handle, node: u32, cpus: &[usize])
        -> Result<Refill, HoleError>;

    /// The first page of the file not on `node`, if any.
    fn stray_page(
        &self,
        handle: &Handle,
        node: u32,
        page_bytes: u64,
    ) -> Result<Option<Stray>, OnNodeError>;

    /// Scrubs (and verifies, as `opts` says) `ranges` of the file.
    fn scrub(
        &self,
        handle: &Handle,
        ranges: &[Range<u64>],
        opts: &ScrubOptions,
        control: &ScrubControl,
    ) -> Result<ScrubReport, ScrubError>;

    /// Truncates a released pool file to nothing: how many of its pages did not come back
    /// to the node's free list. `WouldBlock`: someone holds a file lease on it.
    fn truncate(&self, file: FileAt, node: u32) -> std::io::Result<u64>;

    /// Unlinks a pool file (`NotFound` when it is gone already).
    fn unlink(&self, file: FileAt) -> std::io::Result<()>;

    /// Whether the journal says the last run ended with a clean shutdown.
    fn journal_was_clean(&self) -> bool;

    /// Clears the clean-shutdown marker: from here on a crash means warm records must be
    /// proven again.
    fn journal_clear_clean(&self) -> Result<(), JournalError>;

    /// What recovery decides from: the journal's records and the pool and lease
    /// directories of every mount (`clean`: the last run ended cleanly).
    fn recovery_facts(&self, clean: bool) -> super::Result<Facts>;

    /// Performs one step of the recovery plan. `Ok(false)`: the removal of a pool file
    /// ([`Step::RemoveFile`]) failed and the file is still there (recovery keeps its record).
    fn recovery_step(&self, step: &Step) -> super::Result<bool>;

    /// After the recovery plan: removes the tenants' directories that hold no lease path
    /// (recovery's own, emptied by its steps, and those of an earlier naming scheme).
    fn recovery_finish(&self);
}

impl From<HostError> for super::PoolError {
    fn from(err: HostError) -> super::PoolError {
        use super::PoolError;
        match err {
            HostError::NoMount(ps) => PoolError::Field {
                field: "page_size",
                message: format!("no hugetlbfs mount for {ps} pages"),
            },
            HostError::File(e) => PoolError::File(e),
            HostError::Fault(e) => PoolError::Fault(e),
            HostError::Dir(e) => PoolError::Dir(e),
            HostError::Pin(e) => PoolError::Pin(e),
            HostError::Foreign(id) => PoolError::Io {
                op: "opening",
                path: super::file_key(id).into(),
                source: std::io::Error::other("the handle is not this host's"),
            },
            // The real host's only one: the `stat` of a pool file.
            HostError::Io { id, source } => PoolError::Io {
                op: "stat",
                path: super::file_key(id).into(),
                source,
            },
        }
    }
}
