//! The real host's kernel pools: each call goes to the [`RealPools`] the reservations'
//! ledger shares.

use std::io;

use super::real::RealHost;
use super::KernelPools;
use crate::hugetlb::pool::{PoolError, PullIn};
use crate::journal::JournalError;
use crate::page_size::PageSize;
use crate::pool::reserve::Reserved;

/// The kernel's pools: the [`RealPools`] the reservations' ledger holds too.
impl KernelPools for RealHost {
    fn pool_pages(&self, node: u32, ps: PageSize) -> Result<u64, PoolError> {
        self.pools.pool_pages(node, ps)
    }

    fn set_pool_pages(&self, node: u32, ps: PageSize, pages: u64) -> Result<u64, PoolError> {
        self.pools.set_pool_pages(node, ps, pages)
    }

    fn pull_in(&self, node: u32, bytes: u64) -> Result<PullIn, PoolError> {
        self.pools.pull_in(node, bytes)
    }

    fn compact(&self, node: u32) -> io::Result<std::time::Duration> {
        self.pools.compact(node)
    }

    fn pool_free_pages(&self, node: u32, ps: PageSize) -> u64 {
        self.pools.pool_free_pages(node, ps)
    }

    fn node_available(&self, node: u32) -> u64 {
        self.pools.node_available(node)
    }

    fn ledger_load(&self) -> Result<Vec<Reserved>, JournalError> {
        self.pools.ledger_load()
    }

    fn ledger_store(&self, rec: &Reserved) -> Result<(), JournalError> {
        self.pools.ledger_store(rec)
    }
}
