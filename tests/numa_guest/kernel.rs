//! The kernel's own accounting, read the way an operator would: per-node sysfs pool counters,
//! `/proc/PID/numa_maps` for where a file's pages sit, a node's CPU list, and the CPU
//! affinity of a process. Nothing here asks hugeprep.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use hugeprep::hugetlb::BackingFile;
use hugeprep::topology::parse_list;
use hugeprep::PageSize;

/// Bytes of a 2 MiB page.
pub const PAGE: u64 = 2 << 20;

/// A per-node 2M counter from sysfs (`nr_hugepages`, `free_hugepages`, `surplus_hugepages`).
pub fn node_counter(node: u32, counter: &str) -> Result<u64, String> {
    let path = format!("/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/{counter}");
    let text = fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    text.trim()
        .parse()
        .map_err(|e| format!("{path}: {text:?}: {e}"))
}

/// One counter for every node, by node id.
pub fn per_node(nodes: &[u32], counter: &str) -> Result<BTreeMap<u32, u64>, String> {
    nodes
        .iter()
        .map(|&n| node_counter(n, counter).map(|v| (n, v)))
        .collect()
}

/// Sets node `node`'s 2M pool through sysfs (the guest owns its pools).
pub fn set_node_pages(node: u32, pages: u64) -> Result<(), String> {
    let path =
        format!("/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/nr_hugepages");
    fs::write(&path, pages.to_string()).map_err(|e| format!("{path}: {e}"))
}

/// The CPUs of `node` from sysfs.
pub fn node_cpus(node: u32) -> Result<Vec<usize>, String> {
    let path = format!("/sys/devices/system/node/node{node}/cpulist");
    let text = fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    parse_list(&text).ok_or_else(|| format!("{path}: cannot parse {text:?}"))
}

/// Pages per node of the mapping that starts at `addr` in `/proc/self/numa_maps`.
fn numa_maps_nodes(addr: usize) -> Result<BTreeMap<u32, u64>, String> {
    let text = fs::read_to_string("/proc/self/numa_maps").map_err(|e| e.to_string())?;
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&format!("{addr:x}")))
        .ok_or_else(|| format!("no numa_maps line for {addr:#x}"))?;
    let mut nodes = BTreeMap::new();
    for field in line.split_whitespace() {
        if let Some((n, count)) = field.strip_prefix('N').and_then(|f| f.split_once('=')) {
            if let (Ok(n), Ok(count)) = (n.parse(), count.parse()) {
                nodes.insert(n, count);
            }
        }
    }
    Ok(nodes)
}

/// Where the pages of the hugetlbfs file at `path` sit: maps it shared, reads one byte per
/// page (mapping the file's existing pages; no page is allocated or changed) and returns
/// the pages per node that `/proc/self/numa_maps` counts for the mapping.
pub fn file_nodes(path: &Path) -> Result<BTreeMap<u32, u64>, String> {
    let file = BackingFile::open(path, PageSize::Size2M).map_err(|e| e.to_string())?;
    let region = file.map().map_err(|e| e.to_string())?;
    let bytes = region.as_slice();
    let sum: u64 = bytes
        .iter()
        .step_by(PAGE as usize)
        .map(|&b| u64::from(b))
        .sum();
    std::hint::black_box(sum);
    numa_maps_nodes(region.as_ptr() as usize)
}

/// The CPUs a process may run on (`Cpus_allowed_list`, what `sched_getaffinity` returns).
pub fn process_cpus(pid: u32) -> Result<Vec<usize>, String> {
    let path = format!("/proc/{pid}/status");
    let text = fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let list = text
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .ok_or_else(|| format!("{path}: no Cpus_allowed_list"))?;
    parse_list(list).ok_or_else(|| format!("{path}: cannot parse {list:?}"))
}

/// Whether every CPU of `cpus` is one of `of`.
pub fn all_within(cpus: &[usize], of: &[usize]) -> bool {
    !cpus.is_empty() && cpus.iter().all(|c| of.contains(c))
}
