//! `hugeprep bench trace --days N`: pool policies side by side on a generated week-long VM
//! trace, replayed in simulated time: no pool (the kernel's path), the best static target a
//! sweep finds for the goal, and the adaptive target ([`hugeprep::pool::core::forecast`]). For
//! each page size: the warm-start rate (starts whose whole memory was warm) and the stranded
//! memory (warm but unleased: GiB·hours, and the peak as a share of the most the trace ever
//! held leased). A learning week precedes the measured days; only they are counted.

pub mod driven;
pub mod generate;
pub mod realtime;
pub mod replay;

use serde::Serialize;

use crate::svg::{LineChart, Series};
use generate::{TraceShape, VmLife, MONDAY};
use hugeprep::page_size::PageSize;
use hugeprep::pool::core::forecast::Goal;
use replay::{Outcome, Policy, PoolModel};

const GIB: u64 = 1 << 30;

/// What replays the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// The real pool driver on the simulated host ([`driven`]): file sizes, shapes, the
    /// release's scrub and the worker's jobs as the daemon does them.
    Driver,
    /// The fluid model of warm bytes ([`replay`]): milliseconds, no file sizes.
    Model,
}

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
    /// What replays it.
    pub engine: Engine,
}

/// One page size's comparison.
#[derive(Debug, Clone, Serialize)]
pub struct PageSizeResult {
    /// The page size.
    pub page_size: PageSize,
    /// No pool.
    pub none: Outcome,
    /// The model: the smallest static target that reaches the goal. The driver: hugeprep
    /// 0.1's fixed shape (files of the trace's sizes) at the target of [`Self::demand`].
    pub best_static: Outcome,
    /// The smallest static target that reaches the goal with today's demand shape (the
    /// driver only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demand: Option<Outcome>,
    /// The smallest static target that reached the goal on the learning weeks (what an
    /// operator could have known), replayed on the measured days (the model only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learned_static: Option<Outcome>,
    /// The adaptive target (with the demand shape).
    pub adaptive: Outcome,
    /// The bound (the model only): the adaptive plan made from the measured days' own
    /// needs, hour by hour ([`Policy::Hindsight`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hindsight: Option<Outcome>,
    /// The bound's stranded GiB·hours over the best static target's: no target set by
    /// the hour of the week goes below it on this trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hindsight_ratio: Option<f64>,
    /// The adaptive target's stranded GiB·hours over the best static one's (of either
    /// shape: the one with fewer).
    pub stranded_ratio: f64,
    /// Whether the adaptive target reached that static target's warm-start rate.
    pub rate_reached: bool,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct WeekReport {
    /// What was compared.
    pub config: WeekConfig,
    /// The trace replayed: `generated` or an operator's CSV file.
    pub trace: String,
    /// VM starts in the measured days (both page sizes).
    pub starts: usize,
    /// Per page size.
    pub page_sizes: Vec<PageSizeResult>,
    /// Wall-clock seconds the replays took.
    pub replay_seconds: f64,
}

/// Generates the trace and compares the policies.
pub fn run(config: &WeekConfig) -> Result<WeekReport, driven::DrivenError> {
    let learning_days = 7 * config.learning_weeks;
    let shape = TraceShape {
        days: config.shape.days + learning_days,
        ..config.shape.clone()
    };
    let trace = generate::generate(&shape);
    let measure_from = MONDAY + f64::from(learning_days) * 86_400.0;
    compare(config, "generated", &trace, measure_from)
}

/// Compares the policies on `trace` (sorted by start), counting from `measure_from` on.
pub fn compare(
    config: &WeekConfig,
    name: &str,
    trace: &[VmLife],
    measure_from: f64,
) -> Result<WeekReport, driven::DrivenError> {
    let began = std::time::Instant::now();
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
        if of_size.is_empty() {
            continue;
        }
        let rate = config.refill_rate;
        let mut bounds = None;
        let (none, best_static, demand, adaptive) = match config.engine {
            Engine::Model => {
                let none = replay::replay(&of_size, Policy::None, model, measure_from, false);
                let max = none.held_peak.max(GIB).saturating_mul(2);
                let best_static =
                    replay::best_static(&of_size, model, measure_from, config.goal_rate, GIB, max);
                let adaptive = replay::replay(
                    &of_size,
                    Policy::Adaptive { goal },
                    model,
                    measure_from,
                    true,
                );
                let learned = learned_static(&of_size, model, measure_from, config, max);
                let hindsight = replay::replay(
                    &of_size,
                    Policy::Hindsight { goal },
                    model,
                    measure_from,
                    false,
                );
                bounds = Some((learned, hindsight));
                (none, best_static, None, adaptive)
            }
            Engine::Driver => {
                let none = driven::replay(&of_size, ps, Policy::None, rate, measure_from, false)?;
                let max = none.held_peak.max(GIB).saturating_mul(2);
                let sweep = (config.goal_rate, GIB, max);
                let demand = driven::best_static(
                    &of_size,
                    ps,
                    |bytes| Policy::Demand { bytes },
                    rate,
                    measure_from,
                    sweep,
                )?;
                // hugeprep 0.1's fixed shape at the same target (a sweep of its own finds
                // none reaching 99% up to twice the peak, at ten times the replay's time).
                let bytes = match demand.policy {
                    Policy::Demand { bytes } => bytes,
                    _ => 0,
                };
                let fixed = driven::replay(
                    &of_size,
                    ps,
                    Policy::Static { bytes },
                    rate,
                    measure_from,
                    false,
                )?;
                let adaptive = driven::replay(
                    &of_size,
                    ps,
                    Policy::Adaptive { goal },
                    rate,
                    measure_from,
                    true,
                )?;
                (none, fixed, Some(demand), adaptive)
            }
        };
        // The static target to beat: of those reaching the goal, the one stranding least.
        let beat = [Some(&best_static), demand.as_ref()]
            .into_iter()
            .flatten()
            .filter(|o| o.warm_start_rate >= config.goal_rate)
            .min_by(|a, b| a.stranded_gib_h.total_cmp(&b.stranded_gib_h))
            .unwrap_or(&best_static);
        let of_beat = |o: &Outcome| o.stranded_gib_h / beat.stranded_gib_h.max(1e-9);
        let hindsight_ratio = bounds.as_ref().map(|(_, h)| of_beat(h));
        let (learned_static, hindsight) = bounds.unzip();
        page_sizes.push(PageSizeResult {
            page_size: ps,
            stranded_ratio: of_beat(&adaptive),
            hindsight_ratio,
            learned_static,
            hindsight,
            rate_reached: adaptive.warm_start_rate >= beat.warm_start_rate,
            none,
            best_static,
            demand,
            adaptive,
        });
    }
    Ok(WeekReport {
        config: config.clone(),
        trace: name.to_string(),
        starts: trace.iter().filter(|v| v.at_s >= measure_from).count(),
        page_sizes,
        replay_seconds: began.elapsed().as_secs_f64(),
    })
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

/// The policy's name in the table; `shapes`: the replay knew file shapes (the driver).
fn policy_name(p: &Policy, shapes: bool) -> String {
    match p {
        Policy::None => "none (kernel's path)".into(),
        Policy::Static { bytes } if shapes => format!("fixed shape ({} GiB)", bytes / GIB),
        Policy::Static { bytes } => format!("best static ({} GiB)", bytes / GIB),
        Policy::Demand { bytes } => format!("best static ({} GiB)", bytes / GIB),
        Policy::Adaptive { goal } => format!("adaptive ({:.1}%)", goal.warm_start_rate * 100.0),
        Policy::Hindsight { .. } => "bound: hour plan in hindsight".into(),
    }
}

impl WeekReport {
    /// The side-by-side table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{} trace{}, {} starts measured, goal {:.1}%, refill {:.1} GiB/s, Placement lead {:.0} s, replayed by the {:?} in {:.1} s\n",
            self.trace,
            if self.trace == "generated" {
                format!(
                    " (seed {}, {} measured days after {} learning weeks)",
                    self.config.shape.seed, self.config.shape.days, self.config.learning_weeks
                )
            } else {
                String::new()
            },
            self.starts,
            self.config.goal_rate * 100.0,
            self.config.refill_rate / GIB as f64,
            self.config.shape.placement_lead_s,
            self.config.engine,
            self.replay_seconds,
        );
        out.push_str(&format!(
            "{:<5} {:<30} {:>7} {:>10} {:>12} {:>12}\n",
            "pages", "policy", "starts", "warm", "stranded", "peak/held"
        ));
        for r in &self.page_sizes {
            for (o, learned) in [
                (Some(&r.none), false),
                (Some(&r.best_static), false),
                (r.demand.as_ref(), false),
                (r.learned_static.as_ref(), true),
                (Some(&r.adaptive), false),
                (r.hindsight.as_ref(), false),
            ] {
                let Some(o) = o else { continue };
                let name = if learned {
                    policy_name(&o.policy, false).replace("best", "learned")
                } else {
                    policy_name(&o.policy, r.demand.is_some())
                };
                out.push_str(&format!(
                    "{:<5} {:<30} {:>7} {:>9.2}% {:>9.0} GiBh {:>11.2}\n",
                    r.page_size.name(),
                    name,
                    o.starts,
                    o.warm_start_rate * 100.0,
                    o.stranded_gib_h,
                    o.stranded_peak as f64 / o.held_peak.max(1) as f64,
                ));
            }
            out.push_str(&format!(
                "{:<5} adaptive/best static stranded {:.2}, rate reached: {}",
                r.page_size.name(),
                r.stranded_ratio,
                r.rate_reached
            ));
            if let Some(h) = r.hindsight_ratio {
                out.push_str(&format!("; bound/best static {h:.2}"));
            }
            out.push('\n');
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
