//! The adaptive warm target: how much warm memory of one page size on one node the pool
//! keeps, chosen to reach the operator's warm-start goal with the least warm memory idle.
//!
//! Pure: the driver feeds each VM start (its time and bytes) and, at each look, the time,
//! the known demand and the host's figures; nothing here reads a clock or a file.
//!
//! # The model
//! A start is warm when the pool holds its whole memory at that moment. Between starts the
//! pool's refill makes memory warm again at its measured rate `R`, so what a start needs of
//! a pool that was full is its *need*, a Lindley recursion over the starts: its own bytes,
//! plus what the starts before it took that the refill has not made good since,
//! `need_i = bytes_i + max(0, need_(i-1) - R (t_i - t_(i-1)))`. With a target of `w`
//! bytes, a start whose need is at most `w` is warm. A deploy of ten VMs one second apart
//! needs far less than ten VMs' memory when the refill runs at gigabytes a second.
//!
//! Each start's need is a sample of its *bucket*: the hour of the day on a weekday or on a
//! weekend day (48 buckets; public-cloud VM arrivals follow the day and the week). A sample
//! also counts, at a lower weight, for the two hours on each side (a kernel of 1/4, 1/2, 1,
//! 1/2, 1/4), so a start at 09:58 speaks for 10:00 too and a week of history is enough to
//! begin. The plan picks one target per bucket. Raising bucket `b`'s target from one
//! sample's need to the next makes that many more starts a week warm, at the cost of the
//! increase times the hours a week the bucket lasts (5 for a weekday hour, 2 for a weekend
//! one): the GiB·hours of memory that waits warm. The plan takes the steps with the most
//! warm starts per GiB·hour first, across all buckets, until the goal's share of starts is
//! warm (plus [`MARGIN`] of the starts the goal leaves cold: half, as the files counted
//! at a size threshold (`forecast_files`) are a little optimistic about the pool's files
//! after cuts, measured through the driver). It is a Lagrangian relaxation of the
//! knapsack; each bucket's steps are first
//! replaced by its upper convex hull, so the greedy order is exact on it. Hours whose
//! starts are rare and large are what the goal's remainder (1% at a 99% goal) lets go cold.
//!
//! At a look, the target is the plan's value for the bucket of the moment (or of the next
//! hour, when it begins within [`MIN_HORIZON_S`] or the time the refill takes for a typical
//! start, so the pool is warm when that hour starts), plus the known demand (allocations
//! made and not yet leased: VMs that start within seconds), raised to the recent need when
//! the last hour saw more than its bucket's history (a burst the forecast did not see: its
//! follow-ons are served warm), and cut to the operator's ceiling and to the host's free
//! memory share. Until a bucket has samples (the first week), the largest need of the last
//! day stands in for it.
//!
//! # Files, not bytes
//! Through the pool a start is warm only when a warm file of at least its size is there,
//! so every need above is counted per size class in whole files (`forecast_files`): a
//! sample is a start's class and the bytes of that class it needs, the plan's steps are
//! per bucket and class, and a target is the files of each class to keep
//! ([`Target::files`]), which the daemon installs as the target's flavors.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use super::forecast_files::{self as files, class_of, whole_files, Deficits, Files};
pub use super::forecast_steps::horizon;
use super::forecast_steps::{hull, mixed, pooled};

/// Buckets: 24 weekday hours, then 24 weekend hours.
pub const BUCKETS: usize = 48;

/// Weeks of samples kept: older ones are dropped as a new week begins.
pub const WEEKS_KEPT: u64 = 4;

/// Samples kept per bucket and week (a week's busiest hour on a large host stays well
/// under it; past it the later samples of that week replace random earlier ones).
pub const SAMPLES_PER_WEEK: usize = 2048;

/// The share of the starts the goal leaves cold that the plan still aims to serve warm: at
/// 0, the goal of 99% reached 95.8-97.9% through the driver on 2M pages (`bench trace`,
/// seeds 1-3); at 0.5, 99.2-99.5%.
pub const MARGIN: f64 = 0.5;

/// The share of a bucket's samples drawn from every bucket's needs (see `mixed`).
pub const POOLED: f64 = 0.5;

/// The shortest look-ahead: the start gate holds refills while VMs start and the lessee grace
/// leaves a new VM alone for 2 s, so a pool is never full again sooner.
pub const MIN_HORIZON_S: f64 = 30.0;

/// The longest look-ahead.
pub const MAX_HORIZON_S: f64 = 3600.0;

/// How far back the recent need reaches, s.
pub const RECENT_S: f64 = 3600.0;

/// How far back the stand-in for a bucket without samples reaches, s.
pub const LEARNING_S: f64 = 86_400.0;

