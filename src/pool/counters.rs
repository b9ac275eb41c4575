//! Running totals of the pool's work since start: bytes faulted cold on the lease path and
//! by the refill worker. Read by `hugeprep bench trace` (and the metrics).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Totals since the pool opened.
#[derive(Debug, Default)]
pub struct Counters {
    lease_faulted: AtomicU64,
    refill_faulted: AtomicU64,
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CounterSnapshot {
    /// Bytes faulted cold inside leases (cold and grown leases): a VM waited for them.
    pub lease_faulted_bytes: u64,
    /// Bytes faulted by the refill worker, in the background.
    pub refill_faulted_bytes: u64,
}

impl Counters {
    pub(super) fn lease_faulted(&self, bytes: u64) {
        self.lease_faulted.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn refill_faulted(&self, bytes: u64) {
        self.refill_faulted.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The totals now.
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            lease_faulted_bytes: self.lease_faulted.load(Ordering::Relaxed),
            refill_faulted_bytes: self.refill_faulted.load(Ordering::Relaxed),
        }
    }
}
