//! Command-line interface: one file per subcommand, each with its clap `Args` and `run`.
//! This is the only place (with `main.rs`) that uses `anyhow`.

mod bench_clear;
mod bench_pin;
mod bench_prefault;
mod bench_recycle;
mod ch_args;
mod cpu;
mod lease;
mod mount;
mod pool;
mod prepare;
mod release;
mod serve;
mod status;

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
    Serve(serve::ServeArgs),
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
    /// cloud-hypervisor memory arguments (or vm.create JSON) for leases.
    ChArgs(ch_args::ChArgsArgs),
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
    /// Long-term pin (VFIO's path) of never-faulted memory vs of a lease.
    Pin(bench_pin::BenchPinArgs),
}

/// Sets up `tracing` to stderr; `RUST_LOG` wins over `-v`.
pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Lease(a) => lease::run(a),
        Command::Release(a) => release::run(a),
        Command::Status(a) => status::run(a),
        Command::Bench(b) => match b {
            BenchCommand::Clear(args) => bench_clear::run(args),
            BenchCommand::Prefault(args) => bench_prefault::run(args),
            BenchCommand::Recycle(args) => bench_recycle::run(args),
            BenchCommand::Pin(args) => bench_pin::run(args),
        },
        Command::Pool(args) => pool::run(args),
        Command::Prepare(args) => prepare::run(args),
        Command::Mount(args) => mount::run(args),
        Command::ChArgs(args) => ch_args::run(args),
        Command::Cpu(args) => cpu::run(args),
    }
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
