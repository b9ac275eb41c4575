//! Test support shared by unit tests, integration tests and benchmarks: taking hugepages from
//! the kernel for the duration of a test and giving exactly those back.
//!
//! Other processes on a host may use hugepages, so a test never sets the pool to an absolute
//! value: it raises `nr_hugepages` by the shortfall and lowers it by the same amount when
//! done. A file lock serialises every hugepage test on the machine (across test binaries and
//! developers' runs), so free-page counts a test reads are not disturbed by another test.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::PathBuf;

use nix::fcntl::{Flock, FlockArg};

use crate::page_size::PageSize;

/// The lock file every hugepage-using test holds.
pub const LOCK_PATH: &str = "/tmp/hugeprep-hugepage-tests.lock";

/// Hugepages taken from the kernel for one test; returned on drop.
#[derive(Debug)]
pub struct HugepageReservation {
    page_size: PageSize,
    added: u64,
    _lock: Flock<File>,
}

fn counter(page_size: PageSize, name: &str) -> PathBuf {
    PathBuf::from("/sys/kernel/mm/hugepages")
        .join(page_size.sysfs_dir())
        .join(name)
}

fn read_counter(page_size: PageSize, name: &str) -> io::Result<u64> {
    let text = fs::read_to_string(counter(page_size, name))?;
    text.trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {e}")))
}

fn write_nr(page_size: PageSize, value: u64) -> io::Result<()> {
    fs::write(counter(page_size, "nr_hugepages"), value.to_string())
}

/// Takes the machine-wide hugepage test lock (blocking).
pub fn lock() -> io::Result<Flock<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_PATH)?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))
}

impl HugepageReservation {
    /// Takes the test lock and makes sure at least `pages` pages of `page_size` are free,
    /// raising the pool by the shortfall. Returns `Ok(None)` when the kernel cannot supply
    /// them (1 GiB pages after fragmentation), having given back whatever it did get.
    pub fn ensure_free(page_size: PageSize, pages: u64) -> io::Result<Option<Self>> {
        let lock = lock()?;
        let free = read_counter(page_size, "free_hugepages")?;
        let shortfall = pages.saturating_sub(free);
        let before = read_counter(page_size, "nr_hugepages")?;
        if shortfall > 0 {
            // The write may succeed partially: the kernel stops at what it can allocate.
            let _ = write_nr(page_size, before + shortfall);
        }
        let added = read_counter(page_size, "nr_hugepages")?.saturating_sub(before);
        let reservation = HugepageReservation {
            page_size,
            added,
            _lock: lock,
        };
        if read_counter(page_size, "free_hugepages")? < pages {
            return Ok(None); // dropping `reservation` gives back what was added
        }
        Ok(Some(reservation))
    }

    /// The page size reserved.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// Free pages of this size right now.
    pub fn free_pages(&self) -> u64 {
        read_counter(self.page_size, "free_hugepages").unwrap_or(0)
    }
}

impl Drop for HugepageReservation {
    fn drop(&mut self) {
        if self.added == 0 {
            return;
        }
        if let Ok(nr) = read_counter(self.page_size, "nr_hugepages") {
            let _ = write_nr(self.page_size, nr.saturating_sub(self.added));
        }
    }
}
