//! How long the pool's state lock is waited for and held: two histograms of powers of two
//! of microseconds, and the longest hold with the line of code that took the lock. They
//! tell a slow lease that waited on the lock from one that waited for a CPU (issue 35 item
//! 4: no I/O under the lock), read through `GET /v1/pool/status` and `bench recycle
//! --churn`.
//!
//! Recording costs two clock reads per hold and a few relaxed atomic adds; the longest hold
//! takes a small mutex only when it is beaten.

use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Histogram buckets: bucket `i` counts durations under `2^i` µs (the last: the rest).
pub const BUCKETS: usize = 24;

/// Counts of durations by power of two of microseconds, and their sum.
#[derive(Debug, Default)]
struct Log2Hist {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Log2Hist {
    fn record(&self, d: Duration) {
        self.counts[bucket(d)].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn snapshot(&self) -> [u64; BUCKETS] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed))
    }

    fn seconds(&self) -> f64 {
        self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
    }
}

/// The bucket of `d`: the least `i` with `d < 2^i` µs, at most `BUCKETS - 1`.
fn bucket(d: Duration) -> usize {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let i = (u64::BITS - us.leading_zeros()) as usize;
    i.min(BUCKETS - 1)
}

/// The pool lock's waits and holds since start.
#[derive(Debug, Default)]
pub(in crate::pool) struct LockStats {
    wait: Log2Hist,
    hold: Log2Hist,
    longest_ns: AtomicU64,
    longest_at: Mutex<Option<&'static Location<'static>>>,
}

impl LockStats {
    /// Records a wait for the lock.
    pub(in crate::pool) fn waited(&self, d: Duration) {
        self.wait.record(d);
    }

    /// Records a hold of the lock taken at `at`.
    pub(in crate::pool) fn held(&self, d: Duration, at: &'static Location<'static>) {
        self.hold.record(d);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if self.longest_ns.fetch_max(ns, Ordering::Relaxed) < ns {
            // Another hold may beat this one between the two lines: the site shown is then
            // the later of the two, a near miss the figures tolerate.
            *self.longest_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
        }
    }

    /// What was recorded so far.
    pub(in crate::pool) fn snapshot(&self) -> LockSnapshot {
        let at = *self.longest_at.lock().unwrap_or_else(|e| e.into_inner());
        LockSnapshot {
            wait_us_log2: self.wait.snapshot(),
            hold_us_log2: self.hold.snapshot(),
            wait_seconds: self.wait.seconds(),
            hold_seconds: self.hold.seconds(),
            longest_hold_us: self.longest_ns.load(Ordering::Relaxed) / 1000,
            longest_hold_at: at.map(|l| format!("{}:{}", l.file(), l.line())),
        }
    }
}

/// The pool lock's figures since start (`GET /v1/pool/status`, `lock`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LockSnapshot {
    /// Waits for the lock: entry `i` counts those under `2^i` µs and at least `2^(i-1)`
    /// (the last entry: every longer one).
    pub wait_us_log2: [u64; BUCKETS],
    /// Holds of the lock, in the same buckets.
    pub hold_us_log2: [u64; BUCKETS],
    /// Seconds waited in all.
    #[serde(default)]
    pub wait_seconds: f64,
    /// Seconds held in all.
    #[serde(default)]
    pub hold_seconds: f64,
    /// The longest hold, µs.
    pub longest_hold_us: u64,
    /// The source line that took the lock for the longest hold.
    pub longest_hold_at: Option<String>,
}

impl LockSnapshot {
    /// The counts recorded since `before` (a snapshot of the same daemon).
    pub fn since(&self, before: &LockSnapshot) -> LockSnapshot {
        let sub = |a: &[u64; BUCKETS], b: &[u64; BUCKETS]| {
            std::array::from_fn(|i| a[i].saturating_sub(b[i]))
        };
        LockSnapshot {
            wait_us_log2: sub(&self.wait_us_log2, &before.wait_us_log2),
            hold_us_log2: sub(&self.hold_us_log2, &before.hold_us_log2),
            wait_seconds: (self.wait_seconds - before.wait_seconds).max(0.0),
            hold_seconds: (self.hold_seconds - before.hold_seconds).max(0.0),
            ..self.clone()
        }
    }

    /// The upper bound, µs, of the bucket that holds quantile `q` of the waits (0 when none).
    pub fn wait_quantile_us(&self, q: f64) -> u64 {
        quantile_us(&self.wait_us_log2, q)
    }

    /// The same for the holds.
    pub fn hold_quantile_us(&self, q: f64) -> u64 {
        quantile_us(&self.hold_us_log2, q)
    }

    /// Waits as Prometheus histogram buckets: (upper bound in seconds, count), not
    /// cumulative, the last bound `f64::MAX` (`+Inf`).
    pub fn wait_buckets(&self) -> Vec<(f64, u64)> {
        seconds_buckets(&self.wait_us_log2)
    }

    /// Holds, likewise.
    pub fn hold_buckets(&self) -> Vec<(f64, u64)> {
        seconds_buckets(&self.hold_us_log2)
    }
}

fn seconds_buckets(counts: &[u64; BUCKETS]) -> Vec<(f64, u64)> {
    counts
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let bound = if i + 1 == BUCKETS {
                f64::MAX
            } else {
                (1u64 << i) as f64 / 1e6
            };
            (bound, *n)
        })
        .collect()
}

/// The upper bound (µs) of the bucket in which quantile `q` of `counts` falls.
fn quantile_us(counts: &[u64; BUCKETS], q: f64) -> u64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = ((total as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return 1u64 << i;
        }
    }
    1u64 << (BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_of_microseconds() {
        assert_eq!(bucket(Duration::ZERO), 0);
        assert_eq!(bucket(Duration::from_nanos(999)), 0);
        assert_eq!(bucket(Duration::from_micros(1)), 1);
        assert_eq!(bucket(Duration::from_micros(3)), 2);
        assert_eq!(bucket(Duration::from_micros(4)), 3);
        assert_eq!(bucket(Duration::from_secs(3600)), BUCKETS - 1);
    }

    #[test]
    fn quantiles_and_deltas_follow_the_counts() {
        let s = LockStats::default();
        for _ in 0..99 {
            s.waited(Duration::from_micros(5));
        }
        let before = s.snapshot();
        s.waited(Duration::from_millis(3));
        s.held(Duration::from_millis(2), Location::caller());
        let after = s.snapshot();
        assert_eq!(after.wait_quantile_us(0.5), 8);
        assert_eq!(after.wait_quantile_us(1.0), 4096);
        let delta = after.since(&before);
        assert_eq!(delta.wait_us_log2.iter().sum::<u64>(), 1);
        assert_eq!(delta.hold_quantile_us(0.99), 2048);
        assert_eq!(after.longest_hold_us, 2000);
        assert!((after.hold_seconds - 0.002).abs() < 1e-9);
        let b = after.wait_buckets();
        assert_eq!((b[2].0, b[2].1), (4e-6, 0));
        assert_eq!((b[3].0, b[3].1), (8e-6, 99));
        assert_eq!(b[BUCKETS - 1].0, f64::MAX);
        assert!(after
            .longest_hold_at
            .is_some_and(|l| l.contains("lock_stats.rs")));
        assert_eq!(LockSnapshot::default().wait_quantile_us(0.99), 0);
    }
}
