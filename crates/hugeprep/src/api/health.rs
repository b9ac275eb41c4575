//! `GET /health`: ready, or degraded with the reasons an operator should act on. Served on
//! the API socket and on the metrics listener ([`super::monitor`]); `hugeprep_degraded{reason}`
//! says the same to Prometheus.
//!
//! Degraded means the daemon serves leases but something keeps it from doing its job
//! well: a warm target it cannot reach (and says why), a clearing method that calibration
//! found clearly slower than another and that stays in use, the release proof's open watch
//! stalled (releases wait or take the kernel's path), or a Placement it cannot update
//! (the scheduler sees stale warm capacity), a lease refused for want of memory in the last
//! 15 minutes, or a release proof that sends every release down the kernel's path. A target
//! being filled is not a reason: the pool is doing its job; nor are leases served cold (the
//! packaged defaults keep nothing warm).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::placement;
use crate::policy::Verdict;
use crate::pool::PoolStatus;

/// Ready or degraded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Nothing needs an operator.
    Ready,
    /// Serving, with reasons to look.
    Degraded,
}

/// Why the daemon is degraded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// A warm target cannot be met, and the pool says why (kernel short of pages, mount
    /// full, reserve limit).
    TargetUnmet,
    /// Calibration found the rule's clearing method clearly slower, and it stays in use.
    CalibrationDisagrees,
    /// The release proof's open watch has not turned for seconds: opens of leased files wait.
    ProofReaderStalled,
    /// Placement is configured and the last inventory update failed.
    Placement,
    /// A lease was refused for want of memory (422) in the last 15 minutes
    /// ([`crate::pool::REFUSAL_RECENT`]): a VM did not start.
    LeaseRefused,
    /// Every release takes the kernel's path (no open watch, or the kernel's counts differ
    /// from the proof's model): safe, but memory is faulted anew instead of scrubbed.
    ProofFallback,
}

impl Reason {
    /// Every reason, in label order.
    pub const ALL: [Reason; 6] = [
        Reason::TargetUnmet,
        Reason::CalibrationDisagrees,
        Reason::ProofReaderStalled,
        Reason::Placement,
        Reason::LeaseRefused,
        Reason::ProofFallback,
    ];

    /// The reason's name (a metric label value and the JSON's `reason`).
    pub const fn label(self) -> &'static str {
        match self {
            Reason::TargetUnmet => "target_unmet",
            Reason::CalibrationDisagrees => "calibration_disagrees",
            Reason::ProofReaderStalled => "proof_reader_stalled",
            Reason::Placement => "placement",
            Reason::LeaseRefused => "lease_refused",
            Reason::ProofFallback => "proof_fallback",
        }
    }
}

/// One reason and what it is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Which check.
    pub reason: Reason,
    /// What it found, with what to do.
    pub detail: String,
}

/// The answer of `GET /health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ready` or `degraded`.
    pub status: Status,
    /// Empty when ready.
    pub reasons: Vec<Finding>,
}

/// How long the open watch's reader may stand still before health says so (the watchdog
/// stops pinging at the same age).
pub const READER_STALL: Duration = Duration::from_secs(10);

/// What health is judged from.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The pool now.
    pub pool: &'a PoolStatus,
    /// The calibration's verdict on the policy rule.
    pub verdict: Verdict,
    /// How long the open watch's reader has been stalled, if it is.
    pub reader_stalled: Option<Duration>,
    /// The Placement publisher, when one runs.
    pub placement: Option<&'a placement::Snapshot>,
}

