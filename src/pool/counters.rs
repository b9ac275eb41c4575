//! Running totals of the pool's work since start: bytes faulted cold on the lease path and
//! by the refill worker, bytes scrubbed, and the time each took. Read by `hugeprep bench
//! trace` and `GET /metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// Totals since the pool opened.
#[derive(Debug, Default)]
pub struct Counters {
    lease_faulted: AtomicU64,
    refill_faulted: AtomicU64,
    lease_fault_ns: AtomicU64,
    refill_fault_ns: AtomicU64,
    scrubbed: AtomicU64,
    scrub_ns: AtomicU64,
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CounterSnapshot {
    /// Bytes faulted cold inside leases (cold and grown leases): a VM waited for them.
    pub lease_faulted_bytes: u64,
    /// Bytes faulted by the refill worker, in the background.
    pub refill_faulted_bytes: u64,
    /// Seconds spent faulting inside leases.
    #[serde(default)]
    pub lease_fault_seconds: f64,
    /// Seconds the refill worker spent faulting.
    #[serde(default)]
    pub refill_fault_seconds: f64,
    /// Bytes scrubbed (released and unproven files), verification included.
    #[serde(default)]
    pub scrubbed_bytes: u64,
    /// Seconds of scrubbing and verifying.
    #[serde(default)]
    pub scrub_seconds: f64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Counters {
    pub(super) fn lease_faulted(&self, bytes: u64, took: Duration) {
        self.lease_faulted.fetch_add(bytes, Ordering::Relaxed);
        self.lease_fault_ns
            .fetch_add(nanos(took), Ordering::Relaxed);
    }

    pub(super) fn refill_faulted(&self, bytes: u64, took: Duration) {
        self.refill_faulted.fetch_add(bytes, Ordering::Relaxed);
        self.refill_fault_ns
            .fetch_add(nanos(took), Ordering::Relaxed);
    }

    pub(super) fn scrubbed(&self, bytes: u64, seconds: f64) {
        self.scrubbed.fetch_add(bytes, Ordering::Relaxed);
        let ns = (seconds.max(0.0) * 1e9) as u64;
        self.scrub_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The totals now.
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            lease_faulted_bytes: self.lease_faulted.load(Ordering::Relaxed),
            refill_faulted_bytes: self.refill_faulted.load(Ordering::Relaxed),
            lease_fault_seconds: self.lease_fault_ns.load(Ordering::Relaxed) as f64 / 1e9,
            refill_fault_seconds: self.refill_fault_ns.load(Ordering::Relaxed) as f64 / 1e9,
            scrubbed_bytes: self.scrubbed.load(Ordering::Relaxed),
            scrub_seconds: self.scrub_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}
