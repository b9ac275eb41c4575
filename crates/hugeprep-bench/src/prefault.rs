//! `hugeprep bench prefault`: cold preparation throughput of hugeprep against QEMU's own
//! preallocation (`prealloc=on,prealloc-threads=N`, the same N, size and page size) and
//! against one thread of `MADV_POPULATE_WRITE`, side by side in one run.
//!
//! Every variant starts from a fresh file, so every page is faulted and zeroed by the kernel.
//! Variants alternate within each repetition (the starting variant rotates), after one
//! warm-up round. QEMU's time runs from `spawn` until QMP answers `query-status`; QEMU with
//! `prealloc=off` on the same backend measures its startup floor, so the table shows QEMU
//! both as measured and with the floor taken out.
//!
//! The pages come from a pool topped up by the shortfall for the run and given back after,
//! and the files live on a hugetlbfs mounted for the run in a temporary directory: nothing
//! is left behind, even on error or Ctrl-C (the cancel flag is checked between runs).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Summary;
use hugeprep::hugetlb::{
    BackingFile, FileError, MountError, MountOptions, OwnedMount, PoolError, PoolTopUp,
};
use hugeprep::page_size::PageSize;
use hugeprep::prefault::{default_threads, prefault, PrefaultError, PrefaultOptions};
use hugeprep::sys::affinity::allowed_cpus;
use hugeprep::topology::{Topology, TopologyError};
use hugeprep::units::{format_bytes, gbps};
use hugeprep_testkit::qemu::{self, QemuConfig, QemuError, QemuVm};

/// How long QEMU may take to become ready (a first touch since boot is ~25x slower).
const QEMU_READY_TIMEOUT: Duration = Duration::from_secs(300);

