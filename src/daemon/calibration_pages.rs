//! Hugepages for the start-up calibration. On a fresh host the kernel's 2M pool is empty until
//! the daemon raises it for its warm target, so a calibration run before that raise would time
//! the clearing methods on ordinary memory, which the daemon never scrubs. When the daemon is
//! going to raise the pool anyway, it raises the part the calibration buffer needs first
//! (recorded in the reservation ledger like every raise), times the methods on those pages,
//! and leaves them free in the pool: the refill worker finds them there and raises only the
//! rest, so the ledger ends at the same count as without calibration.

use crate::clear::CALIBRATION_BUFFER;
use crate::hugetlb::pool as kpool;
use crate::page_size::PageSize;
use crate::pool::reserve::{self, Reservations};
use crate::pool::PoolPolicy;
use crate::topology::Topology;

/// Where a calibration may get its hugepages from.
#[derive(Debug, Clone, Copy)]
pub enum PagesFrom<'a> {
    /// Only pages already free in the kernel's pool (`hugeprep cpu`).
    Kernel,
    /// Also pages the daemon is about to add for its warm target under `policy`, recorded in
    /// the ledger of `state_dir`.
    Daemon {
        /// The pool policy the daemon starts with (targets and reserve limits).
        policy: &'a PoolPolicy,
    },
}

/// What [`provide`] did for one calibration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Provided {
    /// 2M pages the daemon added to the kernel's pool (and its ledger) for the calibration.
    pub raised: u64,
}

const PAGE: PageSize = PageSize::Size2M;

fn buffer_pages() -> u64 {
    (CALIBRATION_BUFFER as u64).div_ceil(PAGE.bytes())
}

/// The node the calibrating thread runs on: an anonymous hugetlb mapping takes its pages from
/// the local node first.
fn local_node() -> Option<u32> {
    let topology = Topology::detect().ok()?;
    let cpu = nix::sched::sched_getcpu().ok()?;
    let ids = topology.node_ids();
    ids.iter()
        .copied()
        .find(|&n| topology.node(n).is_ok_and(|node| node.cpus.contains(&cpu)))
        .or_else(|| ids.first().copied())
}

/// How many pages the daemon would add to `node`'s 2M pool for its target and may add now
/// for the calibration: the buffer's shortfall, when the target needs at least that many
/// pages that are not free and the policy's limits allow all of them; otherwise 0 (a raise
/// the target would not make would outlive the calibration in the ledger).
fn pages_to_raise(policy: &PoolPolicy, node: u32, free: u64, added_on_node: u64) -> u64 {
    let want = buffer_pages();
    if free >= want || !policy.reserve.enabled {
        return 0;
    }
    let short = want - free;
    let target_pages = policy.target_bytes(node, PAGE) / PAGE.bytes();
    if target_pages.saturating_sub(free) < short {
        return 0;
    }
    let available = crate::topology::node_available_bytes(node).unwrap_or(0);
    let (pages, _) = reserve::plan(short, PAGE, &policy.reserve, added_on_node, available);
    if pages < short {
        0
    } else {
        pages
    }
}

/// Whether a calibration now would run on hugepages: enough free 2M pages, or a daemon that
/// will add them for its target. A stored calibration timed on ordinary memory is measured
/// again when this holds.
pub fn hugepages_obtainable(from: PagesFrom<'_>) -> bool {
    let Some(node) = local_node() else {
        return false;
    };
    let free = kpool::available(Some(node), PAGE).unwrap_or(0);
    match from {
        PagesFrom::Kernel => free >= buffer_pages(),
        PagesFrom::Daemon { policy } => {
            free >= buffer_pages() || pages_to_raise(policy, node, free, 0) > 0
        }
    }
}

/// Adds to the local node's 2M pool the pages the calibration buffer lacks, when the daemon
/// would add them for its warm target anyway (see the module documentation). Failures are
/// logged: the calibration then runs on what there is.
pub fn provide(state_dir: &std::path::Path, from: PagesFrom<'_>) -> Provided {
    let PagesFrom::Daemon { policy } = from else {
        return Provided::default();
    };
    let Some(node) = local_node() else {
        return Provided::default();
    };
    let free = kpool::available(Some(node), PAGE).unwrap_or(0);
    if free >= buffer_pages() {
        return Provided::default();
    }
    let reservations = match Reservations::open(state_dir) {
        Ok(r) => r,
        Err(err) => {
            tracing::warn!(%err, "calibration: cannot open the reservation ledger; timing on what the kernel has");
            return Provided::default();
        }
    };
    let pages = pages_to_raise(policy, node, free, reservations.added_bytes_on(node));
    if pages == 0 {
        return Provided::default();
    }
    match reservations.raise(node, PAGE, pages) {
        Ok(raise) => {
            tracing::info!(
                node,
                added = raise.added,
                asked = raise.asked,
                "calibration: raised the kernel's 2M pool for the warm target first, to time the clearing methods on hugepages"
            );
            Provided {
                raised: raise.added,
            }
        }
        Err(err) => {
            tracing::warn!(%err, node, "calibration: raising the kernel's 2M pool failed; timing on what the kernel has");
            Provided::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> PoolPolicy {
        PoolPolicy::from_toml(text).unwrap()
    }

    #[test]
    fn raises_only_what_the_target_would_raise_anyway() {
        let four_g =
            policy("reserve_margin = \"0\"\n[[target]]\npage_size = \"2M\"\nwarm = \"4G\"\n");
        // Nothing free, a 4 GiB target: the buffer's 64 pages (bounded only by memory).
        let pages = pages_to_raise(&four_g, 0, 0, 0);
        assert!(pages == 64 || pages == 0, "{pages}");
        // Enough free already: nothing.
        assert_eq!(pages_to_raise(&four_g, 0, 64, 0), 0);
        // A target smaller than the buffer: the worker would never raise that many.
        let small = policy("[[target]]\npage_size = \"2M\"\nwarm = \"64M\"\n");
        assert_eq!(pages_to_raise(&small, 0, 0, 0), 0);
        let off = policy("reserve = false\n[[target]]\npage_size = \"2M\"\nwarm = \"4G\"\n");
        assert_eq!(pages_to_raise(&off, 0, 0, 0), 0);
        // A limit smaller than the buffer's shortfall: no partial raise.
        let capped =
            policy("reserve_limit = \"32M\"\n[[target]]\npage_size = \"2M\"\nwarm = \"4G\"\n");
        assert_eq!(pages_to_raise(&capped, 0, 0, 0), 0);
    }
}
