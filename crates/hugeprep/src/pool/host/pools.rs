//! The kernel's hugepage pools as the pool's driver sees them: `nr_hugepages` of a node read
//! and set, the pull-in of lazily initialised memory, compaction, the figures a raise is
//! planned from, and the ledger of pages the daemon added ([`super::super::reserve`]).
//! [`super::Host`] extends [`KernelPools`], so the driver reaches them through its one
//! host; the reservations' ledger ([`Reservations`](crate::pool::reserve::Reservations))
//! holds the same host (or, outside a pool, a [`RealPools`] of its own).

use std::io;
use std::path::Path;
use std::time::Duration;

use crate::hugetlb::pool::{self as kpool, PoolError, PullIn, Scope};
use crate::journal::{Journal, JournalError};
use crate::page_size::PageSize;
use crate::pool::reserve::{self, Reserved, LEDGER_DIR};

/// The kernel's pools of every node, and the ledger of what the daemon added to them.
pub(crate) trait KernelPools: Send + Sync + std::fmt::Debug {
    /// Pages in `node`'s pool of `ps` (`nr_hugepages`).
    fn pool_pages(&self, node: u32, ps: PageSize) -> Result<u64, PoolError>;

    /// Asks for `pages` in `node`'s pool of `ps`: the pages it holds after, which may be
    /// fewer when raising (memory short or fragmented) or more when lowering (the kernel
    /// frees only free pages).
    fn set_pool_pages(&self, node: u32, ps: PageSize, pages: u64) -> Result<u64, PoolError>;

    /// Pulls up to `bytes` of lazily initialised memory of `node` in through its 2M pool
    /// (leaving that pool as it was; see [`kpool::pull_in`]).
    fn pull_in(&self, node: u32, bytes: u64) -> Result<PullIn, PoolError>;

    /// Compacts `node`'s memory (see [`reserve::compact_node`]): how long it took.
    fn compact(&self, node: u32) -> io::Result<Duration>;

    /// Free pages of `ps` on `node` no mapping has reserved.
    fn pool_free_pages(&self, node: u32, ps: PageSize) -> u64;

    /// Bytes of memory `node` has available (0 when it cannot be read).
    fn node_available(&self, node: u32) -> u64;

    /// The ledger's records (a record that names its pool wrongly is dropped).
    fn ledger_load(&self) -> Result<Vec<Reserved>, JournalError>;

    /// Records `rec` in the ledger, durably (`pages == 0`: removes the pool's record).
    fn ledger_store(&self, rec: &Reserved) -> Result<(), JournalError>;
}

/// The real kernel: sysfs and procfs, the ledger a journal in the state directory.
#[derive(Debug)]
pub(crate) struct RealPools {
    ledger: Journal,
}

impl RealPools {
    /// The pools, with the ledger in `state_dir`.
    pub(crate) fn open(state_dir: &Path) -> Result<RealPools, JournalError> {
        Ok(RealPools {
            ledger: Journal::open_boot(&state_dir.join(LEDGER_DIR))?,
        })
    }
}

/// The ledger's name for a pool's record.
pub(crate) fn ledger_key(node: u32, page_size: PageSize) -> String {
    format!("node{node}-{}", page_size.name())
}

impl KernelPools for RealPools {
    fn pool_pages(&self, node: u32, ps: PageSize) -> Result<u64, PoolError> {
        Ok(kpool::read(Scope::Node(node), ps)?.total)
    }

    fn set_pool_pages(&self, node: u32, ps: PageSize, pages: u64) -> Result<u64, PoolError> {
        Ok(kpool::set_pages(Scope::Node(node), ps, pages)?.after)
    }

    fn pull_in(&self, node: u32, bytes: u64) -> Result<PullIn, PoolError> {
        kpool::pull_in(Scope::Node(node), bytes)
    }

    fn compact(&self, node: u32) -> io::Result<Duration> {
        reserve::compact_node(node)
    }

    fn pool_free_pages(&self, node: u32, ps: PageSize) -> u64 {
        kpool::available(Some(node), ps).unwrap_or(0)
    }

    fn node_available(&self, node: u32) -> u64 {
        crate::topology::node_available_bytes(node).unwrap_or(0)
    }

    fn ledger_load(&self) -> Result<Vec<Reserved>, JournalError> {
        let mut out = Vec::new();
        for (k, rec) in self.ledger.load::<Reserved>()? {
            if k == ledger_key(rec.node, rec.page_size) {
                out.push(rec);
            } else {
                self.ledger.remove(&k)?;
            }
        }
        Ok(out)
    }

    fn ledger_store(&self, rec: &Reserved) -> Result<(), JournalError> {
        let k = ledger_key(rec.node, rec.page_size);
        if rec.pages == 0 {
            self.ledger.remove(&k)
        } else {
            self.ledger.write(&k, rec)
        }
    }
}
