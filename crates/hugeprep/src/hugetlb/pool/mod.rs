//! The kernel's hugepage pools, per NUMA node and page size, through sysfs:
//! `/sys/devices/system/node/nodeN/hugepages/hugepages-<kB>kB/` for a node and
//! `/sys/kernel/mm/hugepages/hugepages-<kB>kB/` for the whole machine.
//!
//! Reading gives total, free and surplus pages; the reserved count (pages promised to a
//! mapping but not yet faulted) exists only system-wide, so a node's reading has
//! `reserved: None`. Setting a pool never lowers it below what is in use
//! (`total - free + reserved`), and raising it reports how many pages the kernel really
//! gave: 1 GiB pages need 1 GiB of contiguous free memory, which fragments soon after boot.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::page_size::PageSize;
use crate::topology::{Topology, TopologyError};

mod top_up;
pub use top_up::{pull_in, PoolTopUp, PullIn};

/// Machine-wide pools.
pub const SYSTEM_ROOT: &str = "/sys/kernel/mm/hugepages";
/// Per-node pools live under `nodeN/hugepages/` here.
pub const NODE_ROOT: &str = "/sys/devices/system/node";

/// Which pool: one NUMA node's, or the whole machine's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The machine-wide counters (the sum over nodes, plus `resv_hugepages`).
    System,
    /// One node's counters.
    Node(u32),
}

impl Scope {
    /// `Scope::Node(n)` for `Some(n)`, `Scope::System` for `None`.
    pub fn from_node(node: Option<u32>) -> Scope {
        node.map_or(Scope::System, Scope::Node)
    }

    /// The node, if this is a node's pool.
    pub fn node(self) -> Option<u32> {
        match self {
            Scope::System => None,
            Scope::Node(n) => Some(n),
        }
    }

    /// The sysfs directory of this scope's pool of `page_size`.
    pub fn dir(self, page_size: PageSize) -> PathBuf {
        match self {
            Scope::System => Path::new(SYSTEM_ROOT).join(page_size.sysfs_dir()),
            Scope::Node(n) => Path::new(NODE_ROOT)
                .join(format!("node{n}/hugepages"))
                .join(page_size.sysfs_dir()),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::System => f.write_str("system"),
            Scope::Node(n) => write!(f, "node {n}"),
        }
    }
}

/// Errors reading or resizing a hugepage pool; each names the pool and the sysfs file.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The kernel has no pool of this page size (not configured, or not x86-64 sizes).
    #[error("{scope}: no {page_size} hugepage pool on this kernel ({path} is missing)")]
    Unsupported {
        /// The pool's scope.
        scope: Scope,
        /// The page size asked for.
        page_size: PageSize,
        /// The directory that does not exist.
        path: PathBuf,
    },
    /// A counter could not be read.
    #[error("{scope} {page_size}: reading {path}: {source}")]
    Read {
        /// The pool's scope.
        scope: Scope,
        /// The pool's page size.
        page_size: PageSize,
        /// The counter file.
        path: PathBuf,
        /// The kernel's answer.
        source: io::Error,
    },
    /// A counter did not hold a number.
    #[error("{path}: expected a page count, found {text:?}")]
    Parse {
        /// The counter file.
        path: PathBuf,
        /// What it held.
        text: String,
    },
    /// Writing `nr_hugepages` failed and the pool did not change.
    #[error("{scope} {page_size}: setting {path} to {value}: {source}")]
    Write {
        /// The pool's scope.
        scope: Scope,
        /// The pool's page size.
        page_size: PageSize,
        /// The `nr_hugepages` file.
        path: PathBuf,
        /// The value written.
        value: u64,
        /// The kernel's answer.
        source: io::Error,
    },
    /// The kernel could not supply enough free pages.
    #[error(
        "{scope}: {wanted} free {page_size} pages needed, only {free} available after raising \
         {path} (the kernel could not allocate more: memory is short or fragmented{why})"
    )]
    Insufficient {
        /// The pool's scope.
        scope: Scope,
        /// The page size.
        page_size: PageSize,
        /// Free pages needed.
        wanted: u64,
        /// Free pages there are.
        free: u64,
        /// The `nr_hugepages` file.
        path: PathBuf,
        /// For 1 GiB pages, what rules out every aligned GiB (": ..."; see
        /// [`crate::hugetlb::contig`]); empty for 2 MiB pages.
        why: String,
    },
    /// The NUMA topology could not be read or has no such node.
    #[error(transparent)]
    Topology(#[from] TopologyError),
}

