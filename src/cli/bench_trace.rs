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
    /// Instead of a real-time replay: compare pool policies (none, the best static target,
    /// the adaptive target) on a generated trace of this many days, after a learning week,
    /// replayed in simulated time (see docs/pool.md, "Sizing the pool itself").
    #[arg(long)]
    pub days: Option<u32>,
    /// With `--days`: the trace's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// With `--days`: the warm-start goal, percent.
    #[arg(long, default_value_t = 99.0)]
    pub goal: f64,
    /// With `--days`: the pool's refill rate, bytes per second.
    #[arg(long, default_value = "4G", value_parser = parse_bytes)]
    pub refill_rate: u64,
    /// With `--days`: add a burst no history shows (12 VMs of 16 GiB on 1G pages, on the
    /// last week's Wednesday at 04:00).
    #[arg(long)]
    pub unseen_burst: bool,
    /// With `--days`: the median seconds from a VM's Placement allocation to its lease (0:
    /// no Placement, nothing seen coming; a cloud's compute service takes seconds to tens
    /// of seconds to bind ports and fetch images in between).
    #[arg(long, default_value_t = 0.0)]
    pub placement_lead: f64,
    /// With `--days`: weeks before the measured days in which the adaptive target learns.
    #[arg(long, default_value_t = 3)]
    pub learning_weeks: u32,
    /// Instead of a real-time replay: compare the pool policies (as `--days` does) on an
    /// operator's own VM trace, a CSV file of starts and stops (docs/pool.md, "An operator's
    /// trace"; `hugeprep bench trace-csv` makes one from libvirt's events).
    #[arg(long, value_name = "FILE", conflicts_with = "days")]
    pub csv: Option<std::path::PathBuf>,
    /// With `--csv`: days at the start of the trace in which the adaptive target learns,
    /// not counted.
    #[arg(long, default_value_t = 0.0)]
    pub learn_days: f64,
    /// With `--days` or `--csv`: replay with the fluid model of warm bytes instead of the real
    /// pool driver on the simulated host (milliseconds; no file sizes or shapes).
    #[arg(long)]
    pub model: bool,
    /// With `--days`: write the plot of warm, leased and target bytes here (SVG).
    #[arg(long)]
    pub svg_out: Option<std::path::PathBuf>,
    /// Instead: replay this many hours of the generated trace (seed `--seed`, its 2M VMs,
    /// from Tuesday 13:00) in real time against the running daemon at `--socket`, which must
    /// keep `--warm` warm on 2M pages with the demand shape, and beside it in simulated time
    /// through the driver; takes `hours / speed` hours (docs/pool.md, "Replay").
    #[arg(long, value_name = "HOURS", conflicts_with_all = ["days", "csv"])]
    pub real_hours: Option<f64>,
    /// With `--real-hours`: the daemon's socket.
    #[arg(
        long,
        env = "HUGEPREP_SOCKET",
        default_value = "/run/hugeprep/hugeprep.sock"
    )]
    pub socket: std::path::PathBuf,
    /// With `--real-hours`: how many times faster than the trace to run.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// With `--real-hours`: divide each VM's memory by this (a small host).
    #[arg(long, default_value_t = 64)]
    pub shrink: u64,
    /// `--json`, `--json-out FILE`.
    #[command(flatten)]
    pub output: super::JsonOutput,
}

/// `--days`: the policies side by side on a generated trace in simulated time.
fn run_week(args: &BenchTraceArgs, days: u32) -> anyhow::Result<()> {
    use trace::week::{generate::TraceShape, WeekConfig};
    if !(50.0..=100.0).contains(&args.goal) {
        anyhow::bail!("--goal: {} is not a percentage from 50 to 100", args.goal);
    }
    if args.learning_weeks > 4 {
        anyhow::bail!(
            "--learning-weeks: {} is more than the 4 weeks the forecast keeps",
            args.learning_weeks
        );
    }
    if !(0.0..=600.0).contains(&args.placement_lead) {
        anyhow::bail!(
            "--placement-lead: {} s is not from 0 to 600",
            args.placement_lead
        );
    }
    if !(1..=366).contains(&days) {
        anyhow::bail!("--days: {days} is not from 1 to 366");
    }
    let config = WeekConfig {
        shape: TraceShape {
            seed: args.seed,
            days,
            unseen_burst: args.unseen_burst,
            placement_lead_s: args.placement_lead,
            ..TraceShape::default()
        },
        goal_rate: args.goal / 100.0,
        refill_rate: args.refill_rate as f64,
        learning_weeks: args.learning_weeks,
        engine: if args.model {
            trace::week::Engine::Model
        } else {
            trace::week::Engine::Driver
        },
    };
    let report = trace::week::run(&config)?;
    if let Some(path) = &args.svg_out {
        std::fs::write(path, report.svg())
            .map_err(|e| anyhow::anyhow!("--svg-out {}: {e}", path.display()))?;
    }
    args.output.emit(&report, || report.table())
}

