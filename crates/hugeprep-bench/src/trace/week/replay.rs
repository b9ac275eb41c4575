//! Replays a VM trace in simulated time against one pool policy, as a fluid model of one
//! page size's pool: warm bytes fill toward the target at the pool's refill rate, a start
//! whose whole memory is warm takes it, a stop's memory comes back (scrubbed) up to the
//! target and is given back above it, and warm memory above a lowered target is given back
//! at once. A week replays in milliseconds.
//!
//! What it leaves out, on purpose: the sizes of the pool's files (a warm start needs the
//! bytes, not a file of its size: the demand shape's job), the kernel's free memory (the
//! host is as large as the trace needs), and the scrub's time (a few seconds at most, next
//! to lifetimes of minutes to days). The real driver's replay on the simulated host, and a
//! real-time replay of an hour against the real daemon, check it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;

use super::generate::VmLife;
use hugeprep::pool::core::forecast::{Forecast, Goal, Inputs};

/// How often the policy looks, s.
pub const LOOK_S: f64 = 60.0;

/// How often the adaptive plan is made again, s.
pub const REPLAN_S: f64 = 3600.0;

/// How often the series for the plot takes a point, s.
pub const SERIES_S: f64 = 600.0;

/// How often the adaptive policy asks Placement for allocations not yet leased, s: an
/// allocation is seen at the first poll after it is made.
pub const PLACEMENT_POLL_S: f64 = 5.0;

/// A pool policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum Policy {
    /// No pool: every start takes the kernel's path.
    None,
    /// A fixed warm target, bytes, in files of the trace's sizes (the fixed shape).
    Static {
        /// The target.
        bytes: u64,
    },
    /// A fixed warm target, bytes, in files of the sizes leased recently (today's demand
    /// shape). The model, which leaves file sizes out, replays it as [`Policy::Static`].
    Demand {
        /// The target.
        bytes: u64,
    },
    /// The adaptive target for a goal.
    Adaptive {
        /// The goal.
        goal: Goal,
    },
    /// A bound, not a policy: the adaptive plan made from the measured days' own needs (in
    /// hindsight), hour by hour, with no recent raise. What any target set by the hour of
    /// the week could reach on this trace, knowing it beforehand.
    Hindsight {
        /// The goal.
        goal: Goal,
    },
}

/// One point of the series: warm, leased and target bytes at a time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    /// Hours since the measured part began.
    pub hour: f64,
    /// Warm bytes.
    pub warm: u64,
    /// Leased bytes.
    pub leased: u64,
    /// The target.
    pub target: u64,
}

/// What one replay measured, over the measured part of the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The policy.
    pub policy: Policy,
    /// Starts in the measured part.
    pub starts: u64,
    /// Of those, starts whose whole memory was warm.
    pub warm_starts: u64,
    /// `warm_starts / starts`.
    pub warm_start_rate: f64,
    /// Warm-but-unleased memory over the measured part, GiB·hours.
    pub stranded_gib_h: f64,
    /// The most warm memory at once, bytes.
    pub stranded_peak: u64,
    /// The most memory the trace held leased at once, bytes.
    pub held_peak: u64,
    /// The series, every [`SERIES_S`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<Point>,
}

/// The pool's figures the replay assumes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PoolModel {
    /// Bytes per second the pool makes warm.
    pub refill_rate: f64,
}

struct Pool {
    t: f64,
    warm: f64,
    target: f64,
    leased: u64,
    rate: f64,
    measure_from: f64,
    area: f64,
}

impl Pool {
    /// Moves time to `to`: warm fills toward the target; the area under warm is counted
    /// from `measure_from` on.
    fn advance(&mut self, to: f64) {
        while self.t < to {
            let until = if self.t < self.measure_from {
                to.min(self.measure_from)
            } else {
                to
            };
            let dt = until - self.t;
            let counted = self.t >= self.measure_from;
            let mut area = self.warm * dt;
            if self.warm < self.target {
                let need = (self.target - self.warm) / self.rate;
                if need >= dt {
                    area += self.rate * dt * dt / 2.0;
                    self.warm += self.rate * dt;
                } else {
                    area += self.rate * need * need / 2.0 + (self.target - self.warm) * (dt - need);
                    self.warm = self.target;
                }
            }
            if counted {
                self.area += area;
            }
            self.t = until;
        }
    }

