//! The file table: the pool's state under its one lock, the condvar that wakes waiters when
//! it changes, the shutdown flag and the byte counters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use crate::pool::state::State;
use crate::pool::{core::Core, counters, lock_stats, locked};

/// The pool's file table (see the module).
#[derive(Debug)]
pub(in crate::pool) struct Table {
    /// Every file and what is being done to it; taken through [`Table::lock`].
    state: Mutex<State>,
    /// Notified whenever the state changes in a way a waiter (a lease, the worker) cares about.
    pub(in crate::pool) changed: Condvar,
    shutdown: AtomicBool,
    /// Whether the journal said the last stop was clean (warm records trusted).
    pub(in crate::pool) clean_start: bool,
    /// Bytes faulted since start.
    pub(in crate::pool) counters: counters::Counters,
    /// How long the state lock was waited for and held.
    pub(in crate::pool) lock_stats: lock_stats::LockStats,
}

impl Table {
    pub(super) fn new(core: Core, clean_start: bool) -> Table {
        Table {
            state: Mutex::new(State {
                core,
                ..State::default()
            }),
            changed: Condvar::new(),
            shutdown: AtomicBool::new(false),
            clean_start,
            counters: counters::Counters::default(),
            lock_stats: lock_stats::LockStats::default(),
        }
    }

    /// Takes the state lock (with the priority ceiling, see [`locked`]).
    #[track_caller]
    pub(in crate::pool) fn lock(&self) -> locked::Locked<'_> {
        locked::Locked::take(&self.state, &self.lock_stats)
    }

    /// Wakes every waiter on the state.
    pub(in crate::pool) fn notify(&self) {
        self.changed.notify_all();
    }

    /// Whether [`Table::shut_down`] was called.
    pub(in crate::pool) fn is_shut_down(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    /// Marks the pool shut down and wakes every waiter.
    pub(in crate::pool) fn shut_down(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.notify();
    }
}
