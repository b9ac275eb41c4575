//! Borrowing hugepages from the kernel for a benchmark and giving exactly those back.
//!
//! Other processes on a host may use hugepages, so a benchmark never sets the pool to an
//! absolute value: it raises `nr_hugepages` by the shortfall and lowers it by the same amount
//! when done. It holds the same machine-wide lock as the test suite
//! ([`crate::testing::LOCK_PATH`]), so a benchmark never takes free pages that a running test
//! counted on, and no test disturbs the measurement.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::page_size::PageSize;

/// Reading or writing the hugepage pool counters failed.
#[derive(Debug, thiserror::Error)]
pub enum HugepageError {
    /// The lock file could not be opened or locked.
    #[error("cannot lock {path}: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A sysfs counter could not be read (the page size may be unsupported by the kernel).
    #[error("cannot read {path}: {source}")]
    Counter {
        /// The sysfs file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// The machine-wide hugepage lock, held for as long as pages are borrowed.
#[derive(Debug)]
pub struct HugepageLock {
    _lock: Flock<File>,
}

impl HugepageLock {
    /// Takes the lock, waiting (and saying so) while a test or another benchmark holds it.
    pub fn acquire() -> Result<HugepageLock, HugepageError> {
        let path = PathBuf::from(crate::testing::LOCK_PATH);
        let lock_err = |source| HugepageError::Lock {
            path: path.clone(),
            source,
        };
        let open = || {
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
        };
        let file = open().map_err(lock_err)?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(HugepageLock { _lock: lock }),
            Err((file, Errno::EWOULDBLOCK)) => {
                tracing::info!("waiting for {} (hugepage tests running)", path.display());
                Flock::lock(file, FlockArg::LockExclusive)
                    .map(|lock| HugepageLock { _lock: lock })
                    .map_err(|(_, e)| lock_err(e.into()))
            }
            Err((_, e)) => Err(lock_err(e.into())),
        }
    }
}

fn counter_path(page_size: PageSize, name: &str) -> PathBuf {
    PathBuf::from("/sys/kernel/mm/hugepages")
        .join(page_size.sysfs_dir())
        .join(name)
}

/// Reads a pool counter (`nr_hugepages`, `free_hugepages`, ...) of `page_size`.
pub fn read_counter(page_size: PageSize, name: &str) -> Result<u64, HugepageError> {
    let path = counter_path(page_size, name);
    let text = fs::read_to_string(&path).map_err(|source| HugepageError::Counter {
        path: path.clone(),
        source,
    })?;
    text.trim().parse().map_err(|e| HugepageError::Counter {
        path,
        source: io::Error::new(io::ErrorKind::InvalidData, format!("{e}")),
    })
}

/// Pages added to the pool for a benchmark; lowered by exactly that many on drop.
#[derive(Debug)]
pub struct PoolTopUp<'lock> {
    page_size: PageSize,
    added: u64,
    _lock: &'lock HugepageLock,
}

impl<'lock> PoolTopUp<'lock> {
    /// Raises the pool of `page_size` by however many pages short of `pages` free it is.
    /// The kernel may supply fewer (1 GiB pages after fragmentation, or without root): check
    /// [`PoolTopUp::free_pages`]. Fails only when the counters cannot be read.
    pub fn ensure_free(
        lock: &'lock HugepageLock,
        page_size: PageSize,
        pages: u64,
    ) -> Result<PoolTopUp<'lock>, HugepageError> {
        let free = read_counter(page_size, "free_hugepages")?;
        let before = read_counter(page_size, "nr_hugepages")?;
        let shortfall = pages.saturating_sub(free);
        if shortfall > 0 {
            // The write may succeed partly (the kernel stops at what it can allocate) or fail
            // (no root): what counts is what the counter says afterwards.
            let _ = fs::write(
                counter_path(page_size, "nr_hugepages"),
                (before + shortfall).to_string(),
            );
        }
        let added = read_counter(page_size, "nr_hugepages")?.saturating_sub(before);
        Ok(PoolTopUp {
            page_size,
            added,
            _lock: lock,
        })
    }

    /// Free pages of this size right now.
    pub fn free_pages(&self) -> u64 {
        read_counter(self.page_size, "free_hugepages").unwrap_or(0)
    }

    /// How many pages this top-up added to the pool.
    pub fn added(&self) -> u64 {
        self.added
    }
}

impl Drop for PoolTopUp<'_> {
    fn drop(&mut self) {
        if self.added == 0 {
            return;
        }
        let path = counter_path(self.page_size, "nr_hugepages");
        let restored = read_counter(self.page_size, "nr_hugepages")
            .map(|nr| nr.saturating_sub(self.added))
            .and_then(|nr| {
                fs::write(&path, nr.to_string()).map_err(|source| HugepageError::Counter {
                    path: path.clone(),
                    source,
                })
            });
        if let Err(err) = restored {
            tracing::warn!(
                "could not give back {} {} hugepages: {err}",
                self.added,
                self.page_size
            );
        }
    }
}