    fn set_target(&mut self, bytes: u64) {
        self.target = bytes as f64;
        // Above the target: given back at once.
        self.warm = self.warm.min(self.target);
    }
}

/// Replays `trace` (sorted by start) with `policy`; only what happens from `measure_from`
/// on is counted (before it, the adaptive target learns). `series`: keep the plot's points.
pub fn replay(
    trace: &[VmLife],
    policy: Policy,
    model: PoolModel,
    measure_from: f64,
    series: bool,
) -> Outcome {
    let mut pool = Pool {
        // An hour before the first start: a static pool is full when it comes.
        t: trace.first().map_or(0.0, |v| v.at_s - 3600.0),
        warm: 0.0,
        target: 0.0,
        leased: 0,
        rate: model.refill_rate.max(1.0),
        measure_from,
        area: 0.0,
    };
    let announced = announcements(trace);
    let mut forecast = match policy {
        Policy::Adaptive { goal } => Some(Forecast::new(goal)),
        Policy::Hindsight { goal } => Some(hindsight(trace, goal, model, measure_from, &announced)),
        _ => None,
    };
    let learns = matches!(policy, Policy::Adaptive { .. });
    let sees_pending = matches!(policy, Policy::Adaptive { .. } | Policy::Hindsight { .. });
    let mut pending: u64 = 0;
    let target_at = |f: &Option<Forecast>, now: f64, pending: u64| match (policy, f) {
        (Policy::None, _) => 0,
        (Policy::Static { bytes } | Policy::Demand { bytes }, _) => bytes,
        (Policy::Adaptive { .. } | Policy::Hindsight { .. }, Some(f)) => {
            f.target(&Inputs {
                now_s: now,
                pending,
                refill_rate: model.refill_rate,
                free_share: u64::MAX,
            })
            .bytes
        }
        (Policy::Adaptive { .. } | Policy::Hindsight { .. }, None) => 0,
    };
    pool.set_target(target_at(&forecast, pool.t, 0));
    let mut ends: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let (mut starts, mut warm_starts, mut held_peak, mut stranded_peak) = (0u64, 0u64, 0u64, 0u64);
    let mut points = Vec::new();
    let (mut next_look, mut next_plan, mut next_point) = (pool.t, pool.t, measure_from);
    let mut i = 0;
    // Allocations by the time the policy sees them: (seen, index into the trace).
    let mut seen_order: Vec<(f64, usize)> = announced
        .iter()
        .enumerate()
        .filter(|&(_, &a)| a > 0.0 && sees_pending)
        .map(|(k, &a)| (trace[k].at_s - a, k))
        .collect();
    seen_order.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut a = 0;
    let end_of_trace = trace.last().map_or(pool.t, |v| v.at_s);
    loop {
        let next_start = trace.get(i).map(|v| v.at_s);
        let next_end = ends.peek().map(|Reverse((t, _))| *t as f64 / 1000.0);
        let next_seen = seen_order.get(a).map(|&(t, _)| t);
        let t = [Some(next_look), next_start, next_end, next_seen]
            .into_iter()
            .flatten()
            .fold(f64::INFINITY, f64::min);
        if t > end_of_trace {
            break;
        }
        pool.advance(t);
        if pool.t >= measure_from {
            stranded_peak = stranded_peak.max(pool.warm as u64);
        }
        if next_end == Some(t) {
            if let Some(Reverse((_, bytes))) = ends.pop() {
                pool.leased = pool.leased.saturating_sub(bytes);
                let room = (pool.target - pool.warm).max(0.0);
                pool.warm += room.min(bytes as f64);
            }
            continue;
        }
        if next_seen == Some(t) {
            let k = seen_order[a].1;
            a += 1;
            pending = pending.saturating_add(trace[k].bytes);
            pool.set_target(target_at(&forecast, t, pending));
            continue;
        }
        if next_start == Some(t) {
            let v = trace[i];
            let announced_s = if sees_pending { announced[i] } else { 0.0 };
            i += 1;
            if announced_s > 0.0 {
                pending = pending.saturating_sub(v.bytes);
            }
            let warm = pool.warm >= v.bytes as f64;
            if warm {
                pool.warm -= v.bytes as f64;
            }
            pool.leased = pool.leased.saturating_add(v.bytes);
            if t >= measure_from {
                starts += 1;
                warm_starts += u64::from(warm);
                held_peak = held_peak.max(pool.leased);
            }
            let end_ms = ((t + v.life_s) * 1000.0) as u64;
            ends.push(Reverse((end_ms, v.bytes)));
            if let Some(f) = forecast.as_mut().filter(|_| learns) {
                f.started_announced(t, v.bytes, model.refill_rate, announced_s);
            }
            if forecast.is_some() {
                pool.set_target(target_at(&forecast, t, pending));
            }
            continue;
        }
        // A look.
        if let Some(f) = forecast.as_mut().filter(|_| learns) {
            if t >= next_plan {
                f.replan();
                next_plan = t + REPLAN_S;
            }
        }
        pool.set_target(target_at(&forecast, t, pending));
        if series && t >= next_point {
            points.push(Point {
                hour: (t - measure_from) / 3600.0,
                warm: pool.warm as u64,
                leased: pool.leased,
                target: pool.target as u64,
            });
            next_point = t + SERIES_S;
        }
        next_look = t + LOOK_S;
    }
    Outcome {
        policy,
        starts,
        warm_starts,
        warm_start_rate: if starts > 0 {
            warm_starts as f64 / starts as f64
        } else {
            1.0
        },
        stranded_gib_h: pool.area / (1u64 << 30) as f64 / 3600.0,
        stranded_peak,
        held_peak,
        series: points,
    }
}

