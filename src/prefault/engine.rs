//! The prefault itself: map, bind, split into disjoint chunks, fault in parallel on pinned
//! workers, prove presence, lock.

use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{default_threads, Populate, PrefaultError, PrefaultOptions, PrefaultReport};
use crate::hugetlb::{pool, BackingFile, Scope};
use crate::sys::affinity::{allowed_cpus, pin_current_thread};
use crate::sys::mmap::MmapRegion;
use crate::sys::numa;
use crate::topology::Topology;
use crate::units::gbps;

/// How often the calling thread reports progress while workers run.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(25);
/// Bytes per `mincore` call when proving presence (bounds the result vector).
const VERIFY_CHUNK: u64 = 1 << 30;

/// A prefaulted range together with its (locked) mapping. The lock lasts as long as the
/// mapping: a daemon that wants the pin to hold keeps this value.
#[derive(Debug)]
pub struct Prefaulted {
    /// What was done.
    pub report: PrefaultReport,
    /// The mapping of the range (file offset `range.start` at its start).
    pub region: MmapRegion,
}

/// Faults in `range` of `file` in parallel and proves every page present; the mapping is
/// dropped afterwards (the pages stay in the file). See [`prefault_mapped`] to keep it.
///
/// On error, pages faulted so far stay in the file: a caller that created the file removes
/// it, one that grew it shrinks it back ([`super::prepare`] and [`super::grow`] do).
///
/// ```no_run
/// use hugeprep::hugetlb::BackingFile;
/// use hugeprep::prefault::{prefault, PrefaultOptions};
/// use hugeprep::PageSize;
/// let file = BackingFile::memfd("guest", 1 << 30, PageSize::Size2M).unwrap();
/// let opts = PrefaultOptions { node: Some(0), ..Default::default() };
/// let report = prefault(&file, 0..file.size(), &opts, None).unwrap();
/// println!("{} GB/s on {} threads", report.gbps, report.threads);
/// ```
pub fn prefault(
    file: &BackingFile,
    range: Range<u64>,
    opts: &PrefaultOptions,
    progress: Option<&dyn Fn(u64)>,
) -> Result<PrefaultReport, PrefaultError> {
    prefault_mapped(file, range, opts, progress).map(|p| p.report)
}

/// The worker plan: the CPUs to pin to and the thread count.
fn plan(
    bytes: u64,
    page: u64,
    opts: &PrefaultOptions,
) -> Result<(Vec<usize>, usize), PrefaultError> {
    let allowed = allowed_cpus();
    let cpus = match opts.node {
        Some(n) => {
            let topology = Topology::detect()?;
            let node_cpus: Vec<usize> = topology
                .node(n)?
                .cpus
                .iter()
                .copied()
                .filter(|c| allowed.contains(c))
                .collect();
            // A memory-only node (CXL, HBM) has no CPUs: run where we may, bound to it.
            if node_cpus.is_empty() {
                allowed
            } else {
                node_cpus
            }
        }
        None => allowed,
    };
    let threads = match opts.threads {
        Some(0) => return Err(PrefaultError::Threads),
        Some(t) => t.min(default_threads(bytes, cpus.len(), Some(t))),
        None => default_threads(bytes, cpus.len(), opts.policy_threads),
    };
    // Workers split whole pages: never more workers than pages.
    let pages = usize::try_from(bytes / page).unwrap_or(usize::MAX);
    Ok((cpus, threads.min(pages).max(1)))
}

/// Pages of `range` that may still need a free page: the range's pages minus every page the
/// file already holds anywhere, so the check never refuses a request that fits.
fn pages_needed(file: &BackingFile, range: &Range<u64>) -> u64 {
    let page = file.page_size().bytes();
    let held = file
        .file()
        .metadata()
        .map(|m| m.blocks() * 512 / page)
        .unwrap_or(0);
    ((range.end - range.start) / page).saturating_sub(held)
}

