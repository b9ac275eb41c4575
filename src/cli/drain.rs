//! `hugeprep drain`: ask the daemon to delete its warm files and give their pages back to the
//! kernel; `--release-pools` also lowers `nr_hugepages` by exactly what the daemon raised.

use std::path::PathBuf;

use hugeprep::client::Client;
use hugeprep::pool::{DrainReport, DrainRequest};
use hugeprep::units::format_bytes;
use hugeprep::PageSize;

/// Delete the daemon's warm files (held empty until `hugeprep resume`) and give memory back.
#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// Only this NUMA node (default: every node).
    #[arg(long)]
    pub node: Option<u32>,
    /// Only this page size (default: every page size the daemon serves).
    #[arg(long)]
    pub page_size: Option<PageSize>,
    /// Also lower the kernel's pools (`nr_hugepages`) by the pages the daemon added.
    #[arg(long)]
    pub release_pools: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// Runs `hugeprep drain`.
pub fn run(args: DrainArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.socket).with_timeout(std::time::Duration::from_secs(120));
    let req = DrainRequest {
        node: args.node,
        page_size: args.page_size,
        release_pools: args.release_pools,
    };
    let report = client.blocking(client.drain(&req))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

fn render(report: &DrainReport) -> String {
    let mut out = String::new();
    for k in &report.kinds {
        out.push_str(&format!(
            "node {} {}: deleted {} of warm files; {} still leased\n",
            k.node,
            k.page_size,
            format_bytes(k.deleted_bytes),
            format_bytes(k.leased_bytes)
        ));
    }
    for r in &report.released {
        out.push_str(&format!(
            "node {} {}: gave {} pages back to the kernel (nr_hugepages lowered by {})",
            r.node, r.page_size, r.released, r.released
        ));
        if r.kept > 0 {
            out.push_str(&format!(
                "; {} pages the daemon added are still leased and stay",
                r.kept
            ));
        }
        out.push('\n');
    }
    if report.incomplete {
        out.push_str("some files were still busy: they are deleted as soon as they settle\n");
    }
    out.push_str("drained kinds stay empty until `hugeprep resume` (or a daemon restart)\n");
    out
}