/// The HTTP status of a health answer: 200 when ready, 503 when degraded (the body says why
/// either way), so a plain HTTP check sees it.
pub fn http_status(health: &Health) -> axum::http::StatusCode {
    match health.status {
        Status::Ready => axum::http::StatusCode::OK,
        Status::Degraded => axum::http::StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// Judges `inputs`.
pub fn assess(inputs: Inputs<'_>) -> Health {
    let mut reasons = Vec::new();
    for k in &inputs.pool.kinds {
        if let Some(why) = &k.reason {
            reasons.push(Finding {
                reason: Reason::TargetUnmet,
                detail: format!("node {} {}: {why}", k.node, k.page_size),
            });
        }
    }
    if inputs.verdict == Verdict::Disagrees {
        reasons.push(Finding {
            reason: Reason::CalibrationDisagrees,
            detail: "calibration measured another clearing method clearly faster than the policy rule's, which stays in use: see `hugeprep cpu` and docs/clearing.md".into(),
        });
    }
    if let Some(stalled) = inputs.reader_stalled.filter(|d| *d >= READER_STALL) {
        reasons.push(Finding {
            reason: Reason::ProofReaderStalled,
            detail: format!(
                "the release proof's open watch has not turned for {} s: opens of leased files wait for it",
                stalled.as_secs()
            ),
        });
    }
    if let Some(p) = inputs.placement {
        if !matches!(p.state, placement::State::Ok | placement::State::Starting) {
            reasons.push(Finding {
                reason: Reason::Placement,
                detail: format!("Placement {}: {}", p.state.label(), p.detail),
            });
        }
    }
    if let Some(refused) = inputs
        .pool
        .last_refused_lease
        .as_ref()
        .filter(|r| r.is_recent())
    {
        reasons.push(Finding {
            reason: Reason::LeaseRefused,
            detail: refused.describe(),
        });
    }
    if let Some(why) = &inputs.pool.proof_fallback {
        reasons.push(Finding {
            reason: Reason::ProofFallback,
            detail: why.clone(),
        });
    }
    Health {
        status: if reasons.is_empty() {
            Status::Ready
        } else {
            Status::Degraded
        },
        reasons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Verification;

    fn pool(reason: Option<&str>) -> PoolStatus {
        let kind: crate::pool::KindStatus = serde_json::from_value(serde_json::json!({
            "node": 0, "page_size": "2M", "mount": "/dev/hugepages", "target_bytes": 8,
            "sizes": [], "warm_bytes": 0, "warm_files": 0, "leased_bytes": 0, "leases": 0,
            "dirty_bytes": 0, "scrubbing_bytes": 0, "filling_bytes": 0,
            "kernel_free_pages": 0, "kernel_total_pages": 0, "mount_used_bytes": null,
            "reason": reason,
        }))
        .unwrap();
        PoolStatus {
            kinds: vec![kind],
            verify: Verification::Sample,
            scrub_bandwidth: None,
            clean_start: true,
            last_scrub: None,
            counters: Default::default(),
            lock: Default::default(),
            last_refused_lease: None,
            proof_fallback: None,
            held_aside_files: 0,
            held_aside_bytes: 0,
            kept_files: 0,
            kept_bytes: 0,
        }
    }

    #[test]
    fn filling_is_ready_and_each_problem_is_a_reason() {
        let filling = pool(None);
        let h = assess(Inputs {
            pool: &filling,
            verdict: Verdict::Overridden,
            reader_stalled: Some(Duration::from_secs(1)),
            placement: None,
        });
        assert_eq!(h.status, Status::Ready, "{h:?}");

        let mut short = pool(Some("the kernel added 2 of 4 pages"));
        short.last_refused_lease = Some(crate::pool::RefusedLease {
            at_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
            node: 0,
            page_size: crate::PageSize::Size2M,
            size: 8 << 20,
            available: 2 << 20,
            reason: Some("the kernel added 1 of the 4 pages asked".into()),
        });
        short.proof_fallback = Some("the probe of descriptor 30 wrote 0 bytes".into());
        let mut snap = placement::Status::default().snapshot();
        snap.state = placement::State::Unreachable;
        snap.detail = "connection refused".into();
        let h = assess(Inputs {
            pool: &short,
            verdict: Verdict::Disagrees,
            reader_stalled: Some(READER_STALL),
            placement: Some(&snap),
        });
        assert_eq!(h.status, Status::Degraded);
        let got: Vec<Reason> = h.reasons.iter().map(|f| f.reason).collect();
        assert_eq!(got, Reason::ALL.to_vec());
        assert!(h.reasons[0]
            .detail
            .starts_with("node 0 2M: the kernel added"));
        assert!(h.reasons[3].detail.contains("connection refused"));
        assert!(
            h.reasons[4].detail.contains("refused 0 s ago")
                && h.reasons[4].detail.contains("added 1 of the 4"),
            "{h:?}"
        );
        assert!(h.reasons[5].detail.contains("descriptor 30"), "{h:?}");

        // A refusal an hour old is history, not a reason.
        let mut old = pool(None);
        old.last_refused_lease = short.last_refused_lease.clone().map(|mut r| {
            r.at_unix -= 3600;
            r
        });
        let h = assess(Inputs {
            pool: &old,
            verdict: Verdict::Overridden,
            reader_stalled: None,
            placement: None,
        });
        assert_eq!(h.status, Status::Ready, "{h:?}");
    }
}
