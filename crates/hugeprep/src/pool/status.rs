//! The pool as `GET /v1/pool` and `hugeprep pool` show it: per node and page size, what is
//! warm, leased, dirty and being scrubbed, beside the kernel's own counts.

use super::*;

/// One (node, page size) of `GET /v1/pool`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct KindStatus {
    /// Node.
    pub node: u32,
    /// Page size.
    pub page_size: PageSize,
    /// The hugetlbfs mount.
    pub mount: PathBuf,
    /// Bytes the policy keeps warm.
    pub target_bytes: u64,
    /// File sizes the refill worker makes.
    pub sizes: Vec<u64>,
    /// Warm bytes (ready to lease).
    pub warm_bytes: u64,
    /// Warm files.
    pub warm_files: usize,
    /// Leased bytes.
    pub leased_bytes: u64,
    /// Live leases.
    pub leases: usize,
    /// Released or unproven bytes waiting for a scrub (or deletion).
    pub dirty_bytes: u64,
    /// Bytes being scrubbed.
    pub scrubbing_bytes: u64,
    /// Bytes being created and faulted.
    pub filling_bytes: u64,
    /// The kernel's free pages of this size on the node.
    pub kernel_free_pages: u64,
    /// The kernel's pages of this size on the node.
    pub kernel_total_pages: u64,
    /// Bytes in use on the mount by its size limit (`statfs`), when it has one.
    pub mount_used_bytes: Option<u64>,
    /// Pages the daemon added to the kernel's pool of this size on the node (and gives back
    /// with `hugeprep drain --release-pools`).
    #[serde(default)]
    pub reserved_pages: u64,
    /// Why the target is not met, with what to do; `None` when it is met or being filled.
    #[serde(default)]
    pub reason: Option<String>,
    /// Emptied by `hugeprep drain`: kept at zero until `hugeprep resume`.
    #[serde(default)]
    pub drained: bool,
}

/// `GET /v1/pool`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct PoolStatus {
    /// Per node and page size.
    pub kinds: Vec<KindStatus>,
    /// Verification level.
    pub verify: Verification,
    /// Background scrub cap, bytes per second.
    pub scrub_bandwidth: Option<u64>,
    /// Whether the last start found a clean-shutdown marker.
    pub clean_start: bool,
    /// The most recent scrub.
    pub last_scrub: Option<ScrubReport>,
    /// Running totals since start: faults, scrubs, and how released memory came back
    /// (proven and scrubbed in place, or the kernel's path, with the pages it did not get
    /// back).
    #[serde(default)]
    pub counters: super::CounterSnapshot,
    /// How long the pool's state lock was waited for and held since start.
    #[serde(default)]
    pub lock: super::LockSnapshot,
    /// The last lease refused for want of memory, if any since start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refused_lease: Option<super::RefusedLease>,
    /// Why every release takes the kernel's path, when one thing makes them all do so (no
    /// open watch, or the kernel's counts do not match the proof's model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof_fallback: Option<String>,
    /// Released files still held by someone, waiting aside for another proof (see
    /// `docs/pool.md`, "Held releases").
    #[serde(default)]
    pub held_aside_files: usize,
    /// Their bytes.
    #[serde(default)]
    pub held_aside_bytes: u64,
    /// Released files the kernel's path could not truncate (another process holds a read
    /// lease on them), kept and charged to their lessee until it lets go (see
    /// `docs/security.md`, "Pages kept past a release").
    #[serde(default)]
    pub kept_files: usize,
    /// Their bytes.
    #[serde(default)]
    pub kept_bytes: u64,
}

