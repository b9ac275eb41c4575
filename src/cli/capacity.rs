//! `hugeprep capacity`: what the daemon can lease now, per node and page size
//! (`GET /v1/capacity`).

use std::path::PathBuf;

use hugeprep::client::Client;
use hugeprep::units::format_bytes;

/// Show what can be leased now: warm (no faulting) and in total.
#[derive(Debug, clap::Args)]
pub struct CapacityArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// Runs `hugeprep capacity`.
pub fn run(args: CapacityArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.socket);
    let cap = client.blocking(client.capacity())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cap)?);
        return Ok(());
    }
    println!(
        "{:>4} {:>4} {:>10} {:>6} {:>14} {:>14} {:>10} {:>10}",
        "node", "page", "warm", "files", "largest warm", "kernel avail", "pending", "total"
    );
    for k in &cap.kinds {
        println!(
            "{:>4} {:>4} {:>10} {:>6} {:>14} {:>14} {:>10} {:>10}{}",
            k.node,
            k.page_size,
            format_bytes(k.warm_bytes),
            k.warm_files,
            format_bytes(k.largest_warm_bytes),
            format_bytes(k.kernel_available_bytes),
            format_bytes(k.pending_bytes),
            format_bytes(k.total_bytes),
            if k.drained { "  (drained)" } else { "" }
        );
    }
    Ok(())
}
