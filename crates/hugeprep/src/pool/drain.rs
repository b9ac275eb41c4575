//! Giving memory back: a drain deletes the warm (and dirty) files of the kinds it names,
//! keeps them at a target of zero until a resume, and with `release_pools` lowers the
//! kernel's pools by exactly the pages the daemon added ([`reserve`](super::reserve)). Live
//! leases are never touched: their pages stay, and so does the ledger's record of them.

use serde::Deserialize;

use super::reserve::Released;
use super::*;

/// `POST /v1/pool/drain`: which kinds to empty, and whether to lower the kernel's pools.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// Only this node (default: every node).
    #[serde(default)]
    pub node: Option<u32>,
    /// Only this page size (default: every page size served).
    #[serde(default)]
    pub page_size: Option<PageSize>,
    /// Also lower `nr_hugepages` by the pages the daemon added.
    #[serde(default)]
    pub release_pools: bool,
}

/// One kind a drain emptied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainedKind {
    /// Node.
    pub node: u32,
    /// Page size.
    pub page_size: PageSize,
    /// Bytes of warm and dirty files deleted.
    pub deleted_bytes: u64,
    /// Bytes still leased (kept).
    pub leased_bytes: u64,
}

/// What a drain did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainReport {
    /// The kinds emptied (now held at zero until resumed).
    pub kinds: Vec<DrainedKind>,
    /// Pages given back to the kernel, per pool (with `release_pools`).
    pub released: Vec<Released>,
    /// Whether files still busy when the wait ran out were left (they are deleted when done).
    pub incomplete: bool,
}

impl Pool {
    /// The (node, page size) kinds a selector names; an unknown node or a page size this
    /// daemon does not serve is a field error.
    pub fn kinds(
        &self,
        node: Option<u32>,
        page_size: Option<PageSize>,
    ) -> Result<Vec<(u32, PageSize)>> {
        if let Some(n) = node {
            self.settings
                .topology
                .node(n)
                .map_err(|e| PoolError::Field {
                    field: "node",
                    message: e.to_string(),
                })?;
        }
        if let Some(ps) = page_size {
            self.mount(ps)?;
        }
        let mut out = Vec::new();
        for ps in self.settings.mounts.keys() {
            for n in self.settings.topology.node_ids() {
                if node.map_or(true, |x| x == n) && page_size.map_or(true, |x| x == *ps) {
                    out.push((n, *ps));
                }
            }
        }
        Ok(out)
    }

    /// Empties the kinds `req` names and keeps them empty until [`Pool::resume`]; waits up to
    /// `wait` for files being scrubbed, filled or released to settle so they can be deleted
    /// too. Blocks (call from a blocking thread).
    pub fn drain(&self, req: &DrainRequest, wait: Duration) -> Result<DrainReport> {
        let kinds = self.kinds(req.node, req.page_size)?;
        let deadline = self.host.now() + wait;
        let (deleted, incomplete) = self.empty_kinds(&kinds, deadline);
        self.table.changed.notify_all();
        let report_kinds = self.drained_kinds(&kinds, &deleted);
        // A raise decided before the drain finishes first and is given back with the rest.
        let _gate = self.kernel.gate();
        let released = if req.release_pools {
            self.release_pools(&kinds)?
        } else {
            Vec::new()
        };
        tracing::info!(kinds = kinds.len(), incomplete, "drained");
        Ok(DrainReport {
            kinds: report_kinds,
            released,
            incomplete,
        })
    }

    /// Marks `kinds` drained and deletes their idle files until none is left unsettled or
    /// `deadline` passes: the bytes deleted per kind, and whether some stayed unsettled.
    fn empty_kinds(
        &self,
        kinds: &[(u32, PageSize)],
        deadline: Instant,
    ) -> (BTreeMap<(u32, PageSize), u64>, bool) {
        let mut deleted: BTreeMap<(u32, PageSize), u64> = BTreeMap::new();
        let mut st = self.lock();
        for k in kinds {
            st.drained.insert(*k);
            st.reasons.remove(k);
        }
        self.table.changed.notify_all();
        let of_kinds = |e: &Entry| kinds.contains(&(e.rec().node, e.rec().page_size));
        loop {
            let idle: Vec<(u64, (u32, PageSize), u64)> = st
                .core
                .files()
                .filter(|e| {
                    of_kinds(e)
                        && e.busy().is_none()
                        && !matches!(e.rec().state, FileState::Leased(_))
                })
                .map(|e| (e.rec().id, (e.rec().node, e.rec().page_size), e.rec().size))
                .collect();
            let ids = idle.iter().map(|f| f.0).collect::<Vec<_>>();
            let gone;
            (st, gone) = self.give_up_all(st, &ids);
            for (id, kind, size) in idle {
                if gone.contains(&id) {
                    *deleted.entry(kind).or_default() += size;
                }
            }
            let unsettled = st.core.files().any(|e| {
                of_kinds(e)
                    && (e.busy().is_some() || !matches!(e.rec().state, FileState::Leased(_)))
            });
            if !unsettled || self.host.now() >= deadline {
                return (deleted, unsettled);
            }
            st = st.wait_timeout(&self.table.changed, Duration::from_millis(20));
        }
    }