const DAY_S: f64 = 86_400.0;
const WEEK_S: f64 = 7.0 * DAY_S;

/// The operator's goal, in place of a size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Goal {
    /// The share of VM starts whose whole memory should be warm (0 to 1).
    pub warm_start_rate: f64,
    /// Never more warm memory than this, bytes.
    pub ceiling: u64,
}

/// What the driver measured, fed in at a look.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Inputs {
    /// Local time in seconds since the Unix epoch (the epoch was a Thursday): places the
    /// look in the day and the week.
    pub now_s: f64,
    /// Bytes of allocations made (Placement) and not yet leased: the known demand's sum.
    /// [`Forecast::target`] plans it as one file; the daemon's looks give the VMs' sizes to
    /// [`Forecast::target_known`] and this sum stays for the record.
    pub pending: u64,
    /// Bytes per second the pool makes warm: its measured fault (or scrub) rate.
    pub refill_rate: f64,
    /// Bytes of the host's free memory the pool may hold.
    pub free_share: u64,
}

/// Why the target has its value: shown by the API and the metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Why {
    /// The bucket of the look: `weekday 09h` or `weekend 23h`.
    pub bucket: String,
    /// The plan's target for it (or for the next hour, whichever is larger), bytes.
    pub planned: u64,
    /// Whether the plan lets this hour go cold: its starts are among the goal's remainder.
    pub cold_hour: bool,
    /// The largest need of the last hour, bytes.
    pub recent_peak: u64,
    /// Whether the recent peak raised the target (more than the bucket's history, or no
    /// history yet).
    pub recent_raised: bool,
    /// Known demand added, bytes.
    pub pending: u64,
    /// How far ahead the look reached for the next hour's plan, s.
    pub horizon_s: f64,
    /// What cut the target, if anything: `ceiling` or `free memory` (whole files are
    /// dropped, of the largest classes first).
    pub capped_by: Option<&'static str>,
    /// The share of the kept starts the plan serves warm.
    pub planned_rate: f64,
}

/// A target and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Target {
    /// Warm bytes to keep: the sum of [`Target::files`].
    pub bytes: u64,
    /// The files to keep warm: (size, count), largest first.
    pub files: Vec<(u64, u64)>,
    /// Why.
    pub why: Why,
}

/// One bucket's needs of one week.
#[derive(Debug, Clone, Default)]
struct Week {
    /// (class, bytes of that class needed).
    samples: Vec<(u64, u64)>,
    seen: u64,
}

/// The adaptive target of one page size on one node: what it has seen and its plan.
#[derive(Debug, Clone)]
pub struct Forecast {
    goal: Goal,
    /// Per bucket, per week number: needs.
    weeks: Vec<BTreeMap<u64, Week>>,
    /// The per-class Lindley state after the last start.
    deficits: Deficits,
    /// Needs of the last day: (time, class, bytes).
    recent: VecDeque<(f64, u64, u64)>,
    /// The mean bytes of a start (exponentially weighted).
    mean_bytes: f64,
    horizon_s: f64,
    /// Per bucket: the planned threshold counts (`None`: no samples yet).
    plan: Vec<Option<Files>>,
    /// Per bucket: the planned bytes (the plan's files' sum), for reports.
    plan_bytes: [Option<u64>; BUCKETS],
    /// Per bucket and class: the largest need among the samples the plan was made from.
    planned_max: Vec<Files>,
    planned_rate: f64,
    /// Random state for replacing samples past [`SAMPLES_PER_WEEK`] (splitmix64).
    rng: u64,
    /// Plan each bucket from its own samples alone, unsmoothed and unpooled (a plan made
    /// in hindsight from the very starts it is judged on: [`Forecast::exact`]).
    exact: bool,
}

/// Sizes are counted in steps of this many bytes (the smallest hugepage), rounded up.
/// A need is whole files of its class up to the ceiling (`forecast_files`): a stream of
/// crafted starts makes at most `ceiling / class` values per class, of a bounded number of
/// classes, in the recent needs and in each bucket's plan.
pub const NEED_STEP: u64 = 2 << 20;

/// The bucket of local time `t_s`: hour of the day, weekend hours after weekday ones.
pub fn bucket(t_s: f64) -> usize {
    let day = (t_s / DAY_S).floor();
    // 1970-01-01 was a Thursday: day 0 is weekday 3 (Monday = 0).
    let weekday = (day as i64 + 3).rem_euclid(7);
    let hour = ((t_s - day * DAY_S) / 3600.0).floor().clamp(0.0, 23.0) as usize;
    if weekday >= 5 {
        24 + hour
    } else {
        hour
    }
}

