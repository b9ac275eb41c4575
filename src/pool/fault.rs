//! Faulting new pages of a pool file in parallel: each worker takes a disjoint range, pinned
//! to one of the node's CPUs (so first-touch allocation lands on the node).

use crate::hugetlb::{BackingFile, FileError};
use crate::sys::affinity::pin_current_thread;
use crate::sys::mmap::MmapError;
use crate::sys::priority;

/// Bytes per `MADV_POPULATE_WRITE` call: large extents, few calls.
const STEP: usize = 256 << 20;

/// Faulting failed.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// Mapping the range failed (`ENOMEM`: the kernel cannot reserve the pages).
    #[error("faulting: {0}")]
    Map(#[from] FileError),
    /// A populate call failed.
    #[error("faulting: {0}")]
    Populate(#[from] MmapError),
}

/// Faults `len` bytes of `file` from `offset` (whole pages) with one worker per CPU in
/// `cpus` (one unpinned worker when empty), at idle priority when `background`.
pub fn fault_range(
    file: &BackingFile,
    offset: u64,
    len: u64,
    cpus: &[usize],
    background: bool,
) -> Result<(), FaultError> {
    if len == 0 {
        return Ok(());
    }
    // A shared hugetlb mapping reserves its pages at mmap time: ENOMEM here, never SIGBUS
    // later.
    let region = file.map_range(offset, len)?;
    let page = file.page_size().bytes() as usize;
    let workers = cpus.len().max(1);
    let len = len as usize;
    let per_worker = len.div_ceil(page).div_ceil(workers) * page;
    let region = &region;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let start = (w * per_worker).min(len);
                let end = ((w + 1) * per_worker).min(len);
                let cpu = cpus.get(w).copied();
                s.spawn(move || -> Result<(), MmapError> {
                    if let Some(cpu) = cpu {
                        let _ = pin_current_thread(&[cpu]);
                    }
                    if background {
                        let _ = priority::set_current_thread_idle();
                    }
                    let mut pos = start;
                    while pos < end {
                        let n = STEP.min(end - pos);
                        region.populate_write(pos, n)?;
                        pos += n;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(r) => r?,
                Err(_) => {
                    return Err(FaultError::Populate(MmapError::Empty {
                        what: "fault worker panicked",
                    }))
                }
            }
        }
        Ok(())
    })
}
