//! `hugeprep libvirt-hook`: libvirt's QEMU hook (`/etc/libvirt/hooks/qemu.d/hugeprep`).
//! Prints nothing on stdout (for some operations libvirt reads stdout as a new XML); errors
//! go to stderr as one line, which virsh shows when the start is aborted.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use hugeprep::vmm::libvirt::{self, Hook, HookConfig, Outcome, DEFAULT_CONFIG};

/// Run as libvirt's QEMU hook: `libvirt-hook NAME OP SUBOP EXTRA` with the domain XML on
/// stdin; or `libvirt-hook --reconcile` to release leases of domains that are gone.
#[derive(Debug, clap::Args)]
pub struct LibvirtHookArgs {
    /// The hook's configuration file.
    #[arg(long, env = "HUGEPREP_LIBVIRT_HOOK_CONFIG", default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Release leases whose domain is gone, then exit (for a timer).
    #[arg(long, conflicts_with = "domain")]
    pub reconcile: bool,
    /// Domain name (libvirt's first argument).
    #[arg(required_unless_present = "reconcile")]
    pub domain: Option<String>,
    /// Operation (`prepare`, `start`, `started`, `stopped`, `release`, ...).
    #[arg(required_unless_present = "reconcile")]
    pub op: Option<String>,
    /// Sub-operation (`begin`, `end`, ...).
    #[arg(required_unless_present = "reconcile")]
    pub subop: Option<String>,
    /// libvirt's extra argument (`-`), ignored.
    pub extra: Option<String>,
}

/// Runs `hugeprep libvirt-hook`.
pub fn run(args: LibvirtHookArgs) -> anyhow::Result<()> {
    if args.reconcile {
        let hook = Hook::new(HookConfig::load(&args.config)?);
        let n = hook.reconcile(None)?;
        eprintln!("released {n} leases of domains that are gone");
        return Ok(());
    }
    let (op, subop) = (args.op.unwrap_or_default(), args.subop.unwrap_or_default());
    // Always drain stdin: libvirt writes the whole XML, and a closed pipe is an error to it.
    let mut xml = String::new();
    std::io::stdin()
        .read_to_string(&mut xml)
        .context("reading the domain XML on stdin")?;
    if !libvirt::hook::acts_on(&op, &subop) {
        return Ok(());
    }
    // Errors become one line (virsh shows it): no cause chain repeating the message.
    let one_line = |e: libvirt::HookError| anyhow::anyhow!("{e}");
    let domain = libvirt::Domain::parse(&xml).map_err(one_line)?;
    // A domain that does not opt in passes without reading the config or asking the daemon.
    if libvirt::opts_in(&domain).is_err() {
        return Ok(());
    }
    let hook = Hook::new(HookConfig::load(&args.config).map_err(one_line)?);
    if let Outcome::Cold(why) = hook.run(&op, &subop, &domain).map_err(one_line)? {
        eprintln!("hugeprep: starting cold (as configured): {why}");
    }
    Ok(())
}
