//! The worker's decisions as pure functions of (state, now, kernel figures, policy), in the
//! shape of quinn-proto's `handle_timeout(now)` / `poll_timeout()`.
//!
//! The driver (`pool::worker`) reads the clock, the start gate and the policy, lends the
//! pool's files ([`View`]) and a source of the kernel's figures ([`Figures`]: free pages,
//! a mount's free blocks; read only when a decision needs them), and calls
//! [`Schedule::decide`]. It gets back the job to start (if any), whether the pool lacks a
//! wanted file, why targets are or are not met, and when to decide again; it performs the
//! job and records the notes. The [`Schedule`] keeps what the decisions remember between
//! calls: the lessee grace, the refill and reserve backoffs, whether a lease missed, the
//! fixed shape's turn. Nothing here reads the clock, sysfs or a file.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub(crate) use super::reshape::{Kind, View};
use crate::page_size::PageSize;
use crate::policy::pool::{PoolPolicy, Shape};
use crate::pool::record::FileRecord;
use crate::pool::shape::Reshape;

/// How long refill waits after the kernel could not supply a file.
pub(crate) const REFILL_BACKOFF: Duration = Duration::from_secs(2);

/// How long the worker waits before raising a kernel pool again after the kernel or a limit
/// gave fewer pages than the target needs (each try may compact memory).
pub(crate) const RESERVE_BACKOFF: Duration = Duration::from_secs(30);

/// How soon an idle worker looks again while a VM start is under way.
pub(crate) const STARTING_POLL: Duration = Duration::from_millis(20);

/// How soon an idle worker looks again otherwise.
pub(crate) const IDLE_POLL: Duration = Duration::from_millis(500);

/// What the driver read for one decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inputs<'a> {
    /// The time of the decision.
    pub(crate) now: Instant,
    /// The policy in force.
    pub(crate) policy: &'a PoolPolicy,
    /// The kinds the daemon serves, in the order the worker visits them.
    pub(crate) kinds: &'a [Kind],
    /// A lease waits on the worker's work.
    pub(crate) urgent: bool,
    /// A VM start is under way (the start gate is shut).
    pub(crate) starting: bool,
}

/// The kernel's figures a decision may need, read by the driver when asked.
pub(crate) trait Figures {
    /// Free bytes the kernel could give a new file of the kind, less what faults in
    /// progress were promised.
    fn free_bytes(&mut self, kind: Kind) -> u64;
    /// Free pages the kind's mount's size limit leaves (`None`: no limit).
    fn mount_free_pages(&mut self, page_size: PageSize) -> Option<u64>;
    /// Free pages of the kind in the kernel's pool.
    fn pool_free_pages(&mut self, kind: Kind) -> u64;
}

/// A job the worker should start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Job {
    /// Scrub the released file and keep it warm at `size`.
    Scrub {
        /// The file.
        id: u64,
        /// Its size once scrubbed (cut first when smaller).
        size: u64,
    },
    /// Give the file back (truncate and unlink).
    Delete(u64),
    /// Cut the warm file to `size`.
    Cut {
        /// The file.
        id: u64,
        /// The new size.
        size: u64,
    },
    /// Create and fault a new warm file.
    Fill {
        /// Its kind.
        kind: Kind,
        /// Its size.
        size: u64,
    },
    /// Raise the node's kernel pool by `pages`.
    Reserve {
        /// The kind.
        kind: Kind,
        /// Pages to add.
        pages: u64,
    },
}

/// Why a kind's target is or is not met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Note {
    /// The target is met.
    Met,
    /// The mount's size limit leaves `free` bytes, less than the next file.
    MountFull {
        /// Bytes the mount has free.
        free: u64,
    },
    /// The kernel's pool lacks `short` pages and the policy does not raise it.
    ReserveDisabled {
        /// Pages short.
        short: u64,
    },
}

/// What one decision returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The job to start, if any.
    pub(crate) job: Option<Job>,
    /// Some kind lacks a wanted file: work that faults nothing goes first.
    pub(crate) pressing: bool,
    /// Why targets are or are not met, to record and log.
    pub(crate) notes: Vec<(Kind, Note)>,
    /// When to decide again if nothing changes meanwhile.
    pub(crate) wake: Instant,
}

