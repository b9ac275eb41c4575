//! What the kernel can still supply: free hugepages per node (sysfs), minus pages reserved
//! for other mappings, limited by the mount's own size limit.

use std::fs;
use std::path::Path;

use crate::page_size::PageSize;

fn read_u64(path: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Free pages of `page_size` on `node` (`.../nodeN/hugepages/.../free_hugepages`).
pub fn node_free_pages(node: u32, page_size: PageSize) -> Option<u64> {
    read_u64(&format!(
        "/sys/devices/system/node/node{node}/hugepages/{}/free_hugepages",
        page_size.sysfs_dir()
    ))
}

/// Pages of `page_size` on `node` in the kernel's pool (`nr_hugepages`).
pub fn node_total_pages(node: u32, page_size: PageSize) -> Option<u64> {
    read_u64(&format!(
        "/sys/devices/system/node/node{node}/hugepages/{}/nr_hugepages",
        page_size.sysfs_dir()
    ))
}

fn global(page_size: PageSize, name: &str) -> Option<u64> {
    read_u64(&format!(
        "/sys/kernel/mm/hugepages/{}/{name}",
        page_size.sysfs_dir()
    ))
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

/// Bytes of new pages a file on `mount` can get on `node` now.
pub fn available_bytes(node: u32, page_size: PageSize, mount: &Path) -> u64 {
    let node_free = node_free_pages(node, page_size).unwrap_or(0);
    // Reserved pages are counted free but promised to mappings that have not faulted yet.
    let global_free = global(page_size, "free_hugepages").unwrap_or(0);
    let resv = global(page_size, "resv_hugepages").unwrap_or(0);
    let unreserved = global_free.saturating_sub(resv);
    let mut pages = node_free.min(unreserved);
    if let Some(m) = mount_free_pages(mount) {
        pages = pages.min(m);
    }
    pages * page_size.bytes()
}
