//! `hugeprep bench pin`: what a VMM's long-term pin of its guest memory costs (the
//! `pin_user_pages(FOLL_LONGTERM)` path VFIO type1 and iommufd take, here through io_uring
//! buffer registration), on never-faulted hugetlbfs memory versus a hugeprep lease.
//!
//! Four cases per size, interleaved (the order rotates every repetition) after one untimed
//! round of each:
//! - `never-faulted`: a fresh hugetlbfs file, mapped shared and pinned: the pin faults and
//!   zeroes every page, one thread (what a VMM pays today);
//! - `lease, pool idle`: a warm lease from an in-process daemon whose pool is settled;
//! - `lease, refilling, no grace`: the second of two leases taken back to back, pinned at once
//!   while the pool refills both files (the worker as it was before the lessee grace);
//! - `lease, refilling, grace`: the same with the daemon's default lessee grace, which holds
//!   the refill back while the VMM pins and first touches its memory.
//!
//! Each pin maps the lease file anew, as a VMM does, so the pin walks page tables the
//! mapping has not populated yet; the unpin is timed too.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::daemon::{BenchDaemon, BenchDaemonError};
use crate::svg::{LineChart, Series};
use crate::Summary;
use hugeprep::clear::ClearPlan;
use hugeprep::client::ClientError;
use hugeprep::hugetlb::{BackingFile, FileError, MountError, MountOptions, OwnedMount, PoolTopUp};
use hugeprep::page_size::PageSize;
use hugeprep::pool::{LeaseInfo, LeaseRequest, PoolPolicy, LESSEE_GRACE};
use hugeprep::sys::pin::{LongTermPin, PinError};
use hugeprep::units::format_bytes;

/// What to run.
#[derive(Debug, Clone)]
pub struct PinBenchConfig {
    /// Bytes of guest memory per pin.
    pub sizes: Vec<u64>,
    /// Page sizes to run (1G where the kernel can supply the pages).
    pub page_sizes: Vec<PageSize>,
    /// Measured repetitions per case.
    pub reps: usize,
    /// Clearing plan of the daemon's scrubber.
    pub plan: ClearPlan,
}

