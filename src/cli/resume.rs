//! `hugeprep resume`: let kinds emptied by `hugeprep drain` refill to their targets.

use std::path::PathBuf;

use hugeprep::api::ResumeRequest;
use hugeprep::client::Client;
use hugeprep::PageSize;

/// Let drained pools refill to their warm targets again.
#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    /// Only this NUMA node (default: every node).
    #[arg(long)]
    pub node: Option<u32>,
    /// Only this page size (default: every page size).
    #[arg(long)]
    pub page_size: Option<PageSize>,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print the daemon's pool afterwards as JSON (as `hugeprep status --json`'s `pool`).
    #[arg(long)]
    pub json: bool,
}

/// Runs `hugeprep resume`.
pub fn run(args: ResumeArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.socket);
    let req = ResumeRequest {
        node: args.node,
        page_size: args.page_size,
    };
    let pool = client.blocking(client.resume(&req))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&pool)?);
    } else {
        print!("{}", super::pool::render_daemon_table(&pool));
    }
    Ok(())
}
