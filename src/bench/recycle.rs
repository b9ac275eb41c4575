//! `hugeprep bench recycle`: what recycling a stopped VM's memory costs.
//!
//! 1. Release-to-warm throughput: scrubbing a dirty, faulted file in place (the daemon's
//!    release path: map, clear in parallel, sample-verify) against deleting the file and
//!    faulting a fresh one (the kernel zeroes every page at fault), at equal threads, side by
//!    side, alternating order, after a warm-up round of each.
//! 2. Lease latency from the warm pool over the API: an in-process daemon (pool, worker,
//!    axum on a unix socket) and a client taking and releasing leases; each lease is timed
//!    from request to answer, with the pool settled (warm) before each one.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::bench::daemon::{BenchDaemon, BenchDaemonError};
use crate::bench::Summary;
use crate::clear::{ClearError, ClearPlan, Clearer, Method};
use crate::client::{Client, ClientError};
use crate::hugetlb::{BackingFile, FileError, MountError, MountOptions, OwnedMount, PoolTopUp};
use crate::page_size::PageSize;
use crate::policy::pool::Verification;
use crate::pool::{fault, LeaseRequest, LeaseSource, PoolPolicy};
use crate::scrub::{ScrubControl, ScrubError, ScrubOptions, Scrubber};
use crate::sys::mmap::MmapRegion;
use crate::units::{format_bytes, gbps};

/// The scrub of a released file should reach this fraction of the best clearing throughput
/// measured at the same thread count (goal b; reported, not asserted).
pub const SCRUB_GOAL: f64 = 0.90;

/// What to run.
#[derive(Debug, Clone)]
pub struct RecycleBenchConfig {
    /// Bytes per file for the throughput part.
    pub size: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Threads for both paths.
    pub threads: usize,
    /// Measured repetitions per path.
    pub reps: usize,
    /// Leases for the latency part (0 skips it).
    pub leases: usize,
    /// Bytes per lease.
    pub lease_size: u64,
    /// Clearing plan (the one in use: rule plus calibration).
    pub plan: ClearPlan,
    /// Methods timed clearing the same mapped file without the scrub's work around the
    /// clear, for the best clearing throughput at this thread count (goal b).
    pub methods: Vec<Method>,
    /// Directory for the journal of the latency part (fsync cost depends on it).
    pub state_dir: Option<PathBuf>,
    /// Also time warm leases with a busy-looping process on every CPU, against quiet
    /// (`--hog`, see [`crate::bench::hog`]).
    pub hog: bool,
    /// Nice value of the benchmark's client thread during `--hog` (default: unchanged, i.e.
    /// an ordinary caller); `-10` times a caller that runs at the API's priority.
    pub client_nice: Option<i32>,
    /// Extra processes of a busy host the release proof is timed beside, after the quiet
    /// host (0: quiet only; see [`crate::bench::host`]).
    pub host_processes: usize,
    /// Threads of one lessee's open floods, each timed against another tenant's opens and
    /// the daemon's ([`crate::bench::flood`]); empty: none.
    pub flood: Vec<usize>,
}

