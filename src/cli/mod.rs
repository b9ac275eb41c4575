//! Command-line interface: one file per subcommand, each with its clap `Args` and `run`.
//! This is the only place (with `main.rs`) that uses `anyhow`.

mod bench_clear;
mod bench_pin;
mod bench_prefault;
mod bench_recycle;
mod bench_trace;
mod bench_trace_csv;
mod bench_vm_start;
mod capacity;
mod ch_args;
mod clearing_in_use;
mod completions;
mod cpu;
mod doctor;
mod drain;
mod hotplug_args;
mod lease;
mod libvirt_adopt;
mod libvirt_attach;
mod libvirt_hook;
mod manpage;
mod mount;
mod pool;
mod prepare;
mod progress;
mod qemu_args;
mod release;
mod removal_check;
mod reserve;
mod resume;
mod serve;
mod status;
mod targets;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// hugeprep: pre-zeroed, pre-faulted hugepage memory for virtual machines.
#[derive(Debug, Parser)]
#[command(version, about, propagate_version = true)]
pub struct Cli {
    /// Log more (-v: debug, -vv: trace). `RUST_LOG` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: warm pools and leases over a unix socket.
    Serve(Box<serve::ServeArgs>),
    /// Take a lease from the daemon.
    Lease(lease::LeaseArgs),
    /// Release a lease.
    Release(release::ReleaseArgs),
    /// Show the daemon's leases and warm pool.
    Status(status::StatusArgs),
    /// Benchmarks: clearing methods, preallocation, recycling.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Show the CPU and the clearing method the policy chooses for it.
    Cpu(cpu::CpuArgs),
    /// Show or set the hugepage pools per NUMA node and page size (local sysfs).
    Pool(pool::PoolArgs),
    /// Create a hugetlbfs file and fault every page in, in parallel (no daemon).
    Prepare(prepare::PrepareArgs),
    /// Mount hugetlbfs of a page size, list the mounts, or unmount one.
    Mount(mount::MountArgs),
    /// Print the QEMU arguments that map one lease (or one per guest NUMA node) as RAM.
    QemuArgs(qemu_args::QemuArgsArgs),
    /// libvirt's QEMU hook: gives file-backed domains their memory from the pool.
    LibvirtHook(libvirt_hook::LibvirtHookArgs),
    /// Lease a DIMM for `virsh attach-device` into a running domain the hook serves.
    LibvirtAttach(libvirt_attach::LibvirtAttachArgs),
    /// Rewrite `<hugepages>` domains into file-backed shared memory the hook serves.
    LibvirtAdopt(libvirt_adopt::LibvirtAdoptArgs),
    /// Ask the daemon to delete its warm files and give memory back to the kernel.
    Drain(drain::DrainArgs),
    /// Let pools emptied by `drain` refill to their targets.
    Resume(resume::ResumeArgs),
    /// Check this host for hugeprep: pools, mounts, kernel features, limits, CPU, daemon, VMMs.
    Doctor(doctor::DoctorArgs),
    /// cloud-hypervisor memory arguments (or vm.create JSON) for leases.
    ChArgs(ch_args::ChArgsArgs),
    /// Lease memory for a running QEMU and print the QMP commands that hot-plug it.
    HotplugArgs(hotplug_args::HotplugArgsArgs),
    /// Raise the per-node hugepage pools to the configured warm targets (boot-time service).
    Reserve(reserve::ReserveArgs),
    /// Show, set or clear the daemon's warm targets (persisted; they win over the config file).
    Targets(targets::TargetsArgs),
    /// Show what the daemon can lease now per node and page size: warm and in total.
    Capacity(capacity::CapacityArgs),
    /// Check what removing the package would break or lose (the package's prerm runs it).
    RemovalCheck(removal_check::RemovalCheckArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::CompletionsArgs),
    /// Write the man pages, one per command, into a directory (used by the package build).
    Manpages(completions::ManpagesArgs),
}

