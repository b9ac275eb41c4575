//! `hugeprep bench trace --days N`: pool policies side by side on a generated week-long VM
//! trace, replayed in simulated time: no pool (the kernel's path), the best static target a
//! sweep finds for the goal, and the adaptive target ([`hugeprep::pool::core::forecast`]). For
//! each page size: the warm-start rate (starts whose whole memory was warm) and the stranded
//! memory (warm but unleased: GiB·hours, and the peak as a share of the most the trace ever
//! held leased). A learning week precedes the measured days; only they are counted.

pub mod generate;
pub mod replay;

use serde::Serialize;

use crate::svg::{LineChart, Series};
use generate::{TraceShape, VmLife, MONDAY};
use hugeprep::page_size::PageSize;
use hugeprep::pool::core::forecast::Goal;
use replay::{Outcome, Policy, PoolModel};

const GIB: u64 = 1 << 30;

/// What to compare.
#[derive(Debug, Clone, Serialize)]
pub struct WeekConfig {
    /// The trace (its `days` are the measured days; a learning week is added before).
    pub shape: TraceShape,
    /// The warm-start goal of the adaptive target, and the rate the best static target must
    /// reach.
    pub goal_rate: f64,
    /// Bytes per second the pool makes warm, per page size (its measured fault rate).
    pub refill_rate: f64,
    /// Weeks of the trace before the measured days, in which the adaptive target learns
    /// (a daemon that has run that long; the forecast keeps 4).
    pub learning_weeks: u32,
}

