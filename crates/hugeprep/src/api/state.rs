//! The state the handlers share, and what `/v1/cpu`, `/metrics` and `/health` read from it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::health::{self, Health};
use super::metrics::{self, Clearing};
use crate::clear::{ClearPlan, Method as ClearMethod};
use crate::placement;
use crate::policy::{CalibrationOutcome, Verdict};
use crate::pool::Pool;

/// `GET /v1/cpu`: how memory is cleared and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CpuReport {
    /// The clearing method in use.
    pub method: ClearMethod,
    /// The plan (fence interval, minimum non-temporal extent).
    pub plan: ClearPlan,
    /// The policy rule that matched this CPU.
    pub rule: String,
    /// Where the rule's choice comes from (its `source` in the policy file).
    pub source: String,
    /// Whether the rule or the calibration run decided the method.
    pub decided_by: crate::policy::DecidedBy,
    /// The rule's confidence: `measured`, `published` or `guess`.
    #[serde(default)]
    pub confidence: crate::policy::Confidence,
    /// Why this method is in use: the rule alone, or what calibration measured and the
    /// margin it applied.
    #[serde(default)]
    pub reason: String,
    /// Calibration results, when a calibration ran.
    #[serde(default)]
    pub calibration: Option<serde_json::Value>,
}

/// Shared state of the handlers.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The pool.
    pub pool: Arc<Pool>,
    /// What `/v1/cpu` reports.
    pub cpu: Arc<CpuReport>,
    /// The Placement publisher, when one runs.
    pub placement: Option<Arc<placement::Status>>,
}

impl CpuReport {
    /// The calibration outcome this report carries, if a calibration ran.
    pub fn outcome(&self) -> Option<CalibrationOutcome> {
        let outcome = self.calibration.as_ref()?.get("outcome")?;
        serde_json::from_value(outcome.clone()).ok()
    }

    /// The clearing decision as the metrics show it.
    pub fn clearing(&self) -> Clearing {
        let word = |v: serde_json::Value| v.as_str().map(str::to_string).unwrap_or_default();
        let outcome = self.outcome();
        Clearing {
            method: self.method.to_string(),
            rule: self.rule.clone(),
            decided_by: word(serde_json::to_value(self.decided_by).unwrap_or_default()),
            confidence: self.confidence.name().to_string(),
            verdict: Verdict::of(outcome.as_ref()),
            rule_speed_ratio: outcome.and_then(|o| {
                let rule = o.rule_gbps?;
                (o.fastest_gbps > 0.0).then(|| rule / o.fastest_gbps)
            }),
        }
    }
}

impl ApiState {
    fn health_of(&self, status: &crate::pool::PoolStatus, clearing: &Clearing) -> Health {
        let placement = self.placement.as_ref().map(|p| p.snapshot());
        health::assess(health::Inputs {
            pool: status,
            verdict: clearing.verdict,
            reader_stalled: self.pool.reader_stalled(),
            placement: placement.as_ref(),
        })
    }

    /// Health now (blocking: reads the pool and sysfs).
    pub fn health(&self) -> Health {
        self.health_of(&self.pool.status(), &self.cpu.clearing())
    }

    /// The metrics text now (blocking: reads the pool and sysfs).
    pub fn metrics_text(&self) -> String {
        let status = self.pool.status();
        let clearing = self.cpu.clearing();
        let health = self.health_of(&status, &clearing);
        let placement = self.placement.as_ref().map(|p| p.snapshot());
        metrics::render(metrics::Sources {
            pool: &self.pool,
            status: &status,
            clearing: &clearing,
            health: &health,
            placement: placement.as_ref(),
        })
    }
}
