//! Raising the kernel's hugepage pools for the warm targets, and giving back exactly what was
//! raised.
//!
//! When a node's kernel pool cannot cover its target, the worker raises that node's
//! `nr_hugepages` (the per-node sysfs file) by the shortfall, bounded by the policy's limit
//! and by the node's available memory minus a margin. Every page the kernel really added is
//! recorded in a ledger in the state directory (`<state>/reservations/`, one journal record
//! per node and page size), so that after a restart or a crash `hugeprep drain
//! --release-pools` (or a stop with `release_on_stop`) lowers the pool by exactly that, never
//! touching pages someone else added. The sysfs write comes before the ledger write: a crash
//! in between leaves those pages in the pool, unrecorded, rather than ever lowering a pool
//! by pages hugeprep did not add.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::host::{KernelPools, RealPools};
use crate::hugetlb::pool as kpool;
use crate::journal::JournalError;
use crate::page_size::PageSize;
use crate::policy::pool::ReservePolicy;
use crate::units::format_bytes;

/// The ledger's directory under the state directory.
pub const LEDGER_DIR: &str = "reservations";

/// One ledger record: pages hugeprep added to a node's pool of one page size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reserved {
    /// Node.
    pub node: u32,
    /// Page size.
    pub page_size: PageSize,
    /// Pages added and not given back yet.
    pub pages: u64,
}

/// Errors of the ledger and of resizing a pool.
#[derive(Debug, thiserror::Error)]
pub enum ReserveError {
    /// The ledger could not be written or read.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The kernel's pool could not be read or written.
    #[error(transparent)]
    Pool(#[from] kpool::PoolError),
}

/// What limits a raise (when something does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Reserving is off (`reserve = false`).
    Disabled,
    /// The policy's `reserve_limit` for the node is used up.
    Cap {
        /// The limit in bytes.
        limit: u64,
    },
    /// The node's available memory minus the margin.
    Memory {
        /// Bytes available on the node.
        available: u64,
        /// Bytes kept back.
        margin: u64,
    },
}

/// How many pages to add to cover `need` pages: the need, bounded by the policy's limit (minus
/// what hugeprep already added to the node, in bytes over every page size) and by the node's
/// available memory minus the margin. Returns the pages and what bounded them, if anything did.
pub fn plan(
    need: u64,
    page_size: PageSize,
    policy: &ReservePolicy,
    added_on_node: u64,
    available: u64,
) -> (u64, Option<Limit>) {
    if !policy.enabled {
        return (0, Some(Limit::Disabled));
    }
    let page = page_size.bytes();
    let mut pages = need;
    let mut limit = None;
    if let Some(cap) = policy.limit {
        let room = cap.saturating_sub(added_on_node) / page;
        if room < pages {
            pages = room;
            limit = Some(Limit::Cap { limit: cap });
        }
    }
    let room = available.saturating_sub(policy.margin) / page;
    if room < pages {
        pages = room;
        limit = Some(Limit::Memory {
            available,
            margin: policy.margin,
        });
    }
    (pages, limit)
}

impl Limit {
    /// Why the target cannot be met, for the log, `GET /v1/pool` and `hugeprep status`.
    pub fn explain(&self, node: u32, page_size: PageSize, short: u64) -> String {
        match self {
            Limit::Disabled => format!(
                "kernel pool short by {short} {page_size} pages on node {node}; reserve disabled \
                 (raise it: hugeprep pool --set N --node {node} --page-size {page_size}, or set \
                 reserve = true in /etc/hugeprep/hugeprep.toml and systemctl reload hugeprep)"
            ),
            Limit::Cap { limit } => format!(
                "kernel pool short by {short} {page_size} pages on node {node}; reserve_limit of \
                 {} reached on the node (raise reserve_limit in /etc/hugeprep/hugeprep.toml, then \
                 systemctl reload hugeprep)",
                format_bytes(*limit)
            ),
            Limit::Memory { available, margin } => format!(
                "kernel pool short by {short} {page_size} pages on node {node}; node {node} has \
                 {} available and keeps {} (reserve_margin) for the host (lower the target or \
                 free memory)",
                format_bytes(*available),
                format_bytes(*margin)
            ),
        }
    }
}

