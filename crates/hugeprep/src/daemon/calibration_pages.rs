//! Hugepages for the start-up calibration. On a fresh host the kernel's pool is empty until
//! the daemon raises it for its warm target, so a calibration run before that raise would time
//! the clearing methods on ordinary memory, which the daemon never scrubs. When the daemon is
//! going to raise the pool anyway, it raises the part the calibration buffer needs first
//! (recorded in the reservation ledger like every raise), times the methods on those pages,
//! and leaves them free in the pool: the refill worker finds them there and raises only the
//! rest, so the ledger ends at the same count as without calibration.
//!
//! The buffer is on the page size the daemon scrubs: 2M pages, or 1G pages for a daemon that
//! serves only 1G pages (one 1G page holds the whole buffer). Where that page size cannot be
//! had, [`provide`] says why, and the calibration says so in its record and the log.

use crate::clear::CALIBRATION_BUFFER;
use crate::hugetlb::pool as kpool;
use crate::page_size::PageSize;
use crate::pool::reserve::{self, Reservations};
use crate::pool::PoolPolicy;
use crate::topology::Topology;

/// Where a calibration may get its hugepages from.
#[derive(Debug, Clone, Copy)]
pub enum PagesFrom<'a> {
    /// Only 2M pages already free in the kernel's pool (`hugeprep cpu`).
    Kernel,
    /// Also pages the daemon is about to add for its warm target under `policy`, recorded in
    /// the ledger of `state_dir`.
    Daemon {
        /// The pool policy the daemon starts with (targets and reserve limits).
        policy: &'a PoolPolicy,
        /// The page size the daemon scrubs: 1G for a daemon that serves only 1G pages.
        page_size: PageSize,
    },
}

impl PagesFrom<'_> {
    /// The page size to calibrate on.
    pub fn page_size(&self) -> PageSize {
        match self {
            PagesFrom::Kernel => PageSize::Size2M,
            PagesFrom::Daemon { page_size, .. } => *page_size,
        }
    }
}

/// What [`provide`] did for one calibration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provided {
    /// Pages the daemon added to the kernel's pool (and its ledger) for the calibration.
    pub raised: u64,
    /// Why the buffer cannot be on pages of the size asked for, when it cannot: the
    /// calibration then times what there is and says this.
    pub why_not: Option<String>,
}

