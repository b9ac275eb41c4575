//! `hugeprep bench prefault`: hugeprep's cold preparation against QEMU's preallocation.

use std::path::PathBuf;

use hugeprep::bench::prefault::{self, PrefaultBenchConfig};
use hugeprep::units::parse_bytes;
use hugeprep::PageSize;

/// Cold preparation throughput: hugeprep vs QEMU prealloc-threads vs one thread.
#[derive(Debug, clap::Args)]
pub struct BenchPrefaultArgs {
    /// Bytes per file (needs that many free hugepages; the pool is topped up for the run).
    #[arg(long, default_value = "4G", value_parser = parse_bytes)]
    pub size: u64,
    /// Page size: 2M or 1G.
    #[arg(long, default_value = "2M")]
    pub page_size: PageSize,
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
    let cfg = PrefaultBenchConfig {
        size: args.size,
        page_size: args.page_size,
        threads: args.threads,
        reps: args.reps,
        node: args.node,
        qemu: args.qemu,
        mount: args.mount,
        cancel: Some(cancel),
    };
    let report = prefault::run(&cfg, &|line| eprintln!("{line}")).map_err(|e| match e {
        prefault::PrefaultBenchError::Invalid { field, reason } => {
            anyhow::anyhow!("--{field}: {reason}")
        }
        other => anyhow::anyhow!(other),
    })?;
    args.output.emit(&report, || report.table())
}
