//! The prefault itself: map, bind, split into disjoint chunks, fault in parallel on pinned
//! workers, prove presence, lock.

use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{default_threads, Populate, PrefaultError, PrefaultOptions, PrefaultReport};
use crate::hugetlb::{pool, BackingFile, Scope};
use crate::sys::affinity::{allowed_cpus, current_cpu, pin_current_thread};
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
    if opts.populate == Populate::Fallocate && !opts.lock {
        return allocate(file, range, opts, progress);
    }
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
            let known = match &opts.cpus {
                Some(cpus) => cpus.clone(),
                None => Topology::detect()?.node(n)?.cpus.clone(),
            };
            let node_cpus: Vec<usize> = known.into_iter().filter(|c| allowed.contains(c)).collect();
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

/// Pages the file holds anywhere (hugetlbfs counts them in `st_blocks`). The range may still
/// need its pages minus these, so the check never refuses a request that fits.
fn pages_held(file: &BackingFile) -> u64 {
    let page = file.page_size().bytes();
    file.file()
        .metadata()
        .map(|m| m.blocks() * 512 / page)
        .unwrap_or(0)
}

/// What [`start`] found: the work and where it runs.
struct Plan {
    bytes: u64,
    cpus: Vec<usize>,
    threads: usize,
    scope: Scope,
    /// Pages the file held before.
    held: u64,
}

/// Checks the range and the pool and plans the workers.
fn start(
    file: &BackingFile,
    range: &Range<u64>,
    opts: &PrefaultOptions,
) -> Result<Plan, PrefaultError> {
    if let Some(taken) = &opts.taken {
        taken.begin(file);
    }
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
    let held = pages_held(file);
    let needed = ((range.end - range.start) / page).saturating_sub(held);
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
    Ok(Plan {
        bytes,
        cpus,
        threads,
        scope,
        held,
    })
}

/// Like [`prefault`], and returns the mapping, locked when `opts.lock` is set.
pub fn prefault_mapped(
    file: &BackingFile,
    range: Range<u64>,
    opts: &PrefaultOptions,
    progress: Option<&dyn Fn(u64)>,
) -> Result<Prefaulted, PrefaultError> {
    let plan = start(file, &range, opts)?;
    let (bytes, page_size) = (plan.bytes, file.page_size());
    let begun = Instant::now();
    let region = file
        .map_range(range.start, bytes)
        .map_err(|source| PrefaultError::Reserve {
            bytes,
            page_size,
            source,
        })?;
    // The mapping reserved every page of the range it did not have.
    if let Some(taken) = &opts.taken {
        taken.mapped(bytes);
    }
    if let Some(node) = opts.node {
        numa::bind_region(&region, 0, region.len(), node)?;
    }
    let ran = run_workers(file, Some(&region), range.start, &plan, opts, progress)?;
    let faulted = begun.elapsed();
    if opts.populate == Populate::Fallocate {
        // `mincore` sees page tables, and `fallocate` fills none.
        verify_allocated(file, &plan, range.start)?;
    } else {
        verify_present(file, &region, range.start)?;
    }
    let verified = begun.elapsed();
    if opts.lock {
        region
            .lock(0, region.len())
            .map_err(|source| PrefaultError::Verify {
                path: file.path().to_path_buf(),
                source,
            })?;
    }
    let seconds = begun.elapsed().as_secs_f64();
    tracing::debug!(
        path = %file.path().display(),
        bytes,
        threads = plan.threads,
        fault_ms = faulted.as_secs_f64() * 1e3,
        verify_ms = (verified - faulted).as_secs_f64() * 1e3,
        lock_ms = (seconds - verified.as_secs_f64()) * 1e3,
        "prefault phases"
    );
    Ok(Prefaulted {
        report: report(file, &plan, opts, ran, seconds),
        region,
    })
}

/// [`prefault`] by `fallocate` alone: no mapping, so nothing to lock; the file's page
/// count proves the range present.
fn allocate(
    file: &BackingFile,
    range: Range<u64>,
    opts: &PrefaultOptions,
    progress: Option<&dyn Fn(u64)>,
) -> Result<PrefaultReport, PrefaultError> {
    let plan = start(file, &range, opts)?;
    let begun = Instant::now();
    let ran = run_workers(file, None, range.start, &plan, opts, progress)?;
    verify_allocated(file, &plan, range.start)?;
    let seconds = begun.elapsed().as_secs_f64();
    Ok(report(file, &plan, opts, ran, seconds))
}

