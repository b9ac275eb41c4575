//! `hugeprep bench trace`: replays a trace of leases (arrival time, size, hold time) against
//! an in-process pool, once with the fixed shape (hugeprep 0.1) and once with the demand
//! shape, on the same trace and the same target, and reports per phase the fraction of
//! leases served warm-exact, the lease latency (p50, p99) and the bytes faulted cold.
//!
//! A trace file has one lease per line, `AT_MS SIZE HOLD_MS [PHASE]` (`#` starts a comment;
//! PHASE is a free word such as `steady` or `burst`). Without a file, a built-in mixed trace
//! is used: a steady stream of 32M/64M/128M leases, a burst of 24 leases within 50 ms, and
//! a steady stream again. The first [`LEARN`] leases are reported as `learning`, not
//! `steady`: both shapes start from the same empty pool.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::Summary;
use hugeprep::clear::ClearPlan;
use hugeprep::hugetlb::{BackingFile, MountError, MountOptions, OwnedMount, PoolTopUp};
use hugeprep::page_size::PageSize;
use hugeprep::policy::pool::Shape;
use hugeprep::pool::{LeaseRequest, LeaseSource, Pool, PoolConfig, PoolError, PoolPolicy};
use hugeprep::units::format_bytes;

mod events;
pub mod operator;
pub mod week;
pub use events::{held_at_arrival, mixed_trace, parse_trace, TraceEvent, MAX_EVENTS};

/// Leases at the start of a trace reported as `learning`.
pub const LEARN: usize = 32;

