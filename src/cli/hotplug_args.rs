//! `hugeprep hotplug-args`: lease memory for a running QEMU and print the QMP commands that
//! plug it in (and, to undo it, out).

use std::path::PathBuf;

use anyhow::Context;
use hugeprep::client::Client;
use hugeprep::policy::pool::Recycle;
use hugeprep::pool::LeaseRequest;
use hugeprep::units::parse_bytes;
use hugeprep::vmm::qemu_hotplug::{self, Hotplug, HotplugDevice};
use hugeprep::vmm::GuestMemoryFile;
use hugeprep::PageSize;

/// Lease memory for a running QEMU and print, as JSON, the lease and the QMP commands that
/// plug it (`object-add` of a `memory-backend-file` on the lease's file, `share=on`, then
/// `device_add` of a `pc-dimm` or `virtio-mem-pci`) and unplug it (`device_del`, then
/// `object-del`; then `hugeprep release NAME`, or let `--pid` release it when QEMU exits).
///
/// Example: `hugeprep hotplug-args vm1-plug0 4G --pid $QEMU_PID | jq -c '.plug[]'` gives the
/// lines to send to QEMU's QMP socket.
#[derive(Debug, clap::Args)]
pub struct HotplugArgsArgs {
    /// Lease name (also the default backend and device ids' suffix).
    pub name: String,
    /// Size (e.g. 4G), a whole number of pages.
    #[arg(value_parser = parse_bytes)]
    pub size: u64,
    /// The memory device: pc-dimm maps the lease's warm pages as they are; virtio-mem-pci
    /// discards its backend when QEMU realizes it (no warm pages, see docs/libvirt.md).
    #[arg(long, value_enum, default_value = "pc-dimm")]
    pub device: HotplugDevice,
    /// The backend's id (`object-add`'s `id`; default `hp-mem-NAME`).
    #[arg(long)]
    pub backend_id: Option<String>,
    /// The device's id (`device_add`'s `id`; default `hp-dev-NAME`).
    #[arg(long)]
    pub device_id: Option<String>,
    /// PCI bus of a virtio-mem-pci (on q35 a free `pcie-root-port`).
    #[arg(long)]
    pub bus: Option<String>,
    /// Guest NUMA node of the device.
    #[arg(long)]
    pub guest_node: Option<u32>,
    /// Page size.
    #[arg(long)]
    pub page_size: Option<PageSize>,
    /// Host NUMA node of the lease.
    #[arg(long)]
    pub node: Option<u32>,
    /// User to hand the file to (QEMU's user).
    #[arg(long)]
    pub owner: Option<String>,
    /// QEMU's pid: the daemon releases the lease when that process exits.
    #[arg(long)]
    pub pid: Option<u32>,
    /// How the memory comes back when released (`proven` or `kernel`).
    #[arg(long, value_enum)]
    pub recycle: Option<Recycle>,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// A QOM id from a lease name: QEMU ids are letters, digits, `-`, `.`, `_`, starting with a
/// letter; anything else becomes `_`.
fn qom_id(prefix: &str, name: &str) -> String {
    let tail: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-._".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{prefix}{tail}")
}

/// Runs `hugeprep hotplug-args`.
pub fn run(args: HotplugArgsArgs) -> anyhow::Result<()> {
    if args.bus.is_some() && args.device != HotplugDevice::VirtioMemPci {
        anyhow::bail!("--bus: only a virtio-mem-pci sits on a PCI bus (--device virtio-mem-pci)");
    }
    let client = Client::new(&args.socket);
    let lease = client
        .blocking(client.lease(&LeaseRequest {
            name: args.name.clone(),
            size: args.size,
            page_size: args.page_size,
            node: args.node,
            owner: args.owner.clone(),
            pid: args.pid,
            pin: false,
            recycle: args.recycle,
        }))
        .with_context(|| format!("daemon at {}", args.socket.display()))?;
    let backend_id = args
        .backend_id
        .clone()
        .unwrap_or_else(|| qom_id("hp-mem-", &args.name));
    let plug = Hotplug {
        mem: GuestMemoryFile {
            id: &backend_id,
            path: &lease.path,
            size: lease.size,
            node: Some(lease.node),
        },
        device: args.device,
        device_id: args
            .device_id
            .clone()
            .unwrap_or_else(|| qom_id("hp-dev-", &args.name)),
        bus: args.bus.clone(),
        guest_node: args.guest_node,
    };
    let out = serde_json::json!({
        "lease": lease,
        "plug": qemu_hotplug::plug_commands(&plug),
        "unplug": qemu_hotplug::unplug_commands(&plug),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
