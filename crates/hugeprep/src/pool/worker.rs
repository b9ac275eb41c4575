//! The background worker: scrubs released files (or deletes them above target), trims the
//! pool to its target and refills it, at idle priority. This file chooses the next job;
//! `jobs.rs` does it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::core::Action;
use super::shape::Reshape;
use super::{FileRecord, FileState, Pool, State};
use crate::page_size::PageSize;
use crate::policy::pool::Shape;

/// How long refill waits after the kernel could not supply a file.
pub(super) const REFILL_BACKOFF: Duration = Duration::from_secs(2);

/// The worker's next job; each file's carries the core's action that starts it.
#[derive(Debug)]
pub(super) enum Job {
    /// Journal the file scrubbing, prove it out of reach, scrub it.
    Scrub(u64, Action),
    /// Truncate and unlink the file.
    Delete(u64, Action),
    /// Journal the new file filling, create and fault it.
    Fill(u64, Action),
    /// Cut a warm file to a size in demand (see `shape`), then journal it.
    Shrink(u64, u64, Action),
    Reserve {
        node: u32,
        page_size: PageSize,
        pages: u64,
    },
}

impl Pool {
    /// Starts the background worker thread; it runs until [`Pool::shutdown`].
    pub fn spawn_worker(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let pool = Arc::clone(self);
        std::thread::Builder::new()
            .name("hugeprep-pool".into())
            .spawn(move || pool.run_worker())
    }

    fn run_worker(&self) {
        use crate::sys::priority::{set_current_thread_idle, set_current_thread_normal};
        if let Err(err) = set_current_thread_idle() {
            tracing::warn!(%err, "cannot run the pool worker at idle priority");
        }
        loop {
            // Choosing the next job takes microseconds and runs at normal priority: at idle
            // priority a busy host delays even the choice of work the next lease needs.
            // A failure leaves it idle, as the warning at the worker's start said.
            let _ = set_current_thread_normal();
            let (job, pressing) = {
                let mut st = self.lock();
                loop {
                    if self.shutdown.load(Ordering::SeqCst) {
                        return;
                    }
                    let pressing = self.incomplete(&st);
                    if let Some(job) = self.next_job(&mut st) {
                        break (job, pressing);
                    }
                    // Held by a start under way: look again soon after it ends; a file
                    // waiting aside: when it is due.
                    let mut wait = if self.gate.under_way() {
                        Duration::from_millis(20)
                    } else {
                        Duration::from_millis(500)
                    };
                    if let Some(due) = st.aside.next_due() {
                        wait = wait.min(due.saturating_duration_since(Instant::now()));
                    }
                    st = st.wait_timeout(&self.changed, wait);
                }
            };
            tracing::debug!(?job, pressing, "pool worker");
            // Work that faults nothing and restores a wanted file (a scrub of a released file,
            // a cut, a give-back) runs at normal priority while the shape lacks a file; the
            // rest (refills, raising the kernel's pool) at idle priority; their calls into the
            // kernel that hold locks a lease needs leave it for their length (`OutOfIdle`).
            let quick = matches!(job, Job::Scrub(..) | Job::Shrink(..) | Job::Delete(..));
            if !(pressing && quick) {
                // Refused at the worker's start already (and logged there).
                let _ = set_current_thread_idle();
            }
            match job {
                Job::Scrub(id, journal) => self.scrub_job(id, &journal, pressing),
                Job::Delete(id, remove) => self.delete_job(id, &remove),
                Job::Fill(id, journal) => self.fill_job(id, &journal),
                Job::Shrink(id, size, journal) => self.shrink_job(id, size, &journal),
                Job::Reserve {
                    node,
                    page_size,
                    pages,
                } => self.reserve_job(node, page_size, pages),
            }
            self.changed.notify_all();
        }
    }

    /// The bytes to keep warm: the policy's target, or none while the kind is drained.
    fn target(&self, st: &State, node: u32, ps: PageSize) -> u64 {
        if st.drained.contains(&(node, ps)) {
            return 0;
        }
        self.policy().target_bytes(node, ps)
    }

