//! `hugeprep qemu-args`: the QEMU arguments that map a lease as a VM's RAM.

use std::path::PathBuf;

use anyhow::Context;
use hugeprep::client::Client;
use hugeprep::pool::LeaseInfo;
use hugeprep::vmm::{qemu, GuestMemoryFile};

/// Print the QEMU arguments that give a VM a lease's memory (`-m`, `-object
/// memory-backend-file,...,share=on,prealloc=off` bound to the lease's node, and `-machine
/// memory-backend=`, or `-numa node,memdev=` per lease with `--numa`).
///
/// Example: `eval "qemu-system-x86_64 -machine q35,accel=kvm $(hugeprep qemu-args vm1) ..."`.
#[derive(Debug, clap::Args)]
pub struct QemuArgsArgs {
    /// Lease names or ids; with `--numa`, one per guest NUMA node, in node order.
    #[arg(required = true, value_name = "NAME|ID")]
    pub leases: Vec<String>,
    /// One guest NUMA node per lease (`-numa node,nodeid=I,memdev=ID`) instead of
    /// `-machine memory-backend=`.
    #[arg(long)]
    pub numa: bool,
    /// Backend ids are this prefix and the lease's position (`mem0`, `mem1`, ...).
    #[arg(long, default_value = "mem")]
    pub id_prefix: String,
    /// Print a JSON array of arguments instead of a shell-quoted line.
    #[arg(long)]
    pub json: bool,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// Finds a live lease by id or, failing that, by name.
pub fn find_lease(client: &Client, lease: &str) -> anyhow::Result<LeaseInfo> {
    let leases = client.blocking(client.leases())?;
    let by_id = lease.parse::<u64>().ok();
    leases
        .into_iter()
        .find(|l| Some(l.id) == by_id || l.name == lease)
        .ok_or_else(|| anyhow::anyhow!("no lease with id or name {lease:?}"))
}

/// Runs `hugeprep qemu-args`.
pub fn run(args: QemuArgsArgs) -> anyhow::Result<()> {
    if args.leases.len() > 1 && !args.numa {
        anyhow::bail!(
            "{} leases given: a machine has one memory backend without --numa (limit 1)",
            args.leases.len()
        );
    }
    let client = Client::new(&args.socket);
    let leases = args
        .leases
        .iter()
        .map(|l| find_lease(&client, l))
        .collect::<anyhow::Result<Vec<_>>>()
        .with_context(|| format!("daemon at {}", args.socket.display()))?;
    let ids: Vec<String> = (0..leases.len())
        .map(|i| format!("{}{i}", args.id_prefix))
        .collect();
    let mems = GuestMemoryFile::for_leases(&leases, &ids);
    let words = if args.numa {
        qemu::numa_args(&mems)
    } else {
        qemu::machine_args(&mems[0])
    };
    if args.json {
        println!("{}", serde_json::to_string(&words)?);
    } else {
        println!("{}", qemu::shell_line(&words));
    }
    Ok(())
}