/// `hugeprep bench ...`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Clearing methods x chunk sizes x threads against the kernel's hugepage fault-in.
    Clear(bench_clear::BenchClearArgs),
    /// Cold preparation: hugeprep vs QEMU prealloc-threads vs one thread.
    Prefault(bench_prefault::BenchPrefaultArgs),
    /// Recycling: scrub-and-return vs delete-and-refault, and warm lease latency.
    Recycle(bench_recycle::BenchRecycleArgs),
    /// VM start: VMM preallocation vs no preallocation vs a hugeprep warm lease.
    VmStart(bench_vm_start::BenchVmStartArgs),
    /// Lease trace replay: the fixed and the demand-shaped pool side by side.
    Trace(bench_trace::BenchTraceArgs),
    /// An operator's VM trace (CSV) from `virsh event --all --loop --timestamp` or the
    /// daemon's log of the libvirt hook's leases, for `bench trace --csv`.
    TraceCsv(bench_trace_csv::BenchTraceCsvArgs),
    /// Long-term pin (VFIO's path) of never-faulted memory vs of a lease.
    Pin(bench_pin::BenchPinArgs),
    /// A QEMU-like process of `bench recycle --host-processes`: threads and descriptors,
    /// idle until its standard input ends.
    #[command(hide = true)]
    BusyProcess(BusyProcessArgs),
}

/// `hugeprep bench busy-process`.
#[derive(Debug, clap::Args)]
pub struct BusyProcessArgs {
    /// Threads, the main one included.
    #[arg(long, default_value_t = 64)]
    pub threads: usize,
    /// Descriptors.
    #[arg(long, default_value_t = 200)]
    pub fds: usize,
    /// Instead: open and close this file in a loop from every thread (an open flood).
    #[arg(long)]
    pub open: Option<std::path::PathBuf>,
    /// Instead: open this file `--count` times and print each open's microseconds.
    #[arg(long)]
    pub time_opens: Option<std::path::PathBuf>,
    /// Opens timed by `--time-opens`.
    #[arg(long, default_value_t = 100)]
    pub count: usize,
}

/// Sets up `tracing` to stderr; `RUST_LOG` wins over `-v`. When stderr is the journal, to
/// the journal in its native protocol, with priorities and fields (`hugeprep::journald`).
pub fn init_tracing(verbose: u8) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    if hugeprep::journald::stderr_is_journal() {
        if let Ok(layer) = hugeprep::journald::JournaldLayer::new() {
            // Fails only when a subscriber is set already (a test harness): that one logs.
            let _ = tracing_subscriber::registry()
                .with(filter)
                .with(layer)
                .try_init();
            return;
        }
    }
    // Under systemd without the native socket (stderr is the journal's stream): plain
    // key=value text, no colour codes, no second timestamp (journald stamps every line).
    use std::io::IsTerminal;
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(progress::StderrAroundProgress);
    // Fails only when a subscriber is set already (a test harness): that one logs.
    let _ = if journal {
        builder.without_time().try_init()
    } else {
        builder.try_init()
    };
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(a) => serve::run(*a),
        Command::Lease(a) => lease::run(a),
        Command::Release(a) => release::run(a),
        Command::Status(a) => status::run(a),
        Command::Bench(b) => match b {
            BenchCommand::Clear(args) => bench_clear::run(args),
            BenchCommand::Prefault(args) => bench_prefault::run(args),
            BenchCommand::Recycle(args) => bench_recycle::run(args),
            BenchCommand::VmStart(args) => bench_vm_start::run(args),
            BenchCommand::Trace(args) => bench_trace::run(args),
            BenchCommand::TraceCsv(args) => bench_trace_csv::run(args),
            BenchCommand::Pin(args) => bench_pin::run(args),
            BenchCommand::BusyProcess(args) => {
                use hugeprep_bench::host;
                match (&args.open, &args.time_opens) {
                    (Some(path), _) => host::flood_opens(args.threads, path)?,
                    (None, Some(path)) => host::time_opens(path, args.count)?,
                    (None, None) => host::busy_process(args.threads, args.fds)?,
                }
                Ok(())
            }
        },
        Command::Pool(args) => pool::run(args),
        Command::Prepare(args) => prepare::run(args),
        Command::Mount(args) => mount::run(args),
        Command::QemuArgs(args) => qemu_args::run(args),
        Command::ChArgs(args) => ch_args::run(args),
        Command::HotplugArgs(args) => hotplug_args::run(args),
        Command::LibvirtAttach(args) => libvirt_attach::run(args),
        Command::Cpu(args) => cpu::run(args),
        Command::LibvirtHook(args) => libvirt_hook::run(args),
        Command::LibvirtAdopt(args) => libvirt_adopt::run(args),
        Command::Drain(args) => drain::run(args),
        Command::Resume(args) => resume::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Reserve(args) => reserve::run(args),
        Command::Targets(args) => targets::run(args),
        Command::Capacity(args) => capacity::run(args),
        Command::RemovalCheck(args) => removal_check::run(args),
        Command::Completions(args) => completions::run_completions(args),
        Command::Manpages(args) => completions::run_manpages(args),
    }
}