/// The name of bucket `b`.
pub fn bucket_name(b: usize) -> String {
    let kind = if b < 24 { "weekday" } else { "weekend" };
    format!("{kind} {:02}h", b % 24)
}

/// Hours a week bucket `b` lasts.
fn bucket_hours(b: usize) -> f64 {
    if b < 24 {
        5.0
    } else {
        2.0
    }
}

impl Forecast {
    /// A forecast with nothing seen, for `goal`.
    pub fn new(goal: Goal) -> Forecast {
        Forecast {
            goal,
            weeks: vec![BTreeMap::new(); BUCKETS],
            deficits: Deficits::default(),
            recent: VecDeque::new(),
            mean_bytes: 0.0,
            horizon_s: MIN_HORIZON_S,
            plan: vec![None; BUCKETS],
            plan_bytes: [None; BUCKETS],
            planned_max: vec![Files::new(); BUCKETS],
            planned_rate: 0.0,
            rng: 0x9e37_79b9_7f4a_7c15,
            exact: false,
        }
    }

    /// A forecast that plans each hour from that hour's own samples only, with no
    /// smoothing over the hours around it and no pooled shape: fed the very starts it is
    /// then judged on, its plan is the least warm memory any target set by the hour of the
    /// week can keep for the goal (a bound for benchmarks, not a forecast: it has nothing
    /// to spare for a week unlike the last).
    pub fn exact(goal: Goal) -> Forecast {
        Forecast {
            exact: true,
            ..Forecast::new(goal)
        }
    }

    /// The goal in force.
    pub fn goal(&self) -> Goal {
        self.goal
    }

    /// Replaces the goal (a reload); the plan follows at the next [`Forecast::replan`].
    pub fn set_goal(&mut self, goal: Goal) {
        self.goal = goal;
    }

    /// How far ahead a look reaches for the next hour's plan, s.
    pub fn horizon_s(&self) -> f64 {
        self.horizon_s
    }

    /// A VM started at local time `at_s` with `bytes` of memory of this pool's page size.
    /// `refill_rate`: the pool's measured rate, bytes/s.
    pub fn started(&mut self, at_s: f64, bytes: u64, refill_rate: f64) {
        self.started_announced(at_s, bytes, refill_rate, 0.0);
    }

    /// A VM started, as [`Forecast::started`], that the pool saw coming `announced_s`
    /// seconds before: a Placement allocation the driver found not yet leased, whose bytes
    /// the look added to the target as known demand. The refill had that long to make
    /// them warm, so the pool itself needed that much less beforehand. What a start needs
    /// of the warm pool is then the Lindley recursion with each start's refill beginning
    /// at its announcement: `D_i = bytes_i + max(-R L_i, D_(i-1) - R (t_i - t_(i-1)))`,
    /// and the need is `max(0, D_i)` (0: the announcement alone makes it warm). With
    /// `announced_s = 0` this is the plain recursion of the module's doc.
    pub fn started_announced(&mut self, at_s: f64, bytes: u64, refill_rate: f64, announced_s: f64) {
        self.mean_bytes = if self.mean_bytes == 0.0 {
            bytes as f64
        } else {
            0.95 * self.mean_bytes + 0.05 * bytes as f64
        };
        self.horizon_s = horizon(self.mean_bytes, refill_rate);
        let rate = if refill_rate.is_finite() {
            refill_rate.max(0.0)
        } else {
            0.0
        };
        let lead = if announced_s.is_finite() {
            announced_s.max(0.0)
        } else {
            0.0
        };
        let class = class_of(bytes, self.goal.ceiling);
        let d = self.deficits.start(at_s, class, rate, lead);
        let need = whole_files(d, class, self.goal.ceiling);
        while self
            .recent
            .front()
            .is_some_and(|&(t, _, _)| t < at_s - LEARNING_S)
        {
            self.recent.pop_front();
        }
        // An earlier need of its class no larger than this one is never the largest of a
        // window that reaches back to it (each such window holds this one too): dropped,
        // so a day of starts keeps only each class's falling sequence of needs.
        let mut i = self.recent.len();
        while i > 0 {
            i -= 1;
            let (t, c, d) = self.recent[i];
            if c == class && d <= need && t <= at_s {
                self.recent.remove(i);
            }
        }
        self.recent.push_back((at_s, class, need));
        self.record(at_s, (class, need));
    }

    /// Forgets the recent starts (the last hour's and day's needs and the last start),
    /// keeping the samples and the plan: a plan made from a trace's own needs can then be
    /// replayed over that trace without seeing ahead (the bench's hindsight bound).
    pub fn forget_recent(&mut self) {
        self.recent.clear();
        self.deficits.clear();
    }

