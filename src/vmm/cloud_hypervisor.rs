//! cloud-hypervisor: a `--memory-zone` (or the `memory.zones` entry of the `vm.create` API body)
//! that maps a prepared file. `--memory size=0` makes the zones the guest's only memory.

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
    /// Host NUMA nodes to bind the zone to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_numa_node: Option<u32>,
}

/// The zone for `mem`.
pub fn memory_zone(mem: &GuestMemoryFile<'_>) -> MemoryZone {
    MemoryZone {
        id: mem.id.to_string(),
        size: mem.size,
        file: mem.path.to_string_lossy().into_owned(),
        shared: true,
        host_numa_node: mem.node,
    }
}

/// The command-line arguments: `--memory size=0 --memory-zone id=..,size=..,file=..,shared=on`.
///
/// ```
/// use hugeprep::vmm::{cloud_hypervisor, GuestMemoryFile};
/// use std::path::Path;
/// let mem = GuestMemoryFile { id: "mem0", path: Path::new("/dev/hugepages/vm1"), size: 1 << 30, node: None };
/// assert_eq!(
///     cloud_hypervisor::memory_args(&mem),
///     ["--memory", "size=0", "--memory-zone", "id=mem0,size=1073741824,file=/dev/hugepages/vm1,shared=on"]
/// );
/// ```
pub fn memory_args(mem: &GuestMemoryFile<'_>) -> Vec<String> {
    let mut zone = format!(
        "id={},size={},file={},shared=on",
        mem.id,
        mem.size,
        mem.path.display()
    );
    if let Some(node) = mem.node {
        zone.push_str(&format!(",host_numa_node={node}"));
    }
    vec![
        "--memory".into(),
        "size=0".into(),
        "--memory-zone".into(),
        zone,
    ]
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

/// The command-line arguments for several zones: `--memory size=0 --memory-zone Z1 Z2 ...`
/// (cloud-hypervisor takes every zone after one `--memory-zone`).
pub fn memory_zones_args(mems: &[GuestMemoryFile<'_>]) -> Vec<String> {
    let mut args: Vec<String> = vec!["--memory".into(), "size=0".into(), "--memory-zone".into()];
    args.extend(mems.iter().map(|m| memory_args(m)[3].clone()));
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn api_body_is_shared() {
        let mem = GuestMemoryFile {
            id: "z",
            path: Path::new("/hp/f"),
            size: 4 << 20,
            node: Some(1),
        };
        let json = serde_json::to_value(memory_zone(&mem)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"id": "z", "size": 4194304, "file": "/hp/f", "shared": true, "host_numa_node": 1})
        );
        assert!(memory_args(&mem)[3].ends_with(",host_numa_node=1"));
    }
}
