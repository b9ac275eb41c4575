//! `hugeprep pool`: the hugepage pools of this machine, read from sysfs, and, when the daemon
//! runs, its warm pool (warm, leased, dirty and scrubbing bytes per node and page size);
//! `--set` resizes a kernel pool.

use std::path::PathBuf;

use anyhow::Context;
use hugeprep::client::{Client, ClientError};
use hugeprep::hugetlb::pool::{self, PoolCounts, Scope};
use hugeprep::pool::PoolStatus;
use hugeprep::units::format_bytes;
use hugeprep::PageSize;

/// Show (or set) the hugepage pools per NUMA node and page size.
#[derive(Debug, clap::Args)]
pub struct PoolArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Set the pool to this many pages (never below what is in use), then print the pools.
    #[arg(long, value_name = "PAGES")]
    pub set: Option<u64>,
    /// Page size of the pool to set.
    #[arg(long, default_value = "2M", requires = "set")]
    pub page_size: PageSize,
    /// Node whose pool to set (default: the machine-wide pool, which the kernel spreads
    /// over nodes).
    #[arg(long, requires = "set")]
    pub node: Option<u32>,
    /// Only the kernel's pools: do not ask the daemon.
    #[arg(long)]
    pub local: bool,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// Runs `hugeprep pool`.
pub fn run(args: PoolArgs) -> anyhow::Result<()> {
    if let Some(pages) = args.set {
        let scope = Scope::from_node(args.node);
        let resize = pool::set_pages(scope, args.page_size, pages)
            .with_context(|| format!("--set {pages} --page-size {}", args.page_size))?;
        if resize.requested < resize.floor {
            eprintln!(
                "{scope} {}: {} pages are in use or reserved; kept {}",
                args.page_size, resize.floor, resize.after
            );
        }
        if !resize.complete() {
            eprintln!(
                "{scope} {}: asked for {} pages, the kernel gave {} (short by {})",
                args.page_size,
                resize.target(),
                resize.after,
                resize.shortfall()
            );
        }
    }
    let daemon = if args.local {
        None
    } else {
        daemon_pool(&args.socket)?
    };
    let kernel = pool::read_all().context("reading hugepage pools")?;
    if args.json {
        let all = serde_json::json!({ "daemon": daemon, "kernel": kernel });
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    if let Some(daemon) = &daemon {
        print!("{}", render_daemon_table(daemon));
        println!();
    }
    print!("{}", render_table(&kernel));
    Ok(())
}

/// The daemon's pool, or `None` when no daemon listens on `socket` (then only the kernel's
/// pools are shown). Any other failure is an error: a daemon that answers badly is news.
fn daemon_pool(socket: &std::path::Path) -> anyhow::Result<Option<PoolStatus>> {
    let client = Client::new(socket);
    match client.blocking(client.pool()) {
        Ok(status) => Ok(Some(status)),
        Err(ClientError::Connect { .. }) => Ok(None),
        Err(e) => Err(e).context("asking the daemon for its pool"),
    }
}

/// The daemon's warm pool, one line per node and page size.
pub fn render_daemon_table(pool: &PoolStatus) -> String {
    let mut out = format!(
        "{:>4} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}  mount\n",
        "node", "page", "target", "warm", "leased", "dirty", "scrubbing", "filling", "kernel free"
    );
    for k in &pool.kinds {
        out.push_str(&format!(
            "{:>4} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}  {}\n",
            k.node,
            k.page_size,
            format_bytes(k.target_bytes),
            format_bytes(k.warm_bytes),
            format_bytes(k.leased_bytes),
            format_bytes(k.dirty_bytes),
            format_bytes(k.scrubbing_bytes),
            format_bytes(k.filling_bytes),
            format_bytes(k.kernel_free_pages * k.page_size.bytes()),
            k.mount.display()
        ));
    }
    for k in &pool.kinds {
        let kind = format!("node {} {}", k.node, k.page_size);
        if k.drained {
            out.push_str(&format!("{kind}: drained (hugeprep resume refills it)\n"));
        }
        if let Some(reason) = &k.reason {
            out.push_str(&format!("{kind}: target not met: {reason}\n"));
        }
        if k.reserved_pages > 0 {
            out.push_str(&format!(
                "{kind}: the daemon added {} pages to the kernel's pool \
                 (hugeprep drain --release-pools gives them back)\n",
                k.reserved_pages
            ));
        }
    }
    out
}

/// A table of pools, one line per scope and page size.
pub fn render_table(pools: &[PoolCounts]) -> String {
    let mut out = format!(
        "{:<8} {:>4} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10}\n",
        "scope", "size", "total", "free", "surplus", "reserved", "in use", "bytes"
    );
    for p in pools {
        let reserved = p.reserved.map_or("-".to_string(), |r| r.to_string());
        out.push_str(&format!(
            "{:<8} {:>4} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10}\n",
            p.scope.to_string(),
            p.page_size.name(),
            p.total,
            p.free,
            p.surplus,
            reserved,
            p.in_use(),
            format_bytes(p.total_bytes())
        ));
    }
    out.push_str("(reserved pages are counted by the kernel only machine-wide)\n");
    out
}
