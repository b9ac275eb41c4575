//! The migration run's results: median and range per case, hugeprep against the floor paired
//! per repetition, the targets, and the table.

use serde::Serialize;

use super::super::table;
use super::super::{VmStartBenchConfig, World};
use super::{MigrateCase, Sample};
use crate::Summary;
use hugeprep::page_size::PageSize;

/// The target: a warm destination is ready within this many seconds of the floor's.
pub const READY_TARGET_S: f64 = 0.005;

/// One destination case at one size.
#[derive(Debug, Clone, Serialize)]
pub struct MigrateCaseResult {
    /// The case.
    pub case: MigrateCase,
    /// Row label.
    pub label: String,
    /// Seconds from the destination's exec (hugeprep: the lease request) to
    /// `migrate-incoming` accepted.
    pub ready: Summary,
    /// The source's `query-migrate` `total-time`, seconds.
    pub total: Summary,
    /// The source's `query-migrate` `downtime`, seconds.
    pub downtime: Summary,
    /// Seconds from `migrate` until the destination left `inmigrate` (wall clock).
    pub loaded: Summary,
    /// Every repetition's (ready, total, downtime, loaded), seconds.
    pub samples: Vec<[f64; 4]>,
}

/// One size on one page size.
#[derive(Debug, Clone, Serialize)]
pub struct MigrateResult {
    /// Guest memory, bytes.
    pub size: u64,
    /// Page size of both QEMUs' memory.
    pub page_size: PageSize,
    /// Per case.
    pub cases: Vec<MigrateCaseResult>,
    /// hugeprep's ready minus the floor's, seconds, paired per repetition.
    pub ready_above_floor: Option<Summary>,
    /// hugeprep's total over the floor's, paired per repetition.
    pub total_over_floor: Option<Summary>,
    /// hugeprep's total over prealloc's, paired per repetition.
    pub total_over_prealloc: Option<Summary>,
    /// prealloc's ready over hugeprep's, paired per repetition.
    pub prealloc_ready_over_hugeprep: Option<Summary>,
    /// The median of `ready_above_floor` is at most [`READY_TARGET_S`].
    pub ready_target_met: bool,
    /// The median of `total_over_floor` is at most 1.
    pub total_target_met: bool,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct MigrateReport {
    /// QEMU `prealloc-threads` and hugeprep's workers.
    pub threads: usize,
    /// Measured repetitions per case.
    pub reps: usize,
    /// QEMU's version line.
    pub qemu_version: Option<String>,
    /// Per size and page size.
    pub results: Vec<MigrateResult>,
    /// Sizes left out, and why.
    pub skipped: Vec<String>,
    /// What this run does not measure.
    pub not_measured: Vec<String>,
    /// The machine's 1-minute load average before and after the run.
    pub load_average: (Option<f64>, Option<f64>),
}

fn field(samples: &[Sample], f: impl Fn(&Sample) -> f64) -> Vec<f64> {
    samples.iter().map(f).collect()
}

/// Summarises one world; `samples[i]` were measured for `cases[i]`.
pub(super) fn world_result(
    world: &World,
    cases: &[MigrateCase],
    samples: Vec<Vec<Sample>>,
) -> MigrateResult {
    let of = |case: MigrateCase| table::samples_of(cases, &samples, case);
    let results: Vec<MigrateCaseResult> = cases
        .iter()
        .zip(&samples)
        .filter_map(|(&case, s)| {
            Some(MigrateCaseResult {
                case,
                label: case.label(world.threads),
                ready: Summary::of(&field(s, |x| x.ready))?,
                total: Summary::of(&field(s, |x| x.total))?,
                downtime: Summary::of(&field(s, |x| x.downtime))?,
                loaded: Summary::of(&field(s, |x| x.loaded))?,
                samples: s
                    .iter()
                    .map(|x| [x.ready, x.total, x.downtime, x.loaded])
                    .collect(),
            })
        })
        .collect();
    let (hp, pre, floor) = (
        of(MigrateCase::Hugeprep),
        of(MigrateCase::Prealloc),
        of(MigrateCase::Floor),
    );
    let ready_above_floor = table::paired(
        &field(hp, |x| x.ready),
        &field(floor, |x| x.ready),
        |a, b| a - b,
    );
    let total_over_floor = table::paired(
        &field(hp, |x| x.total),
        &field(floor, |x| x.total),
        |a, b| a / b,
    );
    let total_over_prealloc =
        table::paired(&field(hp, |x| x.total), &field(pre, |x| x.total), |a, b| {
            a / b
        });
    let prealloc_ready_over_hugeprep =
        table::paired(&field(pre, |x| x.ready), &field(hp, |x| x.ready), |a, b| {
            a / b
        });
    MigrateResult {
        size: world.size,
        page_size: world.page_size,
        cases: results,
        ready_target_met: ready_above_floor.is_some_and(|s| s.median <= READY_TARGET_S),
        total_target_met: total_over_floor.is_some_and(|s| s.median <= 1.0),
        ready_above_floor,
        total_over_floor,
        total_over_prealloc,
        prealloc_ready_over_hugeprep,
    }
}

/// The report of the run.
pub(super) fn report(
    cfg: &VmStartBenchConfig,
    not_measured: Vec<String>,
    results: Vec<MigrateResult>,
    skipped: Vec<String>,
    load_before: Option<f64>,
) -> MigrateReport {
    MigrateReport {
        threads: cfg.threads,
        reps: cfg.reps,
        qemu_version: hugeprep_testkit::qemu::version(&cfg.qemu),
        results,
        skipped,
        not_measured,
        load_average: (load_before, crate::load_average()),
    }
}

impl MigrateReport {
    /// The table: per size and case, ready, total, downtime and loaded, median (range), then
    /// hugeprep against the floor and the targets.
    pub fn table(&self) -> String {
        let mut out = table::head(
            "incoming live migration over a unix socket into a destination started -incoming defer",
            self.threads,
            self.reps,
            self.load_average,
        );
        let s = table::cell;
        for r in &self.results {
            out.push_str(&table::size_head(r.size, r.page_size));
            out.push_str(&format!(
                "{:<40} {:>26} {:>26} {:>26} {:>26}\n",
                "destination",
                "ready (migrate-incoming)",
                "total-time",
                "downtime",
                "loaded (wall)"
            ));
            for c in &r.cases {
                out.push_str(&format!(
                    "{:<40} {:>26} {:>26} {:>26} {:>26}\n",
                    c.label,
                    s(&c.ready),
                    s(&c.total),
                    s(&c.downtime),
                    s(&c.loaded)
                ));
            }
            if let Some(x) = &r.ready_above_floor {
                out.push_str(&format!(
                    "hugeprep ready - floor ready: {} s (target <= {READY_TARGET_S}: {})\n",
                    s(x),
                    table::met(r.ready_target_met)
                ));
            }
            if let Some(x) = &r.total_over_floor {
                out.push_str(&format!(
                    "hugeprep total / floor total: {} (target <= 1: {})\n",
                    s(x),
                    table::met(r.total_target_met)
                ));
            }
            if let Some(x) = &r.total_over_prealloc {
                out.push_str(&format!("hugeprep total / prealloc total: {}\n", s(x)));
            }
            if let Some(x) = &r.prealloc_ready_over_hugeprep {
                out.push_str(&format!("prealloc ready / hugeprep ready: {}\n", s(x)));
            }
        }
        table::lines(&mut out, "skipped", &self.skipped);
        table::lines(&mut out, "not measured", &self.not_measured);
        out
    }
}
