//! What the child provider's inventory should say, from the pool's figures and Placement's
//! usage: pure arithmetic, no I/O.
//!
//! Placement offers `(total - reserved) * allocation_ratio - used` of a class. Nova's
//! allocations are `used`: a VM scheduled here holds its warm MiB from the moment it is
//! scheduled, before its lease exists. So the inventory must offer, besides the warm memory,
//! the memory already leased to VMs that hold allocations, or those allocations would count
//! twice (once as `used`, once missing from the warm memory):
//!
//! ```text
//! offered  = warm + min(leased, used)
//! total    = max(page, target, offered)    reserved = total - offered    ratio = 1
//! capacity = offered - used = warm - (allocated but not yet leased)
//! ```
//!
//! Two VMs scheduled back to back before either leases see `warm - first` and then
//! `warm - first - second`: the same warm MiB is never offered twice, and a lease changes
//! nothing Placement computes (warm falls by what leased rises). Leases made without an
//! allocation (VMs Nova did not schedule) never raise what is offered: `min(leased, used)`.
//!
//! `max_unit` (the most one allocation may take) is the warm memory of the node that has
//! the most, not the sum: a VM's lease comes from one node, so on a host with 8 GiB warm on
//! each of two nodes no VM is promised 16 GiB warm.

use std::collections::BTreeMap;

use crate::PageSize;

const MIB: u64 = 1 << 20;

/// The custom resource class of warm memory of `page_size` pages (`CUSTOM_HUGEPREP_WARM_2M`).
pub fn class_name(page_size: PageSize) -> String {
    format!("CUSTOM_HUGEPREP_WARM_{}", page_size.name())
}

/// One page size's figures, summed over the nodes, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    /// Warm bytes.
    pub warm: u64,
    /// Leased bytes.
    pub leased: u64,
    /// The warm target.
    pub target: u64,
    /// The warm bytes of the node that has the most: a lease comes from one node, so this is
    /// the most one VM can be given warm.
    pub largest_node_warm: u64,
}

/// One class's inventory, MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Inventory {
    /// `total`.
    pub total: u64,
    /// `reserved`: what is neither warm nor leased to an allocation.
    pub reserved: u64,
    /// `min_unit` and `step_size`: one page.
    pub step: u64,
    /// `max_unit`: the largest node's warm memory (at least one page, at most `total`), not
    /// the sum over the nodes: one VM's memory comes from one node.
    pub max_unit: u64,
}

impl Inventory {
    /// What Placement offers on top of `used`: `total - reserved`.
    pub fn offered(&self) -> u64 {
        self.total - self.reserved
    }

    /// The JSON of one inventory record.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "total": self.total,
            "reserved": self.reserved,
            "min_unit": self.step,
            "step_size": self.step,
            "max_unit": self.max_unit,
            "allocation_ratio": 1.0,
        })
    }
}

/// The inventory of `page_size` warm memory, given `figures` and Placement's `used` MiB.
pub fn inventory(page_size: PageSize, figures: Figures, used: u64) -> Inventory {
    let step = (page_size.bytes() / MIB).max(1);
    let warm = figures.warm / MIB;
    let leased = (figures.leased / MIB).min(used);
    let offered = warm + leased;
    let total = step.max(figures.target / MIB).max(offered);
    let largest = figures.largest_node_warm / MIB / step * step;
    Inventory {
        total,
        reserved: total - offered,
        step,
        max_unit: largest.clamp(step, total),
    }
}