/// `--csv`: the policies side by side on an operator's trace in simulated time.
fn run_csv(args: &BenchTraceArgs, path: &std::path::Path) -> anyhow::Result<()> {
    use trace::operator;
    use trace::week::{generate::TraceShape, WeekConfig};
    if !(50.0..=100.0).contains(&args.goal) {
        anyhow::bail!("--goal: {} is not a percentage from 50 to 100", args.goal);
    }
    if !(0.0..=28.0).contains(&args.learn_days) {
        anyhow::bail!("--learn-days: {} is not from 0 to 28", args.learn_days);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--csv {}: {e}", path.display()))?;
    let events = operator::parse(path, &text)?;
    let (lives, orphans) = operator::lives(&events);
    if lives.is_empty() {
        anyhow::bail!("--csv {}: no VM starts", path.display());
    }
    if orphans > 0 {
        eprintln!("{orphans} stops without a start (VMs running before the trace) skipped");
    }
    let measure_from = lives[0].at_s + args.learn_days * 86_400.0;
    let config = WeekConfig {
        shape: TraceShape::default(),
        goal_rate: args.goal / 100.0,
        refill_rate: args.refill_rate as f64,
        learning_weeks: 0,
        engine: if args.model {
            trace::week::Engine::Model
        } else {
            trace::week::Engine::Driver
        },
    };
    let report = trace::week::compare(&config, &path.display().to_string(), &lives, measure_from)?;
    if let Some(out) = &args.svg_out {
        std::fs::write(out, report.svg())
            .map_err(|e| anyhow::anyhow!("--svg-out {}: {e}", out.display()))?;
    }
    args.output.emit(&report, || report.table())
}

/// `--real-hours`: real time against the daemon beside simulated time.
fn run_real(args: &BenchTraceArgs, hours: f64) -> anyhow::Result<()> {
    use trace::week::generate::{generate, TraceShape, MONDAY};
    use trace::week::{driven, realtime, replay::Policy};
    if !(hours > 0.0 && hours <= 24.0) {
        anyhow::bail!("--real-hours: {hours} is not from above 0 to 24");
    }
    if !(1.0..=3600.0).contains(&args.speed) {
        anyhow::bail!("--speed: {} is not from 1 to 3600", args.speed);
    }
    if !(1..=1024).contains(&args.shrink) {
        anyhow::bail!("--shrink: {} is not from 1 to 1024", args.shrink);
    }
    let ps = PageSize::Size2M;
    let trace = generate(&TraceShape {
        seed: args.seed,
        days: 7,
        ..TraceShape::default()
    });
    let from_s = MONDAY + 86_400.0 + 13.0 * 3600.0;
    let slice = realtime::slice(&trace, ps, from_s, hours, args.speed, args.shrink);
    let client = hugeprep::client::Client::new(&args.socket)
        .with_timeout(std::time::Duration::from_secs(60));
    let policy = Policy::Demand { bytes: args.warm };
    eprintln!(
        "replaying {} starts over {:.2} h against {}",
        slice.len(),
        hours / args.speed,
        args.socket.display()
    );
    let prefix = format!("bench-trace-{}-", std::process::id());
    let real = realtime::replay(
        &client,
        &slice,
        ps,
        policy,
        &prefix,
        std::time::Duration::from_millis(100),
    )?;
    let rate = if real.refill_rate > 0.0 {
        real.refill_rate
    } else {
        args.refill_rate as f64
    };
    // Counted from the first start, as in real time (the simulated pool fills for an hour
    // before it, as the daemon had before the replay).
    let first = slice.first().map_or(0.0, |v| v.at_s);
    let simulated = driven::replay(&slice, ps, policy, rate, first, false)?;
    let report = realtime::Agreement {
        starts: slice.len(),
        from_s,
        hours,
        speed: args.speed,
        shrink: args.shrink,
        real,
        simulated,
    };
    args.output.emit(&report, || report.table())
}

/// Runs `hugeprep bench trace`.
pub fn run(args: BenchTraceArgs) -> anyhow::Result<()> {
    if let Some(hours) = args.real_hours {
        return run_real(&args, hours);
    }
    if let Some(days) = args.days {
        return run_week(&args, days);
    }
    if let Some(path) = args.csv.clone() {
        return run_csv(&args, &path);
    }
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
