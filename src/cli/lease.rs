//! `hugeprep lease`: take a lease from the daemon.

use std::path::PathBuf;

use hugeprep::client::Client;
use hugeprep::policy::pool::Recycle;
use hugeprep::pool::{LeaseInfo, LeaseRequest};
use hugeprep::units::{format_bytes, parse_bytes};
use hugeprep::PageSize;

/// Take a lease of pre-zeroed memory from the daemon; prints its path.
#[derive(Debug, clap::Args)]
pub struct LeaseArgs {
    /// Lease name (becomes the file name).
    pub name: String,
    /// Size (e.g. 4G), a whole number of pages.
    #[arg(value_parser = parse_bytes)]
    pub size: u64,
    /// Page size.
    #[arg(long)]
    pub page_size: Option<PageSize>,
    /// NUMA node.
    #[arg(long)]
    pub node: Option<u32>,
    /// User to hand the file to.
    #[arg(long)]
    pub owner: Option<String>,
    /// Release automatically when this process exits.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Long-term pin every page (as VFIO does) before the lease is returned, until release.
    #[arg(long)]
    pub pin: bool,
    /// How the memory comes back when released: `proven` (scrubbed in place once the daemon
    /// proves nobody else can reach it) or `kernel` (always truncated and faulted anew).
    #[arg(long, value_enum)]
    pub recycle: Option<Recycle>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// Prints leases as a table.
pub fn print_leases(leases: &[LeaseInfo]) {
    println!(
        "{:>18}  {:<20} {:>10} {:>4} {:>4} {:<12} {:>9}  path",
        "id", "name", "size", "node", "page", "source", "ready_ms"
    );
    for l in leases {
        println!(
            "{:>18}  {:<20} {:>10} {:>4} {:>4} {:<12} {:>9.2}  {}",
            l.id,
            l.name,
            format_bytes(l.size),
            l.node,
            l.page_size,
            l.source.name(),
            l.ready_ms,
            l.path.display()
        );
    }
}

/// Runs `hugeprep lease`.
pub fn run(args: LeaseArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.socket);
    let req = LeaseRequest {
        name: args.name,
        size: args.size,
        page_size: args.page_size,
        node: args.node,
        owner: args.owner,
        pid: args.pid,
        pin: args.pin,
        recycle: args.recycle,
    };
    let lease = client.blocking(client.lease(&req))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&lease)?);
    } else {
        print_leases(std::slice::from_ref(&lease));
    }
    Ok(())
}