/// A trace replay failed.
#[derive(Debug, thiserror::Error)]
pub enum TraceBenchError {
    /// A trace line does not parse.
    #[error("trace {path} line {line}: {message}")]
    Parse {
        /// The trace file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The trace file cannot be read.
    #[error("trace {path}: {source}")]
    Read {
        /// The trace file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The benchmark's own hugetlbfs could not be mounted.
    #[error("bench trace: {0}")]
    Mount(#[from] MountError),
    /// The kernel's hugepage pool could not be read or raised.
    #[error("bench trace: {0}")]
    KernelPool(#[from] hugeprep::hugetlb::PoolError),
    /// The pool failed (other than a refused lease, which is counted).
    #[error("bench trace: {0}")]
    WarmPool(#[from] PoolError),
    /// Starting the worker failed.
    #[error("bench trace: starting the pool worker: {0}")]
    Worker(std::io::Error),
    /// The pool did not reach its target before the replay (a liveness bound).
    #[error("bench trace: the warm pool did not fill within {seconds} s")]
    Fill {
        /// The bound.
        seconds: u64,
    },
}

/// What to run.
#[derive(Debug, Clone)]
pub struct TraceBenchConfig {
    /// The leases.
    pub events: Vec<TraceEvent>,
    /// Page size.
    pub page_size: PageSize,
    /// Warm target for both shapes.
    pub warm: u64,
    /// The `sizes` mix for both shapes (empty: the default).
    pub sizes: Vec<u64>,
    /// Clearing plan.
    pub plan: ClearPlan,
}

/// One phase of one shape's replay.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseResult {
    /// `learning`, `steady`, `burst`, ... or `all`.
    pub phase: String,
    /// Leases taken.
    pub leases: usize,
    /// Leases refused (counted, not fatal).
    pub refused: usize,
    /// Leases by source.
    pub sources: BTreeMap<String, usize>,
    /// Fraction served warm-exact.
    pub warm_exact: f64,
    /// Median lease latency, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// The most bytes the trace holds leased at once at an arrival of this phase (the
    /// arriving lease included): a target below it cannot keep every lease warm-exact.
    pub peak_held_bytes: u64,
    /// Per size, the most leases of that size held at once in this phase, times the size,
    /// summed: what a pool that never faults during the phase must hold as files.
    pub peak_by_size_bytes: u64,
}

/// One shape's replay.
#[derive(Debug, Clone, Serialize)]
pub struct ShapeResult {
    /// `fixed` or `demand`.
    pub shape: Shape,
    /// Per phase, and `all`.
    pub phases: Vec<PhaseResult>,
    /// Bytes faulted cold inside leases (a VM waited).
    pub lease_faulted_bytes: u64,
    /// Bytes faulted in the background by the refill worker.
    pub refill_faulted_bytes: u64,
    /// How late the replay ran behind the trace at its end, ms.
    pub lag_ms: f64,
    /// Why the pool's target was not met at the end of the replay (the kernel's free pages
    /// taken by someone else on a shared host: such a run measures that, not the shape).
    pub unmet: Option<String>,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct TraceBenchReport {
    /// Leases in the trace.
    pub leases: usize,
    /// Warm target.
    pub warm: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Fixed, then demand.
    pub shapes: Vec<ShapeResult>,
}

struct Sample {
    phase: String,
    ms: f64,
    source: Option<LeaseSource>,
    held: u64,
    size: u64,
    held_of_size: u64,
}

fn summarize(phase: &str, samples: &[&Sample]) -> PhaseResult {
    let ms: Vec<f64> = samples
        .iter()
        .filter(|s| s.source.is_some())
        .map(|s| s.ms)
        .collect();
    let mut sources = BTreeMap::new();
    for s in samples {
        let name = s.source.map_or("refused", |src| src.name()).to_string();
        *sources.entry(name).or_insert(0) += 1;
    }
    let exact = samples
        .iter()
        .filter(|s| s.source == Some(LeaseSource::WarmExact))
        .count();
    PhaseResult {
        phase: phase.to_string(),
        leases: ms.len(),
        refused: samples.len() - ms.len(),
        sources,
        warm_exact: exact as f64 / samples.len().max(1) as f64,
        p50_ms: Summary::quantile(&ms, 0.5).unwrap_or(f64::NAN),
        p99_ms: Summary::quantile(&ms, 0.99).unwrap_or(f64::NAN),
        peak_held_bytes: samples.iter().map(|s| s.held).max().unwrap_or(0),
        peak_by_size_bytes: {
            let mut by: BTreeMap<u64, u64> = BTreeMap::new();
            for s in samples {
                let p = by.entry(s.size).or_insert(0);
                *p = (*p).max(s.held_of_size);
            }
            by.iter().map(|(s, n)| s * n).sum()
        },
    }
}

fn settle(pool: &Pool) -> Result<(), TraceBenchError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(pool.is_idle()
        && pool
            .status()
            .kinds
            .iter()
            .all(|k| k.warm_bytes >= k.target_bytes))
    {
        if Instant::now() > deadline {
            return Err(TraceBenchError::Fill { seconds: 60 });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

fn replay(
    cfg: &TraceBenchConfig,
    shape: Shape,
    mount: &Path,
    log: &dyn Fn(&str),
) -> Result<ShapeResult, TraceBenchError> {
    let base = std::env::temp_dir().join(format!(
        "hugeprep-bench-trace-{}-{shape:?}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&base);
    let mut policy = PoolPolicy::embedded();
    policy.set_warm(cfg.page_size, cfg.warm, cfg.sizes.clone());
    policy.scrub_bandwidth = None;
    policy.shape = shape;
    policy.reserve.enabled = false;
    let pool = Pool::open(PoolConfig {
        state_dir: base.join("state"),
        mounts: vec![mount.to_path_buf()],
        policy,
        plan: cfg.plan,
    })?;
    let worker = pool.spawn_worker().map_err(TraceBenchError::Worker)?;
    let result = (|| {
        settle(&pool)?;
        let before = pool.counters();
        let held = held_at_arrival(&cfg.events);
        let mut samples = Vec::with_capacity(cfg.events.len());
        let mut releases: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
        let start = Instant::now();
        let now_ms = || start.elapsed().as_secs_f64() * 1e3;
        let mut i = 0;
        while i < cfg.events.len() || !releases.is_empty() {
            let next_arrival = cfg.events.get(i).map(|e| e.at_ms);
            let next_release = releases.peek().map(|r| r.0 .0);
            let release_first = match (next_arrival, next_release) {
                (Some(a), Some(r)) => r <= a,
                (None, Some(_)) => true,
                _ => false,
            };
            let due = if release_first {
                next_release
            } else {
                next_arrival
            }
            .unwrap_or(0);
            let wait = due as f64 - now_ms();
            if wait > 0.0 {
                std::thread::sleep(Duration::from_secs_f64(wait / 1e3));
            }
            if release_first {
                if let Some(Reverse((_, id))) = releases.pop() {
                    pool.release(id)?;
                }
                continue;
            }
            let e = &cfg.events[i];
            let req = LeaseRequest {
                recycle: None,
                name: format!("trace{i}"),
                size: e.size,
                page_size: Some(cfg.page_size),
                node: Some(0),
                owner: None,
                pid: None,
                pin: false,
            };
            let t = Instant::now();
            let got = pool.lease(&req);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let phase = if i < LEARN {
                "learning".to_string()
            } else {
                e.phase.clone()
            };
            let source = match got {
                Ok(lease) => {
                    releases.push(Reverse((now_ms() as u64 + e.hold_ms, lease.id)));
                    Some(lease.source)
                }
                Err(PoolError::Insufficient { .. }) => None,
                Err(err) => return Err(err.into()),
            };
            samples.push(Sample {
                phase,
                ms,
                source,
                held: held[i].0,
                size: e.size,
                held_of_size: held[i].1,
            });
            i += 1;
        }
        let lag_ms = now_ms()
            - cfg
                .events
                .last()
                .map_or(0.0, |e| (e.at_ms + e.hold_ms) as f64);
        let after = pool.counters();
        let unmet = pool.status().kinds.into_iter().find_map(|k| k.reason);
        let mut phases: Vec<String> = Vec::new();
        for s in &samples {
            if !phases.contains(&s.phase) {
                phases.push(s.phase.clone());
            }
        }
        let mut out: Vec<PhaseResult> = phases
            .iter()
            .map(|p| {
                let of: Vec<&Sample> = samples.iter().filter(|s| &s.phase == p).collect();
                summarize(p, &of)
            })
            .collect();
        out.push(summarize("all", &samples.iter().collect::<Vec<_>>()));
        let r = ShapeResult {
            shape,
            phases: out,
            lease_faulted_bytes: after.lease_faulted_bytes - before.lease_faulted_bytes,
            refill_faulted_bytes: after.refill_faulted_bytes - before.refill_faulted_bytes,
            lag_ms: lag_ms.max(0.0),
            unmet,
        };
        log(&format!(
            "{shape:?}: {} leases replayed, {} faulted cold in leases",
            samples.len(),
            format_bytes(r.lease_faulted_bytes)
        ));
        Ok(r)
    })();
    // Give every file back before the next shape runs.
    for l in pool.leases() {
        let _ = pool.release(l.id);
    }
    pool.shutdown();
    let _ = worker.join();
    drop(pool);
    for dir in ["pool", "leases"] {
        if let Ok(rd) = std::fs::read_dir(mount.join("hugeprep").join(dir)) {
            for f in rd.flatten() {
                let _ = std::fs::remove_file(f.path());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&base);
    result
}

/// Touches the pages once: the first touch of guest-physical memory is many times slower
/// and would land on whichever shape runs first.
fn warm_up(mount: &Path, ps: PageSize, bytes: u64) {
    let path = mount.join("warm-up");
    if let Ok(f) = BackingFile::create(&path, bytes, ps, None) {
        let cpus = hugeprep::sys::affinity::allowed_cpus();
        let _ = hugeprep::pool::fault::fault_range(&f, 0..bytes, 0, &cpus);
    }
    let _ = std::fs::remove_file(&path);
}

/// Replays the trace with the fixed shape, then the demand shape.
pub fn run(
    cfg: &TraceBenchConfig,
    log: &dyn Fn(&str),
) -> Result<TraceBenchReport, TraceBenchError> {
    // The most leased at once, plus the target and a file being refilled, in pages.
    let peak = held_at_arrival(&cfg.events)
        .into_iter()
        .map(|h| h.0)
        .max()
        .unwrap_or(0);
    let largest = cfg.events.iter().map(|e| e.size).max().unwrap_or(0);
    let page = cfg.page_size.bytes();
    // Replies lag behind the trace on a busy machine: twice the peak.
    let pages = (2 * peak + 2 * cfg.warm + 4 * largest).div_ceil(page);
    let top_up = PoolTopUp::ensure_free(None, cfg.page_size, pages)?;
    let mut options = MountOptions::new(cfg.page_size);
    options.mode = 0o755;
    let mount = OwnedMount::new_temp(&std::env::temp_dir(), &options)?;
    warm_up(mount.path(), cfg.page_size, pages * page);
    let mut shapes = Vec::new();
    for shape in [Shape::Fixed, Shape::Demand] {
        match replay(cfg, shape, mount.path(), log) {
            Ok(r) => shapes.push(r),
            Err(e) => {
                let _ = mount.unmount();
                return Err(e);
            }
        }
    }
    let _ = mount.unmount();
    drop(top_up);
    Ok(TraceBenchReport {
        leases: cfg.events.len(),
        warm: cfg.warm,
        page_size: cfg.page_size,
        shapes,
    })
}

impl TraceBenchReport {
    /// The report as a table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "trace of {} leases, warm target {} of {} pages (peak held: the most bytes leased at once in the phase; by size: per size the most held at once, summed)\n{:<7} {:<9} {:>6} {:>11} {:>9} {:>9} {:>10} {:>10}  sources\n",
            self.leases,
            format_bytes(self.warm),
            self.page_size,
            "shape",
            "phase",
            "leases",
            "warm-exact",
            "p50 ms",
            "p99 ms",
            "peak held",
            "by size"
        );
        for r in &self.shapes {
            for p in &r.phases {
                let sources: Vec<String> =
                    p.sources.iter().map(|(k, v)| format!("{k} {v}")).collect();
                s += &format!(
                    "{:<7} {:<9} {:>6} {:>10.1}% {:>9.3} {:>9.3} {:>10} {:>10}  {}\n",
                    format!("{:?}", r.shape).to_lowercase(),
                    p.phase,
                    p.leases + p.refused,
                    p.warm_exact * 100.0,
                    p.p50_ms,
                    p.p99_ms,
                    format_bytes(p.peak_held_bytes),
                    format_bytes(p.peak_by_size_bytes),
                    sources.join(", ")
                );
            }
            s += &format!(
                "{:<7} faulted cold in leases {}, by refill {}, replay lag {:.0} ms\n",
                format!("{:?}", r.shape).to_lowercase(),
                format_bytes(r.lease_faulted_bytes),
                format_bytes(r.refill_faulted_bytes),
                r.lag_ms
            );
            if let Some(why) = &r.unmet {
                s += &format!(
                    "{:<7} target not met at the end: {why}\n",
                    format!("{:?}", r.shape).to_lowercase()
                );
            }
        }
        s
    }
}
