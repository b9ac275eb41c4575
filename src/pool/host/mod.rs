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
//! Not behind it yet (see docs/architecture.md): the lease's open/resize/link/chown, the
//! scrub's proof, hole refill and scrubber, the kernel's path, recovery's listing of the
//! journal and the mounts, and the raises of the kernel's pools.

mod real;

use std::sync::Arc;
use std::time::Instant;

use crate::background::Yield;
use crate::journal::JournalError;
use crate::page_size::PageSize;
use crate::prefault::Taken;

use super::record::FileRecord;
use super::state::Promised;

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

/// An effect on a pool file that the host could not perform.
#[derive(Debug, thiserror::Error)]
pub(super) enum HostError {
    /// No mount serves the file's page size.
    #[error("no hugetlbfs mount for {0} pages")]
    NoMount(PageSize),
    /// The file could not be opened, created or resized.
    #[error(transparent)]
    File(#[from] crate::hugetlb::FileError),
    /// Faulting the file's pages failed (the kernel had too few, or a worker failed).
    #[error(transparent)]
    Fault(#[from] super::fault::FaultError),
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
pub(super) trait Host: Send + Sync + std::fmt::Debug {
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
}
