//! `hugeprep bench pin`: a VMM's long-term pin of never-faulted memory vs of a lease.

use std::path::PathBuf;

use hugeprep::cpu::CpuInfo;
use hugeprep::policy::ClearingPolicy;
use hugeprep::units::parse_bytes;
use hugeprep::PageSize;
use hugeprep_bench::pin::{self, PinBenchConfig};

/// Long-term pin (VFIO's FOLL_LONGTERM path, via io_uring buffer registration) of
/// never-faulted hugetlbfs memory against a hugeprep lease, pool idle and right after
/// back-to-back leases while the pool refills.
#[derive(Debug, clap::Args)]
pub struct BenchPinArgs {
    /// Bytes pinned per case, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_value = "1G,2G,4G")]
    pub sizes: Vec<u64>,
    /// Page sizes, comma-separated (default: 2M, and 1G where the kernel has a 1G pool; a
    /// size the kernel cannot supply is reported as skipped).
    #[arg(long, value_delimiter = ',')]
    pub page_sizes: Vec<PageSize>,
    /// Measured repetitions per case (after one warm-up round).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Write a chart (pin ms against size) to FILE as SVG.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// `--json`, `--json-out FILE`.
    #[command(flatten)]
    pub output: super::JsonOutput,
}

/// Runs `hugeprep bench pin`.
pub fn run(args: BenchPinArgs) -> anyhow::Result<()> {
    let page_sizes = if args.page_sizes.is_empty() {
        hugeprep::hugetlb::pool::page_sizes()
    } else {
        // Page sizes asked for by name: a size that is no whole number of them is a mistake
        // (with the default page sizes it is skipped and listed).
        for &ps in &args.page_sizes {
            for &size in &args.sizes {
                hugeprep::hugetlb::check_size(size, ps)
                    .map_err(|e| anyhow::anyhow!("--sizes: {e}"))?;
            }
        }
        args.page_sizes.clone()
    };
    let cfg = PinBenchConfig {
        sizes: args.sizes.clone(),
        page_sizes,
        reps: args.reps,
        plan: ClearingPolicy::embedded().resolve(CpuInfo::host()).plan,
    };
    // Borrowed pool pages and timings must not be disturbed by tests or other benchmarks.
    let _lock = hugeprep::hugetlb::lock::HugepageLock::acquire()?;
    let report = pin::run(&cfg, &|line| eprintln!("{line}"))?;
    if let Some(path) = &args.svg {
        std::fs::write(path, report.svg())
            .map_err(|e| anyhow::anyhow!("--svg {}: {e}", path.display()))?;
    }
    args.output.emit(&report, || report.table())
}
