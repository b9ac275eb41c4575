//! `hugeprep prepare`: create one hugetlbfs file and fill it in parallel, no daemon.

use std::path::PathBuf;

use anyhow::anyhow;
use hugeprep::cpu::CpuInfo;
use hugeprep::policy::{ClearingPolicy, Threads};
use hugeprep::prefault::{self, PrefaultOptions, PrepareError, PrepareSpec, Target};
use hugeprep::topology::Topology;
use hugeprep::units::{format_bytes, parse_bytes};
use hugeprep::PageSize;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Create a hugetlbfs file of SIZE and fault every page in, in parallel on the node's CPUs.
#[derive(Debug, clap::Args)]
pub struct PrepareArgs {
    /// Size of the file (e.g. 8G): a multiple of the page size.
    #[arg(long, value_parser = parse_bytes)]
    pub size: u64,
    /// Page size: 2M or 1G.
    #[arg(long, default_value = "2M")]
    pub page_size: PageSize,
    /// NUMA node to take the pages from and run on.
    #[arg(long)]
    pub node: Option<u32>,
    /// The file to create (on hugetlbfs of the page size; must not exist).
    #[arg(long, conflicts_with = "mount")]
    pub path: Option<PathBuf>,
    /// A hugetlbfs mount to create a file with a generated name in.
    #[arg(long)]
    pub mount: Option<PathBuf>,
    /// User (name or uid) to own the file, e.g. libvirt-qemu.
    #[arg(long)]
    pub owner: Option<String>,
    /// Worker threads (default: one per CPU of the node, one per 256 MiB at most).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `hugeprep prepare`.
pub fn run(args: PrepareArgs) -> anyhow::Result<()> {
    let cancel = hugeprep::sys::signals::cancel_on_signals()?;
    let target = match (&args.path, &args.mount) {
        (Some(p), _) => Target::Path(p.clone()),
        (None, Some(m)) => Target::Mount(m.clone()),
        (None, None) => Target::Auto,
    };
    let spec = PrepareSpec {
        size: args.size,
        page_size: args.page_size,
        target,
        owner: args.owner.clone(),
        prefault: PrefaultOptions {
            threads: args.threads,
            policy_threads: policy_threads(),
            node: args.node,
            cancel: Some(cancel),
            ..PrefaultOptions::default()
        },
    };
    let bar = ProgressBar::with_draw_target(Some(args.size), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({binary_bytes_per_sec})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let result = prefault::prepare(&spec, Some(&|done| bar.set_position(done)));
    bar.finish_and_clear();
    let prepared = result.map_err(|e| match e {
        PrepareError::Invalid { field, reason } => anyhow!("--{field}: {reason}"),
        other => anyhow!(other),
    })?;
    let r = &prepared.report;
    let path = prepared.file.path().display().to_string();
    if args.json {
        let json = serde_json::json!({
            "path": path,
            "size": r.bytes,
            "page_size": r.page_size,
            "node": r.node,
            "threads": r.threads,
            "cpus": r.cpus,
            "affinity": r.affinity,
            "seconds": r.seconds,
            "gbps": r.gbps,
            "method": r.method,
            "owner": args.owner,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        let node = r.node.map_or("any".to_string(), |n| n.to_string());
        println!("path     {path}");
        println!("size     {} ({} bytes)", format_bytes(r.bytes), r.bytes);
        println!(
            "pages    {} of {}",
            r.bytes / r.page_size.bytes(),
            r.page_size
        );
        println!("node     {node}");
        println!(
            "threads  {} (cpus {:?}){}",
            r.threads,
            r.cpus,
            cpuless_note(r.node)
        );
        println!("seconds  {:.3}", r.seconds);
        println!("GB/s     {:.1}", r.gbps);
    }
    Ok(())
}

/// For a node without CPUs (CXL, HBM): which CPUs ran its workers instead.
fn cpuless_note(node: Option<u32>) -> String {
    let cpuless = node.and_then(|n| {
        let topology = Topology::detect().ok()?;
        Some(topology.node(n).ok()?.cpus.is_empty())
    });
    match (node, cpuless) {
        (Some(n), Some(true)) => {
            format!("; node {n} has no CPUs: ran on the CPUs this process may use")
        }
        _ => String::new(),
    }
}

/// The clearing policy's per-node thread count for this CPU; `None` for "all" (one worker per
/// CPU of the node).
fn policy_threads() -> Option<usize> {
    let resolution = ClearingPolicy::embedded().resolve(CpuInfo::host());
    match resolution.threads {
        Threads::All => None,
        Threads::Count(n) => Some(n.get()),
    }
}
