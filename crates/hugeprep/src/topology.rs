//! NUMA topology from sysfs: the nodes, their CPUs and their memory.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Reading the topology failed or named a node that does not exist.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A sysfs file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The kernel's answer.
        source: io::Error,
    },
    /// A CPU or node list in sysfs did not parse.
    #[error("{path}: cannot parse list {text:?}")]
    List {
        /// The file.
        path: PathBuf,
        /// Its contents.
        text: String,
    },
    /// The node asked for is not online.
    #[error("node {node} does not exist: online nodes are {online:?}")]
    UnknownNode {
        /// The node asked for.
        node: u32,
        /// The nodes that exist.
        online: Vec<u32>,
    },
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Node {
    /// Node id.
    pub id: u32,
    /// CPUs of the node (may be empty for memory-only nodes such as CXL or HBM).
    pub cpus: Vec<usize>,
    /// Total memory of the node in bytes.
    pub mem_bytes: u64,
}

/// The machine's NUMA nodes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Topology {
    /// Online nodes, by id. A kernel without NUMA shows one node 0.
    pub nodes: Vec<Node>,
}

const NODE_ROOT: &str = "/sys/devices/system/node";

fn read(path: &Path) -> Result<String, TopologyError> {
    fs::read_to_string(path).map_err(|source| TopologyError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The highest CPU or node number a list may name: the kernel's largest `NR_CPUS` (8192)
/// less one. A list is expanded into a vector, so a bound keeps `0-4000000000` (from a
/// domain XML or a corrupt sysfs file) from allocating gigabytes.
pub const MAX_LIST_ID: usize = 8191;

/// Parses a kernel list such as `0-3,8,10-11` (`cpulist_parse` format); `None` when it is
/// malformed, a range is reversed, or a number is above [`MAX_LIST_ID`].
///
/// ```
/// assert_eq!(hugeprep::topology::parse_list("0-2,5").unwrap(), vec![0, 1, 2, 5]);
/// assert_eq!(hugeprep::topology::parse_list("").unwrap(), Vec::<usize>::new());
/// ```
pub fn parse_list(text: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b > MAX_LIST_ID {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok().filter(|n| *n <= MAX_LIST_ID)?),
        }
    }
    Some(out)
}

fn read_list(path: &Path) -> Result<Vec<usize>, TopologyError> {
    let text = read(path)?;
    parse_list(&text).ok_or(TopologyError::List {
        path: path.to_path_buf(),
        text,
    })
}

fn node_mem_bytes(node: u32) -> Result<u64, TopologyError> {
    let path = Path::new(NODE_ROOT).join(format!("node{node}/meminfo"));
    let text = read(&path)?;
    // "Node 0 MemTotal:       24589344 kB"
    Ok(text
        .lines()
        .find(|l| l.contains("MemTotal:"))
        .and_then(|l| l.split_whitespace().rev().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024))
}

/// Bytes of a `meminfo` line (`Node 0 MemFree:  123 kB` or `MemAvailable:  123 kB`).
fn meminfo_field(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.split_whitespace().any(|w| w == field))
        .and_then(|l| l.split_whitespace().rev().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// Memory a new hugepage pool allocation on `node` can get: the node's free memory plus its
/// page cache and reclaimable kernel memory (what the kernel reclaims to satisfy it), capped
/// by the machine's `MemAvailable`. An estimate, like `MemAvailable` itself; hugepages already
/// in pools are not counted.
pub fn node_available_bytes(node: u32) -> Result<u64, TopologyError> {
    let path = Path::new(NODE_ROOT).join(format!("node{node}/meminfo"));
    let text = read(&path)?;
    let node_bytes: u64 = [
        "MemFree:",
        "Active(file):",
        "Inactive(file):",
        "KReclaimable:",
    ]
    .iter()
    .filter_map(|f| meminfo_field(&text, f))
    .sum();
    let system = read(Path::new("/proc/meminfo"))
        .ok()
        .and_then(|t| meminfo_field(&t, "MemAvailable:"));
    Ok(system.map_or(node_bytes, |s| s.min(node_bytes)))
}

impl Topology {
    /// Reads the online nodes from `/sys/devices/system/node`.
    pub fn detect() -> Result<Topology, TopologyError> {
        let online = read_list(&Path::new(NODE_ROOT).join("online"))?;
        let mut nodes = Vec::with_capacity(online.len());
        for id in online {
            let id = id as u32;
            let cpus = read_list(&Path::new(NODE_ROOT).join(format!("node{id}/cpulist")))?;
            nodes.push(Node {
                id,
                cpus,
                mem_bytes: node_mem_bytes(id)?,
            });
        }
        Ok(Topology { nodes })
    }

    /// The node with `id`, or an error listing the nodes that exist.
    pub fn node(&self, id: u32) -> Result<&Node, TopologyError> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .ok_or_else(|| TopologyError::UnknownNode {
                node: id,
                online: self.node_ids(),
            })
    }

    /// The ids of all online nodes.
    pub fn node_ids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields() {
        let text = "Node 0 MemTotal:       24589344 kB\nNode 0 MemFree:  1024 kB\n";
        assert_eq!(meminfo_field(text, "MemFree:"), Some(1 << 20));
        assert_eq!(
            meminfo_field("MemAvailable:  2 kB\n", "MemAvailable:"),
            Some(2048)
        );
        assert_eq!(meminfo_field(text, "KReclaimable:"), None);
    }

    #[test]
    fn lists() {
        assert_eq!(parse_list("0\n"), Some(vec![0]));
        assert_eq!(parse_list("0-1,4-5"), Some(vec![0, 1, 4, 5]));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("a"), None);
        // Bounded: no multi-gigabyte expansion of a hostile range.
        assert_eq!(parse_list("0-4000000000"), None);
        assert_eq!(parse_list("8192"), None);
        assert_eq!(parse_list("8191").map(|v| v.len()), Some(1));
    }

    #[test]
    fn this_machine_has_node_0_with_cpus() {
        let t = Topology::detect().unwrap();
        let n0 = t.node(0).unwrap();
        assert!(!n0.cpus.is_empty());
        assert!(n0.mem_bytes > 0);
        let avail = node_available_bytes(0).unwrap();
        assert!(avail > 0 && avail <= n0.mem_bytes, "{avail}");
        let err = t.node(99).unwrap_err();
        assert!(err.to_string().contains("node 99"), "{err}");
    }
}
