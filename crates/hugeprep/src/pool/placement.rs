//! The node of a lease whose request names none.
//!
//! 1. The request names a `pid` whose CPU affinity lies on one node: that node, so the VM's
//!    memory is local to where its vCPUs may run (libvirt and numactl pin QEMU before it
//!    allocates).
//! 2. Otherwise the node with the most warm bytes of the page size (the fastest lease),
//!    then the most free kernel pages, then the lowest node id. On a one-node host this is
//!    node 0, as before.

use serde::Serialize;

use crate::topology::Topology;

/// Why a lease went to its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeChoice {
    /// Every CPU the requesting pid may run on is on this node.
    PidCpus,
    /// The node with the most warm memory (then free pages, then the lowest id).
    MostWarm,
}

/// What one node could supply now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSupply {
    /// Node id.
    pub node: u32,
    /// Warm bytes ready to lease.
    pub warm_bytes: u64,
    /// Free kernel bytes of the page size.
    pub free_bytes: u64,
}

/// The node of a lease that names none: see the module documentation. `pid_cpus` is the
/// requesting process's affinity, when the request names a pid; `supply` one entry per
/// online node.
///
/// ```
/// use hugeprep::pool::placement::{choose_node, NodeChoice, NodeSupply};
/// use hugeprep::topology::{Node, Topology};
/// let topology = Topology { nodes: vec![
///     Node { id: 0, cpus: vec![0, 1], mem_bytes: 1 << 30 },
///     Node { id: 1, cpus: vec![2, 3], mem_bytes: 1 << 30 },
/// ] };
/// let supply = [
///     NodeSupply { node: 0, warm_bytes: 1 << 30, free_bytes: 0 },
///     NodeSupply { node: 1, warm_bytes: 0, free_bytes: 1 << 30 },
/// ];
/// assert_eq!(choose_node(&topology, Some(&[2, 3]), &supply), (1, NodeChoice::PidCpus));
/// assert_eq!(choose_node(&topology, Some(&[1, 2]), &supply), (0, NodeChoice::MostWarm));
/// assert_eq!(choose_node(&topology, None, &supply), (0, NodeChoice::MostWarm));
/// ```
pub fn choose_node(
    topology: &Topology,
    pid_cpus: Option<&[usize]>,
    supply: &[NodeSupply],
) -> (u32, NodeChoice) {
    if let Some(node) = pid_cpus.and_then(|cpus| single_node_of(topology, cpus)) {
        return (node, NodeChoice::PidCpus);
    }
    let best = supply
        .iter()
        .max_by(|a, b| {
            (a.warm_bytes, a.free_bytes)
                .cmp(&(b.warm_bytes, b.free_bytes))
                // Equal supply: the lower id wins (max_by keeps the last maximum).
                .then(b.node.cmp(&a.node))
        })
        .map_or(0, |s| s.node);
    (best, NodeChoice::MostWarm)
}

/// The node holding every one of `cpus`, when they all lie on one node.
fn single_node_of(topology: &Topology, cpus: &[usize]) -> Option<u32> {
    let mut nodes = cpus.iter().map(|c| {
        topology
            .nodes
            .iter()
            .find(|n| n.cpus.contains(c))
            .map(|n| n.id)
    });
    let first = nodes.next()??;
    nodes.all(|n| n == Some(first)).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Node;

    fn topology() -> Topology {
        let node = |id, cpus: Vec<usize>| Node {
            id,
            cpus,
            mem_bytes: 1 << 30,
        };
        Topology {
            nodes: vec![node(0, vec![0]), node(1, vec![1]), node(2, vec![])],
        }
    }

    fn supply(warm: [u64; 3], free: [u64; 3]) -> Vec<NodeSupply> {
        (0..3)
            .map(|i| NodeSupply {
                node: i as u32,
                warm_bytes: warm[i],
                free_bytes: free[i],
            })
            .collect()
    }

    #[test]
    fn pid_on_one_node_wins_over_warm_memory() {
        let s = supply([8, 0, 0], [0, 0, 0]);
        assert_eq!(
            choose_node(&topology(), Some(&[1]), &s),
            (1, NodeChoice::PidCpus)
        );
    }

    #[test]
    fn pid_spanning_nodes_or_unknown_cpus_falls_back_to_most_warm() {
        let s = supply([0, 0, 8], [0, 0, 0]);
        for cpus in [&[0, 1][..], &[7][..], &[][..]] {
            assert_eq!(
                choose_node(&topology(), Some(cpus), &s),
                (2, NodeChoice::MostWarm)
            );
        }
    }

    #[test]
    fn ties_go_to_free_pages_then_the_lowest_id() {
        let t = topology();
        assert_eq!(choose_node(&t, None, &supply([4, 4, 0], [0, 2, 9])).0, 1);
        assert_eq!(choose_node(&t, None, &supply([4, 4, 4], [2, 2, 2])).0, 0);
        assert_eq!(choose_node(&t, None, &[]).0, 0);
    }
}
