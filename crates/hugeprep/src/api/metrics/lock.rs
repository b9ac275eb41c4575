//! The pool lock's waits and holds as two Prometheus histograms, from the counts the pool
//! keeps in powers of two of microseconds (`pool::LockSnapshot`).

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::pool::LockSnapshot;

/// A histogram read whole at a scrape.
#[derive(Debug)]
struct Fixed {
    sum: f64,
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for Fixed {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let count = self.buckets.iter().map(|b| b.1).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum, count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Registers `pool_lock_wait_seconds` and `pool_lock_hold_seconds`.
pub(super) fn register(reg: &mut Registry, lock: &LockSnapshot) {
    reg.register(
        "pool_lock_wait_seconds",
        "Waits for the pool's state lock (leases, releases, the worker): a lease slowed by the lock shows here, one slowed by CPU does not",
        Fixed {
            sum: lock.wait_seconds,
            buckets: lock.wait_buckets(),
        },
    );
    reg.register(
        "pool_lock_hold_seconds",
        "Holds of the pool's state lock (no file I/O runs under it; docs/architecture.md, \"Where the state lock is held\")",
        Fixed {
            sum: lock.hold_seconds,
            buckets: lock.hold_buckets(),
        },
    );
}