/// The outcome of raising one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Raise {
    /// Pages asked of the kernel.
    pub asked: u64,
    /// Pages the kernel added.
    pub added: u64,
    /// The pull-in of lazily initialised memory between a first ask that fell short and the
    /// second, if there was one ([`kpool::pull_in`]).
    pub pulled_in: Option<kpool::PullIn>,
    /// Compactions of the node's memory between asks that fell short
    /// ([`Reservations::raise_compacting`]).
    pub compactions: u32,
}

/// Compacts `node`'s memory: the kernel moves movable pages (page cache, anonymous memory)
/// together so that free memory forms whole hugepages. The node's own `compact` file
/// (writable under the packaged unit, which lets the daemon write the per-node pools), else
/// the whole machine's `/proc/sys/vm/compact_memory`. Returns how long it took.
pub fn compact_node(node: u32) -> std::io::Result<std::time::Duration> {
    let started = std::time::Instant::now();
    let per_node = format!("/sys/devices/system/node/node{node}/compact");
    match std::fs::write(&per_node, "1") {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write("/proc/sys/vm/compact_memory", "1")
        }
        other => other,
    }?;
    Ok(started.elapsed())
}

/// How many compactions a raise for a lease may run, and how long the raise may take with
/// them ([`Reservations::raise_compacting`]): a VM start waits for it. Measured on this
/// machine (24 GiB, one node, 10-12 GiB of page cache from builds, 0.2-2.7 GiB free), asking
/// for 2048 2M pages: the first ask got 285-1305, each compaction took 3-340 ms, and each
/// round after one added 0-170 pages, a round that added nothing often followed by one that
/// did (the kernel's own reclaim frees page cache as it is asked again).
pub const COMPACT_ROUNDS: u32 = 8;
/// See [`COMPACT_ROUNDS`].
pub const COMPACT_BUDGET: std::time::Duration = std::time::Duration::from_secs(5);
/// Rounds in a row that added nothing after which a raise stops compacting.
pub const COMPACT_IDLE_ROUNDS: u32 = 2;

/// Totals of the raises that compacted memory, since start (`GET /metrics`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionCounts {
    /// Compactions run because the kernel supplied fewer pages than asked.
    pub compactions: u64,
    /// Bytes of hugepages the kernel added after a compaction (the asks a compaction made good).
    pub bytes_after_compaction: u64,
    /// Raises for a lease still short after every compaction (the lease was refused).
    pub raises_still_short: u64,
}

/// Bytes a gigantic-page raise may pull in through the 2M pool when the kernel falls short:
/// the node's available memory less the margin, or 0 when the policy does not pull in.
pub fn pull_in_bytes(policy: &ReservePolicy, available: u64) -> u64 {
    if policy.enabled && policy.pull_in {
        available.saturating_sub(policy.margin)
    } else {
        0
    }
}

/// The outcome of giving pages back to one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    /// Node.
    pub node: u32,
    /// Page size.
    pub page_size: PageSize,
    /// Pages lowered from `nr_hugepages`.
    pub released: u64,
    /// Pages hugeprep added that are still in use (leases) and stay recorded.
    pub kept: u64,
}

/// The ledger of pages hugeprep added to the kernel's pools.
#[derive(Debug)]
pub struct Reservations {
    /// The kernel's pools and the ledger's records: the pool's host, or the real ones.
    pools: Arc<dyn KernelPools>,
    added: Mutex<BTreeMap<(u32, PageSize), u64>>,
    /// Nodes whose memory a raise has pulled in already: memory once initialised stays so,
    /// and a second pull-in would only push the page cache out again.
    pulled_in: Mutex<std::collections::BTreeSet<u32>>,
    /// Compactions made for raises.
    compactions: Mutex<CompactionCounts>,
}