/// A recycle benchmark failed; every variant keeps the failing layer's own error.
#[derive(Debug, thiserror::Error)]
pub enum RecycleBenchError {
    /// A setting is out of range.
    #[error("bench recycle: --{field}: {reason}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// Creating, mapping or removing a backing file failed.
    #[error("bench recycle: {0}")]
    File(#[from] FileError),
    /// The benchmark's own hugetlbfs could not be mounted.
    #[error("bench recycle: {0}")]
    Mount(#[from] MountError),
    /// The kernel's hugepage pool could not be read or raised.
    #[error("bench recycle: {0}")]
    KernelPool(#[from] crate::hugetlb::PoolError),
    /// Faulting a file's pages failed.
    #[error("bench recycle: {0}")]
    Fault(#[from] fault::FaultError),
    /// Running the warm pool failed.
    #[error("bench recycle: {0}")]
    WarmPool(#[from] crate::pool::PoolError),
    /// The clearing plan cannot run on this CPU.
    #[error("bench recycle: {0}")]
    Clear(#[from] ClearError),
    /// A scrub failed.
    #[error("bench recycle: {0}")]
    Scrub(#[from] ScrubError),
    /// A lease request over the API failed.
    #[error("bench recycle: {0}")]
    Client(#[from] ClientError),
    /// The benchmark's daemon failed to start or to refill its pool.
    #[error("bench recycle: {0}")]
    Daemon(#[from] BenchDaemonError),
    /// Timing the release proof failed (a lessee process or its cgroup).
    #[error("bench recycle: proof: {0}")]
    Proof(std::io::Error),
}

/// Throughput of one path.
#[derive(Debug, Clone, Serialize)]
pub struct PathResult {
    /// `scrub` or `kernel-path`.
    pub path: &'static str,
    /// GB/s per repetition.
    pub samples_gbps: Vec<f64>,
    /// Median and range.
    pub gbps: Summary,
}

/// One method clearing the whole mapped file in one parallel call.
#[derive(Debug, Clone, Serialize)]
pub struct MethodClear {
    /// The method.
    pub method: Method,
    /// Median and range, GB/s.
    pub gbps: Summary,
    /// GB/s per repetition, each taken in the same round as the scrub's of that index.
    pub samples_gbps: Vec<f64>,
}

/// Lease latency over the API.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyResult {
    /// Leases timed.
    pub leases: usize,
    /// Bytes per lease.
    pub lease_size: u64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Largest, ms.
    pub max_ms: f64,
    /// Leases served warm-exact.
    pub warm_exact: usize,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct RecycleBenchReport {
    /// Bytes per file.
    pub size: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Threads for both paths.
    pub threads: usize,
    /// The scrubber's method.
    pub method: String,
    /// Scrub (release-to-warm) throughput.
    pub scrub: PathResult,
    /// The kernel's path: truncate, delete and fault a new file (what an unproven release
    /// costs, and what the kernel does without hugeprep).
    pub kernel_path: PathResult,
    /// (c) Median scrub / median kernel's path (the kernel's fault-in of fresh pages).
    pub ratio: f64,
    /// The release proof's own cost (a lessee that opened the file and exited), ms: the
    /// daemon's method on the quiet host.
    pub proof: Option<crate::bench::proof::ProofTiming>,
    /// The whole proven release: the scrub's throughput with the median proof added to
    /// each repetition's time, GB/s.
    pub proven_scrub: Option<Summary>,
    /// Every proof timed: each method on the quiet host and beside the busy one.
    pub proofs: Vec<crate::bench::proof::ProofTiming>,
    /// The proven scrub by each of `proofs`, in the same order, GB/s.
    pub proven_scrubs: Vec<Summary>,
    /// Opens under one lessee's flood, quiet first, by each method.
    pub floods: Vec<crate::bench::flood::FloodTiming>,
    /// Every method clearing the same file, interleaved with the two paths.
    pub clear_methods: Vec<MethodClear>,
    /// The fastest of `clear_methods` by median.
    pub best_clear: Option<MethodClear>,
    /// (b) Median scrub / best clearing median.
    pub scrub_to_best: Option<f64>,
    /// (b) The scrub against the method it compares worst with, repetition by repetition
    /// (the median of the per-round ratios; steadier on a shared host), and that method.
    pub scrub_to_best_paired: Option<(f64, Method)>,
    /// (b) met: the scrub reaches at least 90% of the best clearing throughput (by the
    /// paired ratio).
    pub scrub_goal_met: Option<bool>,
    /// Lease latency, when run.
    pub latency: Option<LatencyResult>,
    /// Quiet against hogged lease latency, with `--hog`.
    pub hog: Option<crate::bench::hog::HogLatency>,
}

fn cpus(threads: usize) -> Vec<usize> {
    let mut c = crate::sys::affinity::allowed_cpus();
    c.truncate(threads.max(1));
    c
}

fn dirty(file: &BackingFile, seed: u8) -> Result<(), RecycleBenchError> {
    let mut m = file.map()?;
    // One byte per 4 KiB is enough to make every page dirty without spending the run on it.
    for (i, b) in m.as_mut_slice().iter_mut().step_by(4096).enumerate() {
        *b = seed ^ (i as u8) | 1;
    }
    Ok(())
}

fn scrub_once(s: &Scrubber, file: &BackingFile, cpus: &[usize]) -> Result<f64, RecycleBenchError> {
    dirty(file, 0xa5)?;
    let opts = ScrubOptions {
        cpus: cpus.to_vec(),
        bandwidth: None,
        background: false,
        verify: Verification::Sample,
        yield_to: None,
    };
    let t = Instant::now();
    s.scrub_file(file, &opts, &ScrubControl::default())?;
    Ok(t.elapsed().as_secs_f64())
}

fn kernel_path_once(
    dir: &Path,
    old: BackingFile,
    cfg: &RecycleBenchConfig,
) -> Result<(f64, BackingFile), RecycleBenchError> {
    dirty(&old, 0x5a)?;
    let path = old.path().to_path_buf();
    let t = Instant::now();
    // As `Pool::remove_file`: truncate (the pages go back to the kernel), then unlink.
    old.file().set_len(0).map_err(|source| {
        RecycleBenchError::File(FileError::Io {
            op: "truncate",
            path: path.clone(),
            source,
        })
    })?;
    old.remove()?;
    let fresh = BackingFile::create(&path, cfg.size, cfg.page_size, None)?;
    fault::fault_range(&fresh, 0..cfg.size, 0, &cpus(cfg.threads))?;
    let s = t.elapsed().as_secs_f64();
    let _ = dir;
    Ok((s, fresh))
}

/// Clears the whole mapped file with `clearer` on `cpus`, as GB/s.
fn clear_once(
    clearer: &Clearer,
    region: &mut MmapRegion,
    cpus: &[usize],
) -> Result<f64, RecycleBenchError> {
    let t = Instant::now();
    clearer.clear_parallel(region.as_mut_slice(), cpus)?;
    Ok(gbps(region.len() as u64, t.elapsed().as_secs_f64()))
}

/// Scrub, the kernel's path and every method's raw clear, as measured by [`throughput`].
struct Throughput {
    scrub: PathResult,
    refault: PathResult,
    methods: Vec<MethodClear>,
    method: String,
}

fn throughput(
    cfg: &RecycleBenchConfig,
    dir: &Path,
    log: &dyn Fn(&str),
) -> Result<Throughput, RecycleBenchError> {
    let scrubber = Scrubber::new(cfg.plan)?;
    let cpus = cpus(cfg.threads);
    let a = BackingFile::create(&dir.join("scrub"), cfg.size, cfg.page_size, None)?;
    fault::fault_range(&a, 0..cfg.size, 0, &cpus)?;
    // The same file, mapped once, for the raw clears: what the methods can do on this memory
    // without the scrub's mapping, thread starts and verification.
    let clearers = cfg
        .methods
        .iter()
        .map(|&m| Clearer::new(ClearPlan::always(m)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut mapped = a.map()?;
    for c in &clearers {
        clear_once(c, &mut mapped, &cpus)?;
    }
    let mut raw: Vec<Vec<f64>> = vec![Vec::with_capacity(cfg.reps); clearers.len()];
    let mut b = BackingFile::create(&dir.join("refault"), cfg.size, cfg.page_size, None)?;
    fault::fault_range(&b, 0..cfg.size, 0, &cpus)?;
    let w1 = scrub_once(&scrubber, &a, &cpus)?;
    let (w2, nb) = kernel_path_once(dir, b, cfg)?;
    b = nb;
    log(&format!(
        "warm-up  scrub {:.1} GB/s  kernel path {:.1} GB/s",
        gbps(cfg.size, w1),
        gbps(cfg.size, w2)
    ));
    let (mut s1, mut s2) = (Vec::new(), Vec::new());
    for rep in 0..cfg.reps {
        let scrub_first = rep % 2 == 0;
        if scrub_first {
            s1.push(gbps(cfg.size, scrub_once(&scrubber, &a, &cpus)?));
        }
        let (t, nb) = kernel_path_once(dir, b, cfg)?;
        b = nb;
        s2.push(gbps(cfg.size, t));
        if !scrub_first {
            s1.push(gbps(cfg.size, scrub_once(&scrubber, &a, &cpus)?));
        }
        for k in 0..clearers.len() {
            let i = (k + rep) % clearers.len();
            raw[i].push(clear_once(&clearers[i], &mut mapped, &cpus)?);
        }
        log(&format!(
            "rep {}/{}  scrub {:.1} GB/s  kernel path {:.1} GB/s",
            rep + 1,
            cfg.reps,
            s1[rep],
            s2[rep]
        ));
    }
    let summary = |v: &Vec<f64>| {
        Summary::of(v).ok_or(RecycleBenchError::Invalid {
            field: "reps",
            reason: "must be at least 1",
        })
    };
    let methods = clearers
        .iter()
        .zip(&raw)
        .map(|(c, samples)| {
            Ok(MethodClear {
                method: c.plan().method,
                gbps: summary(samples)?,
                samples_gbps: samples.clone(),
            })
        })
        .collect::<Result<Vec<_>, RecycleBenchError>>()?;
    Ok(Throughput {
        scrub: PathResult {
            path: "scrub",
            gbps: summary(&s1)?,
            samples_gbps: s1,
        },
        refault: PathResult {
            path: "kernel-path",
            gbps: summary(&s2)?,
            samples_gbps: s2,
        },
        methods,
        method: scrubber.method().name().to_string(),
    })
}

/// The in-process daemon of the latency parts: `warm_files` warm files of the lease size on
/// `mount`, its journal and socket under `base`, no scrub cap and no lessee grace (that would
/// make every settle wait for it; these parts time the lease alone).
pub(crate) fn lease_daemon(
    cfg: &RecycleBenchConfig,
    mount: &Path,
    base: &Path,
    warm_files: u64,
) -> Result<BenchDaemon, RecycleBenchError> {
    let mut policy = PoolPolicy::embedded();
    policy.set_warm(
        cfg.page_size,
        warm_files * cfg.lease_size,
        vec![cfg.lease_size],
    );
    policy.scrub_bandwidth = None;
    policy.threads = cfg.threads;
    let daemon = BenchDaemon::start(base, mount, policy, cfg.plan)?;
    daemon.pool().set_lessee_grace(Duration::ZERO);
    Ok(daemon)
}

fn latency(
    cfg: &RecycleBenchConfig,
    mount: &Path,
    log: &dyn Fn(&str),
) -> Result<LatencyResult, RecycleBenchError> {
    let base = match &cfg.state_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("hugeprep-bench-recycle-{}", std::process::id())),
    };
    let daemon = lease_daemon(cfg, mount, &base, 4)?;
    let client = Client::new(daemon.socket());
    let settle = || daemon.settle(Duration::from_secs(60));
    let mut samples = Vec::with_capacity(cfg.leases);
    let mut warm_exact = 0;
    let result = daemon.runtime().block_on(async {
        // Warm-up: 20 leases untimed.
        for i in 0..cfg.leases + 20 {
            settle()?;
            let req = LeaseRequest {
                name: format!("bench{i}"),
                size: cfg.lease_size,
                page_size: Some(cfg.page_size),
                node: Some(0),
                ..LeaseRequest::default()
            };
            let t = Instant::now();
            let lease = client.lease(&req).await?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if i >= 20 {
                samples.push(ms);
                warm_exact += usize::from(lease.source == LeaseSource::WarmExact);
            }
            client.release(lease.id).await?;
        }
        Ok::<(), RecycleBenchError>(())
    });
    drop(daemon);
    let _ = std::fs::remove_dir_all(&base);
    result?;
    let out = LatencyResult {
        leases: samples.len(),
        lease_size: cfg.lease_size,
        p50_ms: Summary::quantile(&samples, 0.5).unwrap_or(f64::NAN),
        p99_ms: Summary::quantile(&samples, 0.99).unwrap_or(f64::NAN),
        max_ms: samples.iter().copied().fold(0.0, f64::max),
        warm_exact,
    };
    log(&format!(
        "lease latency over the API: p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms ({} of {} warm-exact)",
        out.p50_ms, out.p99_ms, out.max_ms, out.warm_exact, out.leases
    ));
    Ok(out)
}

/// Runs the benchmark; `log` gets progress lines.
pub fn run(
    cfg: &RecycleBenchConfig,
    log: &dyn Fn(&str),
) -> Result<RecycleBenchReport, RecycleBenchError> {
    if cfg.reps == 0 {
        return Err(RecycleBenchError::Invalid {
            field: "reps",
            reason: "must be at least 1",
        });
    }
    crate::hugetlb::check_size(cfg.size, cfg.page_size)?;
    crate::hugetlb::check_size(cfg.lease_size, cfg.page_size)?;
    let lease_files = if cfg.hog {
        crate::bench::hog::BATCH as u64 + 2
    } else {
        6
    };
    let pages = (2 * cfg.size).max(lease_files * cfg.lease_size) / cfg.page_size.bytes();
    // Declared before the mount so that it drops after it, on every return: pages can only be
    // given back once the files on the mount have let go of them.
    let top_up = PoolTopUp::ensure_free(None, cfg.page_size, pages)?;
    let mut options = MountOptions::new(cfg.page_size);
    options.mode = 0o755;
    let mount = OwnedMount::new_temp(&std::env::temp_dir(), &options)?;
    let Throughput {
        scrub,
        refault,
        methods: clear_methods,
        method,
    } = throughput(cfg, mount.path(), log)?;
    for f in ["scrub", "refault"] {
        let _ = std::fs::remove_file(mount.path().join(f));
    }
    let proofs = crate::bench::proof::time_proofs(
        mount.path(),
        cfg.size,
        cfg.page_size,
        cfg.reps,
        cfg.host_processes,
        log,
    )?;
    let with_proof = |p: &crate::bench::proof::ProofTiming| {
        let with_proof: Vec<f64> = scrub
            .samples_gbps
            .iter()
            .map(|g| cfg.size as f64 / 1e9 / (cfg.size as f64 / 1e9 / g + p.ms.median / 1e3))
            .collect();
        Summary::of(&with_proof)
    };
    let proven_scrubs: Vec<Summary> = proofs.iter().filter_map(with_proof).collect();
    let proof = proofs.first().cloned();
    let floods = if cfg.flood.is_empty() {
        Vec::new()
    } else {
        let exe = crate::bench::host::bench_exe().map_err(RecycleBenchError::Proof)?;
        crate::bench::flood::time_floods(mount.path(), cfg.page_size, &cfg.flood, &exe, log)?
    };
    let proven_scrub = proven_scrubs.first().cloned();
    let latency = if cfg.leases > 0 {
        Some(latency(cfg, mount.path(), log)?)
    } else {
        None
    };
    let hog = if cfg.leases > 0 && cfg.hog {
        Some(crate::bench::hog::hogged_latency(cfg, mount.path(), log)?)
    } else {
        None
    };
    let _ = mount.unmount();
    drop(top_up);
    let best_clear = clear_methods
        .iter()
        .max_by(|a, b| a.gbps.median.total_cmp(&b.gbps.median))
        .cloned();
    let paired = clear_methods
        .iter()
        .filter_map(|m| {
            Summary::paired_ratio(&scrub.samples_gbps, &m.samples_gbps).map(|f| (f, m.method))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0));
    Ok(RecycleBenchReport {
        size: cfg.size,
        page_size: cfg.page_size,
        threads: cfg.threads,
        method,
        ratio: scrub.gbps.median / refault.gbps.median,
        scrub_to_best: best_clear
            .as_ref()
            .map(|b| scrub.gbps.median / b.gbps.median),
        scrub_goal_met: paired.map(|(f, _)| f >= SCRUB_GOAL),
        scrub_to_best_paired: paired,
        best_clear,
        clear_methods,
        scrub,
        kernel_path: refault,
        proof,
        proven_scrub,
        proofs,
        proven_scrubs,
        floods,
        latency,
        hog,
    })
}

impl RecycleBenchReport {
    /// The release proof's rows: each method on each host, its ratio to the same method on
    /// the quiet host, and the proven scrub.
    fn proof_table(&self) -> String {
        let mut s = format!(
            "release proof (a lessee that opened the file and exited)\n{:<14} {:>22} {:>24} {:>8} {:>22}\n",
            "method", "host", "ms median (min-max)", "x quiet", "proof + scrub GB/s"
        );
        for (i, p) in self.proofs.iter().enumerate() {
            let quiet = self
                .proofs
                .iter()
                .find(|q| q.method == p.method && q.host_processes == 0);
            let host = if p.host_processes == 0 {
                "quiet".to_string()
            } else {
                format!("+{} procs/{} thr", p.host_processes, p.host_threads)
            };
            s += &format!(
                "{:<14} {:>22} {:>24} {:>8} {:>22}\n",
                p.method,
                host,
                format!("{:.3} ({:.3}-{:.3})", p.ms.median, p.ms.min, p.ms.max),
                quiet.map_or("-".into(), |q| format!("{:.1}", p.ms.median / q.ms.median)),
                self.proven_scrubs
                    .get(i)
                    .map_or("-".into(), |g| g.to_string())
            );
        }
        s
    }

    /// The report as a table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "recycle {} of {} pages, {} threads, method {}\n{:<16} {:>24}\n",
            format_bytes(self.size),
            self.page_size,
            self.threads,
            self.method,
            "path",
            "GB/s median (min-max)"
        );
        for p in [&self.scrub, &self.kernel_path] {
            s += &format!("{:<16} {:>24}\n", p.path, p.gbps.to_string());
        }
        if let Some(g) = &self.proven_scrub {
            s += &format!("{:<16} {:>24}\n", "proof + scrub", g.to_string());
        }
        for m in &self.clear_methods {
            s += &format!(
                "{:<16} {:>24}\n",
                format!("clear {}", m.method),
                m.gbps.to_string()
            );
        }
        if let (Some(best), Some(ratio), Some((paired, vs)), Some(met)) = (
            &self.best_clear,
            self.scrub_to_best,
            self.scrub_to_best_paired,
            self.scrub_goal_met,
        ) {
            s += &format!(
                "(b) scrub / best clear: {:.0}% of {} {:.1} by medians, {:.0}% paired per round against {vs} (goal >= {:.0}%: {})\n",
                ratio * 100.0,
                best.method,
                best.gbps.median,
                paired * 100.0,
                SCRUB_GOAL * 100.0,
                if met { "met" } else { "NOT met" }
            );
        }
        s += &format!(
            "(c) scrub / kernel's path (truncate, delete, fault fresh pages): {:.2}x\n",
            self.ratio
        );
        if !self.floods.is_empty() {
            s += &format!(
                "opens of a leased file under one lessee's open flood, ms\n{:<14} {:>8} {:>26} {:>26}\n",
                "method", "threads", "another tenant p50/p99/max", "the daemon p50/p99/max"
            );
            for f in &self.floods {
                let l = |o: &crate::bench::flood::OpenLatency| {
                    format!("{:.3}/{:.3}/{:.3}", o.p50_ms, o.p99_ms, o.max_ms)
                };
                s += &format!(
                    "{:<14} {:>8} {:>26} {:>26}\n",
                    f.method,
                    f.flood_threads,
                    l(&f.other_tenant),
                    l(&f.daemon)
                );
            }
        }
        if self.proofs.is_empty() {
            s += "release proof: not timed on this host (no fanotify or no cgroup v2)\n";
        } else {
            s += &self.proof_table();
        }
        if let Some(l) = &self.latency {
            s += &format!(
                "warm lease over the API ({} x {}): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms, {} warm-exact\n",
                l.leases,
                format_bytes(l.lease_size),
                l.p50_ms,
                l.p99_ms,
                l.max_ms,
                l.warm_exact
            );
        }
        if let Some(h) = &self.hog {
            s += &h.table();
        }
        s
    }
}