/// Result of pool operations.
pub type Result<T> = std::result::Result<T, PoolError>;

/// One pool's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PoolCounts {
    /// Whose pool.
    pub scope: Scope,
    /// Page size.
    pub page_size: PageSize,
    /// Pages in the pool (`nr_hugepages`), surplus included.
    pub total: u64,
    /// Pages not faulted into any mapping (`free_hugepages`); reserved pages count as free.
    pub free: u64,
    /// Pages above `nr_overcommit` accounting (`surplus_hugepages`).
    pub surplus: u64,
    /// Pages promised to mappings but not yet faulted (`resv_hugepages`). The kernel keeps
    /// this only system-wide: `None` for a node.
    pub reserved: Option<u64>,
    /// How many surplus pages may be allocated on demand (`nr_overcommit_hugepages`);
    /// system-wide only.
    pub overcommit: Option<u64>,
}

impl PoolCounts {
    /// Pages in use or promised: the floor below which the pool is never lowered. For a
    /// node, reservations are unknown (system-wide only) and counted as 0.
    pub fn in_use(&self) -> u64 {
        (self.total.saturating_sub(self.free) + self.reserved.unwrap_or(0)).min(self.total)
    }

    /// Free pages nobody has reserved.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved.unwrap_or(0))
    }

    /// Pool size in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.total * self.page_size.bytes()
    }

    /// Pages given back to the kernel between `before` and these counts (of the same
    /// pool): a freed page returns to the free list, or, when the pool was lowered below
    /// what was in use meanwhile, it was surplus and goes back to the buddy allocator, so
    /// the total drops instead of the free count rising.
    ///
    /// ```
    /// use hugeprep::hugetlb::pool::{PoolCounts, Scope};
    /// use hugeprep::page_size::PageSize;
    /// let at = |total, free, surplus| PoolCounts {
    ///     scope: Scope::Node(0), page_size: PageSize::Size2M,
    ///     total, free, surplus, reserved: None, overcommit: None,
    /// };
    /// // 8 pages in use, 2 free; the pool lowered by 4 makes 4 in-use pages surplus.
    /// let before = at(10, 2, 0);
    /// let lowered = at(8, 0, 2);
    /// // The 8 pages freed: 2 surplus left the pool, 6 joined the free list.
    /// assert_eq!(at(6, 6, 0).returned_since(&lowered), 8);
    /// assert_eq!(at(10, 10, 0).returned_since(&before), 8);
    /// ```
    pub fn returned_since(&self, before: &PoolCounts) -> u64 {
        self.free.saturating_sub(before.free) + before.total.saturating_sub(self.total)
    }
}

/// The outcome of setting a pool's size: what was asked, what the kernel gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Resize {
    /// Whose pool.
    pub scope: Scope,
    /// Page size.
    pub page_size: PageSize,
    /// Pages asked for.
    pub requested: u64,
    /// The in-use floor at the time (requests below it are raised to it).
    pub floor: u64,
    /// Pages before.
    pub before: u64,
    /// Pages after: fewer than asked when the kernel could not allocate more.
    pub after: u64,
}

impl Resize {
    /// The target actually written: the request, raised to the in-use floor.
    pub fn target(&self) -> u64 {
        self.requested.max(self.floor)
    }

    /// Whether the pool reached the target.
    pub fn complete(&self) -> bool {
        self.after == self.target()
    }

    /// Pages the kernel could not supply (0 when complete or shrinking).
    pub fn shortfall(&self) -> u64 {
        self.target().saturating_sub(self.after)
    }
}

/// The page sizes this kernel has pools for, smallest first.
pub fn page_sizes() -> Vec<PageSize> {
    PageSize::ALL
        .into_iter()
        .filter(|p| Scope::System.dir(*p).is_dir())
        .collect()
}

