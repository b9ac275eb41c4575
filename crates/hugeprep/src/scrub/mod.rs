//! Scrubbing: zeroing a released file's memory in parallel with the policy's method, under a
//! bandwidth cap when in the background and at full speed when a VM waits, then proving it
//! clean (sampled or full verification).
//!
//! This is the one place where hugeprep clears guest memory, so switching the clearing
//! engine is an edit in `Scrubber::clear_extent` and `Scrubber::clear_part`.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::clear::{ClearError, ClearPlan, ClearPurpose, Clearer, Method};
use crate::hugetlb::{BackingFile, FileError};
use crate::policy::pool::Verification;
use crate::sys::affinity::pin_current_thread;
use crate::sys::mmap::{populate_write_slice, MmapRegion};
use crate::sys::priority;

mod verify;
pub use verify::{first_nonzero, verify};

/// Extent each worker populates, clears and accounts for at a time: large enough for the
/// streaming paths of every method (`rep stosb` needs >= 32 MiB per call), small enough to
/// throttle and cancel promptly.
const STEP: usize = 64 << 20;

/// A scrub failed; the file must not be handed out.
#[derive(Debug, thiserror::Error)]
pub enum ScrubError {
    /// Mapping or opening the file failed.
    #[error("scrub: {0}")]
    File(#[from] FileError),
    /// A byte was still non-zero after clearing.
    #[error("scrub: verification found byte {value:#04x} at offset {offset} of {path}")]
    Verify {
        /// The file.
        path: String,
        /// Offset of the first non-zero byte found.
        offset: u64,
        /// Its value.
        value: u8,
    },
    /// The clearing engine failed (a worker could not be pinned).
    #[error("scrub of {path}: {source}")]
    Clear {
        /// The file.
        path: String,
        /// The engine's error.
        source: ClearError,
    },
    /// The daemon is shutting down.
    #[error("scrub of {path} cancelled")]
    Cancelled {
        /// The file.
        path: String,
    },
}

/// Shared switches for running scrubs: how many leases are waiting (any waiting lease lifts
/// the bandwidth cap and the idle priority) and whether to stop.
#[derive(Debug, Default)]
pub struct ScrubControl {
    waiters: AtomicUsize,
    cancel: AtomicBool,
}

impl ScrubControl {
    /// A lease starts waiting for scrubbed memory: scrubs run at full speed until
    /// [`ScrubControl::end_urgent`].
    pub fn begin_urgent(&self) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
    }

    /// The waiting lease got its memory (or gave up).
    pub fn end_urgent(&self) {
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether a lease is waiting.
    pub fn is_urgent(&self) -> bool {
        self.waiters.load(Ordering::SeqCst) > 0
    }

    /// Makes running and future scrubs stop with [`ScrubError::Cancelled`].
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }

    /// Whether scrubs are cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }
}

/// How to scrub.
#[derive(Debug, Clone)]
pub struct ScrubOptions {
    /// CPUs to run on, one worker each (the file's node's CPUs); empty = one unpinned worker.
    pub cpus: Vec<usize>,
    /// Bandwidth cap in bytes per second while no lease waits; `None` = none.
    pub bandwidth: Option<u64>,
    /// Run at idle priority (background) unless a lease waits.
    pub background: bool,
    /// How to check the result.
    pub verify: Verification,
    /// What a background scrub waits on between extents (the pool's start gate).
    pub yield_to: Option<std::sync::Arc<dyn crate::background::Yield>>,
}

/// What a scrub did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScrubReport {
    /// Bytes cleared.
    pub bytes: u64,
    /// Wall time of clearing and verifying.
    pub seconds: f64,
    /// Workers used.
    pub threads: usize,
    /// The CPUs each worker's `sched_getaffinity` reported after pinning, by worker (the
    /// clearing threads pin to the same CPUs).
    #[serde(default)]
    pub affinity: Vec<Vec<usize>>,
    /// The clearing method.
    pub method: Method,
    /// The verification done.
    pub verify: Verification,
}

impl ScrubReport {
    /// Throughput in GB/s (10^9 bytes per second).
    pub fn gbps(&self) -> f64 {
        crate::units::gbps(self.bytes, self.seconds)
    }
}