/// How long before each start (by index) the adaptive policy saw its allocation, s: its
/// Placement lead, less the wait for the next poll (0: not seen before it started).
pub fn announcements(trace: &[VmLife]) -> Vec<f64> {
    trace
        .iter()
        .map(|v| {
            if v.lead_s <= 0.0 {
                return 0.0;
            }
            let made = v.at_s - v.lead_s;
            let seen = (made / PLACEMENT_POLL_S).ceil() * PLACEMENT_POLL_S;
            (v.at_s - seen).max(0.0)
        })
        .collect()
}

/// The plan made from the needs of the starts from `measure_from` on, as if the forecast
/// had learnt them beforehand: the bound [`Policy::Hindsight`] replays.
fn hindsight(
    trace: &[VmLife],
    goal: Goal,
    model: PoolModel,
    measure_from: f64,
    announced: &[f64],
) -> Forecast {
    let mut f = Forecast::exact(goal);
    for (v, &a) in trace.iter().zip(announced) {
        if v.at_s >= measure_from {
            f.started_announced(v.at_s, v.bytes, model.refill_rate, a);
        }
    }
    f.replan();
    f.forget_recent();
    f
}

/// The smallest static target, in steps of `step` bytes up to `max`, whose warm-start rate
/// reaches `rate`; the largest tried when none does.
pub fn best_static(
    trace: &[VmLife],
    model: PoolModel,
    measure_from: f64,
    rate: f64,
    step: u64,
    max: u64,
) -> Outcome {
    // The rate grows with the target: a binary search over the steps.
    let (mut lo, mut hi) = (0u64, max / step.max(1));
    let run = |k: u64| {
        replay(
            trace,
            Policy::Static { bytes: k * step },
            model,
            measure_from,
            false,
        )
    };
    let mut best = run(hi);
    if best.warm_start_rate < rate {
        return best;
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        let o = run(mid);
        if o.warm_start_rate >= rate {
            hi = mid;
            best = o;
        } else {
            lo = mid + 1;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use hugeprep::page_size::PageSize;

    const GIB: u64 = 1 << 30;

    fn vm(at_s: f64, gib: u64, life_s: f64) -> VmLife {
        VmLife {
            at_s,
            bytes: gib * GIB,
            lead_s: 0.0,
            page_size: PageSize::Size2M,
            life_s,
            kind: "steady",
        }
    }

    #[test]
    fn a_static_pool_serves_what_it_holds_and_strands_the_rest_by_the_hour() {
        let model = PoolModel {
            refill_rate: GIB as f64,
        };
        // Starts an hour apart, each for a minute: the pool is full again for each.
        let trace: Vec<VmLife> = (0..10)
            .map(|i| vm(f64::from(i) * 3600.0, 4, 60.0))
            .collect();
        let none = replay(&trace, Policy::None, model, 0.0, false);
        assert_eq!(
            (none.starts, none.warm_starts, none.stranded_gib_h),
            (10, 0, 0.0)
        );
        let small = replay(&trace, Policy::Static { bytes: 2 * GIB }, model, 0.0, false);
        assert_eq!(small.warm_starts, 0);
        let fits = replay(&trace, Policy::Static { bytes: 4 * GIB }, model, 0.0, true);
        assert_eq!(fits.warm_starts, 10);
        // 4 GiB warm for 9 hours, less the refill's few seconds after each start.
        assert!(
            (fits.stranded_gib_h - 36.0).abs() < 0.1,
            "{}",
            fits.stranded_gib_h
        );
        assert_eq!(fits.held_peak, 4 * GIB);
        assert!(!fits.series.is_empty());
        // Two starts a second apart need 4 + 4 - 1 GiB: a 4 GiB pool serves the first only.
        let pair = [vm(0.0, 4, 60.0), vm(1.0, 4, 60.0), vm(3600.0, 1, 60.0)];
        let o = replay(&pair, Policy::Static { bytes: 4 * GIB }, model, 0.0, false);
        assert_eq!(o.warm_starts, 2);
        let best = best_static(&pair, model, 0.0, 1.0, GIB, 16 * GIB);
        assert_eq!(best.policy, Policy::Static { bytes: 7 * GIB });
    }

    #[test]
    fn a_start_seen_coming_long_enough_is_warm_with_nothing_kept_for_it() {
        let model = PoolModel {
            refill_rate: GIB as f64,
        };
        let goal = Goal {
            warm_start_rate: 0.99,
            ceiling: u64::MAX,
        };
        // A 4 GiB VM every hour for four weeks; the last week is measured.
        let hourly = |lead_s: f64| -> Vec<VmLife> {
            (0..24 * 28)
                .map(|i| VmLife {
                    lead_s,
                    ..vm(f64::from(i) * 3600.0 + 1800.0, 4, 600.0)
                })
                .collect()
        };
        let from = 21.0 * 86_400.0;
        let unseen = replay(&hourly(0.0), Policy::Adaptive { goal }, model, from, false);
        // Allocated 30 s ahead (seen at the next 5 s poll): 4 GiB is warm in 4 s.
        let seen = replay(&hourly(30.0), Policy::Adaptive { goal }, model, from, false);
        assert_eq!(announcements(&hourly(30.0))[0], 30.0);
        assert_eq!((unseen.warm_starts, seen.warm_starts), (168, 168));
        // Unseen, the pool keeps 4 GiB warm all week; seen, only from the poll to the start.
        assert!(unseen.stranded_gib_h > 600.0, "{}", unseen.stranded_gib_h);
        // 4 GiB for the 26 s after each poll, 168 times: 4.9 GiB·h.
        assert!(seen.stranded_gib_h < 6.0, "{}", seen.stranded_gib_h);
        // The hindsight bound: no hour plan keeps less for the same starts.
        let bound = replay(&hourly(0.0), Policy::Hindsight { goal }, model, from, false);
        assert_eq!(bound.warm_starts, 168);
        assert!(bound.stranded_gib_h <= unseen.stranded_gib_h + 1.0);
    }
}
