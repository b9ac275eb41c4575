//! The pool lock with a priority ceiling: a `SCHED_IDLE` thread (the worker) runs in
//! `SCHED_OTHER` at the API's priority while it holds the lock. Otherwise, on a host whose CPUs are all busy, the
//! worker is preempted mid-hold for hundreds of milliseconds and every lease waits behind it
//! (priority inversion: measured as a warm-lease p99 of 480 ms with a busy loop per CPU).

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::State;
use crate::sys::priority;

/// The held pool lock; the caller's scheduling class is restored when it is dropped, after
/// the lock is released (fields drop in order).
pub(super) struct Locked<'a> {
    guard: Option<MutexGuard<'a, State>>,
    _ceiling: priority::OutOfIdle,
}

impl<'a> Locked<'a> {
    /// Takes `mutex`, first leaving `SCHED_IDLE` if the calling thread is in it.
    pub(super) fn take(mutex: &'a Mutex<State>) -> Locked<'a> {
        let ceiling = priority::OutOfIdle::enter_api();
        Locked {
            guard: Some(mutex.lock().unwrap_or_else(|e| e.into_inner())),
            _ceiling: ceiling,
        }
    }

    /// Waits on `cv` for at most `timeout`, the lock released meanwhile.
    pub(super) fn wait_timeout(mut self, cv: &Condvar, timeout: Duration) -> Locked<'a> {
        if let Some(guard) = self.guard.take() {
            self.guard = Some(
                cv.wait_timeout(guard, timeout)
                    .unwrap_or_else(|e| e.into_inner())
                    .0,
            );
        }
        self
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
