//! `hugeprep bench trace`: the fixed and the demand-shaped pool on the same lease trace.

use hugeprep::cpu::CpuInfo;
use hugeprep::policy::ClearingPolicy;
use hugeprep::units::parse_bytes;
use hugeprep::PageSize;
use hugeprep_bench::trace::{self, TraceBenchConfig};

/// Replays a lease trace (arrival, size, hold time) against the fixed and the demand-shaped
/// pool: warm-exact fraction, lease latency p50/p99 and bytes faulted cold, per phase.
#[derive(Debug, clap::Args)]
pub struct BenchTraceArgs {
    /// Trace file, one lease per line: `AT_MS SIZE HOLD_MS [PHASE]` (default: the built-in
    /// mixed trace with a burst).
    #[arg(long)]
    pub trace: Option<std::path::PathBuf>,
    /// Steady leases before and after the burst of the built-in trace.
    #[arg(long, default_value_t = 200)]
    pub steady: usize,
    /// Warm target for both shapes. The built-in trace's steady part holds at most 544 MiB
    /// at once, and per size at most 5 x 32M + 4 x 64M + 4 x 128M (928 MiB): 1G fits both
    /// (see docs/pool.md, "Measured").
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    pub warm: u64,
    /// The `sizes` mix for both shapes (default: one file of the whole target).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
    pub sizes: Vec<u64>,
    /// Page size: 2M or 1G.
    #[arg(long, default_value = "2M")]
    pub page_size: PageSize,
    /// `--json`, `--json-out FILE`.
    #[command(flatten)]
    pub output: super::JsonOutput,
}

/// Runs `hugeprep bench trace`.
pub fn run(args: BenchTraceArgs) -> anyhow::Result<()> {
    let events = match &args.trace {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|source| trace::TraceBenchError::Read {
                    path: path.clone(),
                    source,
                })?;
            trace::parse_trace(path, &text)?
        }
        None => trace::mixed_trace(args.steady),
    };
    for (i, e) in events.iter().enumerate() {
        hugeprep::hugetlb::check_size(e.size, args.page_size)
            .map_err(|err| anyhow::anyhow!("trace lease {}: {err}", i + 1))?;
    }
    let resolution = ClearingPolicy::embedded().resolve(CpuInfo::host());
    let _lock = hugeprep::hugetlb::lock::HugepageLock::acquire()?;
    let cfg = TraceBenchConfig {
        events,
        page_size: args.page_size,
        warm: args.warm,
        sizes: args.sizes,
        plan: resolution.plan,
    };
    let report = trace::run(&cfg, &|line| eprintln!("{line}"))?;
    args.output.emit(&report, || report.table())
}
