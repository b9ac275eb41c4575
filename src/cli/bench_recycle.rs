//! `hugeprep bench recycle`: scrub-and-return vs delete-and-refault, and warm lease latency.

use hugeprep::units::parse_bytes;
use hugeprep::PageSize;
use hugeprep_bench::recycle::{self, RecycleBenchConfig};

/// Recycling a stopped VM's memory: scrub in place vs delete and fault fresh pages, and
/// lease latency from the warm pool over the API.
#[derive(Debug, clap::Args)]
pub struct BenchRecycleArgs {
    /// Bytes per file for the throughput comparison.
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    pub size: u64,
    /// Page sizes, comma-separated, each measured in turn in the same run (default: 2M, and
    /// 1G where the kernel has a 1G pool; a page size the kernel cannot supply is skipped
    /// and listed).
    #[arg(long, value_delimiter = ',')]
    pub page_size: Vec<PageSize>,
    /// Thread counts, each measured for both paths side by side (default: 1 to every CPU
    /// this process may use).
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Measured repetitions (after one warm-up round).
    #[arg(long, default_value_t = 7)]
    pub reps: usize,
    /// Leases to time over the API (0: skip).
    #[arg(long, default_value_t = 1000)]
    pub leases: usize,
    /// Bytes per lease (default: 64M, or one page where pages are larger).
    #[arg(long, value_parser = parse_bytes)]
    pub lease_size: Option<u64>,
    /// Journal directory for the latency part (default: a temporary directory).
    #[arg(long)]
    pub state_dir: Option<std::path::PathBuf>,
    /// Also time warm leases with one busy-looping process per CPU against a quiet host,
    /// side by side (p50/p99 at the client and in the daemon).
    #[arg(long)]
    pub hog: bool,
    /// With --hog: run the benchmark's client at this nice value (e.g. -10, the daemon's API
    /// priority) instead of as an ordinary process.
    #[arg(long, allow_hyphen_values = true, requires = "hog")]
    pub client_nice: Option<i32>,
    /// Also time warm leases while another client leases and releases files of twice the
    /// lease size in a loop (the kernel's path: the worker journals, truncates and
    /// deletes meanwhile), against a quiet pool, side by side.
    #[arg(long)]
    pub churn: bool,
    /// With --churn: bytes per lease of the churning client instead of twice the lease size
    /// (e.g. one page: the worker's journal writes and deletions per second at the least
    /// faulting, so the timed leases compete with the worker rather than with page faults).
    #[arg(long, value_parser = parse_bytes, requires = "churn")]
    pub churn_size: Option<u64>,
    /// Also time the release proof beside this many extra processes, started by the bench
    /// (one in 50 QEMU-like: 64 threads, 200 descriptors), side by side with the quiet host.
    #[arg(long, default_value_t = 0)]
    pub host_processes: usize,
    /// Also time opens of leased files under one lessee's open flood of these many threads
    /// (e.g. 400,800), quiet first, by each method of proof.
    #[arg(long, value_delimiter = ',')]
    pub flood: Vec<usize>,
    /// Only time an honest release back to warm, quiet against behind these many releases
    /// whose files a process of uid 65534 keeps open (e.g. 10,100), side by side, --reps
    /// rounds of each after a warm-up round; the other parts do not run.
    #[arg(long, value_delimiter = ',')]
    pub held: Vec<usize>,
    /// `--json`, `--json-out FILE`.
    #[command(flatten)]
    pub output: super::JsonOutput,
}