fn counter_path(scope: Scope, page_size: PageSize, name: &str) -> Result<PathBuf> {
    let dir = scope.dir(page_size);
    if !dir.is_dir() {
        return Err(PoolError::Unsupported {
            scope,
            page_size,
            path: dir,
        });
    }
    Ok(dir.join(name))
}

fn read_counter(scope: Scope, page_size: PageSize, name: &str) -> Result<u64> {
    let path = counter_path(scope, page_size, name)?;
    let text = fs::read_to_string(&path).map_err(|source| PoolError::Read {
        scope,
        page_size,
        path: path.clone(),
        source,
    })?;
    text.trim().parse().map_err(|_| PoolError::Parse {
        path,
        text: text.trim().to_string(),
    })
}

/// Reads one pool. For a node that does not exist the error lists the nodes that do.
///
/// ```
/// use hugeprep::hugetlb::pool::{self, Scope};
/// use hugeprep::PageSize;
/// let system = pool::read(Scope::System, PageSize::Size2M).unwrap();
/// assert!(system.free <= system.total);
/// ```
pub fn read(scope: Scope, page_size: PageSize) -> Result<PoolCounts> {
    if let Scope::Node(n) = scope {
        if !Path::new(NODE_ROOT).join(format!("node{n}")).is_dir() {
            Topology::detect()?.node(n)?;
        }
    }
    let (reserved, overcommit) = match scope {
        Scope::System => (
            Some(read_counter(scope, page_size, "resv_hugepages")?),
            Some(read_counter(scope, page_size, "nr_overcommit_hugepages")?),
        ),
        Scope::Node(_) => (None, None),
    };
    Ok(PoolCounts {
        scope,
        page_size,
        total: read_counter(scope, page_size, "nr_hugepages")?,
        free: read_counter(scope, page_size, "free_hugepages")?,
        surplus: read_counter(scope, page_size, "surplus_hugepages")?,
        reserved,
        overcommit,
    })
}

/// Every pool: the system-wide ones, then each online node's, for every page size the kernel
/// has.
pub fn read_all() -> Result<Vec<PoolCounts>> {
    let sizes = page_sizes();
    let mut out = Vec::new();
    for &size in &sizes {
        out.push(read(Scope::System, size)?);
    }
    for node in Topology::detect()?.node_ids() {
        for &size in &sizes {
            out.push(read(Scope::Node(node), size)?);
        }
    }
    Ok(out)
}

/// Free, unreserved pages of `page_size` that a new mapping bound to `node` (or anywhere,
/// for `None`) can get. Reservations are system-wide, so a node's figure is its free count
/// capped by the machine's unreserved count.
pub fn available(node: Option<u32>, page_size: PageSize) -> Result<u64> {
    let (system, node_free) = available_parts(node, page_size)?;
    Ok(node_capped(system, node_free))
}

/// What [`available`] is made of: the machine's free unreserved pages, and `node`'s free
/// pages (`None` for no node).
pub fn available_parts(node: Option<u32>, page_size: PageSize) -> Result<(u64, Option<u64>)> {
    let system = read(Scope::System, page_size)?.available();
    let node_free = node
        .map(|n| read(Scope::Node(n), page_size).map(|c| c.free))
        .transpose()?;
    Ok((system, node_free))
}

/// The rule of [`available`]: a node's free pages, capped by the machine's unreserved ones
/// (reservations are system-wide); the machine's alone for no node.
pub fn node_capped(system_unreserved: u64, node_free: Option<u64>) -> u64 {
    node_free.map_or(system_unreserved, |n| n.min(system_unreserved))
}

/// The lowest size the pool may be set to: pages in use plus, for a node, as many of the
/// machine's reservations as could sit on it (they are not tracked per node, so assume the
/// worst).
fn floor(counts: &PoolCounts, page_size: PageSize) -> Result<u64> {
    let reserved = match counts.reserved {
        Some(r) => r,
        None => read(Scope::System, page_size)?
            .reserved
            .unwrap_or(0)
            .min(counts.free),
    };
    Ok((counts.total.saturating_sub(counts.free) + reserved).min(counts.total))
}

