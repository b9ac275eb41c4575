//! `hugeprep bench prefault`: hugeprep's cold preparation against QEMU's preallocation.

use std::path::PathBuf;

use hugeprep::units::parse_bytes;
use hugeprep::PageSize;
use hugeprep_bench::prefault::{self, PrefaultBenchConfig};

/// Cold preparation throughput: hugeprep vs QEMU prealloc-threads vs one thread.
#[derive(Debug, clap::Args)]
pub struct BenchPrefaultArgs {
    /// Bytes per file (needs that many free hugepages; the pool is topped up for the run).
    #[arg(long, default_value = "4G", value_parser = parse_bytes)]
    pub size: u64,
    /// Page sizes, comma-separated, each measured in turn in the same run (default: 2M, and
    /// 1G where the kernel has a 1G pool; a page size the kernel cannot supply is skipped
    /// and listed). With one page size the JSON is that run's report; with several,
    /// `{"runs": [...], "skipped": [...]}`.
    #[arg(long, value_delimiter = ',')]
    pub page_size: Vec<PageSize>,
    /// hugeprep threads and QEMU prealloc-threads (default: hugeprep's default).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Measured repetitions (after one warm-up round).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// NUMA node for hugeprep's workers and memory.
    #[arg(long)]
    pub node: Option<u32>,
    /// QEMU binary (default: qemu-system-x86_64 from PATH).
    #[arg(long)]
    pub qemu: Option<PathBuf>,
    /// hugetlbfs mount to use (default: one mounted in a temporary directory for the run).
    #[arg(long)]
    pub mount: Option<PathBuf>,
    /// `--json`, `--json-out FILE`.
    #[command(flatten)]
    pub output: super::JsonOutput,
}

/// Runs `hugeprep bench prefault`.
pub fn run(args: BenchPrefaultArgs) -> anyhow::Result<()> {
    let cancel = hugeprep::sys::signals::cancel_on_signals()?;
    // Borrowed pool pages and timings must not be disturbed by tests or other benchmarks.
    let _lock = hugeprep::hugetlb::lock::HugepageLock::acquire()?;
    let mut skipped = Vec::new();
    let page_sizes = if args.page_size.is_empty() {
        super::sizes_fit(
            hugeprep::hugetlb::pool::page_sizes(),
            &[("size", Some(args.size))],
            &mut skipped,
        )
    } else {
        args.page_size.clone()
    };
    let mut runs = Vec::new();
    for &page_size in &page_sizes {
        let cfg = PrefaultBenchConfig {
            size: args.size,
            page_size,
            threads: args.threads,
            reps: args.reps,
            node: args.node,
            qemu: args.qemu.clone(),
            mount: args.mount.clone(),
            cancel: Some(cancel.clone()),
        };
        match prefault::run(&cfg, &|line| eprintln!("{line}")) {
            Ok(report) => runs.push(report),
            Err(e @ prefault::PrefaultBenchError::Pool(_)) if page_sizes.len() > 1 => {
                eprintln!("skipped {page_size} pages: {e}");
                skipped.push(format!("{page_size} pages: {e}"));
            }
            Err(prefault::PrefaultBenchError::Invalid { field, reason }) => {
                anyhow::bail!("--{field}: {reason}")
            }
            Err(other) => return Err(anyhow::anyhow!(other)),
        }
    }
    if page_sizes.len() == 1 && skipped.is_empty() {
        if let Some(report) = runs.first() {
            return args.output.emit(report, || report.table());
        }
    }
    args.output.emit(
        &serde_json::json!({ "runs": runs, "skipped": skipped }),
        || {
            runs.iter().map(|r| r.table() + "\n").collect::<String>()
                + &skipped
                    .iter()
                    .map(|s| format!("skipped {s}\n"))
                    .collect::<String>()
        },
    )
}
