//! Whether a proven file's pages are still on its node. A lessee may move the pages of its
//! own mapping to another node (`mbind(MPOL_MF_MOVE)` migrates hugetlb pages that only it
//! maps); recycled in place, such a file would hand the next lease pages on the wrong node
//! and leave the node counts the pool keeps off by the pages moved. So, before a proven
//! file is scrubbed, every page (all present then: its holes were refilled on its node) is
//! looked up; one page elsewhere sends the file to the kernel's path, whose truncate gives
//! each page back to its own node.

use crate::hugetlb::BackingFile;
use crate::sys::mmap::{MmapError, MmapRegion};
use crate::sys::numa::{self, NumaError};

/// Looking a page up failed; the caller fails closed (the kernel's path).
#[derive(Debug, thiserror::Error)]
pub enum OnNodeError {
    /// The file could not be mapped.
    #[error("mapping {path} to find its pages' nodes: {source}")]
    Map {
        /// The file.
        path: String,
        /// Why.
        source: MmapError,
    },
    /// The kernel did not say where a page is.
    #[error("the node of page {page} of {path}: {source}")]
    Node {
        /// The file.
        path: String,
        /// The page's index.
        page: u64,
        /// Why.
        source: NumaError,
    },
}

/// A page found on another node than its file's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stray {
    /// The page's index in the file.
    pub page: u64,
    /// Where it is.
    pub node: u32,
}

/// Whether the host has more than one NUMA node (read once): on one node no page can be
/// elsewhere, and nothing is looked up.
fn many_nodes() -> bool {
    static MANY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MANY.get_or_init(
        || match std::fs::read_to_string("/sys/devices/system/node/online") {
            Ok(s) => s.trim() != "0",
            Err(_) => true,
        },
    )
}

/// The first page of `file` (every page present) that is not on `node`, if any.
pub fn stray_page(
    file: &BackingFile,
    node: u32,
    page_bytes: u64,
) -> Result<Option<Stray>, OnNodeError> {
    if !many_nodes() || file.size() == 0 || page_bytes == 0 {
        return Ok(None);
    }
    let path = || file.path().display().to_string();
    let len = usize::try_from(file.size()).map_err(|_| OnNodeError::Map {
        path: path(),
        source: MmapError::Map {
            len: usize::MAX,
            what: "a pool file's pages",
            source: std::io::Error::from_raw_os_error(libc::EFBIG),
        },
    })?;
    let region = MmapRegion::shared_file(std::os::fd::AsFd::as_fd(file.file()), 0, len).map_err(
        |source| OnNodeError::Map {
            path: path(),
            source,
        },
    )?;
    for page in 0..file.size() / page_bytes {
        let at = (page * page_bytes) as usize;
        let found = numa::node_of(&region, at).map_err(|source| OnNodeError::Node {
            path: path(),
            page,
            source,
        })?;
        if found != node {
            return Ok(Some(Stray { page, node: found }));
        }
    }
    Ok(None)
}