impl Reservations {
    /// Opens the ledger in `state_dir`, on the real kernel's pools. A record larger than the
    /// node's pool now (the operator lowered it by hand) is cut to the pool: hugeprep never
    /// lowers a pool by more than it holds.
    pub fn open(state_dir: &Path) -> Result<Reservations, ReserveError> {
        Reservations::on(Arc::new(RealPools::open(state_dir)?))
    }

    /// Opens the ledger `pools` keep (see [`Reservations::open`]).
    pub(crate) fn on(pools: Arc<dyn KernelPools>) -> Result<Reservations, ReserveError> {
        let mut added = BTreeMap::new();
        for rec in pools.ledger_load()? {
            let total = pools.pool_pages(rec.node, rec.page_size).unwrap_or(0);
            let pages = rec.pages.min(total);
            if pages < rec.pages {
                tracing::warn!(
                    node = rec.node, page_size = %rec.page_size, recorded = rec.pages, total,
                    "the pool is smaller than what hugeprep recorded adding: recording {pages}"
                );
                pools.ledger_store(&Reserved { pages, ..rec })?;
            }
            if pages > 0 {
                added.insert((rec.node, rec.page_size), pages);
            }
        }
        Ok(Reservations {
            pools,
            added: Mutex::new(added),
            pulled_in: Mutex::default(),
            compactions: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u32, PageSize), u64>> {
        self.added.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pages hugeprep added to this pool and still holds.
    pub fn added(&self, node: u32, page_size: PageSize) -> u64 {
        self.lock().get(&(node, page_size)).copied().unwrap_or(0)
    }

    /// Bytes hugeprep added to `node`'s pools, every page size.
    pub fn added_bytes_on(&self, node: u32) -> u64 {
        self.lock()
            .iter()
            .filter(|((n, _), _)| *n == node)
            .map(|((_, ps), pages)| pages * ps.bytes())
            .sum()
    }

    fn record(&self, node: u32, page_size: PageSize, pages: u64) -> Result<(), ReserveError> {
        self.pools.ledger_store(&Reserved {
            node,
            page_size,
            pages,
        })?;
        let mut added = self.lock();
        if pages == 0 {
            added.remove(&(node, page_size));
        } else {
            added.insert((node, page_size), pages);
        }
        Ok(())
    }

    /// Raises `node`'s pool by `pages` (a delta on the node's `nr_hugepages`) and records what
    /// the kernel added, which may be fewer (memory short or fragmented). For gigantic pages
    /// the kernel fell short of, with `pull_in` bytes to spare: pulls lazily initialised memory
    /// in ([`kpool::pull_in`], which leaves the 2M pool as it found it) and asks again for the
    /// rest, once per node and ledger.
    pub fn raise(
        &self,
        node: u32,
        page_size: PageSize,
        pages: u64,
        pull_in: u64,
    ) -> Result<Raise, ReserveError> {
        let mut added = self.raise_once(node, page_size, pages)?;
        let mut pulled_in = None;
        if added < pages
            && page_size != PageSize::Size2M
            && pull_in >= PageSize::Size2M.bytes()
            && self
                .pulled_in
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(node)
        {
            let pulled = self.pools.pull_in(node, pull_in)?;
            added += self.raise_once(node, page_size, pages - added)?;
            tracing::info!(
                node, page_size = %page_size, asked = pages, added,
                pulled_in_2m_pages = pulled.added, returned_2m_pages = pulled.returned,
                "the kernel gave fewer gigantic pages than asked: pulled lazily initialised memory in and asked again"
            );
            pulled_in = Some(pulled);
        }
        Ok(Raise {
            asked: pages,
            added,
            pulled_in,
            compactions: 0,
        })
    }

    /// [`Reservations::raise`], then, while the kernel has supplied fewer pages than asked:
    /// compacts the node's memory and asks for the rest again, up to [`COMPACT_ROUNDS`] times
    /// and for [`COMPACT_BUDGET`] at most, stopping after [`COMPACT_IDLE_ROUNDS`] rounds in a
    /// row that brought nothing. A
    /// host hours into its life keeps most of its free memory as page cache in blocks smaller
    /// than a hugepage: the kernel's raise stops at the first page it cannot make without
    /// moving others (measured on a Debian libvirt host: 116 of 512 pages, then 13 of 396,
    /// with 20 GB available), while a compaction moves them. `now` reads the host's clock
    /// ([`Host::now`](super::host::Host::now)), which the budget is measured on: a
    /// simulated host moves it on with each compaction, and jumps it.
    pub fn raise_compacting(
        &self,
        (node, page_size): (u32, PageSize),
        pages: u64,
        pull_in: u64,
        now: &dyn Fn() -> std::time::Instant,
    ) -> Result<Raise, ReserveError> {
        let started = now();
        let mut raise = self.raise(node, page_size, pages, pull_in)?;
        let mut idle = 0;
        while raise.added < pages
            && raise.compactions < COMPACT_ROUNDS
            && idle < COMPACT_IDLE_ROUNDS
            && now().saturating_duration_since(started) < COMPACT_BUDGET
        {
            let took = match self.pools.compact(node) {
                Ok(took) => took,
                Err(err) => {
                    tracing::warn!(node, %err, "cannot compact the node's memory for a hugepage raise");
                    break;
                }
            };
            raise.compactions += 1;
            let got = self.raise_once(node, page_size, pages - raise.added)?;
            raise.added += got;
            {
                let mut c = self.compactions.lock().unwrap_or_else(|e| e.into_inner());
                c.compactions += 1;
                c.bytes_after_compaction += got * page_size.bytes();
            }
            tracing::info!(
                node, page_size = %page_size, asked = pages, added = raise.added, after_compaction = got,
                compact_ms = took.as_millis() as u64,
                "the kernel gave fewer hugepages than asked: compacted the node's memory and asked again"
            );
            idle = if got == 0 { idle + 1 } else { 0 };
        }
        if raise.added < pages && raise.compactions > 0 {
            self.compactions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .raises_still_short += 1;
        }
        Ok(raise)
    }

    /// Compactions made for raises since start.
    pub fn compaction_counts(&self) -> CompactionCounts {
        *self.compactions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn raise_once(&self, node: u32, page_size: PageSize, pages: u64) -> Result<u64, ReserveError> {
        let before = self.pools.pool_pages(node, page_size)?;
        let after = self.pools.set_pool_pages(node, page_size, before + pages)?;
        let added = after.saturating_sub(before);
        if added > 0 {
            self.record(node, page_size, self.added(node, page_size) + added)?;
        }
        Ok(added)
    }

    /// Lowers `node`'s pool by what hugeprep added, as far as the pool's pages are free (the
    /// kernel never frees pages in use), and records what is still held.
    ///
    /// The ledger gives the pages up before the kernel frees them (write-ahead): a failed
    /// write lowers nothing, and a crash or a failed write after the lowering leaves pages
    /// in the pool unrecorded, as a crash during a raise does. Never the other way round: a
    /// record of pages the pool no longer has would let a later release lower it by pages
    /// someone else added (found by the driver simulation: a full disk after the lowering).
    pub fn release(&self, node: u32, page_size: PageSize) -> Result<Released, ReserveError> {
        let held = self.added(node, page_size);
        let mut out = Released {
            node,
            page_size,
            released: 0,
            kept: held,
        };
        let free = self.pools.pool_free_pages(node, page_size).min(held);
        if free == 0 {
            return Ok(out);
        }
        self.record(node, page_size, held - free)?;
        let before = self.pools.pool_pages(node, page_size)?;
        let after = self
            .pools
            .set_pool_pages(node, page_size, before.saturating_sub(free))?;
        out.released = before.saturating_sub(after).min(free);
        out.kept = held - out.released;
        if out.released < free {
            // Someone took free pages meanwhile: those the kernel kept are still ours.
            self.record(node, page_size, out.kept)?;
        }
        Ok(out)
    }

    /// Every pool hugeprep holds pages of.
    pub fn held(&self) -> Vec<Reserved> {
        self.lock()
            .iter()
            .map(|(&(node, page_size), &pages)| Reserved {
                node,
                page_size,
                pages,
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "tests/reserve.rs"]
mod tests;