fn buffer_pages(ps: PageSize) -> u64 {
    (CALIBRATION_BUFFER as u64).div_ceil(ps.bytes())
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

/// How many pages of `ps` the daemon would add to `node`'s pool for its target and may add
/// now for the calibration: the buffer's shortfall, when the target needs at least that many
/// pages that are not free and the policy's limits allow all of them; otherwise 0 (a raise
/// the target would not make would outlive the calibration in the ledger), with the reason.
fn pages_to_raise(
    policy: &PoolPolicy,
    node: u32,
    ps: PageSize,
    free: u64,
    added_on_node: u64,
) -> Result<u64, String> {
    let want = buffer_pages(ps);
    if free >= want {
        return Ok(0);
    }
    if !policy.reserve.enabled {
        return Err(format!(
            "no free {ps} page for the calibration buffer, and the daemon raises no pool \
             (reserve = false)"
        ));
    }
    let short = want - free;
    let target_pages = policy.target_bytes(node, ps) / ps.bytes();
    if target_pages.saturating_sub(free) < short {
        return Err(format!(
            "no free {ps} page for the calibration buffer, and the warm target on node {node} \
             raises none"
        ));
    }
    let available = crate::topology::node_available_bytes(node).unwrap_or(0);
    let (pages, limit) = reserve::plan(short, ps, &policy.reserve, added_on_node, available);
    if pages < short {
        let why = limit.map_or_else(String::new, |l| format!(": {}", l.explain(node, ps, short)));
        Err(format!(
            "no free {ps} page for the calibration buffer, and the reserve policy allows no \
             raise{why}"
        ))
    } else {
        Ok(pages)
    }
}

/// Whether a calibration now would run on hugepages of the size asked for: enough free
/// pages, or a daemon that will add them for its target. A stored calibration timed on other
/// memory is measured again when this holds.
pub fn hugepages_obtainable(from: PagesFrom<'_>) -> bool {
    let Some(node) = local_node() else {
        return false;
    };
    let ps = from.page_size();
    let free = kpool::available(Some(node), ps).unwrap_or(0);
    match from {
        PagesFrom::Kernel => free >= buffer_pages(ps),
        PagesFrom::Daemon { policy, .. } => {
            free >= buffer_pages(ps)
                || pages_to_raise(policy, node, ps, free, 0).is_ok_and(|p| p > 0)
        }
    }
}

/// Adds to the local node's pool the pages the calibration buffer lacks, when the daemon
/// would add them for its warm target anyway (see the module documentation). Failures are
/// logged: the calibration then runs on what there is.
pub fn provide(state_dir: &std::path::Path, from: PagesFrom<'_>) -> Provided {
    let PagesFrom::Daemon { policy, page_size } = from else {
        return Provided::default();
    };
    let ps = page_size;
    let Some(node) = local_node() else {
        return Provided::default();
    };
    let free = kpool::available(Some(node), ps).unwrap_or(0);
    if free >= buffer_pages(ps) {
        return Provided::default();
    }
    let reservations = match Reservations::open(state_dir) {
        Ok(r) => r,
        Err(err) => {
            tracing::warn!(%err, "calibration: cannot open the reservation ledger; timing on what the kernel has");
            return Provided {
                raised: 0,
                why_not: Some(format!("cannot open the reservation ledger: {err}")),
            };
        }
    };
    let pages = match pages_to_raise(policy, node, ps, free, reservations.added_bytes_on(node)) {
        Ok(0) => return Provided::default(),
        Ok(pages) => pages,
        Err(why) => {
            return Provided {
                raised: 0,
                why_not: Some(why),
            }
        }
    };
    let available = crate::topology::node_available_bytes(node).unwrap_or(0);
    let pull_in = reserve::pull_in_bytes(&policy.reserve, available);
    match reservations.raise(node, ps, pages, pull_in) {
        Ok(raise) => {
            tracing::info!(
                node,
                page_size = %ps,
                added = raise.added,
                asked = raise.asked,
                "calibration: raised the kernel's pool for the warm target first, to time the clearing methods on hugepages"
            );
            let why_not = (raise.added < pages).then(|| {
                format!(
                    "the kernel added {} of the {pages} {ps} pages the calibration buffer needs \
                     (memory short or fragmented)",
                    raise.added
                )
            });
            Provided {
                raised: raise.added,
                why_not,
            }
        }
        Err(err) => {
            tracing::warn!(%err, node, "calibration: raising the kernel's pool failed; timing on what the kernel has");
            Provided {
                raised: 0,
                why_not: Some(format!("raising the kernel's {ps} pool failed: {err}")),
            }
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
        let m2 = PageSize::Size2M;
        let pages = pages_to_raise(&four_g, 0, m2, 0, 0);
        assert!(matches!(pages, Ok(64) | Err(_)), "{pages:?}");
        // Enough free already: nothing.
        assert_eq!(pages_to_raise(&four_g, 0, m2, 64, 0), Ok(0));
        // A target smaller than the buffer: the worker would never raise that many.
        let small = policy("[[target]]\npage_size = \"2M\"\nwarm = \"64M\"\n");
        let why = pages_to_raise(&small, 0, m2, 0, 0).unwrap_err();
        assert!(why.contains("warm target on node 0 raises none"), "{why}");
        let off = policy("reserve = false\n[[target]]\npage_size = \"2M\"\nwarm = \"4G\"\n");
        let why = pages_to_raise(&off, 0, m2, 0, 0).unwrap_err();
        assert!(why.contains("reserve = false"), "{why}");
        // A limit smaller than the buffer's shortfall: no partial raise.
        let capped =
            policy("reserve_limit = \"32M\"\n[[target]]\npage_size = \"2M\"\nwarm = \"4G\"\n");
        let why = pages_to_raise(&capped, 0, m2, 0, 0).unwrap_err();
        assert!(why.contains("reserve_limit"), "{why}");
    }

    #[test]
    fn one_gig_pages_need_one_page_for_the_buffer() {
        let g1 = PageSize::Size1G;
        assert_eq!(buffer_pages(g1), 1);
        let target =
            policy("reserve_margin = \"0\"\n[[target]]\npage_size = \"1G\"\nwarm = \"2G\"\n");
        assert_eq!(pages_to_raise(&target, 0, g1, 1, 0), Ok(0));
        assert!(matches!(
            pages_to_raise(&target, 0, g1, 0, 0),
            Ok(1) | Err(_)
        ));
        // A 1G-only daemon with no 1G target and nothing free: it says why.
        let none = policy("");
        let why = pages_to_raise(&none, 0, g1, 0, 0).unwrap_err();
        assert!(why.contains("no free 1G page"), "{why}");
    }
}
