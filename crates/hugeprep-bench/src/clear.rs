//! `hugeprep bench clear`: every clearing method at every chunk size and thread count, side by
//! side in one run with the kernel's own zeroing of fresh hugetlbfs pages at fault time.
//!
//! Chunk semantics: a measurement clears the whole buffer by calling the method's kernel on
//! consecutive chunks of the chunk size; the chunks are split into contiguous runs, one per
//! worker thread, each pinned to its own CPU. A chunk size shows what a caller that clears
//! extent by extent gets (one `sfence` and one `rep stosb` start-up per chunk). The raw method
//! is timed (`nt_min_extent` = 0, fence every 2 MiB), not the policy's small-extent fallback.
//!
//! Every configuration gets one untimed warm-up repetition first: the first touch of memory
//! (on a VM host, of guest-physical memory since boot) is about 25x slower than any method.

use std::ops::{ControlFlow, Range};
use std::sync::Barrier;
use std::time::{Duration, Instant};

pub use super::clear_config::{ClearBenchConfig, PolicyChoice, CHUNK_SIZES, MIN_REPS};
pub use super::clear_results::{ClearBenchReport, KernelResult, MethodResult, PurposeResult};
use super::Summary;
use hugeprep::clear::{ClearError, ClearPlan, ClearPurpose, Clearer, Method};
use hugeprep::hugetlb::lock::HugepageLock;
use hugeprep::hugetlb::{BackingFile, FileError};
use hugeprep::hugetlb::{PoolError, PoolTopUp};
use hugeprep::page_size::PageSize;
use hugeprep::sys::affinity::{allowed_cpus, pin_current_thread, AffinityError};
use hugeprep::sys::mmap::{MmapError, MmapRegion};
use hugeprep::units::{format_bytes, gbps};

/// A benchmark that cannot start or could not finish.
#[derive(Debug, thiserror::Error)]
pub enum ClearBenchError {
    /// A configuration field is out of range.
    #[error("bench clear: `{field}` {problem}")]
    Config {
        /// The field (also the CLI option).
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A method cannot run on this CPU.
    #[error("bench clear: {0}")]
    Clear(#[from] ClearError),
    /// The hugepage pool counters could not be read or locked.
    #[error("bench clear: {0}")]
    Hugepages(#[from] PoolError),
    /// The scratch buffer could not be mapped.
    #[error("bench clear: cannot map the {} buffer: {source}", format_bytes(*.len as u64))]
    Map {
        /// Bytes asked for.
        len: usize,
        /// The mapping error.
        source: MmapError,
    },
    /// A memfd for the kernel fault-in baseline could not be made or mapped.
    #[error("bench clear: kernel fault-in baseline ({page_size} pages): {source}")]
    Baseline {
        /// Page size measured.
        page_size: PageSize,
        /// The file error.
        source: FileError,
    },
    /// Populating fresh pages failed (the pool ran short).
    #[error("bench clear: kernel fault-in of {page_size} pages: {source}")]
    Populate {
        /// Page size measured.
        page_size: PageSize,
        /// The madvise error.
        source: MmapError,
    },
    /// A worker could not be pinned to its CPU.
    #[error("bench clear: {0}")]
    Pin(#[from] AffinityError),
    /// The progress callback asked to stop (Ctrl-C); borrowed hugepages were given back.
    #[error("bench clear: cancelled after {done} of {total} measurements")]
    Cancelled {
        /// Measurements finished.
        done: usize,
        /// Measurements planned.
        total: usize,
    },
}

/// What one timed clearer is.
#[derive(Debug, Clone, Copy)]
enum Timed {
    Method(Method),
    Purpose(ClearPurpose),
}

impl std::fmt::Display for Timed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Timed::Method(m) => write!(f, "{m}"),
            Timed::Purpose(p) => write!(f, "in use ({p})"),
        }
    }
}

/// Progress of a run, for a progress bar.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchProgress {
    /// Measurements finished.
    pub done: usize,
    /// Measurements planned.
    pub total: usize,
    /// What is being measured next.
    pub label: String,
}