/// Like [`prefault`], and returns the mapping, locked when `opts.lock` is set.
pub fn prefault_mapped(
    file: &BackingFile,
    range: Range<u64>,
    opts: &PrefaultOptions,
    progress: Option<&dyn Fn(u64)>,
) -> Result<Prefaulted, PrefaultError> {
    let page_size = file.page_size();
    let page = page_size.bytes();
    if range.start >= range.end
        || range.start % page != 0
        || range.end % page != 0
        || range.end > file.size()
    {
        return Err(PrefaultError::Range {
            path: file.path().to_path_buf(),
            start: range.start,
            end: range.end,
            file_size: file.size(),
            page_size,
        });
    }
    let bytes = range.end - range.start;
    let (cpus, threads) = plan(bytes, page, opts)?;
    let scope = Scope::from_node(opts.node);

    let needed = pages_needed(file, &range);
    let free = pool::available(opts.node, page_size)?;
    if needed > free {
        return Err(PrefaultError::Insufficient {
            scope,
            page_size,
            needed,
            free,
            path: file.path().to_path_buf(),
        });
    }

    let start = Instant::now();
    let region = file
        .map_range(range.start, bytes)
        .map_err(|source| PrefaultError::Reserve {
            bytes,
            page_size,
            source,
        })?;
    if let Some(node) = opts.node {
        numa::bind_region(&region, 0, region.len(), node)?;
    }

    let extent = (opts.extent / page).max(1) * page;
    let pages = bytes / page;
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let no_populate_write = AtomicBool::new(opts.populate == Populate::Mlock);
    let worker_cpus: Vec<usize> = (0..threads).map(|i| cpus[i % cpus.len()]).collect();

    let ctx = Worker {
        file,
        region: &region,
        range_start: range.start,
        extent,
        scope,
        opts,
        done: &done,
        stop: &stop,
        no_populate_write: &no_populate_write,
    };
    let results: Vec<Result<Vec<usize>, PrefaultError>> = std::thread::scope(|s| {
        // Each worker says when it is done, so the caller learns of the end at once rather
        // than at the next progress tick (a tick is a sizeable share of a 100 ms fill).
        let (finished_tx, finished_rx) = mpsc::channel::<()>();
        let handles: Vec<_> = worker_cpus
            .iter()
            .enumerate()
            .map(|(i, &cpu)| {
                // Whole pages, as even as they divide: no worker is left without work.
                let lo = pages * i as u64 / threads as u64 * page;
                let hi = pages * (i as u64 + 1) / threads as u64 * page;
                let ctx = &ctx;
                let finished = finished_tx.clone();
                s.spawn(move || {
                    let result = ctx.run(cpu, lo..hi);
                    let _ = finished.send(());
                    result
                })
            })
            .collect();
        // A worker that panics drops its sender unwinding: the channel disconnects once every
        // worker is gone either way.
        drop(finished_tx);
        let mut running = handles.len();
        while running > 0 {
            match finished_rx.recv_timeout(PROGRESS_INTERVAL) {
                Ok(()) => running -= 1,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if let Some(report) = progress {
                report(done.load(Ordering::Relaxed));
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(PrefaultError::WorkerPanicked)))
            .collect()
    });
    // A real failure explains the others, which only stopped because of it.
    let (affinity, errors): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
    let affinity: Vec<Vec<usize>> = affinity.into_iter().filter_map(Result::ok).collect();
    let mut errors: Vec<PrefaultError> = errors.into_iter().filter_map(Result::err).collect();
    if !errors.is_empty() {
        let first_real = errors
            .iter()
            .position(|e| !matches!(e, PrefaultError::Cancelled { .. }))
            .unwrap_or(0);
        return Err(errors.swap_remove(first_real));
    }
    if let Some(report) = progress {
        report(bytes);
    }

    let faulted = start.elapsed();
    verify_present(file, &region, range.start)?;
    let verified = start.elapsed();
    let verify_err = |source| PrefaultError::Verify {
        path: file.path().to_path_buf(),
        source,
    };
    if opts.lock {
        region.lock(0, region.len()).map_err(verify_err)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    tracing::debug!(
        path = %file.path().display(),
        bytes,
        threads,
        fault_ms = faulted.as_secs_f64() * 1e3,
        verify_ms = (verified - faulted).as_secs_f64() * 1e3,
        lock_ms = (seconds - verified.as_secs_f64()) * 1e3,
        "prefault phases"
    );
    let method = if no_populate_write.load(Ordering::Relaxed) {
        Populate::Mlock
    } else {
        Populate::PopulateWrite
    };
    Ok(Prefaulted {
        report: super::PrefaultReport {
            bytes,
            page_size,
            threads,
            cpus: worker_cpus,
            affinity,
            node: opts.node,
            seconds,
            gbps: gbps(bytes, seconds),
            method,
            locked: opts.lock,
        },
        region,
    })
}

/// What every worker shares.
struct Worker<'a> {
    file: &'a BackingFile,
    region: &'a MmapRegion,
    range_start: u64,
    extent: u64,
    scope: Scope,
    opts: &'a PrefaultOptions,
    done: &'a AtomicU64,
    stop: &'a AtomicBool,
    no_populate_write: &'a AtomicBool,
}

impl Worker<'_> {
    /// Faults `chunk` (offsets in the mapping), pinned to `cpu`; returns the affinity the
    /// kernel reports for the worker; on failure tells the other workers to stop.
    fn run(&self, cpu: usize, chunk: Range<u64>) -> Result<Vec<usize>, PrefaultError> {
        let result = self.fault_chunk(cpu, chunk);
        if result.is_err() {
            self.stop.store(true, Ordering::Relaxed);
        }
        result
    }

    fn cancelled(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self
                .opts
                .cancel
                .as_ref()
                .is_some_and(|c| c.load(Ordering::Relaxed))
    }

    fn fault_chunk(&self, cpu: usize, chunk: Range<u64>) -> Result<Vec<usize>, PrefaultError> {
        pin_current_thread(&[cpu])?;
        let affinity = allowed_cpus();
        tracing::debug!(cpu, ?affinity, "prefault worker pinned");
        let mut offset = chunk.start;
        while offset < chunk.end {
            if self.cancelled() {
                return Err(PrefaultError::Cancelled {
                    path: self.file.path().to_path_buf(),
                    done: self.done.load(Ordering::Relaxed),
                    bytes: self.region.len() as u64,
                });
            }
            let len = self.extent.min(chunk.end - offset);
            self.fault_extent(offset, len)?;
            self.done.fetch_add(len, Ordering::Relaxed);
            offset += len;
        }
        Ok(affinity)
    }

    fn fault_extent(&self, offset: u64, len: u64) -> Result<(), PrefaultError> {
        let (off, n) = (offset as usize, len as usize);
        let result = if self.no_populate_write.load(Ordering::Relaxed) {
            self.region.lock(off, n)
        } else {
            match self.region.populate_write(off, n) {
                Err(e) if self.opts.populate == Populate::Auto && is_einval(&e) => {
                    tracing::debug!("MADV_POPULATE_WRITE unsupported ({e}); faulting with mlock");
                    self.no_populate_write.store(true, Ordering::Relaxed);
                    self.region.lock(off, n)
                }
                other => other,
            }
        };
        result.map_err(|source| PrefaultError::Populate {
            path: self.file.path().to_path_buf(),
            offset: self.range_start + offset,
            end: self.range_start + offset + len,
            scope: self.scope,
            source,
        })
    }
}

fn is_einval(e: &crate::sys::mmap::MmapError) -> bool {
    matches!(e, crate::sys::mmap::MmapError::Range { source, .. } if source.raw_os_error() == Some(libc::EINVAL))
}

/// Proves with `mincore` that every page of the mapping is present.
fn verify_present(
    file: &BackingFile,
    region: &MmapRegion,
    range_start: u64,
) -> Result<(), PrefaultError> {
    let len = region.len() as u64;
    let mut offset = 0;
    while offset < len {
        let n = VERIFY_CHUNK.min(len - offset);
        let resident = region
            .resident(offset as usize, n as usize)
            .map_err(|source| PrefaultError::Verify {
                path: file.path().to_path_buf(),
                source,
            })?;
        if let Some(missing) = resident.iter().position(|&r| !r) {
            return Err(PrefaultError::Missing {
                path: file.path().to_path_buf(),
                offset: range_start + offset + missing as u64 * 4096,
            });
        }
        offset += n;
    }
    Ok(())
}
