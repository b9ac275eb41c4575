//! The simulated kernel's hugepage pools: each node has memory the kernel can still make
//! hugepages of ([`SimHost::set_memory`]); part of it may be fragmented, usable only after
//! a compaction ([`SimHost::fragment`]). Raising a pool adds free pages up to what the
//! memory allows (the kernel may give fewer than asked); lowering it takes back free pages
//! only (pages in files, or taken by other users, stay). The reservations' ledger is kept
//! here too, durable at every write as the real one is, and survives crashes.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use super::{enospc, SimHost, World};
use crate::hugetlb::pool::{PoolError, PullIn, Scope};
use crate::journal::JournalError;
use crate::page_size::PageSize;
use crate::pool::host::KernelPools;
use crate::pool::reserve::Reserved;

/// How long a simulated compaction takes (the clock moves on).
const COMPACTION: Duration = Duration::from_millis(40);

/// The memory behind the simulated pools, and the ledger.
#[derive(Debug, Default)]
pub(super) struct Machine {
    /// Bytes of each node's memory the kernel can still make hugepages of.
    memory: BTreeMap<u32, u64>,
    /// Of those, bytes too fragmented for a hugepage until a compaction.
    fragmented: BTreeMap<u32, u64>,
    /// Pages of other users of the machine, in the pools but not free.
    pub(super) others: BTreeMap<(u32, PageSize), u64>,
    /// The reservations' ledger: pages the daemon recorded adding.
    ledger: BTreeMap<(u32, PageSize), u64>,
    /// Pages the daemon's own resizes added to each pool, less those its lowerings took.
    raised: BTreeMap<(u32, PageSize), u64>,
}

impl World {
    /// `nr_hugepages` of a pool: its free pages, the files' and other users'.
    fn pool_pages(&self, kind: (u32, PageSize)) -> u64 {
        self.total.get(&kind).copied().unwrap_or(0)
            + self.machine.others.get(&kind).copied().unwrap_or(0)
    }

    /// Adds up to `pages` pages to a pool from the node's unfragmented memory: how many.
    fn grow(&mut self, (node, ps): (u32, PageSize), pages: u64) -> u64 {
        let m = &mut self.machine;
        let memory = m.memory.get(&node).copied().unwrap_or(0);
        let fragmented = m.fragmented.get(&node).copied().unwrap_or(0);
        let got = pages.min(memory.saturating_sub(fragmented) / ps.bytes());
        m.memory.insert(node, memory - got * ps.bytes());
        *m.raised.entry((node, ps)).or_default() += got;
        *self.total.entry((node, ps)).or_default() += got;
        *self.free.entry((node, ps)).or_default() += got;
        got
    }

    /// Takes up to `pages` free pages out of a pool back into the node's memory: how many.
    fn shrink(&mut self, (node, ps): (u32, PageSize), pages: u64) -> u64 {
        let free = self.free.get(&(node, ps)).copied().unwrap_or(0);
        let got = pages.min(free);
        self.free.insert((node, ps), free - got);
        let total = self.total.entry((node, ps)).or_default();
        *total = total.saturating_sub(got);
        let m = &mut self.machine;
        *m.memory.entry(node).or_default() += got * ps.bytes();
        let raised = m.raised.entry((node, ps)).or_default();
        *raised = raised.saturating_sub(got);
        got
    }
}

impl SimHost {
    /// Gives `node` `bytes` of memory the kernel can make hugepages of.
    pub(in crate::pool) fn set_memory(&self, node: u32, bytes: u64) {
        self.world().machine.memory.insert(node, bytes);
    }

    /// Leaves `bytes` of `node`'s memory too fragmented for a hugepage until a compaction.
    pub(in crate::pool) fn fragment(&self, node: u32, bytes: u64) {
        self.world().machine.fragmented.insert(node, bytes);
    }

    /// The ledger's record of a pool (0: none).
    pub(in crate::pool) fn ledger(&self, node: u32, ps: PageSize) -> u64 {
        let w = self.world();
        w.machine.ledger.get(&(node, ps)).copied().unwrap_or(0)
    }

    /// Checks that the ledger never claims more pages than the daemon's resizes added to
    /// each pool and kept there, and that each pool's `nr_hugepages` is its free pages, the
    /// files' and other users'.
    pub(in crate::pool) fn check_ledger(&self) -> Result<(), String> {
        let w = self.world();
        for (kind, &recorded) in &w.machine.ledger {
            let raised = w.machine.raised.get(kind).copied().unwrap_or(0);
            if recorded > raised {
                return Err(format!(
                    "{kind:?}: the ledger records {recorded} pages added, the pool got {raised}"
                ));
            }
            if recorded > w.pool_pages(*kind) {
                return Err(format!(
                    "{kind:?}: the ledger records {recorded} pages, the pool has {}",
                    w.pool_pages(*kind)
                ));
            }
        }
        Ok(())
    }
}

impl KernelPools for SimHost {
    fn pool_pages(&self, node: u32, ps: PageSize) -> Result<u64, PoolError> {
        Ok(self.world().pool_pages((node, ps)))
    }

    fn set_pool_pages(&self, node: u32, ps: PageSize, pages: u64) -> Result<u64, PoolError> {
        self.effect("resize the kernel's pool");
        let mut w = self.world();
        let now = w.pool_pages((node, ps));
        if pages > now {
            let got = w.grow((node, ps), pages - now);
            if got < pages - now {
                w.inject("the kernel adds fewer pages than asked");
            }
        } else {
            w.shrink((node, ps), now - pages);
        }
        Ok(w.pool_pages((node, ps)))
    }

    fn pull_in(&self, node: u32, bytes: u64) -> Result<PullIn, PoolError> {
        // The simulated kernel initialises its memory at boot: nothing to pull in.
        Ok(PullIn {
            scope: Scope::Node(node),
            asked: bytes / PageSize::Size2M.bytes(),
            added: 0,
            returned: 0,
        })
    }

    fn compact(&self, node: u32) -> io::Result<Duration> {
        self.effect("compact");
        let mut w = self.world();
        w.elapsed += COMPACTION;
        // Each compaction makes half of what is fragmented whole again.
        let fragmented = w.machine.fragmented.entry(node).or_default();
        *fragmented /= 2;
        Ok(COMPACTION)
    }

    fn pool_free_pages(&self, node: u32, ps: PageSize) -> u64 {
        self.free_pages(node, ps)
    }

    fn node_available(&self, node: u32) -> u64 {
        // The kernel's figure counts fragmented memory as available.
        let w = self.world();
        w.machine.memory.get(&node).copied().unwrap_or(0)
    }

    fn ledger_load(&self) -> Result<Vec<Reserved>, JournalError> {
        let w = self.world();
        Ok(w.machine
            .ledger
            .iter()
            .map(|(&(node, page_size), &pages)| Reserved {
                node,
                page_size,
                pages,
            })
            .collect())
    }

    fn ledger_store(&self, rec: &Reserved) -> Result<(), JournalError> {
        self.effect("ledger write");
        let mut w = self.world();
        // The ledger shares the state directory's file system with the journal.
        if w.faults
            .journal_full_after
            .is_some_and(|n| w.journal_writes >= n)
        {
            return Err(enospc());
        }
        let kind = (rec.node, rec.page_size);
        if rec.pages == 0 {
            w.machine.ledger.remove(&kind);
        } else {
            w.machine.ledger.insert(kind, rec.pages);
        }
        Ok(())
    }
}
