//! Background work that gives way to VM starts.
//!
//! The pool's refills and background scrubs fault and clear memory on the same CPUs, with
//! the same memory bandwidth and the same kernel locks (the hugetlb fault mutexes, the
//! `hugetlb_lock`) that a VMM starting on a lease needs. They call [`Yield::wait_turn`]
//! between extents; the pool's start gate (`pool::gate`) holds them there while a start is
//! under way.

use std::fmt::Debug;

/// Something background work waits on between extents.
pub trait Yield: Send + Sync + Debug {
    /// Returns once the work may go on: at once when nothing asks it to wait.
    fn wait_turn(&self);
}
