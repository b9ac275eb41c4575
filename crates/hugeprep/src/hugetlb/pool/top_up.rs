//! Borrowing pages from a pool for a while and giving exactly those back: [`PoolTopUp`] for a
//! task's pages, [`pull_in`] for the moment it takes to pull lazily initialised memory in.

use super::{
    available, counter_path, gigantic_cause, read, set_pages, PoolError, Resize, Result, Scope,
};
use crate::page_size::PageSize;
use serde::Serialize;

/// What [`pull_in`] did: how many 2M pages it asked for, how many the kernel added, and how
/// many of those went back at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PullIn {
    /// Whose pool.
    pub scope: Scope,
    /// 2M pages asked for.
    pub asked: u64,
    /// 2M pages the kernel added.
    pub added: u64,
    /// Of those, pages lowered again (fewer only when someone mapped them meanwhile: the
    /// kernel frees those when they are unmapped).
    pub returned: u64,
}

/// Pulls memory the kernel has not initialised yet into its page allocator, so that the
/// run-time allocator of gigantic pages finds whole free GiB: raises `scope`'s 2M pool by up
/// to `bytes` and lowers it again by exactly the pages that raise added.
///
/// A kernel that initialises memory lazily (`deferred_init=lazy` on its command line) keeps
/// untouched memory out of the page allocator; an ordinary allocation pulls it in, but the 1G
/// allocator (`alloc_contig_pages`) only looks at memory that is already in: on a freshly
/// booted 24 GiB machine `nr_hugepages` of 1G gave 2 of 8 pages, and after a 2M raise of
/// 18 GiB and its lowering, 12 of 12. Other users' 2M pages are never touched: the pool
/// changes by this call's own delta only, read right before each write.
pub fn pull_in(scope: Scope, bytes: u64) -> Result<PullIn> {
    let ps = PageSize::Size2M;
    let asked = bytes / ps.bytes();
    let before = read(scope, ps)?.total;
    let raised = if asked == 0 {
        before
    } else {
        set_pages(scope, ps, before + asked)?.after
    };
    let mut top_up = PoolTopUp {
        scope,
        page_size: ps,
        added: raised.saturating_sub(before),
    };
    let added = top_up.added;
    let (_, returned) = top_up.give_back_counted()?;
    Ok(PullIn {
        scope,
        asked,
        added,
        returned,
    })
}

/// Pages added to a pool for one task and given back when it ends (on drop, or with
/// [`PoolTopUp::release`]). It raises the pool only by the shortfall, so pages other
/// processes use are never touched, and gives back exactly what it added (never below what
/// is in use at that time).
///
/// ```no_run
/// use hugeprep::hugetlb::pool::PoolTopUp;
/// use hugeprep::PageSize;
/// let top_up = PoolTopUp::ensure_free(None, PageSize::Size2M, 512).unwrap();
/// // ... 512 pages of 2 MiB are free here ...
/// top_up.release().unwrap();
/// ```
#[derive(Debug)]
pub struct PoolTopUp {
    scope: Scope,
    page_size: PageSize,
    added: u64,
}

impl PoolTopUp {
    /// Makes at least `pages` unreserved pages of `page_size` free on `node` (or anywhere),
    /// raising the pool by the shortfall. When the kernel cannot supply them, gives back
    /// whatever it added and fails with [`PoolError::Insufficient`].
    pub fn ensure_free(node: Option<u32>, page_size: PageSize, pages: u64) -> Result<PoolTopUp> {
        let top_up = PoolTopUp::raise(node, page_size, pages)?;
        let free = top_up.free_pages()?;
        if free < pages {
            return Err(PoolError::Insufficient {
                scope: top_up.scope,
                page_size,
                wanted: pages,
                free,
                path: counter_path(top_up.scope, page_size, "nr_hugepages")?,
                why: gigantic_cause(page_size),
            });
        }
        Ok(top_up)
    }

    /// Raises the pool by however many pages short of `pages` free it is, as far as the kernel
    /// can (1 GiB pages fragment): the caller checks [`PoolTopUp::free_pages`] and decides what
    /// fewer pages mean. Fails only when the counters cannot be read or written.
    pub fn raise(node: Option<u32>, page_size: PageSize, pages: u64) -> Result<PoolTopUp> {
        let scope = Scope::from_node(node);
        let mut top_up = PoolTopUp {
            scope,
            page_size,
            added: 0,
        };
        let free = available(node, page_size)?;
        if free >= pages {
            return Ok(top_up);
        }
        let before = read(scope, page_size)?.total;
        let resize = set_pages(scope, page_size, before + (pages - free))?;
        top_up.added = resize.after.saturating_sub(before);
        Ok(top_up)
    }

    /// Unreserved free pages of this size in this pool now.
    pub fn free_pages(&self) -> Result<u64> {
        available(self.scope.node(), self.page_size)
    }

    /// Pages this top-up added to the pool.
    pub fn added(&self) -> u64 {
        self.added
    }

    /// The pool topped up.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// Gives the added pages back now and reports the resize.
    pub fn release(mut self) -> Result<Option<Resize>> {
        self.give_back()
    }

    fn give_back(&mut self) -> Result<Option<Resize>> {
        self.give_back_counted().map(|(resize, _)| resize)
    }

    /// Gives the added pages back; the last resize and how many pages were lowered in all.
    fn give_back_counted(&mut self) -> Result<(Option<Resize>, u64)> {
        if self.added == 0 {
            return Ok((None, 0));
        }
        // Pages a process that just exited still held (an io_uring's long-term pin is torn
        // down after the exit, asynchronously) come free a moment later: retry for a short
        // while before declaring them kept.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let mut remaining = self.added;
        loop {
            let total = read(self.scope, self.page_size)?.total;
            let resize = set_pages(self.scope, self.page_size, total.saturating_sub(remaining))?;
            remaining = resize.after.saturating_sub(resize.requested);
            if remaining == 0 || std::time::Instant::now() > deadline {
                if remaining > 0 {
                    // Pages still in use cannot go back: whoever holds them leaks them.
                    tracing::warn!(
                        "{} {}: {remaining} of the {} pages added are still in use and stay in the pool",
                        self.scope,
                        self.page_size,
                        self.added
                    );
                }
                let lowered = self.added - remaining.min(self.added);
                self.added = 0;
                return Ok((Some(resize), lowered));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for PoolTopUp {
    fn drop(&mut self) {
        if let Err(e) = self.give_back() {
            tracing::warn!("giving back {} hugepages: {e}", self.added);
        }
    }
}