/// Zeroes memory with a clearing plan.
#[derive(Debug, Clone)]
pub struct Scrubber {
    clearer: Clearer,
}

struct Throttle<'a> {
    start: Instant,
    done: AtomicU64,
    cap: Option<u64>,
    control: &'a ScrubControl,
}

impl Throttle<'_> {
    /// Accounts `bytes` and sleeps as long as the cap asks, waking early when a lease starts
    /// waiting.
    fn account(&self, bytes: u64) {
        let done = self.done.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let Some(cap) = self.cap else { return };
        let due = Duration::from_secs_f64(done as f64 / cap as f64);
        while !self.control.is_urgent() && !self.control.is_cancelled() {
            let elapsed = self.start.elapsed();
            if elapsed >= due {
                break;
            }
            std::thread::sleep((due - elapsed).min(Duration::from_millis(10)));
        }
    }
}

fn set_priority(background: bool, control: &ScrubControl) {
    let want_idle = background && !control.is_urgent();
    if want_idle != priority::current_thread_is_idle() {
        // A thread that cannot change class scrubs in the one it has.
        let _ = if want_idle {
            priority::set_current_thread_idle()
        } else {
            priority::set_current_thread_normal()
        };
    }
}

impl Scrubber {
    /// A scrubber that clears with `plan` for [`ClearPurpose::Scrub`] (released memory is
    /// not read again soon, so it always streams, whatever `nt_min_extent` says); fails when
    /// this CPU lacks the plan's method.
    pub fn new(plan: ClearPlan) -> Result<Scrubber, ClearError> {
        Ok(Scrubber {
            clearer: Clearer::new(plan.for_purpose(ClearPurpose::Scrub))?,
        })
    }

    /// The plan's clearing method, used for every extent of a scrub.
    pub fn method(&self) -> Method {
        self.clearer.plan().method
    }

    /// The plan.
    pub fn plan(&self) -> ClearPlan {
        *self.clearer.plan()
    }

    /// Zeroes one extent with every worker (background scrubs). With
    /// [`Scrubber::clear_part`], the only calls into the clearing engine.
    fn clear_extent(&self, buf: &mut [u8], cpus: &[usize]) -> Result<(), ClearError> {
        self.clearer.clear_parallel(buf, cpus)
    }

    /// Zeroes one worker's part on the calling thread (foreground scrubs).
    fn clear_part(&self, part: &mut [u8]) {
        self.clearer.clear(part)
    }

    /// Maps `file` and zeroes it in parallel, then verifies it.
    pub fn scrub_file(
        &self,
        file: &BackingFile,
        opts: &ScrubOptions,
        control: &ScrubControl,
    ) -> Result<ScrubReport, ScrubError> {
        self.scrub_file_ranges(file, std::slice::from_ref(&(0..file.size())), opts, control)
    }

    /// Like [`Scrubber::scrub_file`], for the byte `ranges` of `file` only (whole pages, in
    /// order): the pages a released file still holds when the rest were punched out and
    /// refilled by the kernel, which zeroed them.
    pub fn scrub_file_ranges(
        &self,
        file: &BackingFile,
        ranges: &[Range<u64>],
        opts: &ScrubOptions,
        control: &ScrubControl,
    ) -> Result<ScrubReport, ScrubError> {
        let mut region = file.map()?;
        let path = file.path().display().to_string();
        let ranges: Vec<Range<usize>> = ranges
            .iter()
            .map(|r| r.start as usize..r.end as usize)
            .collect();
        self.scrub_ranges(
            &mut region,
            &ranges,
            &path,
            file.page_size().bytes() as usize,
            opts,
            control,
        )
    }

    /// Zeroes and verifies a mapped region (see [`Scrubber::scrub_file`]); `page` is the
    /// page size in bytes, `what` names it in errors.
    ///
    /// Pages that are not present (a crash in the middle of a fill) are faulted by the
    /// clearing stores themselves: a shared hugetlb mapping reserved them at mmap time, so
    /// such a fault cannot fail with SIGBUS.
    pub fn scrub_region(
        &self,
        region: &mut MmapRegion,
        what: &str,
        page: usize,
        opts: &ScrubOptions,
        control: &ScrubControl,
    ) -> Result<ScrubReport, ScrubError> {
        let len = region.len();
        self.scrub_ranges(
            region,
            std::slice::from_ref(&(0..len)),
            what,
            page,
            opts,
            control,
        )
    }

