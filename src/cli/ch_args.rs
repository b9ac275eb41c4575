//! `hugeprep ch-args`: cloud-hypervisor's memory arguments (or `vm.create` JSON) for leases.

use std::path::PathBuf;

use anyhow::{bail, Context};
use hugeprep::client::Client;
use hugeprep::vmm::{cloud_hypervisor, GuestMemoryFile};

/// Print cloud-hypervisor's `--memory size=0 --memory-zone ...` for leases (one zone per
/// lease, mapped shared; no `host_numa_node`: the pages are already on their node), or with
/// `--json` the `memory` (and `numa`) members of a `vm.create` body.
#[derive(Debug, clap::Args)]
pub struct ChArgsArgs {
    /// Lease names or ids, in zone order (zone ids mem0, mem1, ...).
    #[arg(required = true)]
    pub leases: Vec<String>,
    /// Print the `memory` section (`MemoryConfig` with `zones`), and with `--numa` the `numa`
    /// list, of a `vm.create` body, as one JSON object to merge into the body.
    #[arg(long)]
    pub json: bool,
    /// One guest NUMA node per lease, in order (`--numa guest_numa_id=I,memory_zones=memI`).
    #[arg(long)]
    pub numa: bool,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// Runs `hugeprep ch-args`.
pub fn run(args: ChArgsArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.socket);
    let all = client.blocking(client.leases())?;
    let mut leases = Vec::with_capacity(args.leases.len());
    for wanted in &args.leases {
        let lease = all
            .iter()
            .find(|l| l.name == *wanted || l.id.to_string() == *wanted)
            .with_context(|| format!("no lease named or numbered {wanted:?}"))?;
        if lease.path.to_string_lossy().contains(',') {
            bail!(
                "lease {wanted:?}: path {} contains ',', which cloud-hypervisor's option parser splits on",
                lease.path.display()
            );
        }
        leases.push(lease);
    }
    let ids: Vec<String> = (0..leases.len()).map(|i| format!("mem{i}")).collect();
    let mems = GuestMemoryFile::for_leases(leases.iter().copied(), &ids);
    if args.json {
        let members = cloud_hypervisor::vm_create_memory(&mems, args.numa);
        println!("{}", serde_json::to_string_pretty(&members)?);
    } else {
        let mut line = cloud_hypervisor::memory_zones_args(&mems);
        if args.numa {
            line.extend(cloud_hypervisor::numa_args(&mems));
        }
        println!("{}", line.join(" "));
    }
    Ok(())
}