/// What the worker's decisions remember between calls (see the module documentation).
#[derive(Debug, Default, Clone)]
pub(crate) struct Schedule {
    /// Until then refills wait: the kernel could not supply the last one.
    refill_backoff: Option<Instant>,
    /// Until then the worker starts no refill or background scrub: a lessee's VMM starts.
    lessee_grace: Option<Instant>,
    /// A lease was served other than warm-exact since the pool last had every wanted file:
    /// refills no longer wait for the lessee grace.
    missed: bool,
    /// When a kind's pool may be raised again after the kernel or a limit refused.
    reserve_backoff: BTreeMap<Kind, Instant>,
    /// The fixed shape's next size in the mix.
    refill_turn: usize,
    /// Released files taken one after the other while a trim or a refill was wanted (see
    /// [`SHARE_EVERY`]).
    dirty_run: u32,
}

/// After this many released files in a row, a wanted trim or refill goes first: a tenant's
/// steady stream of releases cannot starve the refill (honest leases would be served cold)
/// or the trim.
pub const SHARE_EVERY: u32 = 4;

impl Schedule {
    /// A lease was taken or released at `now`: the lessee grace runs for `grace` (zero:
    /// none).
    pub(crate) fn grace_from(&mut self, now: Instant, grace: Duration) {
        self.lessee_grace = (!grace.is_zero()).then(|| now + grace);
    }

    /// A lease was served other than warm-exact.
    pub(crate) fn missed(&mut self) {
        self.missed = true;
    }

    /// Until when refills wait for the kernel's supply, if they do (for tests).
    #[cfg(test)]
    pub(crate) fn refill_backoff(&self) -> Option<Instant> {
        self.refill_backoff
    }

    /// The daemon gave pages back: the refill backoff no longer describes the supply.
    pub(crate) fn pages_returned(&mut self) {
        self.refill_backoff = None;
    }

    /// A refill failed at `now`: refills wait [`REFILL_BACKOFF`].
    pub(crate) fn refill_failed(&mut self, now: Instant) {
        self.refill_backoff = Some(now + REFILL_BACKOFF);
    }

    /// Raising the kind's pool fell short at `now`: it waits [`RESERVE_BACKOFF`].
    pub(crate) fn reserve_short(&mut self, kind: Kind, now: Instant) {
        self.reserve_backoff.insert(kind, now + RESERVE_BACKOFF);
    }

    /// The kind's target is met: its pool may be raised at once when it is short again.
    pub(crate) fn target_met(&mut self, kind: Kind) {
        self.reserve_backoff.remove(&kind);
    }