/// Checks the file's page count after `fallocate`, which succeeds only once every page of
/// the range is in the file: at least the range's pages, and no fewer than before.
fn verify_allocated(file: &BackingFile, plan: &Plan, start: u64) -> Result<(), PrefaultError> {
    let range_pages = plan.bytes / file.page_size().bytes();
    if pages_held(file) < range_pages.max(plan.held) {
        return Err(PrefaultError::Missing {
            path: file.path().to_path_buf(),
            offset: start,
        });
    }
    Ok(())
}

/// What the workers did: the CPU each started on, the affinity each saw, and the method.
struct Ran {
    cpus: Vec<usize>,
    affinity: Vec<Vec<usize>>,
    method: Populate,
}

fn report(
    file: &BackingFile,
    plan: &Plan,
    opts: &PrefaultOptions,
    ran: Ran,
    seconds: f64,
) -> PrefaultReport {
    PrefaultReport {
        bytes: plan.bytes,
        page_size: file.page_size(),
        threads: plan.threads,
        cpus: ran.cpus,
        affinity: ran.affinity,
        node: opts.node,
        seconds,
        gbps: gbps(plan.bytes, seconds),
        method: ran.method,
        locked: opts.lock,
    }
}

/// Runs the plan's workers over the range (offsets from `range_start`; through `region`
/// where there is one) until all are done or one fails.
fn run_workers(
    file: &BackingFile,
    region: Option<&MmapRegion>,
    range_start: u64,
    plan: &Plan,
    opts: &PrefaultOptions,
    progress: Option<&dyn Fn(u64)>,
) -> Result<Ran, PrefaultError> {
    let page = file.page_size().bytes();
    let (bytes, threads) = (plan.bytes, plan.threads);
    let extent = (opts.extent / page).max(1) * page;
    let pages = bytes / page;
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let no_populate_write = AtomicBool::new(opts.populate == Populate::Mlock);
    let ctx = Worker {
        file,
        region,
        range_start,
        bytes,
        extent,
        scope: plan.scope,
        opts,
        done: &done,
        stop: &stop,
        no_populate_write: &no_populate_write,
    };
    // One `fallocate` worker on a CPU of the node already: the calling thread is the worker.
    // No thread to start (its stack is an `mmap`, which waits for the process's
    // `mmap_lock`), and the work keeps the caller's scheduling class: a lease's fault stays
    // on the lease thread at the API's priority.
    if opts.populate == Populate::Fallocate && threads == 1 {
        if let Some(cpu) = current_cpu().filter(|c| plan.cpus.contains(c)) {
            ctx.fault_extents(0..bytes, progress)?;
            return Ok(Ran {
                cpus: vec![cpu],
                affinity: vec![allowed_cpus()],
                method: Populate::Fallocate,
            });
        }
    }
    let pins = worker_pins(&plan.cpus, threads);
    let results: Vec<Result<(usize, Vec<usize>), PrefaultError>> = std::thread::scope(|s| {
        // Each worker says when it is done, so the caller learns of the end at once rather
        // than at the next progress tick (a tick is a sizeable share of a 100 ms fill).
        let (finished_tx, finished_rx) = mpsc::channel::<()>();
        let handles: Vec<_> = pins
            .iter()
            .enumerate()
            .map(|(i, pin)| {
                // Whole pages, as even as they divide: no worker is left without work.
                let lo = pages * i as u64 / threads as u64 * page;
                let hi = pages * (i as u64 + 1) / threads as u64 * page;
                let ctx = &ctx;
                let finished = finished_tx.clone();
                s.spawn(move || {
                    let result = ctx.run(pin, lo..hi);
                    // The receiver lives until every worker has sent.
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
    let (ran, errors): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
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
    let (cpus, affinity) = ran.into_iter().filter_map(Result::ok).unzip();
    let method = match opts.populate {
        Populate::Fallocate => Populate::Fallocate,
        _ if no_populate_write.load(Ordering::Relaxed) => Populate::Mlock,
        _ => Populate::PopulateWrite,
    };
    Ok(Ran {
        cpus,
        affinity,
        method,
    })
}

/// Where each of `threads` workers may run. Several workers get one CPU each, starting at a
/// rotating offset so that concurrent small prefaults (leases) do not all queue on the
/// node's first CPU. A lone worker may run on any of the node's CPUs: the scheduler puts it
/// on the least busy one, where a pin would put every lease's fault on the same CPU.
fn worker_pins(cpus: &[usize], threads: usize) -> Vec<Vec<usize>> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    if threads == 1 {
        return vec![cpus.to_vec()];
    }
    let start = NEXT.fetch_add(threads, Ordering::Relaxed);
    (0..threads)
        .map(|i| vec![cpus[(start + i) % cpus.len()]])
        .collect()
}

/// What every worker shares.
struct Worker<'a> {
    file: &'a BackingFile,
    /// The range's mapping; `None` with [`Populate::Fallocate`] alone.
    region: Option<&'a MmapRegion>,
    range_start: u64,
    bytes: u64,
    extent: u64,
    scope: Scope,
    opts: &'a PrefaultOptions,
    done: &'a AtomicU64,
    stop: &'a AtomicBool,
    no_populate_write: &'a AtomicBool,
}

impl Worker<'_> {
    /// Faults `chunk` (offsets in the mapping), pinned to `pin`; returns the CPU the worker
    /// started on and the affinity the kernel reports for it; on failure tells the other
    /// workers to stop.
    fn run(&self, pin: &[usize], chunk: Range<u64>) -> Result<(usize, Vec<usize>), PrefaultError> {
        let result = self.fault_chunk(pin, chunk);
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

    fn fault_chunk(
        &self,
        pin: &[usize],
        chunk: Range<u64>,
    ) -> Result<(usize, Vec<usize>), PrefaultError> {
        pin_current_thread(pin)?;
        let affinity = allowed_cpus();
        let cpu = current_cpu().unwrap_or(pin[0]);
        tracing::debug!(cpu, ?affinity, "prefault worker pinned");
        self.fault_extents(chunk, None)?;
        Ok((cpu, affinity))
    }

    /// Faults `chunk` extent by extent, stopping when cancelled.
    fn fault_extents(
        &self,
        chunk: Range<u64>,
        progress: Option<&dyn Fn(u64)>,
    ) -> Result<(), PrefaultError> {
        // `fallocate` has no mapping to bind: the thread's own allocations go to the node
        // meanwhile (a request thread lives on, so its earlier policy comes back after).
        let _bound = match (self.opts.node, self.opts.populate) {
            (Some(node), Populate::Fallocate) => Some(numa::ThreadBinding::bind(node)?),
            _ => None,
        };
        let mut offset = chunk.start;
        while offset < chunk.end {
            if let Some(gate) = &self.opts.yield_to {
                gate.wait_turn();
            }
            if self.cancelled() {
                return Err(PrefaultError::Cancelled {
                    path: self.file.path().to_path_buf(),
                    done: self.done.load(Ordering::Relaxed),
                    bytes: self.bytes,
                });
            }
            let len = self.extent.min(chunk.end - offset);
            self.fault_extent(offset, len)?;
            let done = self.done.fetch_add(len, Ordering::Relaxed) + len;
            if let Some(report) = progress {
                report(done);
            }
            offset += len;
        }
        Ok(())
    }

    fn fault_extent(&self, offset: u64, len: u64) -> Result<(), PrefaultError> {
        let region = match self.region {
            Some(r) if self.opts.populate != Populate::Fallocate => r,
            _ => return self.allocate_extent(offset, len),
        };
        let (off, n) = (offset as usize, len as usize);
        let result = if self.no_populate_write.load(Ordering::Relaxed) {
            region.lock(off, n)
        } else {
            match region.populate_write(off, n) {
                Err(e) if self.opts.populate == Populate::Auto && is_einval(&e) => {
                    tracing::debug!("MADV_POPULATE_WRITE unsupported ({e}); faulting with mlock");
                    self.no_populate_write.store(true, Ordering::Relaxed);
                    region.lock(off, n)
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

impl Worker<'_> {
    /// `fallocate` of an extent; `ENOSPC`/`ENOMEM`: the pool ran dry meanwhile.
    fn allocate_extent(&self, offset: u64, len: u64) -> Result<(), PrefaultError> {
        let start = self.range_start + offset;
        let page_size = self.file.page_size();
        self.file.allocate(start, len).map_err(|source| {
            if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::ENOMEM)) {
                let free = pool::available(self.opts.node, page_size).unwrap_or(0);
                PrefaultError::Insufficient {
                    scope: self.scope,
                    page_size,
                    needed: len / page_size.bytes(),
                    free,
                    path: self.file.path().to_path_buf(),
                }
            } else {
                PrefaultError::Allocate {
                    path: self.file.path().to_path_buf(),
                    offset: start,
                    end: start + len,
                    scope: self.scope,
                    source,
                }
            }
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
