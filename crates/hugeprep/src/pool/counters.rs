//! Running totals of the pool's work since start: bytes faulted cold on the lease path and
//! by the refill worker, bytes scrubbed, and the time each took. Read by `hugeprep bench
//! trace` and `GET /metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::reach::Unproven;

/// Totals since the pool opened.
#[derive(Debug, Default)]
pub struct Counters {
    lease_faulted: AtomicU64,
    refill_faulted: AtomicU64,
    lease_fault_ns: AtomicU64,
    refill_fault_ns: AtomicU64,
    scrubbed: AtomicU64,
    scrub_ns: AtomicU64,
    proven: AtomicU64,
    proof_ns: AtomicU64,
    kernel_path: [AtomicU64; Unproven::LABELS.len()],
    failed: [AtomicU64; ReleaseFailure::ALL.len()],
    unreturned: AtomicU64,
    unreturned_bytes: AtomicU64,
    held_aside: AtomicU64,
}

/// Where recycling a released file failed, so that it was deleted instead of coming back
/// warm (the pages go back to the kernel; the refill faults new ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseFailure {
    /// The released file could not be opened.
    Open,
    /// It could not be cut to the size in demand.
    Cut,
    /// Its holes could not be refilled.
    Holes,
    /// The scrub or its verification failed.
    Scrub,
    /// The scrubbed file could not be journaled as warm.
    Journal,
}

impl ReleaseFailure {
    /// Every stage, in label order.
    pub const ALL: [ReleaseFailure; 5] = [
        ReleaseFailure::Open,
        ReleaseFailure::Cut,
        ReleaseFailure::Holes,
        ReleaseFailure::Scrub,
        ReleaseFailure::Journal,
    ];

    /// The stage's name, a metric label value.
    pub fn label(self) -> &'static str {
        match self {
            ReleaseFailure::Open => "open",
            ReleaseFailure::Cut => "cut",
            ReleaseFailure::Holes => "holes",
            ReleaseFailure::Scrub => "scrub",
            ReleaseFailure::Journal => "journal",
        }
    }
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
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
    /// Released files proven out of everyone else's reach (then scrubbed in place).
    #[serde(default)]
    pub proven_releases: u64,
    /// Seconds spent on those proofs.
    #[serde(default)]
    pub proof_seconds: f64,
    /// Released files that took the kernel's path (truncated and deleted).
    #[serde(default)]
    pub kernel_path_releases: u64,
    /// Released files whose recycling failed (open, cut, holes, scrub or journal): deleted,
    /// their pages back to the kernel.
    #[serde(default)]
    pub failed_releases: u64,
    /// Pages of those files that did not come back to the kernel's free list when truncated:
    /// someone still held them (measured from the node's free count across the truncate).
    #[serde(default)]
    pub unreturned_pages: u64,
    /// The same in bytes (pages of every size: `hugeprep_unreturned_bytes_total`).
    #[serde(default)]
    pub unreturned_bytes: u64,
    /// Proofs that found a released file still held, which then waited aside (see
    /// `pool::aside`).
    #[serde(default)]
    pub held_aside: u64,
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

    pub(super) fn proven(&self, took: Duration) {
        self.proven.fetch_add(1, Ordering::Relaxed);
        self.proof_ns.fetch_add(nanos(took), Ordering::Relaxed);
    }

    pub(super) fn kernel_path(&self, reason: &Unproven) {
        let at = Unproven::LABELS
            .iter()
            .position(|l| *l == reason.label())
            .unwrap_or(Unproven::LABELS.len() - 1);
        self.kernel_path[at].fetch_add(1, Ordering::Relaxed);
    }

    /// A release counted as proven takes the kernel's path after all (a check after the
    /// proof failed): it moves from the proven count to `reason`'s.
    pub(super) fn proven_then_kernel_path(&self, reason: &Unproven) {
        // `Err` is a count at 0 already (`checked_sub`): it stays at 0 rather than wrap.
        let _ = self
            .proven
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        self.kernel_path(reason);
    }

    pub(super) fn release_failed(&self, stage: ReleaseFailure) {
        let at = ReleaseFailure::ALL
            .iter()
            .position(|s| *s == stage)
            .unwrap_or(0);
        self.failed[at].fetch_add(1, Ordering::Relaxed);
    }

    /// A proof found a released file held: it waits aside.
    pub(super) fn held_aside(&self) {
        self.held_aside.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn unreturned(&self, pages: u64, page_bytes: u64) {
        self.unreturned.fetch_add(pages, Ordering::Relaxed);
        self.unreturned_bytes
            .fetch_add(pages.saturating_mul(page_bytes), Ordering::Relaxed);
    }

    /// Releases that took the kernel's path, by reason ([`Unproven::label`]).
    pub fn kernel_path_by_reason(&self) -> Vec<(&'static str, u64)> {
        Unproven::LABELS
            .iter()
            .zip(&self.kernel_path)
            .map(|(l, n)| (*l, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Released files whose recycling failed, by stage ([`ReleaseFailure::label`]).
    pub fn failed_by_stage(&self) -> Vec<(&'static str, u64)> {
        ReleaseFailure::ALL
            .iter()
            .zip(&self.failed)
            .map(|(s, n)| (s.label(), n.load(Ordering::Relaxed)))
            .collect()
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
            proven_releases: self.proven.load(Ordering::Relaxed),
            proof_seconds: self.proof_ns.load(Ordering::Relaxed) as f64 / 1e9,
            kernel_path_releases: self
                .kernel_path
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .sum(),
            failed_releases: self.failed.iter().map(|n| n.load(Ordering::Relaxed)).sum(),
            unreturned_pages: self.unreturned.load(Ordering::Relaxed),
            unreturned_bytes: self.unreturned_bytes.load(Ordering::Relaxed),
            held_aside: self.held_aside.load(Ordering::Relaxed),
        }
    }
}
