//! `hugeprep drain`: ask the daemon to delete its warm files and give their pages back to the
//! kernel; `--release-pools` also lowers `nr_hugepages` by exactly what the daemon raised.

use std::path::PathBuf;

use std::time::Duration;

use hugeprep::client::Client;
use hugeprep::pool::{DrainReport, DrainRequest, PoolStatus};
use hugeprep::units::format_bytes;
use hugeprep::PageSize;

use super::progress::{self, Progress, Unit};

/// How often a drain watched on a terminal asks the daemon what is left to delete.
const WATCH_EVERY: Duration = Duration::from_millis(250);

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
    let report = if progress::drawn(args.json) {
        client.blocking(drain_watched(&client, &req))?
    } else {
        client.blocking(client.drain(&req))?
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

/// The drain, with the bytes the daemon still has to delete (warm, dirty and in-flight files
/// of the kinds `req` names, read from `GET /v1/pool` beside it) shown as they go. The
/// daemon's answer is the drain's; a status that cannot be read only leaves the bar still.
async fn drain_watched(
    client: &Client,
    req: &DrainRequest,
) -> hugeprep::client::Result<DrainReport> {
    let total = client.pool().await.map_or(0, |s| to_delete(&s, req));
    let bar = Progress::bar(false, Unit::Bytes, total);
    bar.set_message("of warm files deleted");
    let drain = client.drain(req);
    tokio::pin!(drain);
    let mut done = 0;
    loop {
        tokio::select! {
            report = &mut drain => return report,
            () = tokio::time::sleep(WATCH_EVERY) => {}
        }
        tokio::select! {
            report = &mut drain => return report,
            status = client.pool() => {
                if let Ok(status) = status {
                    // A fill in flight may add to what is left: the bar never goes back.
                    done = done.max(total.saturating_sub(to_delete(&status, req)));
                    bar.set_position(done);
                }
            }
        }
    }
}

/// Bytes of the files a drain of `req` deletes: every file of its kinds but the leased.
fn to_delete(status: &PoolStatus, req: &DrainRequest) -> u64 {
    status
        .kinds
        .iter()
        .filter(|k| req.node.map_or(true, |n| n == k.node))
        .filter(|k| req.page_size.map_or(true, |ps| ps == k.page_size))
        .map(|k| k.warm_bytes + k.dirty_bytes + k.scrubbing_bytes + k.filling_bytes)
        .sum()
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