/// Runs `hugeprep bench recycle`: one report per thread count (the lease-latency part only
/// with the first), as `{"runs": [...]}` in JSON.
pub fn run(args: BenchRecycleArgs) -> anyhow::Result<()> {
    let threads = if args.threads.is_empty() {
        (1..=hugeprep::sys::affinity::allowed_cpus().len()).collect()
    } else {
        args.threads.clone()
    };
    // Borrowed pool pages and timings must not be disturbed by tests or other benchmarks.
    let lock = hugeprep::hugetlb::lock::HugepageLock::acquire()?;
    let resolution = super::clearing_in_use::decide_in_use(&lock)?;
    let in_use = hugeprep_bench::clear::PolicyChoice::from_resolution(&resolution);
    eprintln!(
        "method in use: {} (rule {}, {}, decided by {}): {}",
        in_use.method,
        in_use.rule,
        in_use.confidence,
        format!("{:?}", in_use.decided_by).to_lowercase(),
        in_use.reason
    );
    let mut skipped = Vec::new();
    let page_sizes = if args.page_size.is_empty() {
        // The kernel's page sizes, less those the sizes asked for do not fit (`--size 256M`
        // on a host with a 1G pool): the user asked for no run of those.
        super::sizes_fit(
            hugeprep::hugetlb::pool::page_sizes(),
            &[("size", Some(args.size)), ("lease-size", args.lease_size)],
            &mut skipped,
        )
    } else {
        args.page_size.clone()
    };
    if !args.held.is_empty() {
        return run_held(&args, &page_sizes, &threads, resolution.plan);
    }
    let mut runs = Vec::with_capacity(threads.len() * page_sizes.len());
    for &page_size in &page_sizes {
        for (i, &threads) in threads.iter().enumerate() {
            let cfg = RecycleBenchConfig {
                size: args.size,
                page_size,
                threads,
                reps: args.reps,
                leases: if i == 0 { args.leases } else { 0 },
                lease_size: args
                    .lease_size
                    .unwrap_or_else(|| (64 << 20).max(page_size.bytes())),
                plan: resolution.plan,
                methods: hugeprep::clear::available_methods(),
                state_dir: args.state_dir.clone(),
                hog: args.hog,
                churn: args.churn,
                churn_size: args.churn_size,
                client_nice: args.client_nice,
                host_processes: if i == 0 { args.host_processes } else { 0 },
                flood: if i == 0 {
                    args.flood.clone()
                } else {
                    Vec::new()
                },
            };
            match recycle::run(&cfg, &|line| eprintln!("{line}")) {
                Ok(run) => runs.push(run),
                // The kernel cannot supply this page size (1G pages, fragmented memory):
                // the other page sizes' results still stand.
                Err(e @ recycle::RecycleBenchError::KernelPool(_)) if page_sizes.len() > 1 => {
                    eprintln!("skipped {page_size} pages: {e}");
                    skipped.push(format!("{page_size} pages: {e}"));
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    args.output.emit(
        &serde_json::json!({ "in_use": in_use, "runs": runs, "skipped": skipped }),
        || {
            let head = format!(
                "method in use: {} (rule {}, {}, decided by {})\n  why: {}\n\n",
                in_use.method,
                in_use.rule,
                in_use.confidence,
                format!("{:?}", in_use.decided_by).to_lowercase(),
                in_use.reason
            );
            head + &runs.iter().map(|r| r.table() + "\n").collect::<String>()
                + &skipped
                    .iter()
                    .map(|s| format!("skipped {s}\n"))
                    .collect::<String>()
        },
    )
}

/// `--held`: the honest release quiet and behind held releases, per page size, at the first
/// thread count; `{"held": [{"page_size", "runs": [...]}]}` in JSON.
fn run_held(
    args: &BenchRecycleArgs,
    page_sizes: &[PageSize],
    threads: &[usize],
    plan: hugeprep::clear::ClearPlan,
) -> anyhow::Result<()> {
    use hugeprep_bench::held::{self, HeldTiming};
    let mut out = Vec::new();
    for &page_size in page_sizes {
        let cfg = RecycleBenchConfig {
            size: page_size.bytes(),
            page_size,
            threads: threads.first().copied().unwrap_or(1),
            reps: args.reps,
            leases: 0,
            lease_size: args
                .lease_size
                .unwrap_or_else(|| (64 << 20).max(page_size.bytes())),
            plan,
            methods: Vec::new(),
            state_dir: args.state_dir.clone(),
            hog: false,
            churn: false,
            churn_size: None,
            client_nice: None,
            host_processes: 0,
            flood: Vec::new(),
        };
        match held::run(&cfg, &args.held, &|line| eprintln!("{line}")) {
            Ok(runs) => out.push((page_size, runs)),
            Err(e @ recycle::RecycleBenchError::KernelPool(_)) if page_sizes.len() > 1 => {
                eprintln!("skipped {page_size} pages: {e}");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let json: Vec<serde_json::Value> = out
        .iter()
        .map(|(ps, runs)| serde_json::json!({ "page_size": ps, "goal_ratio": held::HELD_GOAL, "runs": runs }))
        .collect();
    args.output.emit(&serde_json::json!({ "held": json }), || {
        out.iter()
            .map(|(ps, runs)| {
                format!("{ps} pages\n")
                    + &HeldTiming::table_head()
                    + &runs.iter().map(HeldTiming::table_row).collect::<String>()
            })
            .collect::<String>()
    })
}
