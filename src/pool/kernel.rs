//! What the kernel can still supply to the pool: unreserved free hugepages on a node
//! ([`hugetlb::pool::available`](crate::hugetlb::pool::available)), limited by the pool
//! mount's own size limit.

use std::path::Path;

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
    let mut pages = pool::available(Some(node), page_size).unwrap_or(0);
    if let Some(m) = mount_free_pages(mount) {
        pages = pages.min(m);
    }
    pages * page_size.bytes()
}
