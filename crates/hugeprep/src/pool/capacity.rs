//! What can be leased now, per node and page size (`GET /v1/capacity`, `hugeprep capacity`):
//! warm memory (served without faulting) and the total a lease could get without waiting
//! (warm plus the kernel's free pages within the mount's limit and this daemon's reach).

use super::*;

/// One (node, page size) of `GET /v1/capacity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct KindCapacity {
    /// Node.
    pub node: u32,
    /// Page size.
    pub page_size: PageSize,
    /// Bytes in idle warm files: leasable now without faulting a page.
    pub warm_bytes: u64,
    /// Idle warm files.
    pub warm_files: usize,
    /// The largest idle warm file: the largest lease served warm-exact or warm-shrunk now.
    pub largest_warm_bytes: u64,
    /// Bytes of new pages the kernel can supply now (free, unreserved, within the mount's
    /// size limit).
    pub kernel_available_bytes: u64,
    /// Bytes being scrubbed or refilled, or waiting for a scrub: leasable after a wait.
    pub pending_bytes: u64,
    /// Bytes leasable now: warm plus what the kernel can supply. A lease of at most this
    /// size succeeds without waiting (its cold part faulted on the lease path).
    pub total_bytes: u64,
    /// Emptied by a drain (warm stays zero until resumed).
    pub drained: bool,
}

/// `GET /v1/capacity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Capacity {
    /// Per node and page size the daemon serves.
    pub kinds: Vec<KindCapacity>,
}

impl Pool {
    /// What can be leased now, per node and page size.
    pub fn capacity(&self) -> Capacity {
        let mut kinds = Vec::new();
        for ps in self.settings.mounts.keys() {
            for node in self.settings.topology.node_ids() {
                // The kernel is read outside the lock: leases and the worker take it often.
                let kernel_available_bytes = self.host.available_bytes(node, *ps);
                let st = self.lock();
                let idle: Vec<u64> = st
                    .of_kind(node, *ps)
                    .filter(|e| e.is_idle(&FileState::Warm))
                    .map(|e| e.rec().size)
                    .collect();
                let warm_bytes: u64 = idle.iter().sum();
                kinds.push(KindCapacity {
                    node,
                    page_size: *ps,
                    warm_bytes,
                    warm_files: idle.len(),
                    largest_warm_bytes: idle.iter().copied().max().unwrap_or(0),
                    kernel_available_bytes,
                    pending_bytes: st.pending_clean_bytes(node, *ps),
                    total_bytes: warm_bytes + kernel_available_bytes,
                    drained: st.drained.contains(&(node, *ps)),
                });
            }
        }
        Capacity { kinds }
    }
}
