//! What the kernel can still supply to the pool: unreserved free hugepages on a node
//! ([`hugetlb::pool::available`](crate::hugetlb::pool::available)), limited by the pool
//! mount's own size limit.

use std::collections::BTreeMap;
use std::path::Path;

use super::state::Promised;
use crate::hugetlb::free::FreePages;
use crate::hugetlb::pool::{self, Scope};
use crate::page_size::PageSize;

/// Free pages of `page_size` on `node` (`.../nodeN/hugepages/.../free_hugepages`).
pub fn node_free_pages(node: u32, page_size: PageSize) -> Option<u64> {
    pool::read(Scope::Node(node), page_size)
        .ok()
        .map(|c| c.free)
}

/// Pages of `page_size` on `node` in the kernel's pool (`nr_hugepages`).
pub fn node_total_pages(node: u32, page_size: PageSize) -> Option<u64> {
    pool::read(Scope::Node(node), page_size)
        .ok()
        .map(|c| c.total)
}

/// Free pages of the mount's size limit (`statfs`), `None` when the mount has no limit.
pub fn mount_free_pages(mount: &Path) -> Option<u64> {
    let st = nix::sys::statfs::statfs(mount).ok()?;
    (st.blocks() > 0).then(|| st.blocks_free())
}

/// Pages of the mount's limit in use (`statfs`), `None` when the mount has no limit.
pub fn mount_used_pages(mount: &Path) -> Option<u64> {
    let st = nix::sys::statfs::statfs(mount).ok()?;
    (st.blocks() > 0).then(|| st.blocks() - st.blocks_free())
}

/// Bytes of new pages a file on `mount` can get on `node` now. Reserved pages count as taken:
/// they are promised to mappings that have not faulted yet.
pub fn available_bytes(node: u32, page_size: PageSize, mount: &Path) -> u64 {
    within_mount(
        pool::available(Some(node), page_size).unwrap_or(0),
        page_size,
        mount,
    )
}

/// Bytes of `pages` free kernel pages that a file on `mount` can get: no more than the
/// mount's size limit leaves.
fn within_mount(pages: u64, page_size: PageSize, mount: &Path) -> u64 {
    let pages = mount_free_pages(mount).map_or(pages, |m| pages.min(m));
    pages * page_size.bytes()
}

/// [`available_bytes`] for the pool's hot paths (every lease decision, every worker turn):
/// the kernel's counters of every node and page size the pool serves stay open, so a
/// reading walks no path through sysfs. Read-only after [`Supply::open`]: no lock that a
/// preempted low-priority worker could hold while a lease waits.
#[derive(Debug, Default)]
pub struct Supply {
    counters: BTreeMap<(u32, PageSize), FreePages>,
}

impl Supply {
    /// Opens the counters of `nodes` x `page_sizes`; a pool the kernel does not have is read
    /// the slow way when asked (and reads as empty, as [`available_bytes`] does).
    pub fn open(nodes: &[u32], page_sizes: impl IntoIterator<Item = PageSize> + Clone) -> Supply {
        let mut counters = BTreeMap::new();
        for &node in nodes {
            for ps in page_sizes.clone() {
                if let Ok(c) = FreePages::open(Some(node), ps) {
                    counters.insert((node, ps), c);
                }
            }
        }
        Supply { counters }
    }

    /// Bytes of new pages a file on `mount` can get on `node` now, less what faults in
    /// progress were `promised` and the counters do not show yet: the machine's unreserved
    /// pages and the mount's free blocks lack what those faults reserved, the node's free
    /// pages what they allocated.
    pub fn available_after(
        &self,
        node: u32,
        page_size: PageSize,
        mount: &Path,
        promised: &Promised,
    ) -> u64 {
        let page = page_size.bytes();
        let (system, node_free) = match self.counters.get(&(node, page_size)) {
            Some(counter) => counter.parts().unwrap_or((0, Some(0))),
            None => pool::available_parts(Some(node), page_size).unwrap_or((0, Some(0))),
        };
        let system = system.saturating_sub(promised.unreserved / page);
        let node_free = node_free.map(|n| n.saturating_sub(promised.unallocated / page));
        let pages = pool::node_capped(system, node_free);
        let pages = match mount_free_pages(mount) {
            Some(m) => pages.min(m.saturating_sub(promised.unreserved / page)),
            None => pages,
        };
        pages * page
    }

    /// Bytes of new pages a file on `mount` can get on `node` now (see [`available_bytes`]).
    pub fn available_bytes(&self, node: u32, page_size: PageSize, mount: &Path) -> u64 {
        match self.counters.get(&(node, page_size)) {
            // `statfs` by path: an open descriptor on the mount would keep it from unmounting.
            Some(counter) => within_mount(counter.pages().unwrap_or(0), page_size, mount),
            None => available_bytes(node, page_size, mount),
        }
    }
}
