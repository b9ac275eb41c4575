//! The pool's gauges and counters, read at each scrape: bytes by state, targets and whether
//! they are met, the refill's backlog, the kernel's pages, and how released memory came back.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use std::sync::atomic::AtomicU64;

use super::int;
use crate::pool::adaptive::AdaptiveStatus;
use crate::pool::{Pool, PoolStatus};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
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
struct AdaptiveLabels {
    /// A node, or `all` for a target of every node.
    node: String,
    page_size: String,
}

/// Registers the adaptive targets' gauges: the warm bytes each keeps now and the share of
/// starts its plan serves warm (absent before a target's first look).
pub(super) fn register_adaptive(reg: &mut Registry, targets: &[AdaptiveStatus]) {
    let bytes = Family::<AdaptiveLabels, Gauge>::default();
    let rate = Family::<AdaptiveLabels, Gauge<f64, AtomicU64>>::default();
    let goal = Family::<AdaptiveLabels, Gauge<f64, AtomicU64>>::default();
    for t in targets {
        let labels = AdaptiveLabels {
            node: t.node.map_or("all".to_string(), |n| n.to_string()),
            page_size: t.page_size.name().to_string(),
        };
        bytes.get_or_create(&labels).set(int(t.target_bytes));
        goal.get_or_create(&labels).set(t.goal_percent / 100.0);
        if let Some(why) = &t.why {
            rate.get_or_create(&labels).set(why.planned_rate);
        }
    }
    reg.register(
        "pool_adaptive_target_bytes",
        "Warm bytes an adaptive target keeps now, as the daemon sized it",
        bytes,
    );
    reg.register(
        "pool_adaptive_planned_warm_start_ratio",
        "The share of VM starts the adaptive target's plan serves warm",
        rate,
    );
    reg.register(
        "pool_adaptive_goal_warm_start_ratio",
        "The operator's warm-start goal of the adaptive target",
        goal,
    );
}

/// Registers the gauges of `status` (one consistent snapshot).
pub(super) fn register_status(reg: &mut Registry, status: &PoolStatus) {
    let bytes = Family::<StateLabels, Gauge>::default();
    let target = Family::<KindLabels, Gauge>::default();
    let met = Family::<KindLabels, Gauge>::default();
    let backlog = Family::<KindLabels, Gauge>::default();
    let free = Family::<KindLabels, Gauge>::default();
    let total = Family::<KindLabels, Gauge>::default();
    let reserved = Family::<KindLabels, Gauge>::default();
    for k in &status.kinds {
        let kind = KindLabels {
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
        met.get_or_create(&kind)
            .set(i64::from(k.warm_bytes >= k.target_bytes));
        backlog
            .get_or_create(&kind)
            .set(int(k.target_bytes.saturating_sub(k.warm_bytes)));
        // Base units: the kernel's and the daemon's page counts as bytes of their page size
        // (`hugeprep pool` and `GET /v1/pool` keep the counts).
        let page = k.page_size.bytes();
        free.get_or_create(&kind)
            .set(int(k.kernel_free_pages.saturating_mul(page)));
        total
            .get_or_create(&kind)
            .set(int(k.kernel_total_pages.saturating_mul(page)));
        reserved
            .get_or_create(&kind)
            .set(int(k.reserved_pages.saturating_mul(page)));
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
        "pool_target_met",
        "1 when the warm bytes reach the target of this node and page size, else 0",
        met,
    );
    reg.register(
        "refill_backlog_bytes",
        "Bytes the pool lacks to reach its warm target (target minus warm, at least 0): what the refill and the scrubs still have to bring",
        backlog,
    );
    reg.register(
        "kernel_hugepages_free_bytes",
        "Bytes of the kernel's free hugepages (free_hugepages times the page size) by node and page size",
        free,
    );
    reg.register(
        "kernel_hugepages_bytes",
        "Bytes of the kernel's hugepages (nr_hugepages times the page size) by node and page size",
        total,
    );
    reg.register(
        "reserved_hugepages_bytes",
        "Bytes of hugepages the daemon added to the kernel's pools, by node and page size",
        reserved,
    );
}

/// Registers the running totals of `pool` (faults, scrubs, release outcomes).
pub(super) fn register_counters(reg: &mut Registry, pool: &Pool, status: &PoolStatus) {
    reg.register(
        "release_proof",
        "How released leases are proven out of reach: kernel-counts (BPF), proc-walk (the fallback) or none (every release takes the kernel's path)",
        Info::new(ProofLabels {
            method: pool.proof_method().label().to_string(),
        }),
    );
    let c = &status.counters;
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
    let count = |path: &str, reason: &str, n: u64| {
        recycled
            .get_or_create(&RecycleLabels {
                path: path.into(),
                reason: reason.into(),
            })
            .inc_by(n);
    };
    count("scrub", "proven", c.proven_releases);
    for (reason, n) in pool.kernel_path_by_reason() {
        count("kernel", reason, n);
    }
    for (stage, n) in pool.failed_releases_by_stage() {
        count("failed", stage, n);
    }
    reg.register(
        "recycle",
        "Released leases by how their memory came back: scrubbed in place once proven out of everyone else's reach, the kernel's path (truncated, faulted anew) and why, or failed (deleted) and at which stage (docs/security.md)",
        recycled,
    );
    let proof_seconds = Counter::<f64>::default();
    proof_seconds.inc_by(c.proof_seconds);
    reg.register(
        "proof_seconds",
        "Seconds spent proving released leases out of reach",
        proof_seconds,
    );
    let compaction = pool.compaction_counts();
    for (name, help, n) in [
        (
            "pool_compactions",
            "Compactions of a node's memory the daemon ran because the kernel supplied fewer hugepages than a raise of its pool asked",
            compaction.compactions,
        ),
        (
            "pool_compaction_added_bytes",
            "Bytes of hugepages the kernel added after such a compaction (asks a compaction made good)",
            compaction.bytes_after_compaction,
        ),
        (
            "pool_raise_short_after_compaction",
            "Raises for a lease still short after every compaction: the lease was refused",
            compaction.raises_still_short,
        ),
    ] {
        let counter = Counter::<u64>::default();
        counter.inc_by(n);
        reg.register(name, help, counter);
    }
    let beyond = Counter::<u64>::default();
    beyond.inc_by(pool.proofs_beyond_mount_bound());
    reg.register(
        "proof_mounts_beyond_bound",
        "Release proofs by the kernel's counts whose file system had more mounts than their walk reads (4096): the rest were read from /proc, at the fallback walk's cost (a local user making mounts by the thousand; docs/security.md)",
        beyond,
    );
    let unreturned = Counter::<u64>::default();
    unreturned.inc_by(c.unreturned_bytes);
    reg.register(
        "unreturned_bytes",
        "Bytes of released leases' pages that did not return to the kernel when truncated: another process held them",
        unreturned,
    );
}
