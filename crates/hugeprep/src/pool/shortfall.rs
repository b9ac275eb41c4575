//! When a kind's warm target cannot be met: raise the node's kernel pool (within the policy's
//! limits, recorded in the ledger of [`super::reserve`]) or say why, once, in the log, the
//! status and the metrics.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::{kernel, reserve, Pool, State};
use crate::page_size::PageSize;
use crate::units::format_bytes;

/// The last lease the pool refused for want of memory (a 422 `size` error): `GET /v1/pool`
/// shows it, `/health` and `hugeprep doctor` warn while it is recent ([`REFUSAL_RECENT`]).
/// No name or owner: the pool's status is every client's to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedLease {
    /// When, in seconds since the Unix epoch.
    pub at_unix: u64,
    /// Node.
    pub node: u32,
    /// Page size.
    pub page_size: PageSize,
    /// Bytes asked for.
    pub size: u64,
    /// Bytes the node could supply.
    pub available: u64,
    /// Why the kernel's pool could not be raised for it, when a raise was tried or ruled out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl RefusedLease {
    /// Seconds since it was refused (0 for a clock set back).
    pub fn age_s(&self) -> u64 {
        unix_now().saturating_sub(self.at_unix)
    }

    /// Whether it was refused within [`REFUSAL_RECENT`].
    pub fn is_recent(&self) -> bool {
        self.age_s() < REFUSAL_RECENT.as_secs()
    }

    /// One line: what was refused, when, and why.
    pub fn describe(&self) -> String {
        format!(
            "a lease of {} of {} pages on node {} was refused {} s ago ({} could be supplied){}",
            format_bytes(self.size),
            self.page_size,
            self.node,
            self.age_s(),
            format_bytes(self.available),
            self.reason
                .as_deref()
                .map_or_else(String::new, |r| format!(": {r}"))
        )
    }
}

/// How long a refused lease counts as recent for `/health` and `doctor`.
pub const REFUSAL_RECENT: Duration = Duration::from_secs(15 * 60);

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Refused leases: the last one, and why the last raise for a lease of each kind fell short.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    last: Mutex<Option<RefusedLease>>,
    why: Mutex<BTreeMap<(u32, PageSize), String>>,
}

impl Refusals {
    fn set_why(&self, node: u32, ps: PageSize, why: Option<String>) {
        let mut map = self.why.lock().unwrap_or_else(|e| e.into_inner());
        match why {
            Some(w) => map.insert((node, ps), w),
            None => map.remove(&(node, ps)),
        };
    }

    /// The last refused lease.
    pub(super) fn last(&self) -> Option<RefusedLease> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What a raise for a lease did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Raised {
    /// Pages added.
    pub(super) added: u64,
    /// `reserve_limit` refused it: (the limit, bytes hugeprep added to the node, bytes the
    /// lease lacked).
    pub(super) capped: Option<(u64, u64, u64)>,
}

impl Pool {
    /// Raises `node`'s pool by up to `short` pages, as far as the policy's limit, the node's
    /// memory and the kernel allow; whatever is still missing is explained.
    pub(super) fn reserve_job(&self, node: u32, ps: PageSize, short: u64) {
        let _gate = self.kernel.gate();
        if self.table.is_shut_down() || self.lock().drained.contains(&(node, ps)) {
            return; // decided before a drain or a stop: nothing to fill any more
        }
        let available = self.host.node_available(node);
        let added_on_node = self.kernel.reservations.added_bytes_on(node);
        let (pages, limit) =
            reserve::plan(short, ps, &self.policy().reserve, added_on_node, available);
        let pull_in = reserve::pull_in_bytes(&self.policy().reserve, available);
        // As for a lease: while the kernel falls short, compact the node's memory and ask
        // again (bounded), before the target waits out its back-off.
        let raised = if pages > 0 {
            self.kernel
                .reservations
                .raise_compacting((node, ps), pages, pull_in, &|| self.host.now())
        } else {
            Ok(reserve::Raise {
                asked: 0,
                added: 0,
                pulled_in: None,
                compactions: 0,
            })
        };
        let mut st = self.lock();
        let reason = match raised {
            Ok(r) => {
                if r.added > 0 {
                    tracing::info!(
                        node, page_size = %ps, added = r.added, asked = r.asked,
                        held = self.kernel.reservations.added(node, ps),
                        "raised the kernel's hugepage pool for the warm target"
                    );
                }
                let still = short - r.added.min(short);
                if still == 0 {
                    None
                } else if r.added < r.asked {
                    Some(format!(
                        "kernel pool short by {still} {ps} pages on node {node}; the kernel added \
                         {} of the {} pages asked (memory short or fragmented{})",
                        r.added,
                        r.asked,
                        gigantic_remedy(ps, r.pulled_in.as_ref())
                    ))
                } else {
                    limit.map(|l| l.explain(node, ps, still))
                }
            }
            Err(err) => Some(format!(
                "kernel pool short by {short} {ps} pages on node {node}; raising it failed: {err}"
            )),
        };
        if reason.is_some() {
            st.schedule.reserve_short((node, ps), self.host.now());
            self.explain(&mut st, node, ps, reason);
        }
    }

