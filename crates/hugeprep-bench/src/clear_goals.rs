//! The clearing goals, restated relative to what the machine can do and measured in the same
//! run: (a) the method in use within 10% of the best measured method at chunks >= 2 MiB, at
//! every thread count; (c) the ratio to the kernel's fault-in of fresh 2M pages at every thread
//! count. Reported, never asserted.

use super::clear_report::POLICY_CHECK_MIN_CHUNK;
use super::clear_results::ClearBenchReport;
pub use super::clear_results::ThreadGoals;
use hugeprep::page_size::PageSize;

/// The in-use method's tolerance against the best method measured: 10%.
pub const GOAL_TOLERANCE: f64 = 0.10;

impl ClearBenchReport {
    /// The goals per thread count; empty without a policy.
    pub fn goals(&self) -> Vec<ThreadGoals> {
        let verdicts = self.policy_verdicts();
        let mut threads: Vec<usize> = verdicts.iter().map(|v| v.threads).collect();
        threads.sort_unstable();
        threads.dedup();
        threads
            .into_iter()
            .map(|t| {
                let cells: Vec<_> = verdicts.iter().filter(|v| v.threads == t).collect();
                let fraction = |v: &&super::clear_report::PolicyVerdict| v.fraction();
                let worst = cells
                    .iter()
                    .min_by(|a, b| fraction(a).total_cmp(&fraction(b)));
                let mut in_use: Vec<f64> = cells.iter().map(|v| v.policy_gbps).collect();
                in_use.sort_by(f64::total_cmp);
                let in_use_gbps = hugeprep::stats::Summary::of(&in_use).map_or(0.0, |s| s.median);
                let best_gbps = cells.iter().map(|v| v.best_gbps).fold(0.0, f64::max);
                let kernel = self
                    .kernel
                    .iter()
                    .find(|k| k.page_size == PageSize::Size2M && k.threads == t)
                    .map(|k| k.gbps.median)
                    .filter(|g| *g > 0.0);
                let within = cells.iter().filter(|v| v.within(GOAL_TOLERANCE)).count();
                let spreads: Vec<f64> = cells
                    .iter()
                    .filter_map(|v| {
                        let scrub = self.purposes.iter().find(|p| {
                            p.purpose == hugeprep::clear::ClearPurpose::Scrub
                                && p.chunk_bytes == v.chunk_bytes
                                && p.threads == t
                        })?;
                        let (a, b) = (scrub.gbps.median, v.policy_gbps);
                        (a.max(b) > 0.0).then(|| (a - b).abs() / a.max(b))
                    })
                    .collect();
                let noise = hugeprep::stats::Summary::of(&spreads).map(|s| s.median);
                ThreadGoals {
                    threads: t,
                    cells: cells.len(),
                    cells_within_10pct: within,
                    worst_fraction_of_best: worst.map_or(1.0, fraction),
                    worst_chunk_bytes: worst.map_or(POLICY_CHECK_MIN_CHUNK, |v| v.chunk_bytes),
                    within_10pct_everywhere: within == cells.len(),
                    kernel_2m_gbps: kernel,
                    in_use_gbps,
                    best_gbps,
                    in_use_to_kernel: kernel.map(|k| in_use_gbps / k),
                    best_to_kernel: kernel.map(|k| best_gbps / k),
                    noise,
                }
            })
            .collect()
    }

    /// The goals as text lines for the summary.
    pub fn goals_text(&self) -> String {
        let Some(policy) = &self.policy else {
            return String::new();
        };
        let mut out = format!(
            "\nGoals (reported, not asserted), method in use {} (rule {}, {}, decided by {}):\n",
            policy.method,
            policy.rule,
            policy.confidence,
            format!("{:?}", policy.decided_by).to_lowercase()
        );
        out += &format!("  why: {}\n", policy.reason);
        for g in self.goals() {
            let kernel = match (g.kernel_2m_gbps, g.in_use_to_kernel, g.best_to_kernel) {
                (Some(k), Some(u), Some(b)) => {
                    format!("kernel fault-in 2M {k:.1} GB/s: in use {u:.2}x, best {b:.2}x")
                }
                _ => "kernel fault-in 2M not measured".to_string(),
            };
            let noise = g.noise.map_or(String::new(), |n| {
                format!(
                    "; the same code timed twice differed by {:.0}% (median)",
                    n * 100.0
                )
            });
            out += &format!(
                "  {} thread{}: (a) {} of {} cells >= 2 MiB within 10% of the best{} (worst {:.0}% at {}{noise}); (c) {kernel}\n",
                g.threads,
                if g.threads == 1 { "" } else { "s" },
                g.cells_within_10pct,
                g.cells,
                if g.within_10pct_everywhere { ": met" } else { ": NOT met" },
                g.worst_fraction_of_best * 100.0,
                hugeprep::units::format_bytes(g.worst_chunk_bytes as u64),
            );
        }
        out
    }
}
