//! Command-line interface: one file per subcommand, each with its clap `Args` and `run`.
//! This is the only place (with `main.rs`) that uses `anyhow`.

use clap::{Parser, Subcommand};

mod lease;
mod release;
mod serve;
mod status;

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
    /// Show leases and the pool.
    Status(status::StatusArgs),
    /// Show the warm pool.
    Pool(status::PoolArgs),
    /// Benchmarks: clearing methods, preallocation, recycling.
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// `hugeprep bench ...`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {}

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
        Command::Pool(a) => status::run_pool(a),
        Command::Bench(b) => match b {},
    }
}
