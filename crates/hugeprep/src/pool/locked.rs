//! The pool lock with a priority ceiling: a `SCHED_IDLE` thread (the worker) runs in
//! `SCHED_OTHER` at the API's priority while it holds the lock. Otherwise, on a host whose CPUs are all busy, the
//! worker is preempted mid-hold for hundreds of milliseconds and every lease waits behind it
//! (priority inversion: measured as a warm-lease p99 of 480 ms with a busy loop per CPU).

use std::ops::{Deref, DerefMut};
use std::panic::Location;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::lock_stats::LockStats;
use super::State;
use crate::sys::priority;

/// The held pool lock; the caller's scheduling class is restored when it is dropped, after
/// the lock is released (fields drop in order, after `drop` records the hold).
pub(super) struct Locked<'a> {
    guard: Option<MutexGuard<'a, State>>,
    stats: &'a LockStats,
    /// When the lock was taken (or taken again after a wait on the condvar).
    since: Instant,
    /// The line that took it.
    at: &'static Location<'static>,
    _ceiling: priority::OutOfIdle,
}

impl<'a> Locked<'a> {
    /// Takes `mutex`, first leaving `SCHED_IDLE` if the calling thread is in it; records
    /// the wait and, when dropped, the hold in `stats`.
    #[track_caller]
    pub(super) fn take(mutex: &'a Mutex<State>, stats: &'a LockStats) -> Locked<'a> {
        let at = Location::caller();
        let ceiling = priority::OutOfIdle::enter_api();
        let asked = Instant::now();
        let guard = mutex.lock().unwrap_or_else(|e| e.into_inner());
        let since = Instant::now();
        stats.waited(since.saturating_duration_since(asked));
        Locked {
            guard: Some(guard),
            stats,
            since,
            at,
            _ceiling: ceiling,
        }
    }

    /// Waits on `cv` for at most `timeout`, the lock released meanwhile (the time before
    /// the wait counts as one hold, the time after it as another).
    pub(super) fn wait_timeout(mut self, cv: &Condvar, timeout: Duration) -> Locked<'a> {
        if let Some(guard) = self.guard.take() {
            self.stats.held(self.since.elapsed(), self.at);
            self.guard = Some(
                cv.wait_timeout(guard, timeout)
                    .unwrap_or_else(|e| e.into_inner())
                    .0,
            );
            self.since = Instant::now();
        }
        self
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            let held = self.since.elapsed();
            drop(guard);
            self.stats.held(held, self.at);
        }
    }
}

impl Deref for Locked<'_> {
    type Target = State;

    fn deref(&self) -> &State {
        // The guard is only taken out inside `wait_timeout`, which puts it back.
        self.guard.as_deref().unwrap_or_else(|| unreachable!())
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.guard.as_deref_mut().unwrap_or_else(|| unreachable!())
    }
}