    /// Picks the next job and moves its file to the job's phase (the job journals it).
    fn next_job(&self, st: &mut State) -> Option<Job> {
        // A VMM is starting on a lease just given out (or a lease was just given back): its
        // pin and first touches fault through the same hugetlb fault mutexes, CPUs and memory
        // bandwidth a refill or scrub would load. Wait, unless a lease waits on this work.
        // Under a stream of leases the grace never ends, so while the pool lacks a wanted
        // file, released files are still scrubbed (and files cut or given back), and once a
        // lease has missed (served grown, shrunk or cold: the pool is short for this rate of
        // leases) refills run too: that lease faulted its size cold, which loads the same
        // mutexes and bandwidth far more (see `shape`).
        let incomplete = self.incomplete(st);
        if !incomplete {
            st.missed = false;
        }
        let urgent = self.control.is_urgent();
        let graced = st.lessee_grace.is_some_and(|t| Instant::now() < t) && !urgent;
        if graced && !incomplete {
            return None;
        }
        // A VMM is starting (a lease being taken, or just taken and its VMM not settled):
        // background work waits for it whatever the pool lacks, unless a lease waits on the
        // work (see `gate`).
        let held = !urgent && self.gate.under_way();
        // 1. Released and unproven files: scrub them back to warm, or delete them. Fresh
        // releases first, then files held aside whose next proof is due (see `aside`): an
        // honest release never waits behind a tenant's held files.
        let now = Instant::now();
        st.prune_aside();
        // Among each, fair between principals, then in release order (`core::order`): a
        // tenant that releases many files keeps no other principal's release waiting.
        let dirty = st
            .core
            .next_dirty(|id| !st.aside.contains(id))
            .or_else(|| st.core.next_dirty(|id| !st.aside.waiting(id, now)))
            .and_then(|id| st.core.get(id))
            .map(|e| e.rec().clone());
        if let Some(rec) = dirty.filter(|_| incomplete || !held) {
            return self.dirty_job(st, &rec);
        }
        // 2. Cut or give back warm files of sizes not in demand, or above target.
        if let Some(job) = self.trim_job(st) {
            return Some(job);
        }
        // 3. Below target: make a new warm file of the next size in the mix that fits.
        if held || (graced && !st.missed) || st.refill_backoff.is_some_and(|t| Instant::now() < t) {
            return None;
        }
        self.refill_job(st)
    }

    /// A released file: kept and scrubbed, or given back.
    fn dirty_job(&self, st: &mut State, rec: &FileRecord) -> Option<Job> {
        // Under the demand shape a file of a size in demand is kept (cut to a missing size
        // when its own is not), whatever the pool holds (see `shape`).
        let (keep, size) = match self.policy().shape {
            Shape::Demand => match self.reshape_dirty(st, rec) {
                Reshape::Keep(_, size) => (true, size),
                _ => (false, rec.size),
            },
            Shape::Fixed => (
                st.pool_bytes(rec.node, rec.page_size) + rec.size
                    <= self.target(st, rec.node, rec.page_size),
                rec.size,
            ),
        };
        if keep {
            return self.start(st.core.begin_scrub(rec.id, size), |a| Job::Scrub(rec.id, a));
        }
        self.delete(st, rec.id)
    }

    /// Marks the file deleting: the job that truncates and unlinks it.
    fn delete(&self, st: &mut State, id: u64) -> Option<Job> {
        self.start(st.core.begin_delete(id), |a| Job::Delete(id, a))
    }

    /// The job of a transition the core allowed (none, logged, if it refused).
    fn start(
        &self,
        moved: super::core::Result<Action>,
        job: impl FnOnce(Action) -> Job,
    ) -> Option<Job> {
        match moved {
            Ok(action) => Some(job(action)),
            Err(err) => {
                tracing::error!(%err, "pool core refused the worker's job");
                None
            }
        }
    }