/// Runs `work` on one pinned thread per part, all released together by a barrier, and
/// returns the time from the first start to the last finish.
fn timed_on<T: Send>(
    cpus: &[usize],
    parts: Vec<T>,
    work: impl Fn(T) -> Result<(), ClearBenchError> + Sync,
) -> Result<Duration, ClearBenchError> {
    let barrier = Barrier::new(parts.len());
    let (barrier, work) = (&barrier, &work);
    std::thread::scope(|scope| {
        let workers: Vec<_> = parts
            .into_iter()
            .zip(cpus)
            .map(|(part, &cpu)| {
                scope.spawn(move || {
                    // Wait at the barrier even when pinning failed, or the others would hang.
                    let pinned = pin_current_thread(&[cpu]);
                    barrier.wait();
                    let start = Instant::now();
                    pinned?;
                    work(part)?;
                    Ok::<_, ClearBenchError>((start, Instant::now()))
                })
            })
            .collect();
        let mut span: Option<(Instant, Instant)> = None;
        let mut error = None;
        for worker in workers {
            match worker.join() {
                Ok(Ok((start, end))) => {
                    span = Some(span.map_or((start, end), |(s, e)| (s.min(start), e.max(end))));
                }
                Ok(Err(e)) => error = error.or(Some(e)),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        match (error, span) {
            (Some(e), _) => Err(e),
            (None, Some((start, end))) => Ok(end - start),
            (None, None) => Ok(Duration::ZERO),
        }
    })
}

/// Splits `count` items into `parts` contiguous runs of nearly equal length.
fn split_even(count: usize, parts: usize) -> Vec<Range<usize>> {
    (0..parts)
        .map(|i| count * i / parts..count * (i + 1) / parts)
        .collect()
}

/// Warm-up plus `reps` timed repetitions of `once`, as GB/s over `bytes` each.
fn repeat(
    reps: usize,
    bytes: usize,
    mut once: impl FnMut() -> Result<Duration, ClearBenchError>,
) -> Result<Summary, ClearBenchError> {
    once()?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        samples.push(gbps(bytes as u64, once()?.as_secs_f64()));
    }
    Ok(Summary::of(&samples).unwrap_or(Summary {
        median: 0.0,
        min: 0.0,
        max: 0.0,
    }))
}

/// Clears `buf` once with `threads` pinned workers, chunk by chunk.
fn clear_by_chunks(
    clearer: &Clearer,
    buf: &mut [u8],
    chunk: usize,
    cpus: &[usize],
) -> Result<Duration, ClearBenchError> {
    let chunks = buf.len() / chunk;
    let mut parts = Vec::with_capacity(cpus.len());
    let mut rest = buf;
    for run in split_even(chunks, cpus.len()) {
        let (part, tail) = rest.split_at_mut(run.len() * chunk);
        parts.push(part);
        rest = tail;
    }
    timed_on(cpus, parts, |part: &mut [u8]| {
        for piece in part.chunks_mut(chunk) {
            clearer.clear(piece);
        }
        Ok(())
    })
}

/// Faults in a fresh memfd of `pages` pages with `threads` pinned workers on disjoint ranges.
fn fault_in_fresh(
    page_size: PageSize,
    pages: usize,
    cpus: &[usize],
) -> Result<Duration, ClearBenchError> {
    let page = page_size.bytes() as usize;
    let baseline_err = |source| ClearBenchError::Baseline { page_size, source };
    let file = BackingFile::memfd("hugeprep-bench-fault-in", (pages * page) as u64, page_size)
        .map_err(baseline_err)?;
    let map = file.map().map_err(baseline_err)?;
    let map = &map;
    timed_on(cpus, split_even(pages, cpus.len()), |run: Range<usize>| {
        map.populate_write(run.start * page, run.len() * page)
            .map_err(|source| ClearBenchError::Populate { page_size, source })
    })
}

/// Runs the benchmark described by `config`, holding `lock` (the machine-wide hugepage
/// lock) throughout, and reports each measurement to `progress` as it starts; when
/// `progress` returns [`ControlFlow::Break`] the run stops with
/// [`ClearBenchError::Cancelled`], after giving back what it borrowed.
///
/// Hugepages the kernel lacks are added to the pool for the run and given back at the end;
/// without them the buffer falls back to ordinary memory and the baselines are skipped, with
/// a note saying so.
pub fn run(
    config: &ClearBenchConfig,
    _lock: &HugepageLock,
    progress: &mut dyn FnMut(&BenchProgress) -> ControlFlow<()>,
) -> Result<ClearBenchReport, ClearBenchError> {
    let cpus = allowed_cpus();
    config.validate(&cpus)?;
    // Every method raw, then the plan in use for each purpose.
    let mut timed = config
        .methods
        .iter()
        .map(|&m| Ok((Timed::Method(m), Clearer::new(ClearPlan::always(m))?)))
        .collect::<Result<Vec<_>, ClearError>>()?;
    if let Some(policy) = &config.policy {
        for purpose in [ClearPurpose::Scrub, ClearPurpose::UseSoon] {
            let clearer = Clearer::new(policy.plan.for_purpose(purpose))?;
            timed.push((Timed::Purpose(purpose), clearer));
        }
    }
    let mut notes = Vec::new();
    let buffer = config.buffer_bytes;
    let chunks: Vec<usize> = config
        .chunk_sizes
        .iter()
        .copied()
        .filter(|&c| c <= buffer)
        .collect();
    for &c in config.chunk_sizes.iter().filter(|&&c| c > buffer) {
        notes.push(format!(
            "chunk {} skipped: larger than the {} buffer",
            format_bytes(c as u64),
            format_bytes(buffer as u64)
        ));
    }
    let total = timed.len() * chunks.len() * config.threads.len()
        + config.kernel_page_sizes.len() * config.threads.len();
    let mut done = 0;
    let mut step = |label: String| {
        let flow = progress(&BenchProgress { done, total, label });
        done += 1;
        match flow {
            ControlFlow::Continue(()) => Ok(()),
            ControlFlow::Break(()) => Err(ClearBenchError::Cancelled {
                done: done - 1,
                total,
            }),
        }
    };

    let page_2m = PageSize::Size2M.bytes() as usize;
    let topup_2m = PoolTopUp::raise(None, PageSize::Size2M, (buffer / page_2m) as u64)?;
    let mut results = Vec::new();
    let mut purposes = Vec::new();
    let hugepage_backed;
    {
        let (mut region, huge) = match MmapRegion::anonymous(buffer, Some(PageSize::Size2M)) {
            Ok(region) => (region, true),
            Err(err) => {
                notes.push(format!(
                    "buffer is ordinary anonymous memory: no {} of free 2M hugepages ({err})",
                    format_bytes(buffer as u64)
                ));
                let region =
                    MmapRegion::anonymous(buffer, None).map_err(|source| ClearBenchError::Map {
                        len: buffer,
                        source,
                    })?;
                (region, false)
            }
        };
        hugepage_backed = huge;
        let _ = region.populate_write(0, buffer);
        region.as_mut_slice().fill(0);
        for &chunk in &chunks {
            for &threads in &config.threads {
                for (what, _) in &timed {
                    step(format!("{what} {} x{threads}", format_bytes(chunk as u64)))?;
                }
                if buffer / chunk < threads {
                    notes.push(format!(
                        "{} chunks with {threads} threads skipped: fewer chunks than threads",
                        format_bytes(chunk as u64)
                    ));
                    continue;
                }
                let buf = region.as_mut_slice();
                let cpus = &cpus[..threads];
                // Interleaved: one warm-up each, then every repetition times every clearer
                // once, in a rotated order, so that a slow moment of the shared host hits
                // all of them alike and the cells of one row compare fairly.
                for (_, clearer) in &timed {
                    clear_by_chunks(clearer, buf, chunk, cpus)?;
                }
                let mut samples = vec![Vec::with_capacity(config.reps); timed.len()];
                for rep in 0..config.reps {
                    for k in 0..timed.len() {
                        let i = (k + rep) % timed.len();
                        let took = clear_by_chunks(&timed[i].1, buf, chunk, cpus)?;
                        samples[i].push(gbps(buffer as u64, took.as_secs_f64()));
                    }
                }
                for ((what, clearer), samples) in timed.iter().zip(&samples) {
                    let gbps = Summary::of(samples).unwrap_or(Summary {
                        median: 0.0,
                        min: 0.0,
                        max: 0.0,
                    });
                    match what {
                        Timed::Method(method) => results.push(MethodResult {
                            method: *method,
                            chunk_bytes: chunk,
                            threads,
                            gbps,
                            samples_gbps: samples.clone(),
                        }),
                        Timed::Purpose(purpose) => purposes.push(PurposeResult {
                            purpose: *purpose,
                            method_used: clearer.method_for(chunk),
                            chunk_bytes: chunk,
                            threads,
                            gbps,
                        }),
                    }
                }
            }
        }
    }

    let mut kernel = Vec::new();
    for &page_size in &config.kernel_page_sizes {
        let max_threads = config.threads.iter().copied().max().unwrap_or(1);
        let (wanted, topup) = match page_size {
            // The same bytes as the cleared buffer, whose pages are free again now.
            PageSize::Size2M => (buffer / page_2m, None),
            // One page per worker at the largest thread count.
            PageSize::Size1G => {
                let topup = PoolTopUp::raise(None, page_size, max_threads as u64);
                match topup {
                    Ok(t) => (max_threads, Some(t)),
                    Err(err) => {
                        notes.push(format!("kernel fault-in of 1G pages skipped: {err}"));
                        continue;
                    }
                }
            }
        };
        let free = match &topup {
            Some(t) => t.free_pages()? as usize,
            None => topup_2m.free_pages()? as usize,
        };
        let pages = wanted.min(free);
        for &threads in &config.threads {
            step(format!("kernel fault-in {page_size} x{threads}"))?;
            if pages < threads {
                notes.push(format!(
                    "kernel fault-in of {page_size} pages with {threads} threads skipped: the kernel could supply {free} free {page_size} pages, {} needed",
                    wanted.max(threads)
                ));
                continue;
            }
            let bytes = pages * page_size.bytes() as usize;
            let summary = repeat(config.reps, bytes, || {
                fault_in_fresh(page_size, pages, &cpus[..threads])
            })?;
            kernel.push(KernelResult {
                page_size,
                threads,
                gbps: summary,
            });
        }
        drop(topup);
    }
    drop(topup_2m);
    let _ = progress(&BenchProgress {
        done: total,
        total,
        label: "done".into(),
    });
    let mut report = ClearBenchReport {
        policy: config.policy.clone(),
        buffer_bytes: buffer,
        hugepage_backed,
        reps: config.reps,
        cpus,
        results,
        purposes,
        kernel,
        goals: Vec::new(),
        notes,
    };
    report.goals = report.goals();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_splits_cover_everything() {
        assert_eq!(split_even(5, 2), vec![0..2, 2..5]);
        assert_eq!(split_even(1, 2), vec![0..0, 0..1]);
        assert_eq!(split_even(512, 1), vec![0..512]);
    }

    #[test]
    fn configs_name_the_bad_field() {
        let cpus = allowed_cpus();
        let check = |config: ClearBenchConfig, field: &str| {
            let err = config.validate(&cpus).unwrap_err().to_string();
            assert!(err.contains(&format!("`{field}`")), "{err}");
        };
        let good = ClearBenchConfig::quick();
        good.validate(&cpus).unwrap();
        check(
            ClearBenchConfig {
                buffer_bytes: 3 << 20,
                ..good.clone()
            },
            "buffer",
        );
        check(
            ClearBenchConfig {
                chunk_sizes: vec![4097],
                ..good.clone()
            },
            "chunks",
        );
        check(
            ClearBenchConfig {
                threads: vec![cpus.len() + 1],
                ..good.clone()
            },
            "threads",
        );
        check(
            ClearBenchConfig {
                reps: 2,
                ..good.clone()
            },
            "reps",
        );
        check(
            ClearBenchConfig {
                methods: vec![],
                ..good
            },
            "methods",
        );
    }
}
