//! The pool's state under its lock: every file and what is being done to it, and the
//! bookkeeping that the lease path and the worker share.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::prefault::Taken;

use super::core::Core;
use super::{idempotency, shape, Entry, FileState, PageSize, ScrubReport, Work};

#[derive(Debug, Default)]
pub(super) struct State {
    /// Every pool file, in its phase (see [`super::core`]): changed only by its transitions.
    pub(super) core: Core,
    /// What the worker's decisions remember: the lessee grace, the refill and reserve
    /// backoffs, whether a lease missed (see [`super::core::decide`]).
    pub(super) schedule: super::core::decide::Schedule,
    pub(super) last_scrub: Option<ScrubReport>,
    /// Why a kind's target is not met, as last logged (see `Pool::explain`).
    pub(super) reasons: BTreeMap<(u32, PageSize), String>,
    /// Kinds emptied by a drain: kept at a target of zero until resumed.
    pub(super) drained: BTreeSet<(u32, PageSize)>,
    /// Recent lease sizes per kind, that the demand shape learns from.
    pub(super) demand: BTreeMap<(u32, PageSize), shape::History>,
    /// Leases with an idempotency key in progress, by key.
    pub(super) keyed: BTreeMap<String, idempotency::Idempotency>,
    /// Free pages that leases and refills have been promised, per file being faulted: the
    /// kernel counts them free until the fault reserves or allocates them, so every
    /// decision subtracts what it does not show yet (concurrent cold leases would otherwise
    /// promise the same free pages twice).
    pub(super) faulting: BTreeMap<u64, Promise>,
    /// Released files still held by someone, waiting aside for another proof (see `aside`).
    pub(super) aside: super::aside::AsideQueue,
    /// Leases being taken by a tenant, by file id, until journaled (see `tenant`).
    pub(super) taking: BTreeMap<u64, Taking>,
    /// Files whose lease holds a long-term pin (mirrors the pins, for the tenants' counts).
    pub(super) pinned: BTreeSet<u64>,
}

/// Free pages promised to the fault of one file.
#[derive(Debug)]
pub(super) struct Promise {
    pub(super) node: u32,
    pub(super) page_size: PageSize,
    pub(super) bytes: u64,
    /// How much of it the kernel's counters show so far (the fault records it).
    pub(super) taken: Arc<Taken>,
}

/// What faults in progress of one kind were promised, and how much of it the kernel's
/// counters do not show yet: the part of the free pages they read that is not free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Promised {
    /// Bytes promised in all (they come back free should the faults fail).
    pub bytes: u64,
    /// Not yet gone from the machine's unreserved free pages and the mount's free blocks.
    pub unreserved: u64,
    /// Not yet gone from the node's free pages.
    pub unallocated: u64,
}

impl State {
    /// The daemon itself gave pages back (a file deleted, cut or scrubbed shorter): the
    /// refill backoff, set when the kernel had too few free pages, no longer describes the
    /// supply, so the next refill looks again at once. Without this a VM's memory that took
    /// the kernel's path came back warm only when the backoff ran out (up to
    /// `REFILL_BACKOFF` later), and a VM started meanwhile was served cold. It cannot spin:
    /// each give-back clears it once, and a refill that still finds too little sets it again.
    pub(super) fn pages_returned(&mut self) {
        self.schedule.pages_returned();
    }

    /// What faults in progress of the kind were promised (see `faulting`). Read before the
    /// kernel's counters: a fault's progress is recorded after the kernel's counter moved,
    /// so the two read in this order never count a page as free twice.
    pub(super) fn promised(&self, node: u32, ps: PageSize) -> Promised {
        let mut p = Promised::default();
        for f in self
            .faulting
            .values()
            .filter(|f| f.node == node && f.page_size == ps)
        {
            let reserved = f.taken.reserved().min(f.bytes);
            let allocated = f.taken.allocated().min(f.bytes);
            p.bytes += f.bytes;
            p.unreserved += f.bytes - reserved;
            p.unallocated += f.bytes - allocated;
        }
        p
    }

    /// Promises `bytes` of the kind's free pages to the fault of file `id` about to start;
    /// the fault records its progress in what this returns.
    pub(super) fn start_faulting(
        &mut self,
        id: u64,
        node: u32,
        page_size: PageSize,
        bytes: u64,
    ) -> Arc<Taken> {
        let taken = Arc::new(Taken::default());
        self.faulting.insert(
            id,
            Promise {
                node,
                page_size,
                bytes,
                taken: Arc::clone(&taken),
            },
        );
        taken
    }

    /// The progress record of file `id`'s fault, if one is promised.
    pub(super) fn taken(&self, id: u64) -> Option<Arc<Taken>> {
        self.faulting.get(&id).map(|f| Arc::clone(&f.taken))
    }

    /// The fault of file `id` is over (done or failed): the kernel's count is right again.
    pub(super) fn end_faulting(&mut self, id: u64) {
        self.faulting.remove(&id);
    }

    /// Forgets the files aside that are no longer released and waiting (scrubbed, given
    /// up for room, drained): what the tenants' `held_bytes` count must not include.
    pub(super) fn prune_aside(&mut self) {
        let core = &self.core;
        self.aside.retain(|id| {
            core.get(id)
                .is_some_and(|e| matches!(e.rec().state, FileState::Dirty | FileState::Scrubbing))
        });
    }

    /// What the worker's decisions read of the state (see [`super::core::decide`]).
    pub(super) fn view(&self) -> super::core::reshape::View<'_> {
        super::core::reshape::View {
            core: &self.core,
            aside: &self.aside,
            drained: &self.drained,
            demand: &self.demand,
        }
    }

    pub(super) fn of_kind(&self, node: u32, ps: PageSize) -> impl Iterator<Item = &Entry> {
        self.core.of_kind(node, ps)
    }

    /// Bytes that a waiting lease could get once the worker has caught up.
    pub(super) fn pending_clean_bytes(&self, node: u32, ps: PageSize) -> u64 {
        self.of_kind(node, ps)
            .filter(|e| {
                matches!(e.busy(), Some(Work::Scrub) | Some(Work::Refill))
                    || (e.busy().is_none() && e.rec().state == FileState::Dirty)
            })
            .map(|e| e.rec().size)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promised_counts_what_the_kernel_does_not_show_yet() {
        let mut st = State::default();
        let ps = PageSize::Size2M;
        // A mapped fault: all of it reserved at the mmap, nothing allocated yet.
        st.start_faulting(1, 0, ps, 64 << 20)
            .mapped_for_test(64 << 20);
        // One that has not begun, and one whose mapping covers more than was promised
        // (clamped).
        st.start_faulting(2, 0, ps, 32 << 20);
        st.start_faulting(3, 0, ps, 16 << 20)
            .mapped_for_test(64 << 20);
        // Another node's fault counts for its own kind only.
        st.start_faulting(4, 1, ps, 128 << 20);
        assert_eq!(
            st.promised(0, ps),
            Promised {
                bytes: 112 << 20,
                unreserved: 32 << 20,
                unallocated: 112 << 20,
            }
        );
        st.end_faulting(1);
        assert_eq!(st.promised(0, ps).bytes, 48 << 20);
        assert_eq!(st.promised(1, ps).unreserved, 128 << 20);
    }
}

/// A lease being taken, until its record is journaled (then the record counts).
#[derive(Debug, Clone)]
pub(super) struct Taking {
    pub(super) principal: String,
    pub(super) page_size: PageSize,
    pub(super) size: u64,
    pub(super) descriptors: u64,
}