    /// A lease lacks `short` bytes of `ps` pages on `node`: more than the kernel's free pages
    /// and the pool's files can give. Raises the node's kernel pool for it, as for a warm
    /// target: within `reserve_limit` and `reserve_margin`, recorded in the ledger (so `drain
    /// --release-pools` gives the pages back), never when `reserve = false` or the kind is
    /// drained. This is what lets the packaged defaults, which keep nothing warm, serve a
    /// first VM start: its lease is cold (faulted on the lease path), and the pages it
    /// released stay in the kernel's pool for the next one. A lease the limits cannot cover
    /// in full adds nothing (a failing request changes nothing). Returns the pages the
    /// kernel added; what it could not add is logged with the reason.
    pub(super) fn raise_for_lease(
        &self,
        node: u32,
        ps: PageSize,
        mount: &std::path::Path,
        short: u64,
    ) -> Raised {
        let policy = self.policy();
        let pages = short.div_ceil(ps.bytes());
        if pages == 0 {
            return Raised::default();
        }
        if let Some(why) = ruled_out(&policy.reserve, node, ps, mount, pages) {
            self.kernel.refusals.set_why(node, ps, Some(why));
            return Raised::default();
        }
        let _gate = self.kernel.gate();
        if self.table.is_shut_down() || self.lock().drained.contains(&(node, ps)) {
            return Raised::default();
        }
        let available = self.host.node_available(node);
        let added_on_node = self.kernel.reservations.added_bytes_on(node);
        let (asked, limit) = reserve::plan(pages, ps, &policy.reserve, added_on_node, available);
        if asked < pages {
            // A lease that will fail anyway changes nothing: no pages added for it.
            if let Some(l) = limit {
                let reason = l.explain(node, ps, pages - asked);
                tracing::warn!(node, page_size = %ps, "a lease cannot be served: {reason}");
                self.kernel.refusals.set_why(node, ps, Some(reason));
            }
            let capped = match limit {
                Some(reserve::Limit::Cap { limit }) => Some((limit, added_on_node, short)),
                _ => None,
            };
            return Raised { added: 0, capped };
        }
        // As the reserve job: gigantic pages the kernel falls short of pull memory in once.
        // Then, while the kernel falls short, compact the node's memory and ask again, within
        // a bounded time, before the lease is refused.
        let pull_in = reserve::pull_in_bytes(&policy.reserve, available);
        match self
            .kernel
            .reservations
            .raise_compacting((node, ps), asked, pull_in, &|| self.host.now())
        {
            Ok(r) => self.raised_for_lease(node, ps, pages, &r),
            Err(err) => {
                tracing::warn!(node, page_size = %ps, %err, "raising the kernel's hugepage pool for a lease failed");
                self.kernel.refusals.set_why(
                    node,
                    ps,
                    Some(format!("raising the kernel's pool failed: {err}")),
                );
                Raised::default()
            }
        }
    }

