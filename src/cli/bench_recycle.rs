//! `hugeprep bench recycle`: scrub-and-return vs delete-and-refault, and warm lease latency.

use hugeprep::bench::recycle::{self, RecycleBenchConfig};
use hugeprep::cpu::CpuInfo;
use hugeprep::policy::ClearingPolicy;
use hugeprep::units::parse_bytes;
use hugeprep::PageSize;

/// Recycling a stopped VM's memory: scrub in place vs delete and fault fresh pages, and
/// lease latency from the warm pool over the API.
#[derive(Debug, clap::Args)]
pub struct BenchRecycleArgs {
    /// Bytes per file for the throughput comparison.
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    pub size: u64,
    /// Page size: 2M or 1G.
    #[arg(long, default_value = "2M")]
    pub page_size: PageSize,
    /// Threads for both paths (default: every CPU this process may use).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Measured repetitions (after one warm-up round).
    #[arg(long, default_value_t = 7)]
    pub reps: usize,
    /// Leases to time over the API (0: skip).
    #[arg(long, default_value_t = 1000)]
    pub leases: usize,
    /// Bytes per lease.
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    pub lease_size: u64,
    /// Journal directory for the latency part (default: a temporary directory).
    #[arg(long)]
    pub state_dir: Option<std::path::PathBuf>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `hugeprep bench recycle`.
pub fn run(args: BenchRecycleArgs) -> anyhow::Result<()> {
    let resolution = ClearingPolicy::embedded().resolve(CpuInfo::host());
    let threads = args
        .threads
        .unwrap_or_else(|| hugeprep::sys::affinity::allowed_cpus().len());
    let cfg = RecycleBenchConfig {
        size: args.size,
        page_size: args.page_size,
        threads,
        reps: args.reps,
        leases: args.leases,
        lease_size: args.lease_size,
        plan: resolution.plan,
        state_dir: args.state_dir,
    };
    // Hugepage tests count free pages: do not move the pool under them.
    let _lock = hugeprep::testing::lock()?;
    let report = recycle::run(&cfg, &|line| eprintln!("{line}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}