    /// Forgets the timers that have run out by `now`.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.refill_backoff = self.refill_backoff.filter(|t| now < *t);
        self.lessee_grace = self.lessee_grace.filter(|t| now < *t);
        self.reserve_backoff.retain(|_, t| now < *t);
    }

    /// When to decide again: the earliest timer still running, a file aside coming due
    /// (`aside_due`), or the next poll (sooner while a start is under way).
    pub(crate) fn poll_timeout(
        &self,
        now: Instant,
        starting: bool,
        aside_due: Option<Instant>,
    ) -> Instant {
        let poll = now + if starting { STARTING_POLL } else { IDLE_POLL };
        let timers = self
            .refill_backoff
            .iter()
            .chain(&self.lessee_grace)
            .chain(self.reserve_backoff.values())
            .copied()
            .filter(|t| now < *t);
        timers.chain(aside_due).fold(poll, Instant::min)
    }

    /// The worker's next decision (see the module documentation).
    pub(crate) fn decide(&mut self, v: &View, w: &Inputs, k: &mut dyn Figures) -> Decision {
        self.handle_timeout(w.now);
        let pressing = v.incomplete(w.policy, w.kinds);
        let mut notes = Vec::new();
        let job = self.next_job(v, w, k, pressing, &mut notes);
        Decision {
            job,
            pressing,
            notes,
            wake: self.poll_timeout(w.now, w.starting, v.aside.next_due()),
        }
    }

    /// Picks the next job: released files first, then trims, then refills.
    fn next_job(
        &mut self,
        v: &View,
        w: &Inputs,
        k: &mut dyn Figures,
        pressing: bool,
        notes: &mut Vec<(Kind, Note)>,
    ) -> Option<Job> {
        // A VMM is starting on a lease just given out (or a lease was just given back): its
        // pin and first touches fault through the same hugetlb fault mutexes, CPUs and
        // memory bandwidth a refill or scrub would load. Wait, unless a lease waits on this
        // work. Under a stream of leases the grace never ends, so while the pool lacks a
        // wanted file, released files are still scrubbed (and files cut or given back), and
        // once a lease has missed (the pool is short for this rate of leases) refills run
        // too: that lease faulted its size cold, which loads the same resources far more.
        if !pressing {
            self.missed = false;
        }
        let graced = self.lessee_grace.is_some_and(|t| w.now < t) && !w.urgent;
        if graced && !pressing {
            return None;
        }
        // A VMM is starting: background work waits for it whatever the pool lacks, unless
        // a lease waits on the work (see `gate`).
        let held = !w.urgent && w.starting;
        // 1. Released files: fresh releases first, then files held aside whose next proof
        // is due; among each, fair between principals, then in release order.
        // A file held aside past its bound goes first of all: it takes the kernel's path.
        let dirty = v
            .core
            .next_dirty(|id| v.aside.past_bound(id, w.now))
            .or_else(|| v.core.next_dirty(|id| !v.aside.contains(id)))
            .or_else(|| v.core.next_dirty(|id| !v.aside.waiting(id, w.now)))
            .and_then(|id| v.core.get(id));
        let backoff = self.refill_backoff.is_some_and(|t| w.now < t);
        let may_refill = !(held || (graced && !self.missed) || backoff);
        if let Some(e) = dirty.filter(|_| pressing || !held) {
            return Some(self.dirty_or_turn(v, w, k, notes, e.rec(), may_refill));
        }
        self.dirty_run = 0;
        // 2. Cut or give back warm files of sizes not in demand, or above target.
        if let Some(job) = trim_job(v, w) {
            return Some(job);
        }
        // 3. Below target: a new warm file of the next size in the mix that fits.
        if !may_refill {
            return None;
        }
        self.refill_job(v, w, k, notes)
    }

    /// The job for released file `rec`, or, once [`SHARE_EVERY`] released files went one
    /// after the other, a wanted trim or refill first, also while the pool lacks a wanted
    /// file (a tenant that leases every file scrubbed warm keeps it lacking).
    fn dirty_or_turn(
        &mut self,
        v: &View,
        w: &Inputs,
        k: &mut dyn Figures,
        notes: &mut Vec<(Kind, Note)>,
        rec: &FileRecord,
        may_refill: bool,
    ) -> Job {
        if self.dirty_run >= SHARE_EVERY {
            let other = trim_job(v, w).or_else(|| {
                may_refill
                    .then(|| self.refill_job(v, w, k, notes))
                    .flatten()
            });
            if let Some(job) = other {
                self.dirty_run = 0;
                return job;
            }
        }
        self.dirty_run = self.dirty_run.saturating_add(1);
        dirty_job(v, w.policy, rec)
    }

    /// Below target: a new file of the next size that fits, or a raise of the kernel's pool
    /// when the kernel cannot supply it.
    fn refill_job(
        &mut self,
        v: &View,
        w: &Inputs,
        k: &mut dyn Figures,
        notes: &mut Vec<(Kind, Note)>,
    ) -> Option<Job> {
        for &kind in w.kinds {
            let (node, ps) = kind;
            let Some(target) = w.policy.target(node, ps) else {
                continue;
            };
            if v.drained.contains(&kind) {
                continue;
            }
            let deficit = target.warm.saturating_sub(v.pool_bytes(kind));
            if deficit == 0 {
                self.target_met(kind);
                notes.push((kind, Note::Met));
                continue;
            }
            let demand = w.policy.shape == Shape::Demand;
            let size = if demand {
                v.next_missing(w.policy, kind, deficit)
            } else {
                next_fixed_size(&target.sizes, self.refill_turn, deficit, ps.bytes())
            };
            if size == 0 {
                continue;
            }
            if k.free_bytes(kind) < size {
                if let Some(pages) = self.shortfall(w, k, kind, (deficit, size), notes) {
                    return Some(Job::Reserve { kind, pages });
                }
                self.refill_backoff = Some(w.now + REFILL_BACKOFF);
                continue;
            }
            if !demand {
                self.refill_turn = self.refill_turn.wrapping_add(1);
            }
            return Some(Job::Fill { kind, size });
        }
        None
    }

    /// A kind's target lacks `deficit` bytes and the kernel cannot supply the next file of
    /// `size`: the pages to raise the node's pool by, or else `None` with the reason noted
    /// (or a backoff still running).
    fn shortfall(
        &self,
        w: &Inputs,
        k: &mut dyn Figures,
        kind: Kind,
        (deficit, size): (u64, u64),
        notes: &mut Vec<(Kind, Note)>,
    ) -> Option<u64> {
        let page = kind.1.bytes();
        if let Some(free) = k.mount_free_pages(kind.1) {
            let free = free.saturating_mul(page);
            if free < size {
                notes.push((kind, Note::MountFull { free }));
                return None;
            }
        }
        let free = k.pool_free_pages(kind);
        let short = deficit.div_ceil(page).saturating_sub(free).max(1);
        if !w.policy.reserve.enabled {
            notes.push((kind, Note::ReserveDisabled { short }));
            return None;
        }
        if self.reserve_backoff.get(&kind).is_some_and(|t| w.now < *t) {
            return None;
        }
        Some(short)
    }
}

