//! `hugeprep pool`: the hugepage pools of this machine, read from sysfs (no daemon needed),
//! and `--set` to resize one.

use anyhow::Context;
use hugeprep::hugetlb::pool::{self, PoolCounts, Scope};
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
    print!("{}", render_local(args.json)?);
    Ok(())
}

/// The pools of this machine as a table or JSON, read from sysfs (a daemon-backed
/// `hugeprep pool` can call this for the local view).
pub fn render_local(json: bool) -> anyhow::Result<String> {
    let pools = pool::read_all().context("reading hugepage pools")?;
    if json {
        Ok(serde_json::to_string_pretty(&pools)? + "\n")
    } else {
        Ok(render_table(&pools))
    }
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