    fn record(&mut self, at_s: f64, demand: (u64, u64)) {
        let week = (at_s / WEEK_S).floor().max(0.0) as u64;
        let weeks = &mut self.weeks[bucket(at_s)];
        weeks.retain(|&w, _| w + WEEKS_KEPT > week);
        let slot = weeks.entry(week).or_default();
        slot.seen += 1;
        if slot.samples.len() < SAMPLES_PER_WEEK {
            slot.samples.push(demand);
        } else {
            // Reservoir sampling: each of the week's samples stays with the same chance.
            self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            let i = (z ^ (z >> 31)) % slot.seen;
            if let Some(s) = slot.samples.get_mut(i as usize) {
                *s = demand;
            }
        }
    }

    /// Plans every bucket's files from the samples kept (see the module's doc). Cheap
    /// enough for every few minutes: a sort of each bucket's samples and one greedy pass.
    pub fn replan(&mut self) {
        let own = self.weekly();
        let global = pooled(&own);
        let mut steps = Vec::new();
        let mut total = 0.0;
        let mut plan: Vec<Option<Files>> = vec![None; BUCKETS];
        for (b, planned) in plan.iter_mut().enumerate() {
            let weighted = if self.exact {
                let mut own_b = own[b].clone();
                own_b.sort_unstable_by_key(|&(s, _)| s);
                own_b
            } else {
                mixed(&own, &global, b)
            };
            if weighted.is_empty() {
                continue;
            }
            *planned = Some(Files::new());
            self.planned_max[b] = Files::new();
            total += weighted.iter().map(|&(_, w)| w).sum::<f64>();
            // Sorted by (class, need): each class's run is a bucket of its own.
            for run in weighted.chunk_by(|x, y| x.0 .0 == y.0 .0) {
                let class = run[0].0 .0;
                let needs: Vec<(u64, f64)> = run.iter().map(|&((_, n), w)| (n, w)).collect();
                let max = needs.last().map_or(0, |&(n, _)| n);
                self.planned_max[b].insert(class, max);
                steps.extend(
                    hull(&needs)
                        .into_iter()
                        .map(|(bytes, starts)| (b, class, bytes, starts)),
                );
            }
        }
        // Steps of every bucket and class by warm starts per GiB·hour, best first; a
        // class's own steps come in order (its hull's densities fall).
        let density = |&(b, _, bytes, starts): &(usize, u64, u64, f64)| {
            starts / (bytes.max(1) as f64 * bucket_hours(b))
        };
        steps.sort_by(|x, y| density(y).total_cmp(&density(x)));
        let goal = self.goal.warm_start_rate.clamp(0.0, 1.0);
        let want = (goal + (1.0 - goal) * MARGIN) * total;
        let mut warm = 0.0;
        for (b, class, bytes, starts) in steps {
            if warm >= want - 1e-9 {
                break;
            }
            let p = plan[b]
                .get_or_insert_with(Files::new)
                .entry(class)
                .or_insert(0);
            *p = p.saturating_add(bytes);
            warm += starts;
        }
        for (bytes, p) in self.plan_bytes.iter_mut().zip(&plan) {
            *bytes = p.as_ref().map(|t| files::total(&files::nest(t)));
        }
        self.plan = plan;
        self.planned_rate = if total > 0.0 { warm / total } else { 1.0 };
    }

    /// Each bucket's own needs, each weighing its week's starts over its week's samples (a
    /// reservoir keeps fewer than it saw) per week kept: warm starts a week.
    fn weekly(&self) -> Vec<Vec<((u64, u64), f64)>> {
        self.weeks
            .iter()
            .map(|weeks| {
                let n_weeks = weeks.len().max(1) as f64;
                weeks
                    .values()
                    .flat_map(|w| {
                        let weight = w.seen as f64 / w.samples.len().max(1) as f64 / n_weeks;
                        w.samples.iter().map(move |&s| (s, weight))
                    })
                    .collect()
            })
            .collect()
    }

    /// The planned bytes of every bucket (`None`: no samples yet), for reports.
    pub fn plan(&self) -> &[Option<u64>; BUCKETS] {
        &self.plan_bytes
    }

    /// The planned files of bucket `b`: bytes per size class.
    pub fn plan_files(&self, b: usize) -> Option<Files> {
        self.thresholds(b).map(files::nest)
    }

    /// The planned threshold counts of bucket `b` (see `forecast_files`).
    fn thresholds(&self, b: usize) -> Option<&Files> {
        self.plan.get(b).and_then(Option::as_ref)
    }
}

/// What a forecast has seen, kept across restarts (one submodule: it reads the fields).
#[path = "forecast_file.rs"]
pub mod file;

#[path = "forecast_look.rs"]
mod look;

#[cfg(test)]
#[path = "tests/forecast.rs"]
mod tests;