    /// Demand shape: cut or give back warm files of sizes not in demand; any shape: give back
    /// warm files above target (the policy changed, or leases came back).
    fn trim_job(&self, st: &mut State) -> Option<Job> {
        match self.reshape_any(st) {
            Some(Reshape::Shrink(id, size)) => {
                return self.start(st.core.begin_cut(id, size), |a| Job::Shrink(id, size, a));
            }
            Some(Reshape::Delete(id)) => return self.delete(st, id),
            _ => {}
        }
        for ps in self.mounts.keys() {
            for node in self.topology.node_ids() {
                if st.pool_bytes(node, *ps) > self.target(st, node, *ps) {
                    let victim = st
                        .of_kind(node, *ps)
                        .filter(|e| e.is_idle(&FileState::Warm))
                        .max_by_key(|e| e.rec().size)
                        .map(|e| e.rec().id);
                    if let Some(id) = victim {
                        return self.delete(st, id);
                    }
                }
            }
        }
        None
    }

    /// Below target: a new file of the next size that fits, or a raise of the kernel's pool
    /// when the kernel cannot supply it.
    fn refill_job(&self, st: &mut State) -> Option<Job> {
        let policy = self.policy();
        for (ps, mount) in self.mounts.iter() {
            for node in self.topology.node_ids() {
                let Some(target) = policy.target(node, *ps) else {
                    continue;
                };
                if st.drained.contains(&(node, *ps)) {
                    continue;
                }
                let deficit = target.warm.saturating_sub(st.pool_bytes(node, *ps));
                if deficit == 0 {
                    self.explain(st, node, *ps, None);
                    continue;
                }
                let demand = policy.shape == Shape::Demand;
                let size = if demand {
                    self.next_missing(st, node, *ps, deficit)
                } else {
                    next_fixed_size(&target.sizes, st.refill_turn, deficit, ps.bytes())
                };
                if size == 0 {
                    continue;
                }
                let promised = st.promised(node, *ps);
                let free = self
                    .supply
                    .available_after(node, *ps, &mount.root, &promised);
                if free < size {
                    if let Some(pages) = self.shortfall(st, node, *ps, mount, deficit, size) {
                        return Some(Job::Reserve {
                            node,
                            page_size: *ps,
                            pages,
                        });
                    }
                    st.refill_backoff = Some(Instant::now() + REFILL_BACKOFF);
                    continue;
                }
                if !demand {
                    st.refill_turn = st.refill_turn.wrapping_add(1);
                }
                let (id, journal) = st.core.new_fill(node, *ps, size);
                st.start_faulting(id, node, *ps, size);
                return Some(Job::Fill(id, journal));
            }
        }
        None
    }
}

/// The fixed shape's next refill: the next size of the mix (from `turn`) that fits the
/// deficit. Files come back from leases at their own sizes, so the deficit can be smaller
/// than every size in the mix: fill it exactly then, or the pool would stay below its target
/// for good (a small warm file still serves a grown lease).
fn next_fixed_size(sizes: &[u64], turn: usize, deficit: u64, page: u64) -> u64 {
    let n = sizes.len();
    (0..n)
        .map(|i| sizes[(turn + i) % n])
        .find(|&s| s <= deficit)
        .unwrap_or(deficit / page * page)
}

#[cfg(test)]
mod tests {
    use super::next_fixed_size;

    const M: u64 = 1 << 20;

    #[test]
    fn the_fixed_shape_cycles_through_its_sizes() {
        let sizes = [4 * M, 8 * M];
        assert_eq!(next_fixed_size(&sizes, 0, 64 * M, 2 * M), 4 * M);
        assert_eq!(next_fixed_size(&sizes, 1, 64 * M, 2 * M), 8 * M);
        assert_eq!(next_fixed_size(&sizes, 2, 64 * M, 2 * M), 4 * M);
    }

    #[test]
    fn a_deficit_below_every_size_is_filled_exactly_in_whole_pages() {
        let sizes = [4 * M, 8 * M];
        // 8M does not fit a 6M deficit: the next size that does.
        assert_eq!(next_fixed_size(&sizes, 1, 6 * M, 2 * M), 4 * M);
        assert_eq!(next_fixed_size(&sizes, 0, 3 * M, 2 * M), 2 * M);
        assert_eq!(next_fixed_size(&[], 0, 5 * M, 2 * M), 4 * M);
        assert_eq!(next_fixed_size(&sizes, 0, M, 2 * M), 0);
    }
}