/// The error and its causes on one line, each cause once. Many of the library's error
/// messages already name their cause (`mkdir /x: Permission denied`) so that a log line or an
/// API error body is complete on its own, and they also expose it as `source()`; printing
/// the whole chain would repeat it (`...: No such file or directory (os error 2) (is
/// `hugeprep serve` running?): No such file or directory (os error 2)`). A cause whose text
/// the message already holds adds nothing and is left out.
pub fn render_error(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The default page sizes of a benchmark, less those a size the user gave is not a whole
/// number of pages of: each left out says so on stderr and in `skipped` (the run's JSON),
/// instead of failing the run for a page size nobody asked for. `sizes` are the options'
/// names and values (`None`: not given, its default fits every page size).
pub fn sizes_fit(
    page_sizes: Vec<hugeprep::PageSize>,
    sizes: &[(&str, Option<u64>)],
    skipped: &mut Vec<String>,
) -> Vec<hugeprep::PageSize> {
    page_sizes
        .into_iter()
        .filter(|ps| {
            let misfit = sizes
                .iter()
                .find_map(|(name, size)| size.filter(|s| s % ps.bytes() != 0).map(|s| (name, s)));
            match misfit {
                None => true,
                Some((name, size)) => {
                    let why = format!(
                        "{ps} pages: --{name} {} is not a whole number of {ps} pages (pass \
                         --page-size {ps} with a size that is to measure them)",
                        hugeprep::units::format_bytes(size)
                    );
                    eprintln!("skipped {why}");
                    skipped.push(why);
                    false
                }
            }
        })
        .collect()
}

/// The `--json` and `--json-out FILE` of every benchmark: JSON next to the human table.
#[derive(Debug, clap::Args)]
pub struct JsonOutput {
    /// Print the results as JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,
}

impl JsonOutput {
    /// Writes `report` as JSON to `--json-out`, then prints it (`--json`) or `table()`.
    pub fn emit(
        &self,
        report: &impl serde::Serialize,
        table: impl FnOnce() -> String,
    ) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(report)?;
        if let Some(path) = &self.json_out {
            std::fs::write(path, format!("{json}\n"))
                .with_context(|| format!("--json-out {}", path.display()))?;
        }
        if self.json {
            println!("{json}");
        } else {
            print!("{}", table());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_printed_once() {
        let client = hugeprep::client::Client::new("/nonexistent/hugeprep-test.sock");
        let err = anyhow::Error::new(client.blocking(client.pool()).unwrap_err());
        let text = render_error(&err);
        assert_eq!(text.matches("os error 2").count(), 1, "{text}");
        assert!(text.contains("is the daemon running?"), "{text}");

        // A context above a library error that names its own cause.
        let io = std::io::Error::from_raw_os_error(libc::EACCES);
        let err = anyhow::Error::new(hugeprep::hugetlb::PoolError::Write {
            scope: hugeprep::hugetlb::Scope::Node(0),
            page_size: hugeprep::PageSize::Size2M,
            path: "/sys/x/nr_hugepages".into(),
            value: 4,
            source: io,
        })
        .context("--set 4");
        let text = render_error(&err);
        assert_eq!(text.matches("Permission denied").count(), 1, "{text}");
        assert!(text.starts_with("--set 4: node 0 2M: setting"), "{text}");

        // Causes the message does not name are kept.
        let err = anyhow::anyhow!("inner cause").context("outer");
        assert_eq!(render_error(&err), "outer: inner cause");
    }
}
