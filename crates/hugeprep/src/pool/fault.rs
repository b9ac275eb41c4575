//! Faulting new pages of a pool file: the prefault engine's parallel, NUMA-bound workers
//! (each a disjoint range, pinned to one of the node's CPUs, memory bound to the node); a
//! range one worker does is allocated with `fallocate`, which keeps the lease path's faults
//! and the worker's refills off the process's `mmap_lock` (see [`Populate::Fallocate`]).

use std::ops::Range;
use std::sync::Arc;

use crate::background::Yield;
use crate::hugetlb::BackingFile;
use crate::prefault::{default_threads, prefault, Populate, PrefaultError, PrefaultOptions, Taken};

/// Bytes per call of a background fault: the start gate is looked at between calls, so a
/// refill stands aside for a VM start within one of these (a few ms).
pub const BACKGROUND_EXTENT: u64 = 32 << 20;

/// Faulting failed.
#[derive(Debug, thiserror::Error)]
#[error("faulting: {0}")]
pub struct FaultError(#[from] pub PrefaultError);

/// Faults `range` of `file` (whole pages) on `node` with up to one worker per CPU of `cpus`
/// (the node's; [`default_threads`] caps them by size). The workers
/// inherit the calling thread's scheduling class, so the background worker's refills run at
/// idle priority. A shared hugetlb mapping reserves its pages up front: a pool that cannot
/// supply them fails here with `ENOMEM`, never with `SIGBUS` later.
pub fn fault_range(
    file: &BackingFile,
    range: Range<u64>,
    node: u32,
    cpus: &[usize],
) -> Result<(), FaultError> {
    fault_with(file, range, node, cpus, None, None, None)
}

/// [`fault_range`] for a lease, recording in `taken` how much of it the kernel's counters
/// show (the pool's promise of the rest, see `State::promised`). Beside other faults
/// (concurrent cold leases): one `fallocate` worker, which takes the file's inode lock
/// only. Several workers on one file map it and populate, holding the daemon's
/// `mmap_lock` for reading for each extent, and every other lease's `mmap`/`munmap` waits
/// for that; one worker per file, the leases run in parallel instead.
pub fn fault_lease_range(
    file: &BackingFile,
    range: Range<u64>,
    node: u32,
    cpus: &[usize],
    beside_others: bool,
    taken: Arc<Taken>,
) -> Result<(), FaultError> {
    let max_threads = beside_others.then_some(1);
    fault_with(file, range, node, cpus, None, max_threads, Some(taken))
}

/// [`fault_range`] for background work (refills): in extents of [`BACKGROUND_EXTENT`], each
/// after `gate` lets it go on; records its progress in `taken` as [`fault_lease_range`].
pub fn fault_range_background(
    file: &BackingFile,
    range: Range<u64>,
    node: u32,
    cpus: &[usize],
    gate: Arc<dyn Yield>,
    taken: Arc<Taken>,
) -> Result<(), FaultError> {
    fault_with(file, range, node, cpus, Some(gate), None, Some(taken))
}

fn fault_with(
    file: &BackingFile,
    range: Range<u64>,
    node: u32,
    cpus: &[usize],
    gate: Option<Arc<dyn Yield>>,
    max_threads: Option<usize>,
    taken: Option<Arc<Taken>>,
) -> Result<(), FaultError> {
    if range.is_empty() {
        return Ok(());
    }
    let threads = default_threads(range.end - range.start, cpus.len().max(1), max_threads);
    let opts = PrefaultOptions {
        threads: Some(threads),
        node: Some(node),
        lock: false,
        populate: if threads == 1 {
            Populate::Fallocate
        } else {
            Populate::Auto
        },
        cpus: Some(cpus.to_vec()),
        extent: if gate.is_some() {
            BACKGROUND_EXTENT
        } else {
            crate::prefault::DEFAULT_EXTENT
        },
        yield_to: gate,
        taken,
        ..PrefaultOptions::default()
    };
    prefault(file, range, &opts, None)?;
    Ok(())
}
