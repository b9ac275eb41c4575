//! What `hugeprep bench clear` measures: methods, chunk sizes, thread counts, buffer,
//! repetitions, and the clearing decision in use.

use serde::Serialize;

use super::clear::ClearBenchError;
use hugeprep::clear::{ClearPlan, Method};
use hugeprep::page_size::PageSize;
use hugeprep::policy::{Confidence, DecidedBy, Resolution};
use hugeprep::sys::affinity::allowed_cpus;

/// The chunk sizes of a full run: a base page, the smallest extent where a per-call `sfence`
/// stops hurting, a 2 MiB hugepage, around and above the LLC, and a 1 GiB hugepage.
pub const CHUNK_SIZES: [usize; 7] = [
    4 << 10,
    64 << 10,
    2 << 20,
    8 << 20,
    32 << 20,
    128 << 20,
    1 << 30,
];

/// Fewest timed repetitions a measurement may have: a median and range need a handful.
pub const MIN_REPS: usize = 5;

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct ClearBenchConfig {
    /// Methods to time (each must be available).
    pub methods: Vec<Method>,
    /// Bytes per kernel call; sizes larger than the buffer are skipped with a note.
    pub chunk_sizes: Vec<usize>,
    /// Worker thread counts; at most the number of CPUs this process may use.
    pub threads: Vec<usize>,
    /// Bytes cleared per repetition (a multiple of 2 MiB); also the size of the 2 MiB
    /// fault-in baseline.
    pub buffer_bytes: usize,
    /// Timed repetitions per measurement, after one warm-up ([`MIN_REPS`] or more).
    pub reps: usize,
    /// Page sizes whose kernel fault-in is measured as the baseline.
    pub kernel_page_sizes: Vec<PageSize>,
    /// The clearing decision in use, reported alongside; its plan is also timed for both
    /// [`hugeprep::clear::ClearPurpose`]s.
    pub policy: Option<PolicyChoice>,
}

impl ClearBenchConfig {
    /// The full run: every available method, [`CHUNK_SIZES`], 1 to all allowed CPUs, a
    /// 1 GiB buffer, 7 repetitions, 2 MiB and 1 GiB fault-in baselines.
    pub fn full() -> ClearBenchConfig {
        ClearBenchConfig {
            methods: hugeprep::clear::available_methods(),
            chunk_sizes: CHUNK_SIZES.to_vec(),
            threads: (1..=allowed_cpus().len().max(1)).collect(),
            buffer_bytes: 1 << 30,
            reps: 7,
            kernel_page_sizes: PageSize::ALL.to_vec(),
            policy: None,
        }
    }

    /// The quick run (well under a minute on two cores): no 1 GiB or 8 MiB chunks, a
    /// 512 MiB buffer, 5 repetitions.
    pub fn quick() -> ClearBenchConfig {
        ClearBenchConfig {
            chunk_sizes: vec![4 << 10, 64 << 10, 2 << 20, 32 << 20, 128 << 20],
            buffer_bytes: 512 << 20,
            reps: MIN_REPS,
            ..ClearBenchConfig::full()
        }
    }

    pub(super) fn validate(&self, cpus: &[usize]) -> Result<(), ClearBenchError> {
        let bad = |field, problem: String| Err(ClearBenchError::Config { field, problem });
        let page = PageSize::Size2M.bytes() as usize;
        if self.methods.is_empty() {
            return bad("methods", "is empty: name at least one method".into());
        }
        if self.buffer_bytes == 0 || self.buffer_bytes % page != 0 {
            return bad(
                "buffer",
                format!(
                    "= {} must be a positive multiple of 2 MiB",
                    self.buffer_bytes
                ),
            );
        }
        if let Some(&c) = self.chunk_sizes.iter().find(|&&c| c == 0 || c % 4096 != 0) {
            return bad(
                "chunks",
                format!("contains {c}: chunk sizes must be positive multiples of 4 KiB"),
            );
        }
        if self.chunk_sizes.is_empty() {
            return bad("chunks", "is empty".into());
        }
        match self.threads.iter().find(|&&t| t == 0 || t > cpus.len()) {
            Some(&t) => {
                return bad(
                    "threads",
                    format!(
                        "contains {t}: thread counts must be 1 to {} (the CPUs this process may use: {cpus:?})",
                        cpus.len()
                    ),
                )
            }
            None if self.threads.is_empty() => return bad("threads", "is empty".into()),
            None => {}
        }
        if self.reps < MIN_REPS {
            return bad(
                "reps",
                format!("= {} is below the minimum of {MIN_REPS}", self.reps),
            );
        }
        Ok(())
    }
}

/// The clearing decision in use, as reported beside the measurements: the method with the
/// default settings (rule plus `auto` calibration), the rule, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyChoice {
    /// The method in use on this CPU.
    pub method: Method,
    /// The rule that matched.
    pub rule: String,
    /// The rule's confidence.
    pub confidence: Confidence,
    /// Whether the rule or calibration chose `method`.
    pub decided_by: DecidedBy,
    /// Why, in one sentence.
    pub reason: String,
    /// The plan in use (its `nt_min_extent` decides the use-soon rows).
    pub plan: ClearPlan,
}

impl PolicyChoice {
    /// The choice a [`Resolution`] describes.
    pub fn from_resolution(r: &Resolution) -> PolicyChoice {
        PolicyChoice {
            method: r.method(),
            rule: r.rule.clone(),
            confidence: r.confidence,
            decided_by: r.decided_by,
            reason: r.calibration.as_ref().map_or_else(
                || format!("rule {} ({}), not calibrated", r.rule, r.confidence),
                |c| c.reason.clone(),
            ),
            plan: r.plan,
        }
    }

    /// A choice made by `rule` alone with `plan`, not calibrated.
    pub fn rule_only(plan: ClearPlan, rule: &str) -> PolicyChoice {
        PolicyChoice {
            method: plan.method,
            rule: rule.to_string(),
            confidence: Confidence::Guess,
            decided_by: DecidedBy::Rule,
            reason: format!("rule {rule}, not calibrated"),
            plan,
        }
    }
}