    fn scrub_ranges(
        &self,
        region: &mut MmapRegion,
        ranges: &[Range<usize>],
        what: &str,
        page: usize,
        opts: &ScrubOptions,
        control: &ScrubControl,
    ) -> Result<ScrubReport, ScrubError> {
        let start = Instant::now();
        let cpus = if opts.cpus.is_empty() {
            crate::sys::affinity::allowed_cpus()
        } else {
            opts.cpus.clone()
        };
        let throttle = Throttle {
            start,
            done: AtomicU64::new(0),
            cap: if opts.background {
                opts.bandwidth
            } else {
                None
            },
            control,
        };
        let mut bytes = 0;
        let mut affinity = Vec::new();
        for range in ranges {
            let range = range.start.min(region.len())..range.end.min(region.len());
            let used =
                self.scrub_range(region, range.clone(), what, page, &cpus, opts, &throttle)?;
            if used.len() > affinity.len() {
                affinity = used;
            }
            bytes += range.len() as u64;
        }
        Ok(ScrubReport {
            bytes,
            seconds: start.elapsed().as_secs_f64(),
            threads: cpus.len().max(1),
            affinity,
            method: self.method(),
            verify: opts.verify,
        })
    }

    /// Populates, clears and verifies `range` of `region` with one worker per CPU.
    #[allow(clippy::too_many_arguments)]
    fn scrub_range(
        &self,
        region: &mut MmapRegion,
        range: Range<usize>,
        what: &str,
        page: usize,
        cpus: &[usize],
        opts: &ScrubOptions,
        throttle: &Throttle<'_>,
    ) -> Result<Vec<Vec<usize>>, ScrubError> {
        let control = throttle.control;
        let workers = cpus.len().max(1);
        // Map every page table entry in one call first: a fresh mapping of a faulted file
        // would otherwise take one minor fault per page inside the clearing loop.
        let base = range.start;
        let len = range.len();
        let per_worker = len.div_ceil(page).div_ceil(workers) * page;
        if !opts.background {
            let part = &mut region.as_mut_slice()[range];
            return self.scrub_foreground(part, base, what, page, per_worker, cpus, opts, control);
        }
        let affinity: Vec<Vec<usize>> = std::thread::scope(|s| {
            let region = &*region;
            let handles: Vec<_> = cpus
                .iter()
                .enumerate()
                .filter_map(|(w, &cpu)| {
                    let off = (w * per_worker).min(len);
                    let n = per_worker.min(len - off);
                    (n > 0).then(|| {
                        s.spawn(move || {
                            // Unpinned, it still clears; only locality suffers.
                            let _ = pin_current_thread(&[cpu]);
                            let affinity = crate::sys::affinity::allowed_cpus();
                            tracing::debug!(what, cpu, ?affinity, "scrub worker pinned");
                            if let Err(err) = region.populate_write(base + off, n) {
                                tracing::debug!(%err, "populate before scrub failed; clearing faults pages in");
                            }
                            affinity
                        })
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        let buf = &mut region.as_mut_slice()[range];
        // Extents of STEP bytes per worker: each call streams (>= the LLC size per call),
        // and the cap, urgency and cancellation are looked at between calls. Threads the
        // clearer starts inherit this thread's scheduling class.
        let extent_len = STEP * workers;
        for extent in buf.chunks_mut(extent_len) {
            if let Some(gate) = &opts.yield_to {
                gate.wait_turn();
            }
            if control.is_cancelled() {
                return Err(ScrubError::Cancelled { path: what.into() });
            }
            set_priority(opts.background, control);
            self.clear_extent(extent, cpus)
                .map_err(|source| ScrubError::Clear {
                    path: what.into(),
                    source,
                })?;
            throttle.account(extent.len() as u64);
        }
        let buf = &*buf;
        let results: Vec<Result<(), (u64, u8)>> = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(per_worker.max(page))
                .enumerate()
                .map(|(w, chunk)| {
                    let cpu = cpus.get(w).copied();
                    s.spawn(move || {
                        if let Some(cpu) = cpu {
                            // Unpinned, it still clears; only locality suffers.
                            let _ = pin_current_thread(&[cpu]);
                        }
                        verify(chunk, (base + w * per_worker) as u64, page, opts.verify)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err((u64::MAX, 0))))
                .collect()
        });
        for r in results {
            r.map_err(|(offset, value)| ScrubError::Verify {
                path: what.into(),
                offset,
                value,
            })?;
        }
        Ok(affinity)
    }
}

impl Scrubber {
    /// A foreground scrub (a VM waits): one pinned thread per worker maps the page table
    /// entries of its part, clears it and verifies it, with no pause between the phases and
    /// one thread start per worker. Three rounds of thread starts and joins (populate,
    /// clear, verify) cost a one-thread scrub of 1 GiB several percent, more on a busy host.
    #[allow(clippy::too_many_arguments)]
    fn scrub_foreground(
        &self,
        buf: &mut [u8],
        base: usize,
        what: &str,
        page: usize,
        per_worker: usize,
        cpus: &[usize],
        opts: &ScrubOptions,
        control: &ScrubControl,
    ) -> Result<Vec<Vec<usize>>, ScrubError> {
        if control.is_cancelled() {
            return Err(ScrubError::Cancelled { path: what.into() });
        }
        set_priority(false, control);
        let results: Vec<Result<Vec<usize>, ScrubError>> = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks_mut(per_worker.max(page))
                .zip(cpus)
                .enumerate()
                .map(|(w, (part, &cpu))| {
                    s.spawn(move || {
                        let offset = base + w * per_worker;
                        pin_current_thread(&[cpu]).map_err(|source| ScrubError::Clear {
                            path: what.into(),
                            source: ClearError::Pin {
                                start: offset,
                                end: offset + part.len(),
                                source,
                            },
                        })?;
                        let affinity = crate::sys::affinity::allowed_cpus();
                        tracing::debug!(what, cpu, ?affinity, "scrub worker pinned");
                        if let Err(err) = populate_write_slice(part) {
                            tracing::debug!(%err, "populate before scrub failed; clearing faults pages in");
                        }
                        self.clear_part(part);
                        verify(part, offset as u64, page, opts.verify).map_err(
                            |(offset, value)| ScrubError::Verify {
                                path: what.into(),
                                offset,
                                value,
                            },
                        )?;
                        Ok(affinity)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        results.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(verify: Verification) -> ScrubOptions {
        ScrubOptions {
            cpus: vec![0, 0],
            bandwidth: None,
            background: false,
            verify,
            yield_to: None,
        }
    }

    #[test]
    fn scrub_zeroes_every_byte_of_a_region() {
        let mut r = MmapRegion::anonymous(6 << 20, None).unwrap();
        r.as_mut_slice().fill(0xa7);
        let s = Scrubber::new(ClearPlan::always(Method::WriteBytes)).unwrap();
        let rep = s
            .scrub_region(
                &mut r,
                "anon",
                2 << 20,
                &opts(Verification::Full),
                &ScrubControl::default(),
            )
            .unwrap();
        assert_eq!(rep.bytes, 6 << 20);
        assert!(r.as_slice().iter().all(|&b| b == 0));
    }

    #[test]
    fn cancelled_scrub_stops() {
        let mut r = MmapRegion::anonymous(4 << 20, None).unwrap();
        let c = ScrubControl::default();
        c.cancel();
        let s = Scrubber::new(ClearPlan::always(Method::WriteBytes)).unwrap();
        let err = s
            .scrub_region(&mut r, "anon", 2 << 20, &opts(Verification::Sample), &c)
            .unwrap_err();
        assert!(matches!(err, ScrubError::Cancelled { .. }), "{err}");
    }

    #[test]
    fn capped_scrub_is_lifted_by_a_waiting_lease() {
        let mut r = MmapRegion::anonymous(8 << 20, None).unwrap();
        let c = ScrubControl::default();
        c.begin_urgent();
        let mut o = opts(Verification::Sample);
        o.background = true;
        o.bandwidth = Some(1); // one byte per second: only urgency lets this finish
        let s = Scrubber::new(ClearPlan::always(Method::WriteBytes)).unwrap();
        s.scrub_region(&mut r, "anon", 2 << 20, &o, &c).unwrap();
        c.end_urgent();
        assert!(!c.is_urgent());
    }
}
