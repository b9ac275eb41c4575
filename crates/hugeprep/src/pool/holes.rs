//! Released files with holes.
//!
//! QEMU with `discard-data=on` (libvirt `<discard/>`, which OpenStack Nova's file-backed
//! memory sets) punches every page out of its backing file when it exits, even while
//! hugeprep holds another link; a balloon or free-page reporting punches single pages while
//! the guest runs. Those pages went back to the kernel, which zeroes them again when they
//! are faulted, so they need no scrub: only the pages still present hold guest data.
//!
//! Finding the holes: hugetlbfs has no `SEEK_HOLE` (its `llseek` calls the whole file data),
//! `cachestat` refuses hugetlbfs (`EOPNOTSUPP`) and `mincore` sees only the caller's page
//! tables, not the file's pages. The file's block count says how many pages are present,
//! and faulting a page is the only way to learn whether it was one. So:
//! - no hole: scrub the whole file, as before;
//! - every page a hole (the `<discard/>` case): refill the file with the prefault engine
//!   (parallel, NUMA-bound workers), scrub nothing;
//! - some holes: fault the file page by page on a node-bound mapping, reading the block
//!   count after each, so each hole is filled by the kernel and each page that did not grow
//!   the count is known to hold data and is scrubbed.

use std::ops::Range;
use std::os::unix::fs::MetadataExt;

use super::fault::{self, FaultError};
use crate::hugetlb::{BackingFile, FileError};
use crate::sys::mmap::MmapError;
use crate::sys::numa::{self, NumaError};

/// Refilling a file's holes failed; the file must not be handed out as it is.
#[derive(Debug, thiserror::Error)]
pub enum HoleError {
    /// Reading the file's block count failed.
    #[error("stat {path}: {source}")]
    Stat {
        /// The file.
        path: String,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// Mapping the file failed (the kernel cannot supply pages for the holes).
    #[error("refilling holes: {0}")]
    Map(#[from] FileError),
    /// Binding the mapping to the file's node failed.
    #[error("refilling holes: {0}")]
    Bind(#[from] NumaError),
    /// Faulting a hole failed (no free page on the node).
    #[error("refilling the hole at offset {offset} of {path}: {source}")]
    Populate {
        /// The file.
        path: String,
        /// Offset of the page.
        offset: u64,
        /// The kernel's answer.
        source: MmapError,
    },
    /// The prefault engine failed.
    #[error("refilling holes: {0}")]
    Fault(#[from] FaultError),
}

/// What refilling found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refill {
    /// Byte ranges that were present (hold guest data: scrub them), in order.
    pub present: Vec<Range<u64>>,
    /// Bytes of holes filled with pages the kernel zeroed.
    pub filled: u64,
}

/// Pages present in `file` by its block count (512-byte units, whatever the page size).
pub fn present_pages(file: &BackingFile) -> Result<u64, HoleError> {
    let meta = file.file().metadata().map_err(|source| HoleError::Stat {
        path: file.path().display().to_string(),
        source,
    })?;
    Ok(meta.blocks() * 512 / file.page_size().bytes())
}

/// Fills every hole of `file` with kernel-zeroed pages on `node` (workers on `cpus` when the
/// whole file is a hole) and returns the ranges that were present. On error some holes may
/// be filled: the caller deletes the file.
pub fn refill(file: &BackingFile, node: u32, cpus: &[usize]) -> Result<Refill, HoleError> {
    let page = file.page_size().bytes();
    let size = file.size();
    let pages = size / page;
    let present = present_pages(file)?.min(pages);
    if present == pages {
        return Ok(Refill {
            present: std::iter::once(0..size).filter(|r| !r.is_empty()).collect(),
            filled: 0,
        });
    }
    if present == 0 {
        fault::fault_range(file, 0..size, node, cpus)?;
        return Ok(Refill {
            present: vec![],
            filled: size,
        });
    }
    locate_and_fill(file, node, present)
}

/// Faults `file` page by page and tells holes (the block count grew) from present pages.
fn locate_and_fill(file: &BackingFile, node: u32, present: u64) -> Result<Refill, HoleError> {
    let page = file.page_size().bytes();
    let region = file.map()?;
    numa::bind_region(&region, 0, region.len(), node)?;
    let mut ranges: Vec<Range<u64>> = Vec::new();
    let mut blocks = present;
    let mut filled = 0;
    for offset in (0..file.size()).step_by(page as usize) {
        region
            .populate_write(offset as usize, page as usize)
            .map_err(|source| HoleError::Populate {
                path: file.path().display().to_string(),
                offset,
                source,
            })?;
        let now = present_pages(file)?;
        if now > blocks {
            filled += page;
        } else {
            match ranges.last_mut() {
                Some(r) if r.end == offset => r.end += page,
                _ => ranges.push(offset..offset + page),
            }
        }
        blocks = now;
    }
    Ok(Refill {
        present: ranges,
        filled,
    })
}