/// A pin benchmark failed; every variant keeps the failing layer's error.
#[derive(Debug, thiserror::Error)]
pub enum PinBenchError {
    /// A setting is out of range.
    #[error("bench pin: --{field}: {reason}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A backing file could not be made, opened or removed.
    #[error("bench pin: {0}")]
    File(#[from] FileError),
    /// The benchmark's hugetlbfs could not be mounted.
    #[error("bench pin: {0}")]
    Mount(#[from] MountError),
    /// Pinning failed.
    #[error("bench pin: {0}")]
    Pin(#[from] PinError),
    /// The in-process daemon failed.
    #[error("bench pin: {0}")]
    Daemon(#[from] BenchDaemonError),
    /// A lease request failed.
    #[error("bench pin: {0}")]
    Client(#[from] ClientError),
}

/// How long a settle may take (a liveness bound).
const SETTLE: Duration = Duration::from_secs(120);

/// Between a lease and the VMM's pin: QEMU's exec and setup before it maps guest RAM take
/// about this long (and the pool's worker wakes within it).
pub const VMM_SETUP: Duration = Duration::from_millis(10);

/// The cases, in the report's order.
pub const CASES: [&str; 4] = [
    "never-faulted",
    "lease, pool idle",
    "lease, refilling, no grace",
    "lease, refilling, grace",
];

/// One case at one size.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// One of [`CASES`].
    pub case: &'static str,
    /// Pin (buffer registration) time per repetition, ms.
    pub pin_samples_ms: Vec<f64>,
    /// Unpin time per repetition, ms.
    pub unpin_samples_ms: Vec<f64>,
    /// Median and range of the pin, ms.
    pub pin_ms: Summary,
    /// Median and range of the unpin, ms.
    pub unpin_ms: Summary,
    /// Repetitions in which the pool was refilling or scrubbing when the pin started
    /// ([`VMM_SETUP`] after the lease).
    pub pool_busy_at_pin: usize,
}

/// All cases at one size and page size.
#[derive(Debug, Clone, Serialize)]
pub struct SizeResult {
    /// Bytes pinned.
    pub size: u64,
    /// Page size.
    pub page_size: PageSize,
    /// The cases, in [`CASES`] order.
    pub cases: Vec<CaseResult>,
    /// Median never-faulted pin / median pin of each lease case, in [`CASES`] order from the
    /// second.
    pub speedup: Vec<f64>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct PinBenchReport {
    /// Repetitions per case.
    pub reps: usize,
    /// The daemon's lessee grace in the `grace` case, ms.
    pub grace_ms: u64,
    /// Results.
    pub runs: Vec<SizeResult>,
    /// Sizes or page sizes not run, and why (the kernel could not supply the pages).
    pub skipped: Vec<String>,
}

/// Pins `path` as a VMM would (fresh shared mapping), then unpins: (pin ms, unpin ms).
fn pin_path(path: &Path, size: u64, ps: PageSize) -> Result<(f64, f64), PinBenchError> {
    let file = BackingFile::open(path, ps)?;
    let pin = LongTermPin::pin_file(std::os::fd::AsFd::as_fd(file.file()), size as usize)?;
    let pin_ms = pin.took().as_secs_f64() * 1e3;
    let unpin_ms = pin.unpin().as_secs_f64() * 1e3;
    Ok((pin_ms, unpin_ms))
}

struct Sizer<'a> {
    size: u64,
    ps: PageSize,
    mount: &'a Path,
    daemon: &'a BenchDaemon,
    n: usize,
}

impl Sizer<'_> {
    fn lease(&mut self) -> Result<LeaseInfo, PinBenchError> {
        self.n += 1;
        let req = LeaseRequest {
            name: format!("pin{}", self.n),
            size: self.size,
            page_size: Some(self.ps),
            ..LeaseRequest::default()
        };
        Ok(self.daemon.block_on(self.daemon.client().lease(&req))?)
    }

    fn release(&self, lease: &LeaseInfo) -> Result<(), PinBenchError> {
        self.daemon
            .block_on(self.daemon.client().release(lease.id))?;
        Ok(())
    }

    /// Waits as long as a VMM takes from its lease to its pin, then says whether the pool
    /// is faulting or scrubbing memory at that moment.
    fn vmm_start(&self) -> bool {
        std::thread::sleep(VMM_SETUP);
        self.daemon
            .pool()
            .status()
            .kinds
            .iter()
            .any(|k| k.filling_bytes + k.scrubbing_bytes > 0)
    }

    /// One repetition of `case`: (pin ms, unpin ms, pool busy at the pin).
    fn run(&mut self, case: usize) -> Result<(f64, f64, bool), PinBenchError> {
        match case {
            0 => {
                // The baseline gets a quiet pool too: the previous case's release leaves
                // scrubs and refills behind.
                self.daemon.settle(SETTLE)?;
                let path = self.mount.join("never-faulted");
                let file = BackingFile::create(&path, self.size, self.ps, None)?;
                drop(file);
                let r = pin_path(&path, self.size, self.ps);
                BackingFile::open(&path, self.ps)?.remove()?;
                let (p, u) = r?;
                Ok((p, u, false))
            }
            1 => {
                self.daemon.pool().set_lessee_grace(LESSEE_GRACE);
                self.daemon.settle(SETTLE)?;
                let lease = self.lease()?;
                let busy = self.vmm_start();
                let r = pin_path(&lease.path, self.size, self.ps);
                self.release(&lease)?;
                let (p, u) = r?;
                Ok((p, u, busy))
            }
            _ => {
                let grace = if case == 2 {
                    Duration::ZERO
                } else {
                    LESSEE_GRACE
                };
                self.daemon.pool().set_lessee_grace(grace);
                self.daemon.settle(SETTLE)?;
                let first = self.lease()?;
                let second = self.lease()?;
                let busy = self.vmm_start();
                let r = pin_path(&second.path, self.size, self.ps);
                self.release(&first)?;
                self.release(&second)?;
                let (p, u) = r?;
                Ok((p, u, busy))
            }
        }
    }
}

fn run_size(
    cfg: &PinBenchConfig,
    size: u64,
    ps: PageSize,
    mount: &Path,
    log: &dyn Fn(&str),
) -> Result<SizeResult, PinBenchError> {
    let mut policy = PoolPolicy::embedded();
    // Two warm files, so that two leases back to back are both warm and both refilled.
    policy.set_warm(ps, 2 * size, vec![size]);
    policy.scrub_bandwidth = None;
    let base = std::env::temp_dir().join(format!("hugeprep-bench-pin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let samples = BenchDaemon::start(&base, mount, policy, cfg.plan)
        .map_err(PinBenchError::from)
        .and_then(|daemon| sample(cfg, size, ps, mount, &daemon, log));
    let _ = std::fs::remove_dir_all(&base);
    let cases: Vec<CaseResult> = samples?
        .into_iter()
        .zip(CASES)
        .map(|((pins, unpins, busy), case)| {
            let summary = |v: &[f64]| {
                Summary::of(v).ok_or(PinBenchError::Invalid {
                    field: "reps",
                    reason: "must be at least 1".into(),
                })
            };
            Ok(CaseResult {
                case,
                pin_ms: summary(&pins)?,
                unpin_ms: summary(&unpins)?,
                pin_samples_ms: pins,
                unpin_samples_ms: unpins,
                pool_busy_at_pin: busy,
            })
        })
        .collect::<Result<_, PinBenchError>>()?;
    let cold = cases[0].pin_ms.median;
    let speedup = cases[1..].iter().map(|c| cold / c.pin_ms.median).collect();
    Ok(SizeResult {
        size,
        page_size: ps,
        cases,
        speedup,
    })
}

/// Per case: (pin ms, unpin ms, repetitions that found the pool busy at the pin).
type CaseSamples = Vec<(Vec<f64>, Vec<f64>, usize)>;

/// Runs every case once untimed, then `cfg.reps` repetitions with the cases interleaved.
fn sample(
    cfg: &PinBenchConfig,
    size: u64,
    ps: PageSize,
    mount: &Path,
    daemon: &BenchDaemon,
    log: &dyn Fn(&str),
) -> Result<CaseSamples, PinBenchError> {
    let mut sizer = Sizer {
        size,
        ps,
        mount,
        daemon,
        n: 0,
    };
    let mut samples = vec![(Vec::new(), Vec::new(), 0usize); CASES.len()];
    for case in 0..CASES.len() {
        sizer.run(case)?;
    }
    for rep in 0..cfg.reps {
        let mut line = format!("{} {ps} rep {}/{}:", format_bytes(size), rep + 1, cfg.reps);
        for k in 0..CASES.len() {
            let case = (rep + k) % CASES.len();
            let (p, u, busy) = sizer.run(case)?;
            samples[case].0.push(p);
            samples[case].1.push(u);
            samples[case].2 += usize::from(busy);
            line += &format!("  [{}] {p:.1} ms", CASES[case]);
        }
        log(&line);
    }
    Ok(samples)
}

/// Runs the benchmark; `log` gets progress lines.
pub fn run(cfg: &PinBenchConfig, log: &dyn Fn(&str)) -> Result<PinBenchReport, PinBenchError> {
    if cfg.reps == 0 {
        return Err(PinBenchError::Invalid {
            field: "reps",
            reason: "must be at least 1".into(),
        });
    }
    let mut runs = Vec::new();
    let mut skipped = Vec::new();
    for &ps in &cfg.page_sizes {
        for &size in &cfg.sizes {
            // A size that is no whole number of these pages (256M of 1G pages, where the
            // default page sizes include 1G) is no case to measure: skipped and listed.
            if let Err(e) = hugeprep::hugetlb::check_size(size, ps) {
                let why = format!("{} of {ps} pages: {e}", format_bytes(size));
                log(&format!("skipped: {why}"));
                skipped.push(why);
                continue;
            }
            // Two leases plus the two files that replace them.
            let pages = 4 * size / ps.bytes();
            // Declared before the mount so that it drops after it, on every return.
            let top_up = match PoolTopUp::ensure_free(None, ps, pages) {
                Ok(t) => t,
                Err(e) => {
                    let why = format!("{} of {ps} pages: {e}", format_bytes(size));
                    log(&format!("skipped: {why}"));
                    skipped.push(why);
                    continue;
                }
            };
            let mut options = MountOptions::new(ps);
            options.mode = 0o755;
            let mount = OwnedMount::new_temp(&std::env::temp_dir(), &options)?;
            let result = run_size(cfg, size, ps, mount.path(), log);
            let _ = mount.unmount();
            drop(top_up);
            runs.push(result?);
        }
    }
    Ok(PinBenchReport {
        reps: cfg.reps,
        grace_ms: LESSEE_GRACE.as_millis() as u64,
        runs,
        skipped,
    })
}

impl PinBenchReport {
    /// The report as a table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "long-term pin (io_uring buffer registration, FOLL_LONGTERM), {} reps, ms median (min-max)\n",
            self.reps
        );
        s += &format!(
            "{:>6} {:>4}  {:<28} {:>22} {:>20} {:>9}\n",
            "size", "page", "case", "pin ms", "unpin ms", "speedup"
        );
        for r in &self.runs {
            for (i, c) in r.cases.iter().enumerate() {
                let speedup = match i {
                    0 => "1.0x".to_string(),
                    _ => format!("{:.1}x", r.speedup[i - 1]),
                };
                s += &format!(
                    "{:>6} {:>4}  {:<28} {:>22} {:>20} {:>9}\n",
                    format_bytes(r.size),
                    r.page_size.name(),
                    c.case,
                    c.pin_ms.to_string(),
                    format!(
                        "{:.3} ({:.3}-{:.3})",
                        c.unpin_ms.median, c.unpin_ms.min, c.unpin_ms.max
                    ),
                    speedup
                );
            }
        }
        s += &format!(
            "speedup: median never-faulted pin / median pin of the case; grace = the daemon's lessee grace ({} ms)\n",
            self.grace_ms
        );
        for why in &self.skipped {
            s += &format!("skipped: {why}\n");
        }
        s
    }

    /// Pin time against size, one line per case and page size.
    pub fn svg(&self) -> String {
        let mut series: Vec<Series> = Vec::new();
        for r in &self.runs {
            for c in &r.cases {
                let name = format!("{} ({})", c.case, r.page_size.name());
                let point = (r.size as f64 / (1u64 << 30) as f64, c.pin_ms.median);
                match series.iter_mut().find(|s| s.name == name) {
                    Some(s) => s.points.push(point),
                    None => series.push(Series {
                        name,
                        points: vec![point],
                    }),
                }
            }
        }
        LineChart {
            title: "long-term pin of guest memory, median ms".into(),
            x_label: "GiB pinned".into(),
            y_label: "ms".into(),
            series,
            ..LineChart::default()
        }
        .render()
    }
}
