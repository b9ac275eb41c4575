//! `GET /metrics`: the daemon in the Prometheus text format (OpenMetrics 1.0), encoded by the
//! `prometheus-client` crate. Names follow Prometheus conventions (base units, `_total` on
//! counters, an `_info` metric for the clearing method); labels have small fixed value sets
//! (node, page size, state, source, kind), never a lease name or id. See `docs/api.md`,
//! "Metrics".
//!
//! The pool's state is read at each scrape into a fresh registry, so every gauge is one
//! consistent snapshot; the lease latencies and the error counts are events, kept in a
//! process-wide [`ApiMetrics`] (one daemon per process).

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use super::routes::CpuReport;
use crate::pool::{LeaseSource, Pool};

/// The `Content-Type` of `GET /metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    node: String,
    page_size: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    node: String,
    page_size: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabel {
    path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RecycleLabels {
    path: String,
    reason: String,
}

/// How releases are proven (`hugeprep_release_proof_info`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProofLabels {
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClearingLabels {
    method: String,
    rule: String,
    decided_by: String,
    confidence: String,
}

fn lease_histogram() -> Histogram {
    // 50 µs to about 52 s: a warm lease is well under a millisecond, a cold one of many GiB
    // takes seconds.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 21))
}

/// Events the API counts: lease latency and leases by source, errors by kind.
#[derive(Debug)]
pub struct ApiMetrics {
    lease_seconds: Family<SourceLabel, Histogram, fn() -> Histogram>,
    leases: Family<SourceLabel, Counter>,
    errors: Family<KindLabel, Counter>,
}

/// The process's [`ApiMetrics`].
pub fn api_metrics() -> &'static ApiMetrics {
    static METRICS: OnceLock<ApiMetrics> = OnceLock::new();
    METRICS.get_or_init(|| ApiMetrics {
        lease_seconds: Family::new_with_constructor(lease_histogram as fn() -> Histogram),
        leases: Family::default(),
        errors: Family::default(),
    })
}

impl ApiMetrics {
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

    /// Counts an error answer of `kind` (see [`ApiError::kind`](super::ApiError::kind)).
    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }
}

fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The exposition text of `pool` and `cpu` now, with the API's events.
pub fn render(pool: &Pool, cpu: &CpuReport) -> String {
    let mut reg = Registry::with_prefix("hugeprep");
    let status = pool.status();

    let bytes = Family::<StateLabels, Gauge>::default();
    let target = Family::<PoolLabels, Gauge>::default();
    let free = Family::<PoolLabels, Gauge>::default();
    let total = Family::<PoolLabels, Gauge>::default();
    let reserved = Family::<PoolLabels, Gauge>::default();
    for k in &status.kinds {
        let kind = PoolLabels {
            node: k.node.to_string(),
            page_size: k.page_size.name().to_string(),
        };
        for (state, b) in [
            ("warm", k.warm_bytes),
            ("leased", k.leased_bytes),
            ("dirty", k.dirty_bytes),
            ("scrubbing", k.scrubbing_bytes),
            ("filling", k.filling_bytes),
        ] {
            let labels = StateLabels {
                node: kind.node.clone(),
                page_size: kind.page_size.clone(),
                state: state.to_string(),
            };
            bytes.get_or_create(&labels).set(int(b));
        }
        target.get_or_create(&kind).set(int(k.target_bytes));
        free.get_or_create(&kind).set(int(k.kernel_free_pages));
        total.get_or_create(&kind).set(int(k.kernel_total_pages));
        reserved.get_or_create(&kind).set(int(k.reserved_pages));
    }
    reg.register(
        "pool_bytes",
        "Bytes of pool files by node, page size and state",
        bytes,
    );
    reg.register(
        "pool_target_bytes",
        "Bytes the policy keeps warm by node and page size",
        target,
    );
    reg.register(
        "kernel_free_pages",
        "The kernel's free hugepages by node and page size",
        free,
    );
    reg.register(
        "kernel_pages",
        "The kernel's hugepages (nr_hugepages) by node and page size",
        total,
    );
    reg.register(
        "reserved_pages",
        "Hugepages the daemon added to the kernel's pools, by node and page size",
        reserved,
    );

    let c = pool.counters();
    let fault_bytes = Family::<PathLabel, Counter>::default();
    let fault_seconds = Family::<PathLabel, Counter<f64>>::default();
    for (path, b, s) in [
        ("lease", c.lease_faulted_bytes, c.lease_fault_seconds),
        ("refill", c.refill_faulted_bytes, c.refill_fault_seconds),
    ] {
        let label = PathLabel {
            path: path.to_string(),
        };
        fault_bytes.get_or_create(&label).inc_by(b);
        fault_seconds.get_or_create(&label).inc_by(s);
    }
    reg.register(
        "fault_bytes",
        "Bytes faulted fresh from the kernel, on the lease path or by the refill worker",
        fault_bytes,
    );
    reg.register(
        "fault_seconds",
        "Seconds spent faulting, on the lease path or by the refill worker",
        fault_seconds,
    );
    let scrub_bytes = Counter::<u64>::default();
    scrub_bytes.inc_by(c.scrubbed_bytes);
    let scrub_seconds = Counter::<f64>::default();
    scrub_seconds.inc_by(c.scrub_seconds);
    reg.register("scrub_bytes", "Bytes scrubbed and verified", scrub_bytes);
    reg.register(
        "scrub_seconds",
        "Seconds spent scrubbing and verifying",
        scrub_seconds,
    );

    let recycled = Family::<RecycleLabels, Counter>::default();
    recycled
        .get_or_create(&RecycleLabels {
            path: "scrub".into(),
            reason: "proven".into(),
        })
        .inc_by(c.proven_releases);
    for (reason, n) in pool.kernel_path_by_reason() {
        recycled
            .get_or_create(&RecycleLabels {
                path: "kernel".into(),
                reason: reason.into(),
            })
            .inc_by(n);
    }
    reg.register(
        "recycle",
        "Released leases by how their memory came back: scrubbed in place once proven out of everyone else's reach, or the kernel's path (truncated, faulted anew) and why (docs/security.md)",
        recycled,
    );
    let proof_seconds = Counter::<f64>::default();
    proof_seconds.inc_by(c.proof_seconds);
    reg.register(
        "proof_seconds",
        "Seconds spent proving released leases out of reach",
        proof_seconds,
    );
    let unreturned = Counter::<u64>::default();
    unreturned.inc_by(c.unreturned_pages);
    reg.register(
        "unreturned_pages",
        "Pages of released leases that did not return to the kernel when truncated: another process held them",
        unreturned,
    );

    let word = |v: serde_json::Value| v.as_str().map(str::to_string).unwrap_or_default();
    reg.register(
        "clearing",
        "The clearing method in use and the policy rule that chose it",
        Info::new(ClearingLabels {
            method: cpu.method.to_string(),
            rule: cpu.rule.clone(),
            decided_by: word(serde_json::to_value(cpu.decided_by).unwrap_or_default()),
            confidence: word(serde_json::to_value(cpu.confidence).unwrap_or_default()),
        }),
    );

    reg.register(
        "release_proof",
        "How released leases are proven out of reach: kernel-counts (BPF), proc-walk (the fallback) or none (every release takes the kernel's path)",
        Info::new(ProofLabels {
            method: pool.proof_method().label().to_string(),
        }),
    );

    let api = api_metrics();
    reg.register(
        "lease_duration_seconds",
        "Time from lease request to memory ready, by where the memory came from",
        api.lease_seconds.clone(),
    );
    reg.register(
        "leases",
        "Leases made, by where the memory came from",
        api.leases.clone(),
    );
    reg.register(
        "errors",
        "Error answers of the API, by kind",
        api.errors.clone(),
    );

    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    out
}