/// What to measure.
#[derive(Debug, Clone)]
pub struct PrefaultBenchConfig {
    /// Bytes per file.
    pub size: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Threads for hugeprep and `prealloc-threads` for QEMU (`None`: hugeprep's default).
    pub threads: Option<usize>,
    /// Measured repetitions (at least 5 for a median and range worth reading).
    pub reps: usize,
    /// Node to bind hugeprep's workers and memory to.
    pub node: Option<u32>,
    /// QEMU binary (`None`: `qemu-system-x86_64` from `PATH`; QEMU rows are left out when
    /// it is missing).
    pub qemu: Option<PathBuf>,
    /// A hugetlbfs mount to use (`None`: mount one in a temporary directory for the run).
    pub mount: Option<PathBuf>,
    /// Checked between runs; when set the benchmark stops, cleans up and fails.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// One way of preparing memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// hugeprep with N threads.
    Hugeprep,
    /// QEMU `prealloc=on,prealloc-threads=N`.
    QemuPrealloc,
    /// hugeprep with one thread: the kernel's single-thread fault rate.
    HugeprepOneThread,
    /// QEMU `prealloc=off`: startup without preallocation (the floor).
    QemuNoPrealloc,
}

impl Variant {
    /// The row label.
    pub fn label(self, threads: usize) -> String {
        match self {
            Variant::Hugeprep => format!("hugeprep, {threads} threads"),
            Variant::QemuPrealloc => format!("qemu prealloc-threads={threads}"),
            Variant::HugeprepOneThread => "hugeprep, 1 thread".into(),
            Variant::QemuNoPrealloc => "qemu prealloc=off (startup floor)".into(),
        }
    }
}

/// One variant's measurements.
#[derive(Debug, Clone, Serialize)]
pub struct VariantResult {
    /// Which variant.
    pub variant: Variant,
    /// Row label.
    pub label: String,
    /// Threads used.
    pub threads: usize,
    /// Seconds per run.
    pub seconds: Summary,
    /// GB/s per run (size / seconds; for the floor this is not a fault rate).
    pub gbps: Summary,
    /// Every measured run, in seconds.
    pub samples: Vec<f64>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct PrefaultBenchReport {
    /// Bytes per file.
    pub size: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Threads (hugeprep) and prealloc-threads (QEMU).
    pub threads: usize,
    /// Measured repetitions.
    pub reps: usize,
    /// QEMU's version line, when QEMU ran.
    pub qemu_version: Option<String>,
    /// One entry per variant.
    pub results: Vec<VariantResult>,
    /// hugeprep GB/s over QEMU prealloc GB/s, per repetition.
    pub ratio_vs_qemu: Option<Summary>,
    /// The same with QEMU's startup floor (same repetition) taken out of its time.
    pub ratio_vs_qemu_without_startup: Option<Summary>,
    /// hugeprep N threads over hugeprep 1 thread, per repetition.
    pub ratio_vs_one_thread: Option<Summary>,
}

/// Errors running the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum PrefaultBenchError {
    /// Bad configuration.
    #[error("{field}: {reason}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Mounting or finding hugetlbfs failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// The pool could not supply the pages.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// Creating a file failed.
    #[error(transparent)]
    File(#[from] FileError),
    /// hugeprep's prefault failed.
    #[error(transparent)]
    Prefault(#[from] PrefaultError),
    /// QEMU failed.
    #[error(transparent)]
    Qemu(#[from] QemuError),
    /// The topology could not be read.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// Interrupted.
    #[error("interrupted; everything the benchmark took was given back")]
    Cancelled,
}

type Result<T> = std::result::Result<T, PrefaultBenchError>;

/// Everything one run needs.
struct Bench<'a> {
    cfg: &'a PrefaultBenchConfig,
    dir: PathBuf,
    threads: usize,
    qemu: Option<PathBuf>,
}

impl Bench<'_> {
    fn check_cancel(&self) -> Result<()> {
        match &self.cfg.cancel {
            Some(c) if c.load(Ordering::Relaxed) => Err(PrefaultBenchError::Cancelled),
            _ => Ok(()),
        }
    }

    /// Runs one variant on a fresh file and returns its seconds; the file is gone after.
    fn run_once(&self, variant: Variant, tag: &str) -> Result<f64> {
        self.check_cancel()?;
        let path = self.dir.join(format!("bench-{tag}"));
        let _ = std::fs::remove_file(&path);
        let result = match variant {
            Variant::Hugeprep => self.hugeprep(&path, self.threads),
            Variant::HugeprepOneThread => self.hugeprep(&path, 1),
            Variant::QemuPrealloc => self.qemu(&path, true),
            Variant::QemuNoPrealloc => self.qemu(&path, false),
        };
        let _ = std::fs::remove_file(&path);
        result
    }

    fn hugeprep(&self, path: &Path, threads: usize) -> Result<f64> {
        let opts = PrefaultOptions {
            threads: Some(threads),
            node: self.cfg.node,
            cancel: self.cfg.cancel.clone(),
            ..PrefaultOptions::default()
        };
        let start = Instant::now();
        let file = BackingFile::create(path, self.cfg.size, self.cfg.page_size, None)?;
        prefault(&file, 0..self.cfg.size, &opts, None)?;
        Ok(start.elapsed().as_secs_f64())
    }

    fn qemu(&self, path: &Path, prealloc: bool) -> Result<f64> {
        let binary = self.qemu.clone().ok_or(PrefaultBenchError::Invalid {
            field: "qemu",
            reason: "qemu-system-x86_64 not found".into(),
        })?;
        let config = QemuConfig {
            binary,
            size: self.cfg.size,
            mem_path: path.to_path_buf(),
            share: true,
            prealloc,
            prealloc_threads: self.threads,
            qmp_socket: self.dir.join(".bench-qmp.sock"),
        };
        let start = Instant::now();
        let mut vm = QemuVm::spawn(&config)?;
        vm.wait_ready(QEMU_READY_TIMEOUT)?;
        let seconds = start.elapsed().as_secs_f64();
        vm.quit(Duration::from_secs(5));
        Ok(seconds)
    }
}

/// Runs the benchmark. `log` gets a line per finished run (for a progress display).
pub fn run(cfg: &PrefaultBenchConfig, log: &dyn Fn(&str)) -> Result<PrefaultBenchReport> {
    if cfg.reps == 0 {
        return Err(PrefaultBenchError::Invalid {
            field: "reps",
            reason: "must be at least 1".into(),
        });
    }
    if hugeprep::hugetlb::check_size(cfg.size, cfg.page_size).is_err() {
        return Err(PrefaultBenchError::Invalid {
            field: "size",
            reason: format!(
                "{} is not a positive multiple of the {} page size",
                cfg.size, cfg.page_size
            ),
        });
    }
    let cpus = match cfg.node {
        Some(n) => Topology::detect()?.node(n)?.cpus.len(),
        None => allowed_cpus().len(),
    };
    let threads = default_threads(cfg.size, cpus, cfg.threads);
    let qemu = cfg.qemu.clone().or_else(qemu::find_binary);
    let qemu_version = qemu.as_deref().and_then(qemu::version);

    // Declared first so they are dropped last: files go before the mount and the pages.
    let owned_mount;
    let dir = match &cfg.mount {
        Some(m) => m.clone(),
        None => {
            owned_mount =
                OwnedMount::new_temp(&std::env::temp_dir(), &MountOptions::new(cfg.page_size))?;
            owned_mount.path().to_path_buf()
        }
    };
    let _top_up =
        PoolTopUp::ensure_free(cfg.node, cfg.page_size, cfg.size / cfg.page_size.bytes())?;

    let bench = Bench {
        cfg,
        dir,
        threads,
        qemu: qemu.clone(),
    };
    let mut variants = vec![Variant::Hugeprep, Variant::HugeprepOneThread];
    if qemu.is_some() {
        variants.insert(1, Variant::QemuPrealloc);
        variants.push(Variant::QemuNoPrealloc);
    }

    for &v in &variants {
        let s = bench.run_once(v, "warmup")?;
        log(&format!("warm-up  {:<36} {:.3} s", v.label(threads), s));
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for rep in 0..cfg.reps {
        for i in 0..variants.len() {
            let k = (rep + i) % variants.len();
            let v = variants[k];
            let s = bench.run_once(v, &format!("{rep}-{k}"))?;
            log(&format!(
                "rep {}/{}  {:<36} {:.3} s  {:.1} GB/s",
                rep + 1,
                cfg.reps,
                v.label(threads),
                s,
                gbps(cfg.size, s)
            ));
            samples[k].push(s);
        }
    }
    Ok(report(cfg, threads, qemu_version, &variants, &samples))
}

fn report(
    cfg: &PrefaultBenchConfig,
    threads: usize,
    qemu_version: Option<String>,
    variants: &[Variant],
    samples: &[Vec<f64>],
) -> PrefaultBenchReport {
    let rate = |s: &f64| gbps(cfg.size, *s);
    let of = |v: Variant| {
        variants
            .iter()
            .position(|&x| x == v)
            .map(|i| samples[i].as_slice())
    };
    let paired = |num: Option<&[f64]>, den: Option<&[f64]>, floor: Option<&[f64]>| {
        let (num, den) = (num?, den?);
        let ratios: Vec<f64> = (0..num.len().min(den.len()))
            .map(|i| {
                let den_s = den[i] - floor.map_or(0.0, |f| f[i]);
                den_s / num[i] // (size/num) / (size/den) = den/num
            })
            .collect();
        Summary::of(&ratios)
    };
    let results = variants
        .iter()
        .zip(samples)
        .filter_map(|(&variant, s)| {
            let rates: Vec<f64> = s.iter().map(rate).collect();
            Some(VariantResult {
                variant,
                label: variant.label(threads),
                threads: match variant {
                    Variant::HugeprepOneThread => 1,
                    _ => threads,
                },
                seconds: Summary::of(s)?,
                gbps: Summary::of(&rates)?,
                samples: s.clone(),
            })
        })
        .collect();
    PrefaultBenchReport {
        size: cfg.size,
        page_size: cfg.page_size,
        threads,
        reps: cfg.reps,
        qemu_version,
        results,
        ratio_vs_qemu: paired(of(Variant::Hugeprep), of(Variant::QemuPrealloc), None),
        ratio_vs_qemu_without_startup: paired(
            of(Variant::Hugeprep),
            of(Variant::QemuPrealloc),
            of(Variant::QemuNoPrealloc),
        ),
        ratio_vs_one_thread: paired(of(Variant::Hugeprep), of(Variant::HugeprepOneThread), None),
    }
}

impl PrefaultBenchReport {
    /// The human-readable table: median (min-max) per variant, then the ratios.
    pub fn table(&self) -> String {
        let mut out = format!(
            "cold preparation of {} in {} pages, {} threads, {} reps (median (min-max))\n",
            format_bytes(self.size),
            self.page_size,
            self.threads,
            self.reps
        );
        if let Some(v) = &self.qemu_version {
            out.push_str(&format!("{v}\n"));
        }
        out.push_str(&format!(
            "{:<38} {:>22} {:>22}\n",
            "variant", "seconds", "GB/s"
        ));
        for r in &self.results {
            out.push_str(&format!(
                "{:<38} {:>22} {:>22}\n",
                r.label,
                format!(
                    "{:.3} ({:.3}-{:.3})",
                    r.seconds.median, r.seconds.min, r.seconds.max
                ),
                r.gbps.to_string()
            ));
        }
        let ratio = |name: &str, s: &Option<Summary>| match s {
            Some(s) => format!("{name:<52} {:.2}x ({:.2}-{:.2})\n", s.median, s.min, s.max),
            None => String::new(),
        };
        out.push_str(&ratio(
            "hugeprep vs qemu prealloc (same threads)",
            &self.ratio_vs_qemu,
        ));
        out.push_str(&ratio(
            "hugeprep vs qemu prealloc minus qemu startup",
            &self.ratio_vs_qemu_without_startup,
        ));
        out.push_str(&ratio(
            "hugeprep N threads vs 1 thread",
            &self.ratio_vs_one_thread,
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_pair_repetitions() {
        let cfg = PrefaultBenchConfig {
            size: 1 << 30,
            page_size: PageSize::Size2M,
            threads: Some(2),
            reps: 2,
            node: None,
            qemu: None,
            mount: None,
            cancel: None,
        };
        let variants = [
            Variant::Hugeprep,
            Variant::QemuPrealloc,
            Variant::HugeprepOneThread,
            Variant::QemuNoPrealloc,
        ];
        let samples = vec![
            vec![0.05, 0.05],
            vec![0.15, 0.10],
            vec![0.1, 0.1],
            vec![0.05, 0.05],
        ];
        let r = report(&cfg, 2, None, &variants, &samples);
        let q = r.ratio_vs_qemu.unwrap();
        assert!(
            (q.min - 2.0).abs() < 1e-9 && (q.max - 3.0).abs() < 1e-9,
            "{q:?}"
        );
        let net = r.ratio_vs_qemu_without_startup.unwrap();
        assert!((net.min - 1.0).abs() < 1e-9 && (net.max - 2.0).abs() < 1e-9);
        assert!(r.table().contains("hugeprep, 2 threads"));
    }
}