/// One page size's comparison.
#[derive(Debug, Clone, Serialize)]
pub struct PageSizeResult {
    /// The page size.
    pub page_size: PageSize,
    /// No pool.
    pub none: Outcome,
    /// The smallest static target that reaches the goal on the measured days: a sweep in
    /// hindsight, which no operator can run.
    pub best_static: Outcome,
    /// The smallest static target that reached the goal on the learning weeks (what an
    /// operator could have known), replayed on the measured days.
    pub learned_static: Outcome,
    /// The adaptive target.
    pub adaptive: Outcome,
    /// The bound: the adaptive plan made from the measured days' own needs.
    pub hindsight: Outcome,
    /// The bound's stranded GiB·hours over the best static target's: no target set by
    /// the hour of the week goes below it on this trace.
    pub hindsight_ratio: f64,
    /// The adaptive target's stranded GiB·hours over the best static one's.
    pub stranded_ratio: f64,
    /// Whether the adaptive target reached the best static target's warm-start rate.
    pub rate_reached: bool,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct WeekReport {
    /// What was compared.
    pub config: WeekConfig,
    /// VM starts in the measured days (both page sizes).
    pub starts: usize,
    /// Per page size.
    pub page_sizes: Vec<PageSizeResult>,
}

/// Generates the trace and compares the policies.
pub fn run(config: &WeekConfig) -> WeekReport {
    let learning_days = 7 * config.learning_weeks;
    let shape = TraceShape {
        days: config.shape.days + learning_days,
        ..config.shape.clone()
    };
    let trace = generate::generate(&shape);
    let measure_from = MONDAY + f64::from(learning_days) * 86_400.0;
    let model = PoolModel {
        refill_rate: config.refill_rate,
    };
    let goal = Goal {
        warm_start_rate: config.goal_rate,
        ceiling: u64::MAX,
    };
    let mut page_sizes = Vec::new();
    for ps in [PageSize::Size2M, PageSize::Size1G] {
        let of_size: Vec<VmLife> = trace
            .iter()
            .copied()
            .filter(|v| v.page_size == ps)
            .collect();
        let none = replay::replay(&of_size, Policy::None, model, measure_from, false);
        let max = none.held_peak.max(GIB).saturating_mul(2);
        let best_static =
            replay::best_static(&of_size, model, measure_from, config.goal_rate, GIB, max);
        let learned_static = learned_static(&of_size, model, measure_from, config, max);
        let adaptive = replay::replay(
            &of_size,
            Policy::Adaptive { goal },
            model,
            measure_from,
            true,
        );
        let hindsight = replay::replay(
            &of_size,
            Policy::Hindsight { goal },
            model,
            measure_from,
            false,
        );
        let of_static = |o: &Outcome| o.stranded_gib_h / best_static.stranded_gib_h.max(1e-9);
        page_sizes.push(PageSizeResult {
            page_size: ps,
            stranded_ratio: of_static(&adaptive),
            hindsight_ratio: of_static(&hindsight),
            rate_reached: adaptive.warm_start_rate >= best_static.warm_start_rate,
            none,
            best_static,
            learned_static,
            adaptive,
            hindsight,
        });
    }
    WeekReport {
        config: config.clone(),
        starts: trace.iter().filter(|v| v.at_s >= measure_from).count(),
        page_sizes,
    }
}

/// The static target an operator could have chosen: the smallest that reached the goal on
/// the learning weeks, replayed on the measured days.
fn learned_static(
    trace: &[VmLife],
    model: PoolModel,
    measure_from: f64,
    config: &WeekConfig,
    max: u64,
) -> Outcome {
    let learning: Vec<VmLife> = trace
        .iter()
        .copied()
        .filter(|v| v.at_s < measure_from)
        .collect();
    let from = MONDAY.min(measure_from);
    let swept = replay::best_static(&learning, model, from, config.goal_rate, GIB, max);
    let bytes = match swept.policy {
        Policy::Static { bytes } => bytes,
        _ => 0,
    };
    replay::replay(trace, Policy::Static { bytes }, model, measure_from, false)
}

fn policy_name(p: &Policy, row: &str) -> String {
    match p {
        Policy::None => "none (kernel's path)".into(),
        Policy::Static { bytes } => format!("{row} static ({} GiB)", bytes / GIB),
        Policy::Adaptive { goal } => format!("adaptive ({:.1}%)", goal.warm_start_rate * 100.0),
        Policy::Hindsight { .. } => "bound: hour plan in hindsight".into(),
    }
}

impl WeekReport {
    /// The side-by-side table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "seed {}, {} measured days after {} learning weeks, {} starts, goal {:.1}%, refill {:.1} GiB/s, Placement lead {:.0} s\n",
            self.config.shape.seed,
            self.config.shape.days,
            self.config.learning_weeks,
            self.starts,
            self.config.goal_rate * 100.0,
            self.config.refill_rate / GIB as f64,
            self.config.shape.placement_lead_s
        );
        out.push_str(&format!(
            "{:<5} {:<30} {:>7} {:>10} {:>12} {:>12}\n",
            "pages", "policy", "starts", "warm", "stranded", "peak/held"
        ));
        for r in &self.page_sizes {
            for (o, row) in [
                (&r.none, ""),
                (&r.best_static, "best"),
                (&r.learned_static, "learned"),
                (&r.adaptive, ""),
                (&r.hindsight, ""),
            ] {
                out.push_str(&format!(
                    "{:<5} {:<30} {:>7} {:>9.2}% {:>9.0} GiBh {:>11.2}\n",
                    r.page_size.name(),
                    policy_name(&o.policy, row),
                    o.starts,
                    o.warm_start_rate * 100.0,
                    o.stranded_gib_h,
                    o.stranded_peak as f64 / o.held_peak.max(1) as f64,
                ));
            }
            out.push_str(&format!(
                "{:<5} adaptive/best static stranded {:.2}, rate reached: {}; bound/best static {:.2}\n",
                r.page_size.name(),
                r.stranded_ratio,
                r.rate_reached,
                r.hindsight_ratio
            ));
        }
        out
    }

    /// The plot of warm, leased and target bytes over the measured days, per page size,
    /// with the adaptive target (SVG).
    pub fn svg(&self) -> String {
        let mut series = Vec::new();
        for r in &self.page_sizes {
            let pts = &r.adaptive.series;
            let gib = |f: fn(&replay::Point) -> u64| -> Vec<(f64, f64)> {
                pts.iter()
                    .map(|p| (p.hour, f(p) as f64 / GIB as f64))
                    .collect()
            };
            let name = r.page_size.name();
            series.push(Series {
                name: format!("{name} leased"),
                points: gib(|p| p.leased),
            });
            series.push(Series {
                name: format!("{name} target"),
                points: gib(|p| p.target),
            });
            series.push(Series {
                name: format!("{name} warm"),
                points: gib(|p| p.warm),
            });
        }
        LineChart {
            title: format!(
                "Adaptive warm target, seed {}: GiB over the measured week",
                self.config.shape.seed
            ),
            x_label: "hours from Monday 00:00".into(),
            y_label: "GiB".into(),
            x_ticks: (0..=7)
                .map(|d| (f64::from(d) * 24.0, format!("{}", d * 24)))
                .collect(),
            series,
            ..LineChart::default()
        }
        .render()
    }
}
