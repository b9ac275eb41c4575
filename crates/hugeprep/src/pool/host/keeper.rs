//! The effects of the files kept past a release (`pool::kept`, and the pin check before a
//! released file's truncate in `pool::kernel_path`): opening a released or kept file for
//! writing without waiting for a read lease, the kernel's counts of its pinned pages,
//! punching out the pages nobody pins, renaming it to its kept name, truncating and
//! removing it, and listing the kept names a previous run left. [`super::Host`] extends
//! [`Keeper`], so the driver reaches them through its one host.

use std::io;

use crate::page_size::PageSize;
use crate::pool::reach::kernel::Pins;

use super::FileAt;

/// A released or kept file the host opened for writing (the real host's open file; the
/// simulated host's file id).
#[derive(Debug)]
pub(crate) struct Opened {
    id: u64,
    real: Option<std::fs::File>,
}

impl Opened {
    /// File `id`, open as `real` on a real host.
    pub(crate) fn new(id: u64, real: Option<std::fs::File>) -> Opened {
        Opened { id, real }
    }

    /// The pool file's id.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The real host's open file.
    pub(crate) fn real(&self) -> Option<&std::fs::File> {
        self.real.as_ref()
    }
}

/// A kept file, by its page size (which picks the mount) and its name in the pool directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeptAt {
    /// The page size of its mount.
    pub(crate) page_size: PageSize,
    /// Its name (`kept-...`, see `pool::kept`).
    pub(crate) name: String,
}

/// The effects of keeping released files for their holders.
pub(crate) trait Keeper {
    /// Opens released pool file `file` for writing, without waiting for a read lease to be
    /// given up (`WouldBlock`: someone holds one; `NotFound`: gone).
    fn open_released(&self, file: FileAt) -> io::Result<Opened>;

    /// Opens kept file `kept` for writing, as [`Keeper::open_released`].
    fn open_kept(&self, kept: &KeptAt) -> io::Result<Opened>;

    /// The kernel's counts of the open file's pages referenced beyond the page cache and
    /// any mapping (see [`crate::pool::reach::kernel::Reach::pinned_pages`]). `Ok(None)`:
    /// no counts (the walk), `Err`: they could not be read now.
    fn pinned_pages(&self, opened: &Opened) -> Result<Option<Pins>, String>;

    /// Punches out the open file's pages that nobody pins, when every pinned page is known.
    fn punch_unpinned(&self, opened: &Opened, pins: &Pins, page_size: PageSize);

    /// Bytes of pages the open file holds (hugetlbfs counts them in `st_blocks`).
    fn held_bytes(&self, opened: &Opened) -> u64;

    /// Bytes of pages pool file `file` holds (0 when it cannot be read: gone meanwhile).
    fn held_bytes_at(&self, file: FileAt) -> u64;

    /// The length of pool file `file` and the bytes of pages it holds (`None`: it cannot be
    /// read), by its pool name: what a leased file takes from the host when its lessee
    /// grew it (a tenant's usage).
    fn leased_size(&self, file: FileAt) -> Option<(u64, u64)>;

    /// Renames released pool file `file` to `name` within its pool directory, never over
    /// another entry (`RENAME_NOREPLACE`).
    fn keep_as(&self, file: FileAt, name: &str) -> io::Result<()>;

    /// Truncates an open kept file on `node` to nothing: the result, and the pages that
    /// came back to the node's free list (0 when they cannot be read).
    fn truncate_kept(
        &self,
        opened: Opened,
        node: u32,
        page_size: PageSize,
    ) -> (io::Result<()>, u64);

    /// The length of kept file `kept` and the bytes of pages it holds (`None`: it cannot be
    /// read).
    fn kept_size(&self, kept: &KeptAt) -> Option<(u64, u64)>;

    /// Removes kept file `kept` (`NotFound` when it is gone already).
    fn remove_kept(&self, kept: &KeptAt) -> io::Result<()>;

    /// The kept files of the pool directory of `page_size` (`kept-` names, which a
    /// previous run left), with the bytes of pages each holds.
    fn kept_names(&self, page_size: PageSize) -> Vec<(String, u64)>;
}
