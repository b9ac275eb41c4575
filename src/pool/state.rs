//! The pool's state under its lock: every file and what is being done to it, and the
//! bookkeeping that the lease path and the worker share.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use super::{idempotency, shape, Entry, FileState, PageSize, ScrubReport, Work};

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) files: BTreeMap<u64, Entry>,
    pub(super) next_id: u64,
    pub(super) pending_names: BTreeSet<String>,
    pub(super) refill_turn: usize,
    pub(super) refill_backoff: Option<Instant>,
    /// Until then the worker starts no refill or background scrub: the lessee's VMM is
    /// starting (see [`LESSEE_GRACE`]).
    pub(super) lessee_grace: Option<Instant>,
    /// A lease was served other than warm-exact since the pool last had every wanted file:
    /// refills no longer wait for the lessee grace (see `worker`).
    pub(super) missed: bool,
    pub(super) last_scrub: Option<ScrubReport>,
    /// Why a kind's target is not met, as last logged (see `Pool::explain`).
    pub(super) reasons: BTreeMap<(u32, PageSize), String>,
    /// When a kind's pool may be raised again after the kernel or a limit refused.
    pub(super) reserve_backoff: BTreeMap<(u32, PageSize), Instant>,
    /// Kinds emptied by a drain: kept at a target of zero until resumed.
    pub(super) drained: BTreeSet<(u32, PageSize)>,
    /// Recent lease sizes per kind, that the demand shape learns from.
    pub(super) demand: BTreeMap<(u32, PageSize), shape::History>,
    /// Leases with an idempotency key in progress, by key.
    pub(super) keyed: BTreeMap<String, idempotency::Idempotency>,
    /// Bytes per kind that leases and refills have been promised but not faulted yet: the
    /// kernel still counts them free, so every decision subtracts them (concurrent cold
    /// leases would otherwise promise the same free pages twice).
    pub(super) faulting: BTreeMap<u64, (u32, PageSize, u64)>,
}

impl State {
    /// Bytes of the kind promised to a fault in progress (see `faulting`).
    pub(super) fn faulting(&self, node: u32, ps: PageSize) -> u64 {
        self.faulting
            .values()
            .filter(|f| f.0 == node && f.1 == ps)
            .map(|f| f.2)
            .sum()
    }

    /// Promises `bytes` of the kind's free pages to the fault of file `id` about to start.
    pub(super) fn start_faulting(&mut self, id: u64, node: u32, ps: PageSize, bytes: u64) {
        self.faulting.insert(id, (node, ps, bytes));
    }

    /// The fault of file `id` is over (done or failed): the kernel's count is right again.
    pub(super) fn end_faulting(&mut self, id: u64) {
        self.faulting.remove(&id);
    }

    pub(super) fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub(super) fn name_in_use(&self, name: &str) -> bool {
        self.pending_names.contains(name)
            || self.files.values().any(|e| match &e.rec.state {
                FileState::Leased(l) => l.name == name,
                _ => false,
            })
    }

    pub(super) fn of_kind(&self, node: u32, ps: PageSize) -> impl Iterator<Item = &Entry> {
        self.files
            .values()
            .filter(move |e| e.rec.node == node && e.rec.page_size == ps)
    }

    /// Bytes that are or will be warm: warm files not on their way out, plus scrubs and
    /// refills in progress.
    pub(super) fn pool_bytes(&self, node: u32, ps: PageSize) -> u64 {
        self.of_kind(node, ps)
            .filter(|e| match e.busy {
                Some(Work::Scrub) | Some(Work::Refill) => true,
                None => e.rec.state == FileState::Warm,
                _ => false,
            })
            .map(|e| e.rec.size)
            .sum()
    }

    /// A released file waiting for the worker to give back for `short` bytes: the smallest
    /// that covers them, else the largest.
    pub(super) fn dirty_victim(&self, node: u32, ps: PageSize, short: u64) -> Option<u64> {
        let dirty = || {
            self.of_kind(node, ps)
                .filter(|e| e.busy.is_none() && e.rec.state == FileState::Dirty)
        };
        dirty()
            .filter(|e| e.rec.size >= short)
            .min_by_key(|e| e.rec.size)
            .or_else(|| dirty().max_by_key(|e| e.rec.size))
            .map(|e| e.rec.id)
    }

    /// Bytes of released files waiting for the worker (what [`State::dirty_victim`] can
    /// give back).
    pub(super) fn dirty_idle_bytes(&self, node: u32, ps: PageSize) -> u64 {
        self.of_kind(node, ps)
            .filter(|e| e.busy.is_none() && e.rec.state == FileState::Dirty)
            .map(|e| e.rec.size)
            .sum()
    }

    /// Bytes that a waiting lease could get once the worker has caught up.
    pub(super) fn pending_clean_bytes(&self, node: u32, ps: PageSize) -> u64 {
        self.of_kind(node, ps)
            .filter(|e| {
                matches!(e.busy, Some(Work::Scrub) | Some(Work::Refill))
                    || (e.busy.is_none() && e.rec.state == FileState::Dirty)
            })
            .map(|e| e.rec.size)
            .sum()
    }
}