impl Pool {
    /// Counts per node and page size.
    ///
    /// The kernel's figures are read before the lock: a status (every /health, every
    /// metrics scrape) need not hold up a lease for sysfs reads and a statfs per kind.
    pub fn status(&self) -> PoolStatus {
        let figures = self.kernel_figures();
        let st = self.lock();
        let mut kinds = Vec::new();
        for (ps, mount) in self.settings.mounts.iter() {
            for node in &self.settings.topology.nodes {
                let n = node.id;
                let sum = |f: &dyn Fn(&Entry) -> bool| -> (u64, usize) {
                    st.of_kind(n, *ps)
                        .filter(|e| f(e))
                        .fold((0, 0), |(b, c), e| (b + e.rec().size, c + 1))
                };
                let warm = sum(&|e| e.rec().state == FileState::Warm);
                let leased = sum(&|e| matches!(e.rec().state, FileState::Leased(_)));
                let dirty = sum(&|e| e.rec().state == FileState::Dirty);
                let scrubbing = sum(&|e| e.rec().state == FileState::Scrubbing);
                let filling = sum(&|e| e.rec().state == FileState::Filling);
                let policy = self.policy();
                let target = policy.target(n, *ps);
                let (kernel_free, kernel_total, mount_used_bytes) =
                    figures.get(&(n, *ps)).copied().unwrap_or((0, 0, None));
                kinds.push(KindStatus {
                    node: n,
                    page_size: *ps,
                    mount: mount.root.clone(),
                    target_bytes: target.map_or(0, |t| t.warm),
                    sizes: target.map_or(Vec::new(), |t| t.sizes.clone()),
                    warm_bytes: warm.0,
                    warm_files: warm.1,
                    leased_bytes: leased.0,
                    leases: leased.1,
                    dirty_bytes: dirty.0,
                    scrubbing_bytes: scrubbing.0,
                    filling_bytes: filling.0,
                    kernel_free_pages: kernel_free,
                    kernel_total_pages: kernel_total,
                    mount_used_bytes,
                    reserved_pages: self.kernel.reservations.added(n, *ps),
                    reason: st.reasons.get(&(n, *ps)).cloned(),
                    drained: st.drained.contains(&(n, *ps)),
                });
            }
        }
        PoolStatus {
            kinds,
            verify: self.policy().verify,
            scrub_bandwidth: self.policy().scrub_bandwidth,
            clean_start: self.table.clean_start,
            last_scrub: st.last_scrub.clone(),
            counters: self.table.counters.snapshot(),
            lock: self.table.lock_stats.snapshot(),
            last_refused_lease: self.kernel.refusals.last(),
            proof_fallback: self.proof_fallback(),
            held_aside_files: st.aside.totals().0,
            held_aside_bytes: st.aside.totals().1,
            kept_files: self.kept_totals().0,
            kept_bytes: self.kept_totals().1,
        }
    }

    /// Per kind: the node's free and total pages, and the bytes used on its mount.
    fn kernel_figures(&self) -> BTreeMap<(u32, PageSize), (u64, u64, Option<u64>)> {
        let mut figures = BTreeMap::new();
        for (ps, mount) in self.settings.mounts.iter() {
            let used = kernel::mount_used_pages(&mount.root).map(|p| p * ps.bytes());
            for node in &self.settings.topology.nodes {
                let n = node.id;
                let free = kernel::node_free_pages(n, *ps).unwrap_or(0);
                let total = kernel::node_total_pages(n, *ps).unwrap_or(0);
                figures.insert((n, *ps), (free, total, used));
            }
        }
        figures
    }

    /// The pool file of the live lease `lease_id` (a benchmark follows it back to warm).
    pub fn file_of_lease(&self, lease_id: u64) -> Option<u64> {
        let st = self.lock();
        let found = st.core.files().find_map(|e| match &e.rec().state {
            FileState::Leased(l) if l.id == lease_id => Some(e.rec().id),
            _ => None,
        });
        found
    }

    /// Whether pool file `id` is warm and idle.
    pub fn file_is_warm(&self, id: u64) -> bool {
        let st = self.lock();
        let warm = st.core.get(id).is_some_and(|e| e.is_idle(&FileState::Warm));
        warm
    }
}