    /// The kernel added `r.added` of the `pages` a lease lacked: logged, and what it could
    /// not add remembered as the reason should the lease be refused.
    fn raised_for_lease(&self, node: u32, ps: PageSize, pages: u64, r: &reserve::Raise) -> Raised {
        let (added, asked, compactions) = (r.added, r.asked, r.compactions);
        if added > 0 {
            tracing::info!(
                node, page_size = %ps, added, asked = pages,
                held = self.kernel.reservations.added(node, ps),
                "raised the kernel's hugepage pool for a lease"
            );
        }
        if added < pages {
            // Those it added stay recorded (`drain --release-pools` gives them back), as
            // for a target.
            let why = format!(
                "kernel pool short by {} {ps} pages on node {node}; the kernel added {added} of \
                 the {asked} pages asked after {compactions} compaction(s) of the node's memory \
                 (memory short or fragmented)",
                pages - added
            );
            tracing::warn!(node, page_size = %ps, "a lease cannot be served: {why}");
            self.kernel.refusals.set_why(node, ps, Some(why));
        } else {
            self.kernel.refusals.set_why(node, ps, None);
        }
        Raised {
            added,
            capped: None,
        }
    }

    /// A lease of `size` bytes was refused: only `available` could be supplied. Remembered
    /// with why the last raise for its kind fell short, for `/health` and `doctor`.
    pub(super) fn note_refused(&self, node: u32, ps: PageSize, size: u64, available: u64) {
        let reason = self
            .kernel
            .refusals
            .why
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(node, ps));
        *self
            .kernel
            .refusals
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(RefusedLease {
            at_unix: unix_now(),
            node,
            page_size: ps,
            size,
            available,
            reason,
        });
    }

    /// Records why a kind's target is not met (`None`: it is met) and says so in the log once,
    /// and again whenever the reason changes. The metrics read the same reasons through
    /// [`Pool::status`].
    pub(super) fn explain(&self, st: &mut State, node: u32, ps: PageSize, reason: Option<String>) {
        let key = (node, ps);
        match reason {
            Some(reason) => {
                if st.reasons.get(&key) != Some(&reason) {
                    tracing::warn!(node, page_size = %ps, "warm target not met: {reason}");
                    st.reasons.insert(key, reason);
                }
            }
            None => {
                if st.reasons.remove(&key).is_some() {
                    tracing::info!(node, page_size = %ps, "warm target met");
                }
                st.schedule.target_met(key);
            }
        }
    }
}

/// Why no raise may cover a lease's `pages`, before any is tried: the policy raises no
/// pool, or the mount's size limit leaves less than the lease lacks (more kernel pages would
/// not be usable).
fn ruled_out(
    reserve: &crate::policy::pool::ReservePolicy,
    node: u32,
    ps: PageSize,
    mount: &std::path::Path,
    pages: u64,
) -> Option<String> {
    if !reserve.enabled {
        return Some(reserve::Limit::Disabled.explain(node, ps, pages));
    }
    let free = kernel::mount_free_pages(mount).filter(|free| *free < pages)?;
    Some(format!(
        "mount {} is full: its size limit leaves {} free (remount it larger)",
        mount.display(),
        format_bytes(free * ps.bytes())
    ))
}

/// What to add to a gigantic-page shortfall's reason: what the pull-in got, and the remedy.
fn gigantic_remedy(ps: PageSize, pulled_in: Option<&crate::hugetlb::pool::PullIn>) -> String {
    if ps == PageSize::Size2M {
        return String::new();
    }
    let pulled = match pulled_in {
        Some(p) => format!(
            " after pulling {} of lazily initialised memory in",
            format_bytes(p.added * PageSize::Size2M.bytes())
        ),
        None => String::new(),
    };
    format!("{pulled}: reserve {ps} pages at boot, hugepagesz={ps} hugepages=N")
}
