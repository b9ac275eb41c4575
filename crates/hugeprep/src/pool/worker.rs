//! The background worker: scrubs released files (or deletes them above target), trims the
//! pool to its target and refills it, at idle priority. This file is the driver of the
//! core's decisions (`core::decide`): it reads the clock, the start gate, the policy and the
//! kernel's figures, feeds them in, and starts the job that comes back; `jobs.rs` does it.

use std::sync::Arc;
use std::time::Instant;

use super::core::decide::{self, Decision, Figures, Inputs, Kind, Note};
use super::core::Action;
use super::{Pool, State};
use crate::page_size::PageSize;

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
    /// Raise the node's kernel pool by `pages`.
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
            let Some((job, pressing)) = self.wait_for_job() else {
                return;
            };
            self.do_job(job, pressing);
        }
    }

    /// Does one job the worker chose; `pressing`: the shape lacks a file.
    fn do_job(&self, job: Job, pressing: bool) {
        use crate::sys::priority::set_current_thread_idle;
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
        self.table.changed.notify_all();
    }

    /// Chooses and does one job, as the worker's loop does, without waiting: whether there
    /// was one. Tests (and the `sim` feature's replays) drive the worker with it on the
    /// simulated host.
    #[cfg(any(test, feature = "sim"))]
    pub(super) fn work_once(&self) -> bool {
        let (job, pressing) = {
            let mut st = self.lock();
            let decision = self.decide(&mut st, self.host.now());
            let pressing = decision.pressing;
            match self.begin(&mut st, decision) {
                Some(job) => (job, pressing),
                None => return false,
            }
        };
        self.do_job(job, pressing);
        // The job may have left the thread at idle priority: a test thread goes on at normal.
        let _ = crate::sys::priority::set_current_thread_normal();
        true
    }

    /// Decides until there is a job (with whether the pool lacks a wanted file), sleeping
    /// until the decision's wake time or a change between; `None` once the pool stops.
    fn wait_for_job(&self) -> Option<(Job, bool)> {
        let mut st = self.lock();
        loop {
            if self.table.is_shut_down() {
                return None;
            }
            let now = self.host.now();
            let decision = self.decide(&mut st, now);
            let pressing = decision.pressing;
            let wake = decision.wake;
            if let Some(job) = self.begin(&mut st, decision) {
                return Some((job, pressing));
            }
            st = st.wait_timeout(&self.table.changed, wake.saturating_duration_since(now));
        }
    }

    /// The core's decision at `now` on what the driver reads: the policy, the start gate,
    /// a lease's urgency and (when asked) the kernel's free pages.
    fn decide(&self, st: &mut State, now: Instant) -> Decision {
        st.prune_aside();
        let policy = self.policy();
        let kinds = self.kinds(None, None).unwrap_or_default();
        let inputs = Inputs {
            now,
            policy: &policy,
            kinds: &kinds,
            urgent: self.clearing.control.is_urgent(),
            starting: self.clearing.gate.under_way(now),
        };
        let mut schedule = std::mem::take(&mut st.schedule);
        let shared: &State = st;
        let decision = schedule.decide(
            &shared.view(),
            &inputs,
            &mut KernelFigures {
                pool: self,
                st: shared,
            },
        );
        st.schedule = schedule;
        decision
    }

    /// Records the decision's notes and starts its job: moves its file to the job's phase
    /// (the job journals it).
    fn begin(&self, st: &mut State, decision: Decision) -> Option<Job> {
        for ((node, ps), note) in decision.notes {
            let reason = self.reason(node, ps, note);
            self.explain(st, node, ps, reason);
        }
        match decision.job? {
            decide::Job::Scrub { id, size } => {
                self.start(st.core.begin_scrub(id, size), |a| Job::Scrub(id, a))
            }
            decide::Job::Delete(id) => self.start(st.core.begin_delete(id), |a| Job::Delete(id, a)),
            decide::Job::Cut { id, size } => {
                self.start(st.core.begin_cut(id, size), |a| Job::Shrink(id, size, a))
            }
            decide::Job::Fill {
                kind: (node, ps),
                size,
            } => {
                let (id, journal) = st.core.new_fill(node, ps, size);
                st.start_faulting(id, node, ps, size);
                Some(Job::Fill(id, journal))
            }
            decide::Job::Reserve {
                kind: (node, page_size),
                pages,
            } => Some(Job::Reserve {
                node,
                page_size,
                pages,
            }),
        }
    }

    /// A note's reason in words (`None`: the target is met).
    fn reason(&self, node: u32, ps: PageSize, note: Note) -> Option<String> {
        match note {
            Note::Met => None,
            Note::MountFull { free } => Some(format!(
                "mount {} is full: its size limit leaves {} free (remount it larger)",
                self.mount(ps)
                    .map_or_else(|_| "?".into(), |m| m.root.display().to_string()),
                crate::units::format_bytes(free)
            )),
            Note::ReserveDisabled { short } => {
                Some(super::reserve::Limit::Disabled.explain(node, ps, short))
            }
        }
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
}

/// The kernel's figures, read from sysfs and the mounts when a decision asks.
struct KernelFigures<'a> {
    pool: &'a Pool,
    st: &'a State,
}

/// Read under the state lock on purpose: the free pages are the kernel's counters less
/// the promises of faults in flight, which the lock holds still; read before it, a fault
/// that ends in between would be counted free twice (a refill or lease then faults pages
/// the kernel no longer has, fails and backs off). Only read when a decision asks, at
/// most once per kind: three `pread`s of sysfs counters on descriptors opened at start and
/// one `statfs` of the mount, measured at 12 us a kind (median of 7 runs of 20,000,
/// range 4-21 us, from Python, an upper bound) on the 2-vCPU test machine.
impl Figures for KernelFigures<'_> {
    fn free_bytes(&mut self, (node, ps): Kind) -> u64 {
        let promised = self.st.promised(node, ps);
        self.pool.host.available_after(node, ps, &promised)
    }

    fn mount_free_pages(&mut self, ps: PageSize) -> Option<u64> {
        let mount = self.pool.mount(ps).ok()?;
        super::kernel::mount_free_pages(&mount.root)
    }

    fn pool_free_pages(&mut self, (node, ps): Kind) -> u64 {
        self.pool.host.pool_free_pages(node, ps)
    }
}
