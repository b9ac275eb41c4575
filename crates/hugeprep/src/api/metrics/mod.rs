//! `GET /metrics`: the daemon in the Prometheus text format (OpenMetrics 1.0), encoded by the
//! `prometheus-client` crate. Names follow Prometheus conventions (base units, `_total` on
//! counters, `_info` metrics for the build and the clearing method); labels have small fixed
//! value sets (node, page size, state, source, kind, reason), never a lease name or id. See
//! `docs/api.md`, "Metrics", and `docs/operations.md`, "Monitoring".
//!
//! The pool's state is read at each scrape into a fresh registry, so every gauge is one
//! consistent snapshot; the lease latencies and the error counts are events, kept in the
//! process-wide [`Events`] that the route layer feeds.
//!
//! This module owns the types it renders ([`Clearing`], [`Sources`]): the routes build them,
//! the metrics never reach back into the routes.

mod events;
mod lock;
mod pool;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

pub use events::{events, Events, HOST_LEASE_ERRORS};

use super::health::{Health, Reason};
use crate::placement;
use crate::policy::Verdict;
use crate::pool::{Pool, PoolStatus};

/// The `Content-Type` of `GET /metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The clearing decision as the metrics show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Clearing {
    /// The method in use.
    pub method: String,
    /// The policy rule that matched.
    pub rule: String,
    /// `rule` or `calibration`.
    pub decided_by: String,
    /// The rule's confidence.
    pub confidence: String,
    /// What calibration said about the rule.
    pub verdict: Verdict,
    /// The rule method's measured speed over the fastest method's, when calibrated.
    pub rule_speed_ratio: Option<f64>,
}

/// What one scrape reads.
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    /// The pool.
    pub pool: &'a Pool,
    /// Its status, read once for this scrape.
    pub status: &'a PoolStatus,
    /// The clearing decision.
    pub clearing: &'a Clearing,
    /// Health, judged from the same status.
    pub health: &'a Health,
    /// The Placement publisher, when one runs.
    pub placement: Option<&'a placement::Snapshot>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClearingLabels {
    method: String,
    rule: String,
    decided_by: String,
    confidence: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabel {
    verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    resource_class: String,
    page_size: String,
}

const MIB: u64 = 1 << 20;

pub(crate) fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The exposition text of `sources` now, with the API's events.
pub fn render(sources: Sources<'_>) -> String {
    let mut reg = Registry::with_prefix("hugeprep");
    reg.register(
        "build",
        "The daemon's version",
        Info::new(BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_string(),
        }),
    );
    pool::register_status(&mut reg, sources.status);
    pool::register_counters(&mut reg, sources.pool, sources.status);
    lock::register(&mut reg, &sources.status.lock);
    pool::register_adaptive(&mut reg, &sources.pool.adaptive());
    register_clearing(&mut reg, sources.clearing);
    register_health(&mut reg, sources.health);
    if let Some(p) = sources.placement {
        register_placement(&mut reg, p);
    }
    events().register(&mut reg);
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    out
}

fn register_clearing(reg: &mut Registry, c: &Clearing) {
    reg.register(
        "clearing",
        "The clearing method in use and the policy rule that chose it",
        Info::new(ClearingLabels {
            method: c.method.clone(),
            rule: c.rule.clone(),
            decided_by: c.decided_by.clone(),
            confidence: c.confidence.clone(),
        }),
    );
    let verdict = Family::<VerdictLabel, Gauge>::default();
    for v in Verdict::ALL {
        verdict
            .get_or_create(&VerdictLabel {
                verdict: v.label().into(),
            })
            .set(i64::from(v == c.verdict));
    }
    reg.register(
        "calibration_verdict",
        "What the startup calibration said about the policy rule's clearing method (1 for the verdict in force): not_calibrated, agrees (within tolerance of the fastest), overridden (replaced by the fastest), disagrees (clearly slower, kept)",
        verdict,
    );
    if let Some(ratio) = c.rule_speed_ratio {
        let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        g.set(ratio);
        reg.register(
            "calibration_rule_speed_ratio",
            "The policy rule's method speed over the fastest method's, as calibration measured them",
            g,
        );
    }
}

fn register_health(reg: &mut Registry, h: &Health) {
    let ready = Gauge::<i64>::default();
    ready.set(i64::from(h.reasons.is_empty()));
    reg.register(
        "ready",
        "1 when the daemon is ready, 0 when degraded (GET /health says why)",
        ready,
    );
    let degraded = Family::<ReasonLabel, Gauge>::default();
    for r in Reason::ALL {
        degraded
            .get_or_create(&ReasonLabel {
                reason: r.label().into(),
            })
            .set(i64::from(h.reasons.iter().any(|f| f.reason == r)));
    }
    reg.register(
        "degraded",
        "1 for each reason the daemon is degraded for (target_unmet, calibration_disagrees, proof_reader_stalled, placement)",
        degraded,
    );
}

fn register_placement(reg: &mut Registry, p: &placement::Snapshot) {
    let state = Family::<StateLabel, Gauge>::default();
    for s in placement::State::ALL {
        state
            .get_or_create(&StateLabel {
                state: s.label().into(),
            })
            .set(i64::from(s == p.state));
    }
    reg.register(
        "placement_state",
        "Where the OpenStack Placement publisher stands (1 for the state in force)",
        state,
    );
    let attempts = Family::<ResultLabel, Counter>::default();
    for (s, n) in &p.attempts {
        attempts
            .get_or_create(&ResultLabel {
                result: s.label().into(),
            })
            .inc_by(*n);
    }
    reg.register(
        "placement_updates",
        "Inventory updates of Placement by result (ok, or why they failed)",
        attempts,
    );
    // One gauge per meaning, in bytes (Placement counts the classes in MiB).
    let total = Family::<ClassLabels, Gauge>::default();
    let reserved = Family::<ClassLabels, Gauge>::default();
    let max_unit = Family::<ClassLabels, Gauge>::default();
    let used = Family::<ClassLabels, Gauge>::default();
    for c in &p.published {
        let labels = ClassLabels {
            resource_class: c.class.clone(),
            page_size: c.page_size.clone(),
        };
        for (family, mib) in [
            (&total, c.total),
            (&reserved, c.reserved),
            (&max_unit, c.max_unit),
            (&used, c.used),
        ] {
            family
                .get_or_create(&labels)
                .set(int(mib.saturating_mul(MIB)));
        }
    }
    reg.register(
        "placement_inventory_total_bytes",
        "The inventory total last published to Placement (warm, leased to allocations, and the rest of the target), bytes",
        total,
    );
    reg.register(
        "placement_inventory_reserved_bytes",
        "The inventory reserved last published to Placement (neither warm nor leased to an allocation), bytes",
        reserved,
    );
    reg.register(
        "placement_inventory_max_unit_bytes",
        "The inventory max_unit last published to Placement (the most one VM may be given: the largest NUMA node's offer), bytes",
        max_unit,
    );
    reg.register(
        "placement_used_bytes",
        "Placement's allocations of the class when the inventory was last published, bytes",
        used,
    );
    let secs = p
        .last_success
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64());
    let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    g.set(secs);
    reg.register(
        "placement_last_success_timestamp_seconds",
        "When Placement last accepted an inventory update (Unix time; 0: never)",
        g,
    );
}
