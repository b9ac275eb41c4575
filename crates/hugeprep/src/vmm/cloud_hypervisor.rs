//! cloud-hypervisor: a `--memory-zone` (or the `memory.zones` entry of the `vm.create` API body)
//! that maps a prepared file. `--memory size=0` makes the zones the guest's only memory.
//!
//! Checked against cloud-hypervisor v53.0 itself (`tests/ch_real.rs`): it opens the file
//! without create or truncate and maps it shared (same inode, no new hugepages). A zone
//! carries no `host_numa_node`: cloud-hypervisor refuses a NUMA policy on a `MAP_SHARED`
//! zone ("Invalid to try applying a NUMA policy to a memory zone that is memory mapped with
//! MAP_SHARED"), and a lease's pages are already on their node (hugeprep faulted them there).
//! Guest NUMA nodes are a separate `numa` entry per node naming its zones.

use serde::Serialize;

use super::GuestMemoryFile;

/// One entry of `MemoryConfig.zones` in cloud-hypervisor's API (`MemoryZoneConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryZone {
    /// Zone id.
    pub id: String,
    /// Bytes.
    pub size: u64,
    /// The prepared file.
    pub file: String,
    /// Always true: a private mapping would fault and zero every page again.
    pub shared: bool,
}

/// The zone for `mem`. Its `node` is not passed on: the pages are already there, and
/// cloud-hypervisor refuses a NUMA policy on a shared zone.
pub fn memory_zone(mem: &GuestMemoryFile<'_>) -> MemoryZone {
    MemoryZone {
        id: mem.id.to_string(),
        size: mem.size,
        file: mem.path.to_string_lossy().into_owned(),
        shared: true,
    }
}

/// The command-line arguments: `--memory size=0 --memory-zone id=..,size=..,file=..,shared=on`.
///
/// ```
/// use hugeprep::vmm::{cloud_hypervisor, GuestMemoryFile};
/// use std::path::Path;
/// let mem = GuestMemoryFile { id: "mem0", path: Path::new("/dev/hugepages/vm1"), size: 1 << 30, node: Some(0) };
/// assert_eq!(
///     cloud_hypervisor::memory_args(&mem),
///     ["--memory", "size=0", "--memory-zone", "id=mem0,size=1073741824,file=/dev/hugepages/vm1,shared=on"]
/// );
/// ```
pub fn memory_args(mem: &GuestMemoryFile<'_>) -> Vec<String> {
    memory_zones_args(std::slice::from_ref(mem))
}

fn zone_arg(mem: &GuestMemoryFile<'_>) -> String {
    format!(
        "id={},size={},file={},shared=on",
        mem.id,
        mem.size,
        mem.path.display()
    )
}

/// The `memory` section of a `vm.create` body (`MemoryConfig`): no default RAM, one zone
/// per file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryConfig {
    /// Always 0: the zones are the guest's only memory.
    pub size: u64,
    /// One zone per lease.
    pub zones: Vec<MemoryZone>,
}

/// The `memory` section for `mems`, in order.
pub fn memory_config(mems: &[GuestMemoryFile<'_>]) -> MemoryConfig {
    MemoryConfig {
        size: 0,
        zones: mems.iter().map(memory_zone).collect(),
    }
}

/// One entry of the `numa` list of a `vm.create` body (`NumaConfig`): a guest NUMA node
/// made of memory zones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    /// The guest's node number.
    pub guest_numa_id: u32,
    /// Zone ids whose memory the node holds.
    pub memory_zones: Vec<String>,
}

/// One guest NUMA node per zone, numbered in order: node `i` holds `mems[i]`.
pub fn numa_nodes(mems: &[GuestMemoryFile<'_>]) -> Vec<NumaNode> {
    mems.iter()
        .zip(0u32..)
        .map(|(m, i)| NumaNode {
            guest_numa_id: i,
            memory_zones: vec![m.id.to_string()],
        })
        .collect()
}

/// The members of a `vm.create` body that hand over the leases: `memory`, and `numa` when
/// the guest gets one NUMA node per lease. A control plane merges it into its own body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmCreateMemory {
    /// The `memory` section.
    pub memory: MemoryConfig,
    /// Guest NUMA nodes, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<Vec<NumaNode>>,
}

/// The `vm.create` members for `mems`; with `numa`, one guest node per zone.
pub fn vm_create_memory(mems: &[GuestMemoryFile<'_>], numa: bool) -> VmCreateMemory {
    VmCreateMemory {
        memory: memory_config(mems),
        numa: numa.then(|| numa_nodes(mems)),
    }
}

/// The command-line arguments for several zones: `--memory size=0 --memory-zone Z1 Z2 ...`
/// (cloud-hypervisor takes every zone after one `--memory-zone`).
pub fn memory_zones_args(mems: &[GuestMemoryFile<'_>]) -> Vec<String> {
    let mut args: Vec<String> = vec!["--memory".into(), "size=0".into(), "--memory-zone".into()];
    args.extend(mems.iter().map(zone_arg));
    args
}

/// `--numa guest_numa_id=0,memory_zones=mem0 guest_numa_id=1,memory_zones=mem1 ...`: one
/// guest NUMA node per zone, in order.
pub fn numa_args(mems: &[GuestMemoryFile<'_>]) -> Vec<String> {
    let mut args: Vec<String> = vec!["--numa".into()];
    args.extend(numa_nodes(mems).iter().map(|n| {
        format!(
            "guest_numa_id={},memory_zones={}",
            n.guest_numa_id,
            n.memory_zones.join(",")
        )
    }));
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn mems() -> [GuestMemoryFile<'static>; 2] {
        [
            GuestMemoryFile {
                id: "mem0",
                path: Path::new("/hp/a"),
                size: 4 << 20,
                node: Some(1),
            },
            GuestMemoryFile {
                id: "mem1",
                path: Path::new("/hp/b"),
                size: 2 << 20,
                node: Some(0),
            },
        ]
    }

    #[test]
    fn shared_zones_carry_no_host_numa_policy() {
        let json = serde_json::to_value(vm_create_memory(&mems(), false)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"memory": {"size": 0, "zones": [
                {"id": "mem0", "size": 4194304, "file": "/hp/a", "shared": true},
                {"id": "mem1", "size": 2097152, "file": "/hp/b", "shared": true},
            ]}})
        );
        assert!(!memory_zones_args(&mems()).join(" ").contains("host_numa"));
    }

    #[test]
    fn guest_numa_nodes_one_per_zone() {
        assert_eq!(
            numa_args(&mems()),
            [
                "--numa",
                "guest_numa_id=0,memory_zones=mem0",
                "guest_numa_id=1,memory_zones=mem1"
            ]
        );
        let json = serde_json::to_value(vm_create_memory(&mems(), true)).unwrap();
        assert_eq!(
            json["numa"],
            serde_json::json!([
                {"guest_numa_id": 0, "memory_zones": ["mem0"]},
                {"guest_numa_id": 1, "memory_zones": ["mem1"]},
            ])
        );
    }
}