/// Sets a pool to `pages` pages (`nr_hugepages`), never below what is in use, and reports
/// what the kernel gave. A raise the kernel can only partly satisfy is not an error: check
/// [`Resize::complete`] or [`Resize::shortfall`].
pub fn set_pages(scope: Scope, page_size: PageSize, pages: u64) -> Result<Resize> {
    let counts = read(scope, page_size)?;
    let floor = floor(&counts, page_size)?;
    let target = pages.max(floor);
    let path = counter_path(scope, page_size, "nr_hugepages")?;
    let written = if target == counts.total {
        Ok(())
    } else {
        fs::write(&path, target.to_string())
    };
    let after = read_counter(scope, page_size, "nr_hugepages")?;
    super::ledger::record(
        page_size,
        own_change(counts.total, target, after),
        &scope.to_string(),
    );
    if let Err(source) = written {
        // A partial raise can still report an error (ENOMEM); what counts is the result.
        if after == counts.total {
            return Err(PoolError::Write {
                scope,
                page_size,
                path,
                value: target,
                source,
            });
        }
    }
    Ok(Resize {
        scope,
        page_size,
        requested: pages,
        floor,
        before: counts.total,
        after,
    })
}

/// The part of a pool's move from `before` to `after` that our write of `target` made: other
/// processes may change the pool between our read and our write, and what they did is theirs.
fn own_change(before: u64, target: u64, after: u64) -> i64 {
    let (before, target, after) = (before as i64, target as i64, after as i64);
    if target >= before {
        after.clamp(before, target) - before
    } else {
        after.clamp(target, before) - before
    }
}

/// ": " and what keeps the kernel from assembling pages of a gigantic `page_size` (read only
/// on this failure path: it scans /proc/kpageflags), or nothing.
fn gigantic_cause(page_size: PageSize) -> String {
    if page_size == PageSize::Size2M {
        return String::new();
    }
    crate::hugetlb::contig::Census::take(page_size)
        .map(|c| format!(": {}", c.cause()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_change_leaves_others_changes_out() {
        // raised 10 -> 15, the kernel gave 3
        assert_eq!(own_change(10, 15, 13), 3);
        // raised 10 -> 15 while another process added 4 more between read and write
        assert_eq!(own_change(10, 15, 19), 5);
        // lowered 10 -> 4, pages in use kept it at 6
        assert_eq!(own_change(10, 4, 6), -4);
        // lowered 10 -> 4 while another process lowered to 2
        assert_eq!(own_change(10, 4, 2), -6);
        assert_eq!(own_change(10, 10, 12), 0);
    }

    #[test]
    fn scopes_name_their_sysfs_directories() {
        assert_eq!(
            Scope::Node(3).dir(PageSize::Size2M),
            PathBuf::from("/sys/devices/system/node/node3/hugepages/hugepages-2048kB")
        );
        assert_eq!(
            Scope::System.dir(PageSize::Size1G),
            PathBuf::from("/sys/kernel/mm/hugepages/hugepages-1048576kB")
        );
        assert_eq!(Scope::Node(1).to_string(), "node 1");
    }

    #[test]
    fn in_use_counts_reservations_and_resize_reports_shortfall() {
        let c = PoolCounts {
            scope: Scope::System,
            page_size: PageSize::Size2M,
            total: 10,
            free: 6,
            surplus: 0,
            reserved: Some(2),
            overcommit: Some(0),
        };
        assert_eq!(c.in_use(), 6);
        assert_eq!(c.available(), 4);
        let r = Resize {
            scope: Scope::System,
            page_size: PageSize::Size1G,
            requested: 4,
            floor: 1,
            before: 1,
            after: 3,
        };
        assert!(!r.complete());
        assert_eq!(r.shortfall(), 1);
    }

    #[test]
    fn a_missing_node_lists_the_online_ones() {
        let err = read(Scope::Node(999), PageSize::Size2M).unwrap_err();
        assert!(err.to_string().contains("node 999"), "{err}");
    }
}
