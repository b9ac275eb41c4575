//! Faulting new pages of a pool file: the prefault engine's parallel, NUMA-bound workers
//! (each a disjoint range, pinned to one of the node's CPUs, memory bound to the node).

use std::ops::Range;

use crate::hugetlb::BackingFile;
use crate::prefault::{prefault, PrefaultError, PrefaultOptions};

/// Faulting failed.
#[derive(Debug, thiserror::Error)]
#[error("faulting: {0}")]
pub struct FaultError(#[from] pub PrefaultError);

/// Faults `range` of `file` (whole pages) on `node` with `threads` workers. The workers
/// inherit the calling thread's scheduling class, so the background worker's refills run at
/// idle priority. A shared hugetlb mapping reserves its pages up front: a pool that cannot
/// supply them fails here with `ENOMEM`, never with `SIGBUS` later.
pub fn fault_range(
    file: &BackingFile,
    range: Range<u64>,
    node: u32,
    threads: usize,
) -> Result<(), FaultError> {
    if range.is_empty() {
        return Ok(());
    }
    let opts = PrefaultOptions {
        threads: Some(threads.max(1)),
        node: Some(node),
        lock: false,
        ..PrefaultOptions::default()
    };
    prefault(file, range, &opts, None)?;
    Ok(())
}
