//! The real pool driver on the simulated host, as a library (feature `sim`): the same lease,
//! release, scrub, fill and trim code as the daemon's, on files, free pages, a journal and
//! a clock kept in memory. `hugeprep bench trace` replays weeks of VM starts and stops
//! through it in simulated time; the daemon never builds a pool on it.
//!
//! No worker thread runs: the caller moves the clock ([`SimulatedPool::advance_to`]) and
//! does the worker's jobs one at a time ([`SimulatedPool::work_once`]), so how long a job
//! takes (a fill, a scrub) is the caller's model, not this machine's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::host::sim::SimHost;
use super::host::Host;
use super::{FileState, Pool, PoolPolicy, Result};
use crate::page_size::PageSize;

/// Bytes of one (node, page size) of a simulated pool, by the state of their files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimKind {
    /// Warm files (ready to lease).
    pub warm: u64,
    /// Leased files.
    pub leased: u64,
    /// Files being filled, released files waiting for a scrub, and files being scrubbed.
    pub busy: u64,
}

/// A [`Pool`] on a simulated host with its own virtual clock.
#[derive(Debug)]
pub struct SimulatedPool {
    host: Arc<SimHost>,
    pool: Arc<Pool>,
    dir: PathBuf,
    epoch: Instant,
}

impl SimulatedPool {
    /// A pool of `policy` on a simulated host whose node 0 has `free_pages` free pages of
    /// each page size, with plain directories below `dir` (created; removed when the pool is
    /// dropped) standing for the mounts and holding the pool's small state files. The start
    /// gate is off: nothing else runs on the simulated host.
    pub fn new(dir: &Path, free_pages: &[(PageSize, u64)], policy: PoolPolicy) -> Result<Self> {
        let kinds: Vec<((u32, PageSize), u64)> =
            free_pages.iter().map(|&(ps, n)| ((0, ps), n)).collect();
        let host = SimHost::new(&kinds);
        let page_sizes: Vec<PageSize> = free_pages.iter().map(|&(ps, _)| ps).collect();
        let pool = Pool::with_host(Arc::clone(&host), dir, &page_sizes, policy)?;
        pool.set_start_gate(false);
        let epoch = host.now();
        Ok(SimulatedPool {
            host,
            pool,
            dir: dir.to_path_buf(),
            epoch,
        })
    }

    /// The pool: lease, release, status, policy, as on a real host.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Simulated time since the pool was built.
    pub fn elapsed(&self) -> Duration {
        self.host.now().saturating_duration_since(self.epoch)
    }

    /// Sets the clock to `at` since the pool was built (a clock never goes back: an earlier
    /// `at` leaves it where it is).
    pub fn advance_to(&self, at: Duration) {
        let now = self.elapsed();
        if at > now {
            self.host.advance(at - now);
        }
    }

    /// Chooses and does one of the worker's jobs, as the daemon's worker would now: whether
    /// there was one. The job takes no simulated time.
    pub fn work_once(&self) -> bool {
        self.pool.work_once()
    }

    /// The bytes of `ps` on node 0, by state, from the pool's own records.
    pub fn kind(&self, ps: PageSize) -> SimKind {
        let st = self.pool.lock();
        let mut k = SimKind::default();
        for e in st.of_kind(0, ps) {
            let rec = e.rec();
            match rec.state {
                FileState::Warm => k.warm += rec.size,
                FileState::Leased(_) => k.leased += rec.size,
                _ => k.busy += rec.size,
            }
        }
        k
    }

    /// Free pages of `ps` on node 0 of the simulated kernel.
    pub fn free_pages(&self, ps: PageSize) -> u64 {
        self.host.free_pages(0, ps)
    }

    /// Checks what the driver's unit tests check after every step: every page in exactly
    /// one file, every file named, no lease path ever linked to another principal's bytes.
    pub fn check(&self) -> std::result::Result<(), String> {
        self.host.check_pages()?;
        match self.host.leaks().first() {
            Some(leak) => Err(leak.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for SimulatedPool {
    fn drop(&mut self) {
        self.pool.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