    /// What the drain did to each of `kinds`: bytes deleted, bytes still leased.
    fn drained_kinds(
        &self,
        kinds: &[(u32, PageSize)],
        deleted: &BTreeMap<(u32, PageSize), u64>,
    ) -> Vec<DrainedKind> {
        let status = self.status();
        kinds
            .iter()
            .map(|&(node, page_size)| DrainedKind {
                node,
                page_size,
                deleted_bytes: deleted.get(&(node, page_size)).copied().unwrap_or(0),
                leased_bytes: status
                    .kinds
                    .iter()
                    .find(|k| k.node == node && k.page_size == page_size)
                    .map_or(0, |k| k.leased_bytes),
            })
            .collect()
    }

    /// Gives the pages hugeprep added to the kernel's pools of `kinds` back.
    fn release_pools(&self, kinds: &[(u32, PageSize)]) -> Result<Vec<reserve::Released>> {
        let mut released = Vec::new();
        for &(node, ps) in kinds {
            let r = self.kernel.reservations.release(node, ps)?;
            if r.released > 0 || r.kept > 0 {
                tracing::info!(
                    node, page_size = %ps, released = r.released, kept = r.kept,
                    "gave the pages hugeprep added back to the kernel's pool"
                );
            }
            released.push(r);
        }
        Ok(released)
    }

    /// Gives up the idle files `ids` together: all marked deleting under one hold of the lock
    /// (so that the worker, woken by the drain, takes none of them meanwhile), truncated,
    /// unlinked and unjournaled outside it. Returns the lock taken again and the files deleted.
    fn give_up_all<'a>(
        &'a self,
        mut st: locked::Locked<'a>,
        ids: &[u64],
    ) -> (locked::Locked<'a>, Vec<u64>) {
        let removals: Vec<(u64, core::Action)> = ids
            .iter()
            .filter_map(|&id| st.core.begin_delete(id).ok().map(|a| (id, a)))
            .collect();
        drop(st);
        let removed: Vec<_> = removals
            .into_iter()
            .map(|(id, remove)| (id, self.remove(&remove)))
            .collect();
        let mut st = self.lock();
        let mut gone = Vec::new();
        let mut after = Vec::new();
        for (id, removal) in removed {
            after.push(self.finish_delete(&mut st, id, removal));
            if st.core.get(id).is_none() {
                gone.push(id);
            }
        }
        // The records of the deleted files are removed outside the lock.
        drop(st);
        for a in after {
            self.perform_after(a);
        }
        (self.lock(), gone)
    }

    /// Lets the kinds `node`/`page_size` name refill to their targets again after a drain;
    /// returns the kinds that were drained.
    pub fn resume(
        &self,
        node: Option<u32>,
        page_size: Option<PageSize>,
    ) -> Result<Vec<(u32, PageSize)>> {
        let kinds = self.kinds(node, page_size)?;
        let mut st = self.lock();
        let resumed: Vec<_> = kinds.into_iter().filter(|k| st.drained.remove(k)).collect();
        drop(st);
        self.table.changed.notify_all();
        Ok(resumed)
    }

    /// At a clean stop with `release_on_stop`: after the worker has exited, deletes every warm
    /// and dirty file and gives back the pages the daemon added (leased pages stay).
    pub fn give_back_on_stop(&self) -> Result<DrainReport> {
        let req = DrainRequest {
            node: None,
            page_size: None,
            release_pools: true,
        };
        self.drain(&req, Duration::from_secs(10))
    }
}