/// Every class's inventory: `figures` by page size, `used` by class name.
pub fn inventories(
    figures: &BTreeMap<PageSize, Figures>,
    used: &BTreeMap<String, u64>,
) -> BTreeMap<String, Inventory> {
    figures
        .iter()
        .map(|(ps, f)| {
            let class = class_name(*ps);
            let u = used.get(&class).copied().unwrap_or(0);
            (class, inventory(*ps, *f, u))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn capacity(inv: Inventory, used: u64) -> i64 {
        inv.offered() as i64 - used as i64
    }

    #[test]
    fn back_to_back_allocations_never_share_warm_memory() {
        let ps = PageSize::Size2M;
        let f = Figures {
            warm: 8 * G,
            leased: 0,
            target: 8 * G,
            largest_node_warm: 8 * G,
        };
        // Published before any VM: 8 GiB offered.
        let inv = inventory(ps, f, 0);
        assert_eq!((inv.total, inv.reserved), (8192, 0));
        // Two 4 GiB VMs scheduled before either leases: the inventory Placement holds is
        // still the one above; its capacity falls with each allocation.
        assert_eq!(capacity(inv, 4096), 4096);
        assert_eq!(capacity(inv, 8192), 0);
        // The first leases: warm falls, leased rises, capacity stays exact whether the
        // publisher has caught up or not.
        let leased = Figures {
            warm: 4 * G,
            leased: 4 * G,
            largest_node_warm: 4 * G,
            ..f
        };
        assert_eq!(capacity(inventory(ps, leased, 8192), 8192), 0);
        // Both leased: nothing offered, nothing counted twice.
        let both = Figures {
            warm: 0,
            leased: 8 * G,
            largest_node_warm: 0,
            ..f
        };
        let inv = inventory(ps, both, 8192);
        assert_eq!((inv.total, inv.reserved), (8192, 0));
        assert_eq!(capacity(inv, 8192), 0);
    }

    #[test]
    fn leases_without_allocations_offer_nothing_and_an_empty_pool_reserves_all() {
        let ps = PageSize::Size2M;
        // 4 GiB leased by a VM Nova did not schedule: only the warm memory is offered.
        let f = Figures {
            warm: 2 * G,
            leased: 4 * G,
            target: 2 * G,
            largest_node_warm: 2 * G,
        };
        let inv = inventory(ps, f, 0);
        assert_eq!(capacity(inv, 0), 2048);
        // Nothing warm, no target: one page of total, all reserved (Placement needs total >= 1).
        let inv = inventory(ps, Figures::default(), 0);
        assert_eq!((inv.total, inv.reserved, inv.step), (2, 2, 2));
        assert_eq!(capacity(inv, 0), 0);
        // 1 GiB pages: whole GiB units.
        let inv = inventory(
            PageSize::Size1G,
            Figures {
                warm: 3 * G,
                leased: 0,
                target: 4 * G,
                largest_node_warm: 3 * G,
            },
            0,
        );
        assert_eq!((inv.total, inv.reserved, inv.step), (4096, 1024, 1024));
        assert_eq!(class_name(PageSize::Size1G), "CUSTOM_HUGEPREP_WARM_1G");
    }

    #[test]
    fn max_unit_is_the_largest_nodes_warm_memory_not_the_sum() {
        let ps = PageSize::Size2M;
        // 8 GiB warm on node 0, 6 GiB on node 1: 14 GiB offered, at most 8 GiB to one VM.
        let f = Figures {
            warm: 14 * G,
            leased: 0,
            target: 16 * G,
            largest_node_warm: 8 * G,
        };
        let inv = inventory(ps, f, 0);
        assert_eq!((inv.total, inv.reserved, inv.max_unit), (16384, 2048, 8192));
        assert_eq!(inv.json()["max_unit"], 8192);
        // Nothing warm: one page (Placement needs max_unit >= min_unit), all reserved.
        let inv = inventory(
            ps,
            Figures {
                largest_node_warm: 0,
                warm: 0,
                ..f
            },
            0,
        );
        assert_eq!((inv.max_unit, inv.offered()), (2, 0));
        // 1 GiB pages: whole pages, never above total.
        let inv = inventory(
            PageSize::Size1G,
            Figures {
                warm: 3 * G,
                leased: 0,
                target: 0,
                largest_node_warm: 3 * G,
            },
            0,
        );
        assert_eq!((inv.total, inv.max_unit), (3072, 3072));
    }
}
