//! The host the daemon runs on: the journal in the state directory, files on the
//! hugetlbfs mounts, the kernel's free-page counters and the monotonic clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::{Background, FileAt, Host, HostError};
use crate::hugetlb::BackingFile;
use crate::journal::{Journal, JournalError};
use crate::page_size::PageSize;
use crate::pool::kernel::Supply;
use crate::pool::record::{file_key, FileRecord};
use crate::pool::state::Promised;
use crate::pool::{fault, PoolMount};

/// The real host: what [`super::Host`] asks is done with syscalls.
#[derive(Debug)]
pub(in crate::pool) struct RealHost {
    mounts: Arc<BTreeMap<PageSize, PoolMount>>,
    journal: Journal,
    supply: Supply,
}

impl RealHost {
    /// The host of `mounts`, journaling in `journal`, reading free pages from `supply`.
    pub(in crate::pool) fn new(
        mounts: Arc<BTreeMap<PageSize, PoolMount>>,
        journal: Journal,
        supply: Supply,
    ) -> RealHost {
        RealHost {
            mounts,
            journal,
            supply,
        }
    }

    fn mount(&self, page_size: PageSize) -> Result<&PoolMount, HostError> {
        self.mounts
            .get(&page_size)
            .ok_or(HostError::NoMount(page_size))
    }

    /// The mount root of `page_size` (empty when none serves it, as the callers had it).
    fn root(&self, page_size: PageSize) -> std::path::PathBuf {
        self.mounts
            .get(&page_size)
            .map(|m| m.root.clone())
            .unwrap_or_default()
    }
}

impl Host for RealHost {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn journal_write(&self, rec: &FileRecord) -> Result<(), JournalError> {
        self.journal.write(&rec.key(), rec)
    }

    fn journal_remove(&self, id: u64) -> Result<(), JournalError> {
        self.journal.remove(&file_key(id))
    }

    fn journal_mark_clean(&self) -> Result<(), JournalError> {
        self.journal.mark_clean_shutdown()
    }

    fn file_size(&self, file: FileAt) -> Result<u64, HostError> {
        let path = self.mount(file.page_size)?.file_path(file.id);
        std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(|source| HostError::Io {
                id: file.id,
                source,
            })
    }

    fn cut(&self, file: FileAt, size: u64) -> Result<(), HostError> {
        let path = self.mount(file.page_size)?.file_path(file.id);
        let mut f = BackingFile::open(&path, file.page_size)?;
        Ok(f.set_len(size)?)
    }

    fn fill(
        &self,
        file: FileAt,
        size: u64,
        node: u32,
        cpus: &[usize],
        background: Background,
    ) -> Result<(), HostError> {
        let path = self.mount(file.page_size)?.file_path(file.id);
        let f = BackingFile::create(&path, size, file.page_size, None)?;
        fault::fault_range_background(&f, 0..size, node, cpus, background.gate, background.taken)?;
        Ok(())
    }

    fn available_after(&self, node: u32, page_size: PageSize, promised: &Promised) -> u64 {
        self.supply
            .available_after(node, page_size, &self.root(page_size), promised)
    }

    fn available_bytes(&self, node: u32, page_size: PageSize) -> u64 {
        self.supply
            .available_bytes(node, page_size, &self.root(page_size))
    }
}