/// A released file: kept and scrubbed (at a size in demand), or given back.
fn dirty_job(v: &View, policy: &PoolPolicy, rec: &FileRecord) -> Job {
    // Under the demand shape a file of a size in demand is kept (cut to a missing size
    // when its own is not), whatever the pool holds (see `shape`).
    let kind = (rec.node, rec.page_size);
    let (keep, size) = match policy.shape {
        Shape::Demand => match v.reshape_dirty(policy, rec) {
            Reshape::Keep(_, size) => (true, size),
            _ => (false, rec.size),
        },
        Shape::Fixed => (
            v.pool_bytes(kind) + rec.size <= v.target(policy, kind),
            rec.size,
        ),
    };
    if keep {
        Job::Scrub { id: rec.id, size }
    } else {
        Job::Delete(rec.id)
    }
}

/// Demand shape: cut or give back warm files of sizes not in demand; any shape: give back
/// warm files above target (the policy changed, or leases came back).
fn trim_job(v: &View, w: &Inputs) -> Option<Job> {
    match v.reshape_any(w.policy, w.kinds) {
        Some(Reshape::Shrink(id, size)) => return Some(Job::Cut { id, size }),
        Some(Reshape::Delete(id)) => return Some(Job::Delete(id)),
        _ => {}
    }
    for &kind in w.kinds {
        if v.pool_bytes(kind) > v.target(w.policy, kind) {
            let victim = v
                .core
                .of_kind(kind.0, kind.1)
                .filter(|e| e.is_idle(&crate::pool::record::FileState::Warm))
                .max_by_key(|e| e.rec().size)
                .map(|e| e.rec().id);
            if let Some(id) = victim {
                return Some(Job::Delete(id));
            }
        }
    }
    None
}

/// The fixed shape's next refill: the next size of the mix (from `turn`) that fits the
/// deficit. Files come back from leases at their own sizes, so the deficit can be smaller
/// than every size in the mix: fill it exactly then, or the pool would stay below its target
/// for good (a small warm file still serves a grown lease).
pub(crate) fn next_fixed_size(sizes: &[u64], turn: usize, deficit: u64, page: u64) -> u64 {
    let n = sizes.len();
    (0..n)
        .map(|i| sizes[(turn + i) % n])
        .find(|&s| s <= deficit)
        .unwrap_or(deficit / page * page)
}
