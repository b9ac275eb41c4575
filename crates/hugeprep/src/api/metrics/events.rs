//! What the API counts as it happens: lease latency and leases by source, error answers by
//! kind. Kept process-wide (one daemon per process); the route layer records, `render`
//! reads.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::pool::LeaseSource;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

fn lease_histogram() -> Histogram {
    // 50 µs to about 52 s: a warm lease is well under a millisecond, a cold one of many GiB
    // takes seconds.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 21))
}

/// Events the API counts: lease latency and leases by source, errors by kind.
#[derive(Debug)]
pub struct Events {
    lease_seconds: Family<SourceLabel, Histogram, fn() -> Histogram>,
    leases: Family<SourceLabel, Counter>,
    errors: Family<KindLabel, Counter>,
    lease_errors: Family<KindLabel, Counter>,
}

/// The kinds of lease error the host causes rather than the client (`ApiError::kind`): the
/// lease error rate alert counts these. Their counters exist from the start at 0, so that
/// the first failure shows in `rate()` and `increase()` (a series that appears at 1 does not).
pub const HOST_LEASE_ERRORS: [&str; 10] = [
    "insufficient",
    "pin",
    "shutting_down",
    "internal",
    "journal",
    "file",
    "fault",
    "reserve",
    "io",
    "directory",
];

/// The process's [`Events`].
pub fn events() -> &'static Events {
    static EVENTS: OnceLock<Events> = OnceLock::new();
    EVENTS.get_or_init(|| {
        let lease_errors = Family::<KindLabel, Counter>::default();
        for kind in HOST_LEASE_ERRORS {
            lease_errors
                .get_or_create(&KindLabel {
                    kind: kind.to_string(),
                })
                .inc_by(0);
        }
        Events {
            lease_seconds: Family::new_with_constructor(lease_histogram as fn() -> Histogram),
            leases: Family::default(),
            errors: Family::default(),
            lease_errors,
        }
    })
}

impl Events {
    /// Counts a lease made (not a replay) and its time from request to memory ready.
    pub fn lease(&self, source: LeaseSource, ready_ms: f64) {
        let label = SourceLabel {
            source: source.name().to_string(),
        };
        self.lease_seconds
            .get_or_create(&label)
            .observe(ready_ms / 1e3);
        self.leases.get_or_create(&label).inc();
    }

    /// Counts an error answer of `kind` (`hugeprep_errors_total{kind}`).
    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Counts a lease request answered with an error of `kind`
    /// (`hugeprep_lease_errors_total{kind}`; also in `hugeprep_errors_total`).
    pub fn lease_error(&self, kind: &str) {
        self.lease_errors
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    pub(super) fn register(&self, reg: &mut Registry) {
        reg.register(
            "lease_duration_seconds",
            "Time from lease request to memory ready, by where the memory came from",
            self.lease_seconds.clone(),
        );
        reg.register(
            "leases",
            "Leases made, by where the memory came from",
            self.leases.clone(),
        );
        reg.register(
            "errors",
            "Error answers of the API, by kind",
            self.errors.clone(),
        );
        reg.register(
            "lease_errors",
            "Lease requests (POST /v1/leases) answered with an error, by kind: with hugeprep_leases_total, the lease error rate",
            self.lease_errors.clone(),
        );
    }
}
