//! QEMU memory hot-plug from a lease: the QMP commands that plug a lease into a running VM
//! (`object-add` of a `memory-backend-file` on the lease's path, `share=on`, then
//! `device_add` of a `pc-dimm` or a `virtio-mem-pci`) and the ones that unplug it.
//!
//! The machine needs room for memory devices (`-m SIZE,slots=N,maxmem=MAX`); a
//! `virtio-mem-pci` on `q35` also needs a free PCIe root port (`bus`). QEMU 7.2 accepts both
//! on a paused guest. A `pc-dimm` maps the lease's present pages as they are; a
//! `virtio-mem-pci` discards its whole backend when it is realized (every block starts
//! unplugged: the lease's pages are punched out of the file and go back to the kernel), so
//! it gets no warm pages from a lease, only the guarantee that its memory comes back through
//! the usual release (measured: a prefaulted 64 MiB file had 0 blocks after `device_add`).

use serde::Serialize;
use serde_json::{json, Value};

use super::GuestMemoryFile;

/// The memory device that takes the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum HotplugDevice {
    /// `pc-dimm`: a DIMM of the lease's size, mapped as it is (warm).
    PcDimm,
    /// `virtio-mem-pci` with `requested-size` the lease's size (QEMU discards its backend
    /// at plug: no warm pages).
    VirtioMemPci,
}

impl HotplugDevice {
    /// QEMU's driver name.
    pub fn driver(self) -> &'static str {
        match self {
            HotplugDevice::PcDimm => "pc-dimm",
            HotplugDevice::VirtioMemPci => "virtio-mem-pci",
        }
    }
}

/// What to plug: the backend on `mem`, a device `device_id` of `device`, on PCI `bus` (a
/// `virtio-mem-pci` on q35 needs a free root port), in guest NUMA node `guest_node`.
#[derive(Debug, Clone)]
pub struct Hotplug<'a> {
    /// The lease's file; `mem.id` is the backend's id.
    pub mem: GuestMemoryFile<'a>,
    /// The device.
    pub device: HotplugDevice,
    /// The device's id.
    pub device_id: String,
    /// The PCI bus (virtio-mem-pci only).
    pub bus: Option<String>,
    /// The guest NUMA node (the device's `node`).
    pub guest_node: Option<u32>,
}

/// `object-add`'s arguments: the backend on the lease's file, shared, no preallocation
/// (the pages are present), bound to the lease's host node.
///
/// ```
/// use hugeprep::vmm::{qemu_hotplug, GuestMemoryFile};
/// use std::path::Path;
/// let mem = GuestMemoryFile { id: "hp1", path: Path::new("/hp/vm1-plug"), size: 1 << 30, node: Some(0) };
/// let a = qemu_hotplug::object_add_arguments(&mem);
/// assert_eq!(a["qom-type"], "memory-backend-file");
/// assert_eq!(a["mem-path"], "/hp/vm1-plug");
/// assert_eq!(a["share"], true);
/// assert_eq!(a["host-nodes"][0], 0);
/// ```
pub fn object_add_arguments(mem: &GuestMemoryFile<'_>) -> Value {
    let mut a = json!({
        "qom-type": "memory-backend-file",
        "id": mem.id,
        "size": mem.size,
        "mem-path": mem.path.to_string_lossy(),
        "share": true,
        "prealloc": false,
    });
    if let Some(node) = mem.node {
        a["host-nodes"] = json!([node]);
        a["policy"] = json!("bind");
    }
    a
}

/// `device_add`'s arguments for the device.
pub fn device_add_arguments(plug: &Hotplug<'_>) -> Value {
    let mut a = json!({
        "driver": plug.device.driver(),
        "id": plug.device_id,
        "memdev": plug.mem.id,
    });
    if plug.device == HotplugDevice::VirtioMemPci {
        a["requested-size"] = json!(plug.mem.size);
        if let Some(bus) = &plug.bus {
            a["bus"] = json!(bus);
        }
    }
    if let Some(node) = plug.guest_node {
        a["node"] = json!(node);
    }
    a
}

/// The QMP commands that plug the lease, in order: `object-add`, then `device_add`.
pub fn plug_commands(plug: &Hotplug<'_>) -> Vec<Value> {
    vec![
        json!({ "execute": "object-add", "arguments": object_add_arguments(&plug.mem) }),
        json!({ "execute": "device_add", "arguments": device_add_arguments(plug) }),
    ]
}

/// The QMP commands that unplug it, in order: `device_del` (the guest must eject it: wait
/// for the `DEVICE_DELETED` event), then `object-del`; then release the lease.
pub fn unplug_commands(plug: &Hotplug<'_>) -> Vec<Value> {
    vec![
        json!({ "execute": "device_del", "arguments": { "id": plug.device_id } }),
        json!({ "execute": "object-del", "arguments": { "id": plug.mem.id } }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn plug(device: HotplugDevice) -> Hotplug<'static> {
        Hotplug {
            mem: GuestMemoryFile {
                id: "hpmem0",
                path: Path::new("/hp/a,b"),
                size: 4 << 30,
                node: None,
            },
            device,
            device_id: "hpdev0".into(),
            bus: Some("rp1".into()),
            guest_node: Some(0),
        }
    }

    #[test]
    fn pc_dimm_names_the_backend_and_keeps_commas() {
        let p = plug(HotplugDevice::PcDimm);
        let c = plug_commands(&p);
        assert_eq!(c[0]["execute"], "object-add");
        // QMP takes JSON: a comma in the path is not doubled.
        assert_eq!(c[0]["arguments"]["mem-path"], "/hp/a,b");
        assert!(c[0]["arguments"].get("host-nodes").is_none());
        assert_eq!(
            c[1]["arguments"],
            json!({"driver": "pc-dimm", "id": "hpdev0", "memdev": "hpmem0", "node": 0})
        );
        assert_eq!(unplug_commands(&p)[1]["arguments"]["id"], "hpmem0");
    }

    #[test]
    fn virtio_mem_asks_for_the_whole_lease_on_its_bus() {
        let c = plug_commands(&plug(HotplugDevice::VirtioMemPci));
        assert_eq!(c[1]["arguments"]["driver"], "virtio-mem-pci");
        assert_eq!(c[1]["arguments"]["requested-size"], 4u64 << 30);
        assert_eq!(c[1]["arguments"]["bus"], "rp1");
    }
}
