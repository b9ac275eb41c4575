//! `hugeprep libvirt-attach`: a lease for a memory device that `virsh attach-device` will
//! add to a running domain (no libvirt hook runs for a device), linked where libvirt points
//! QEMU's backend for it.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use hugeprep::units::parse_bytes;
use hugeprep::vmm::libvirt::{self, Hook, HookConfig, DEFAULT_CONFIG};

/// Lease memory for a `<memory model='dimm'>` that `virsh attach-device --live` will plug
/// into a running domain whose memory the hook serves. Reads the running domain's XML on
/// stdin (`virsh dumpxml DOMAIN`), takes a lease named `libvirt-<uuid>-<alias>` (released
/// with the domain's others when it stops), links it at
/// `<memory_backing_dir>/libvirt/qemu/<id>-<name>/<alias>` for QEMU's user, and prints the
/// device XML to attach:
///
/// `virsh dumpxml vm1 | hugeprep libvirt-attach ua-hp0 4G > dimm.xml && virsh attach-device vm1 dimm.xml --live`
#[derive(Debug, clap::Args)]
pub struct LibvirtAttachArgs {
    /// The device's user alias (`ua-` and letters, digits, `-`, `_`): libvirt names the
    /// backend's file after it.
    pub alias: String,
    /// Size of the DIMM, a whole number of pages.
    #[arg(value_parser = parse_bytes)]
    pub size: u64,
    /// Guest NUMA cell of the DIMM (libvirt needs one for memory hot-plug).
    #[arg(long, default_value_t = 0)]
    pub guest_node: u32,
    /// Host NUMA node of the lease.
    #[arg(long)]
    pub node: Option<u32>,
    /// The hook's configuration file.
    #[arg(long, env = "HUGEPREP_LIBVIRT_HOOK_CONFIG", default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
}

/// Runs `hugeprep libvirt-attach`.
pub fn run(args: LibvirtAttachArgs) -> anyhow::Result<()> {
    let mut xml = String::new();
    std::io::stdin()
        .read_to_string(&mut xml)
        .context("reading the running domain's XML on stdin (virsh dumpxml DOMAIN)")?;
    let one_line = |e: libvirt::HookError| anyhow::anyhow!("{e}");
    let domain = libvirt::Domain::parse(&xml).map_err(one_line)?;
    let hook = Hook::new(HookConfig::load(&args.config).map_err(one_line)?);
    let link = hook
        .attach(&domain, &args.alias, args.size, args.node)
        .map_err(one_line)?;
    eprintln!("linked {}", link.display());
    println!(
        "<memory model='dimm'><target><size unit='KiB'>{}</size><node>{}</node></target><alias name='{}'/></memory>",
        args.size >> 10,
        args.guest_node,
        args.alias
    );
    Ok(())
}
