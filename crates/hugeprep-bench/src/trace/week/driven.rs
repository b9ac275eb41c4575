//! Replays a VM trace in simulated time through the real pool driver
//! ([`hugeprep::pool::simulated`]): every start is a lease of the real `Pool`, every stop
//! its release (proof, scrub, keep or give back), and the worker's real fill, scrub and
//! trim jobs run between them, on a simulated host whose clock the replay sets.
//!
//! Time: the simulated host does a job at once; the replay charges the worker the job's
//! bytes (faulted or scrubbed) at the refill rate before it may start the next one, so a
//! pool refills at the rate the model assumes. A job's effect shows when it starts (a fill
//! of a 64 GiB file at 4 GiB/s is warm 16 s early): next to starts minutes apart, noise.
//! A lease faults its cold bytes inside the lease (the kernel's path) and takes no worker
//! time. The host is as large as the trace needs (the model's assumption too).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::generate::VmLife;
use super::replay::{announcements, Outcome, Point, Policy, LOOK_S, REPLAN_S, SERIES_S};
use hugeprep::page_size::PageSize;
use hugeprep::policy::pool::{Flavor, Shape};
use hugeprep::pool::core::forecast::{Forecast, Inputs, Target};
use hugeprep::pool::simulated::SimulatedPool;
use hugeprep::pool::{LeaseRequest, LeaseSource, PoolError, PoolPolicy};

/// Bytes of free pages the simulated host starts with: more than any trace holds.
const HOST_BYTES: u64 = 1 << 46;

/// A replay through the driver failed.
#[derive(Debug, thiserror::Error)]
pub enum DrivenError {
    /// The pool on the simulated host failed (not a cold start: a bug, or a host too small).
    #[error("replay through the driver, VM {vm} at {at_s:.0} s: {source}")]
    Pool {
        /// The VM's index in the trace.
        vm: usize,
        /// Its start, s.
        at_s: f64,
        /// The pool's error.
        source: PoolError,
    },
    /// The simulated host's pages or leases are off (a bug in the driver).
    #[error("replay through the driver: the simulated host is inconsistent: {0}")]
    Host(String),
}

fn setup_error(source: PoolError) -> DrivenError {
    DrivenError::Pool {
        vm: 0,
        at_s: 0.0,
        source,
    }
}

/// The policy of the pool for `policy`: a warm target of `bytes` on `ps`, in files of the
/// trace's own sizes under the fixed shape (an operator of a static pool names its flavors),
/// and of the adaptive target's `files` (size, count) as its flavors, as the daemon installs.
fn pool_policy(
    ps: PageSize,
    policy: Policy,
    bytes: u64,
    sizes: &[u64],
    files: &[(u64, u64)],
) -> PoolPolicy {
    let shape = match policy {
        Policy::Static { .. } | Policy::None => "fixed",
        Policy::Demand { .. } | Policy::Adaptive { .. } | Policy::Hindsight { .. } => "demand",
    };
    let text = format!(
        "reserve = false\nlessee_grace_ms = 0\nscrub_bandwidth = \"0\"\nshape = \"{shape}\"\n"
    );
    let mut p = PoolPolicy::from_toml(&text).unwrap_or_else(|_| PoolPolicy::embedded());
    p.shape = if shape == "fixed" {
        Shape::Fixed
    } else {
        Shape::Demand
    };
    if bytes > 0 {
        let sizes = match policy {
            Policy::Static { .. } => sizes.to_vec(),
            _ => Vec::new(),
        };
        p.set_warm(ps, bytes, sizes);
        if let Some(t) = p.targets.iter_mut().find(|t| t.page_size == ps) {
            t.flavors = files
                .iter()
                .map(|&(size, count)| Flavor {
                    size,
                    count: u32::try_from(count).unwrap_or(u32::MAX),
                })
                .collect();
        }
    }
    p
}

/// The warm-bytes area and the last change, for the stranded GiB·hours.
struct Area {
    t: f64,
    held: f64,
    measure_from: f64,
    sum: f64,
    peak: u64,
}

impl Area {
    /// Time moves to `t`; the pool now holds `held` bytes unleased.
    fn at(&mut self, t: f64, held: u64) {
        let from = self.t.max(self.measure_from);
        if t > from {
            self.sum += self.held * (t - from);
        }
        self.t = self.t.max(t);
        self.held = held as f64;
        if t >= self.measure_from {
            self.peak = self.peak.max(held);
        }
    }
}

struct Run<'a> {
    sim: SimulatedPool,
    ps: PageSize,
    rate: f64,
    t0: f64,
    /// When the worker may start its next job, s.
    worker_free: f64,
    area: Area,
    policy: Policy,
    sizes: &'a [u64],
    target: u64,
    files: Vec<(u64, u64)>,
}

impl Run<'_> {
    fn clock(&self, t: f64) {
        self.sim
            .advance_to(Duration::from_secs_f64((t - self.t0).max(0.0)));
    }

    /// Warm bytes: what a VM could start on (the stranded memory while none does). Files
    /// being filled, scrubbed or given back are left out, as in the model: each is so for
    /// the seconds a job takes.
    fn held(&self) -> u64 {
        self.sim.kind(self.ps).warm
    }

    /// The worker does its jobs until `t`, each charged its bytes at the refill rate.
    fn work_until(&mut self, t: f64) {
        while self.worker_free <= t {
            let at = self.worker_free.max(self.area.t);
            self.clock(at);
            let before = self.sim.pool().counters();
            if !self.sim.work_once() {
                self.worker_free = t.max(self.worker_free) + 1e-3;
                break;
            }
            let after = self.sim.pool().counters();
            let bytes = (after.refill_faulted_bytes - before.refill_faulted_bytes)
                + (after.scrubbed_bytes - before.scrubbed_bytes);
            let held = self.held();
            self.area.at(at, held);
            // At least a millisecond a job: a worker that finds work forever still ends.
            self.worker_free = at + (bytes as f64 / self.rate).max(1e-3);
        }
        self.clock(t);
    }

    /// Installs the adaptive target's files (its bytes and flavors), as the daemon does.
    fn set_target(&mut self, t: &Target) {
        if t.bytes != self.target || t.files != self.files {
            self.target = t.bytes;
            self.files.clone_from(&t.files);
            let p = pool_policy(self.ps, self.policy, t.bytes, self.sizes, &t.files);
            self.sim.pool().set_policy(p);
        }
    }
}

/// The distinct sizes of `trace`, largest first: the static pool's file sizes.
pub fn flavors(trace: &[VmLife]) -> Vec<u64> {
    let mut s: Vec<u64> = trace.iter().map(|v| v.bytes).collect();
    s.sort_unstable_by(|a, b| b.cmp(a));
    s.dedup();
    s
}

/// Replays `trace` (one page size's VMs, sorted by start) through the real driver with
/// `policy`; only what happens from `measure_from` on is counted. The driver's log lines
/// (a line per release, thousands a simulated day) are not emitted.
pub fn replay(
    trace: &[VmLife],
    ps: PageSize,
    policy: Policy,
    refill_rate: f64,
    measure_from: f64,
    series: bool,
) -> Result<Outcome, DrivenError> {
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
        replay_logged(trace, ps, policy, refill_rate, measure_from, series)
    })
}

fn replay_logged(
    trace: &[VmLife],
    ps: PageSize,
    policy: Policy,
    refill_rate: f64,
    measure_from: f64,
    series: bool,
) -> Result<Outcome, DrivenError> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "hugeprep-sim-replay-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let sizes = flavors(trace);
    let start_bytes = match policy {
        Policy::Static { bytes } | Policy::Demand { bytes } => bytes,
        _ => 0,
    };
    let sim = SimulatedPool::new(
        &dir,
        &[(ps, HOST_BYTES / ps.bytes())],
        pool_policy(ps, policy, start_bytes, &sizes, &[]),
    )
    .map_err(setup_error)?;
    // An hour before the first start: a static pool is full when it comes.
    let t0 = trace.first().map_or(0.0, |v| v.at_s - 3600.0);
    let mut run = Run {
        sim,
        ps,
        rate: refill_rate.max(1.0),
        t0,
        worker_free: t0,
        area: Area {
            t: t0,
            held: 0.0,
            measure_from,
            sum: 0.0,
            peak: 0,
        },
        policy,
        sizes: &sizes,
        target: start_bytes,
        files: Vec::new(),
    };
    let mut forecast = match policy {
        Policy::Adaptive { goal } => Some(Forecast::new(goal)),
        _ => None,
    };
    // Placement: the sizes of the VMs allocated and not yet started, as the daemon would
    // see them (polled), and when each is seen: (seen, index into the trace).
    let announced = announcements(trace);
    let mut seen_order: Vec<(f64, usize)> = announced
        .iter()
        .enumerate()
        .filter(|&(_, &a)| a > 0.0 && forecast.is_some())
        .map(|(k, &a)| (trace[k].at_s - a, k))
        .collect();
    seen_order.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut pending: Vec<u64> = Vec::new();
    let mut a = 0;
    let target_at = |f: &Forecast, now_s: f64, pending: &[u64]| {
        let inputs = Inputs {
            now_s,
            pending: pending.iter().sum(),
            refill_rate,
            free_share: u64::MAX,
        };
        f.target_known(&inputs, pending)
    };
    // Stops: (ms, lease id, bytes).
    let mut ends: BinaryHeap<Reverse<(u64, u64, u64)>> = BinaryHeap::new();
    let (mut starts, mut warm_starts, mut held_peak, mut leased) = (0u64, 0u64, 0u64, 0u64);
    let mut points = Vec::new();
    let (mut next_look, mut next_plan, mut next_point) = (t0, t0, measure_from);
    let end_of_trace = trace.last().map_or(t0, |v| v.at_s);
    let mut i = 0;
    loop {
        let next_start = trace.get(i).map(|v| v.at_s);
        let next_end = ends.peek().map(|Reverse((ms, _, _))| *ms as f64 / 1000.0);
        let next_seen = seen_order.get(a).map(|&(t, _)| t);
        let t = [Some(next_look), next_start, next_end, next_seen]
            .into_iter()
            .flatten()
            .fold(f64::INFINITY, f64::min);
        if t > end_of_trace {
            break;
        }
        run.work_until(t);
        if next_end == Some(t) {
            if let Some(Reverse((_, id, bytes))) = ends.pop() {
                run.sim
                    .pool()
                    .release(id)
                    .map_err(|source| DrivenError::Pool {
                        vm: usize::MAX,
                        at_s: t,
                        source,
                    })?;
                leased = leased.saturating_sub(bytes);
            }
        } else if next_seen == Some(t) {
            pending.push(trace[seen_order[a].1].bytes);
            a += 1;
            if let Some(f) = forecast.as_ref() {
                run.set_target(&target_at(f, t, &pending));
            }
        } else if next_start == Some(t) {
            let v = trace[i];
            let announced_s = if forecast.is_some() {
                announced[i]
            } else {
                0.0
            };
            if announced_s > 0.0 {
                if let Some(k) = pending.iter().position(|&b| b == v.bytes) {
                    pending.swap_remove(k);
                }
            }
            let req = LeaseRequest {
                recycle: None,
                name: format!("vm{i}"),
                size: v.bytes,
                page_size: Some(ps),
                node: Some(0),
                owner: None,
                pid: None,
                pin: false,
            };
            let lease = run
                .sim
                .pool()
                .lease(&req)
                .map_err(|source| DrivenError::Pool {
                    vm: i,
                    at_s: t,
                    source,
                })?;
            i += 1;
            let warm = matches!(
                lease.source,
                LeaseSource::WarmExact | LeaseSource::WarmShrunk
            );
            leased += v.bytes;
            if t >= measure_from {
                starts += 1;
                warm_starts += u64::from(warm);
                held_peak = held_peak.max(leased);
            }
            ends.push(Reverse((
                ((t + v.life_s) * 1000.0) as u64,
                lease.id,
                v.bytes,
            )));
            if let Some(f) = forecast.as_mut() {
                f.started_announced(t, v.bytes, refill_rate, announced_s);
                run.set_target(&target_at(f, t, &pending));
            }
        } else {
            // A look.
            if let Some(f) = forecast.as_mut() {
                if t >= next_plan {
                    f.replan();
                    next_plan = t + REPLAN_S;
                }
                run.set_target(&target_at(f, t, &pending));
            }
            if series && t >= next_point {
                let k = run.sim.kind(ps);
                points.push(Point {
                    hour: (t - measure_from) / 3600.0,
                    warm: k.warm,
                    leased: k.leased,
                    target: run.target,
                });
                next_point = t + SERIES_S;
            }
            next_look = t + LOOK_S;
        }
        let held = run.held();
        run.area.at(t, held);
    }
    run.sim.check().map_err(DrivenError::Host)?;
    Ok(Outcome {
        policy,
        starts,
        warm_starts,
        warm_start_rate: if starts > 0 {
            warm_starts as f64 / starts as f64
        } else {
            1.0
        },
        stranded_gib_h: run.area.sum / (1u64 << 30) as f64 / 3600.0,
        stranded_peak: run.area.peak,
        held_peak,
        series: points,
    })
}

/// The smallest target of `policy`'s kind (`make(bytes)`), in steps of `step` bytes up to
/// `max`, whose warm-start rate through the driver reaches `rate`; the largest tried when
/// none does.
pub fn best_static(
    trace: &[VmLife],
    ps: PageSize,
    make: fn(u64) -> Policy,
    refill_rate: f64,
    measure_from: f64,
    (rate, step, max): (f64, u64, u64),
) -> Result<Outcome, DrivenError> {
    let run = |k: u64| replay(trace, ps, make(k * step), refill_rate, measure_from, false);
    let (mut lo, mut hi) = (0u64, max / step.max(1));
    let mut best = run(hi)?;
    if best.warm_start_rate < rate {
        return Ok(best);
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        let o = run(mid)?;
        if o.warm_start_rate >= rate {
            hi = mid;
            best = o;
        } else {
            lo = mid + 1;
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::week::replay::{self as model, PoolModel};

    const GIB: u64 = 1 << 30;
    const PS: PageSize = PageSize::Size2M;

    fn vm(at_s: f64, gib: u64, life_s: f64) -> VmLife {
        VmLife {
            at_s,
            bytes: gib * GIB,
            lead_s: 0.0,
            page_size: PS,
            life_s,
            kind: "steady",
        }
    }

    #[test]
    fn the_driver_serves_what_the_pool_holds_and_counts_the_stranded_hours() {
        let rate = GIB as f64;
        // Starts an hour apart, each for a minute: the pool is full again for each.
        let trace: Vec<VmLife> = (0..10)
            .map(|i| vm(f64::from(i) * 3600.0, 4, 60.0))
            .collect();
        let none = replay(&trace, PS, Policy::None, rate, 0.0, false).unwrap();
        assert_eq!(
            (none.starts, none.warm_starts, none.stranded_gib_h),
            (10, 0, 0.0)
        );
        let small = replay(
            &trace,
            PS,
            Policy::Demand { bytes: 2 * GIB },
            rate,
            0.0,
            false,
        );
        assert_eq!(small.unwrap().warm_starts, 0);
        for p in [
            Policy::Static { bytes: 4 * GIB },
            Policy::Demand { bytes: 4 * GIB },
        ] {
            let fits = replay(&trace, PS, p, rate, 0.0, true).unwrap();
            assert_eq!(fits.warm_starts, 10, "{p:?}");
            // 4 GiB warm for 9 hours, less the refill's seconds after each start.
            assert!(
                (fits.stranded_gib_h - 36.0).abs() < 0.1,
                "{p:?}: {}",
                fits.stranded_gib_h
            );
            assert_eq!((fits.held_peak, fits.stranded_peak), (4 * GIB, 4 * GIB));
            assert!(!fits.series.is_empty());
        }
    }

    /// Placement through the driver: a VM the forecast never saw is warm when its
    /// allocation is seen before it starts (its size becomes a file of the target), cold
    /// without.
    #[test]
    fn the_driver_replay_serves_known_demand_from_placement() {
        let goal = hugeprep::pool::core::forecast::Goal {
            warm_start_rate: 0.99,
            ceiling: u64::MAX,
        };
        let rate = GIB as f64;
        let mut lone = vm(100_000.0, 4, 60.0);
        let cold = replay(&[lone], PS, Policy::Adaptive { goal }, rate, 0.0, false).unwrap();
        assert_eq!((cold.starts, cold.warm_starts), (1, 0));
        lone.lead_s = 60.0;
        let warm = replay(&[lone], PS, Policy::Adaptive { goal }, rate, 0.0, false).unwrap();
        assert_eq!((warm.starts, warm.warm_starts), (1, 1));
    }

    /// With one VM size the pool's file sizes cannot matter: the driver and the model of
    /// warm bytes must count the same starts warm, and nearly the same stranded hours.
    #[test]
    fn with_one_size_the_driver_agrees_with_the_model() {
        let mut x: u64 = 7;
        let mut next = || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut t = 0.0;
        let trace: Vec<VmLife> = (0..400)
            .map(|_| {
                t += 60.0 + next() * 600.0;
                vm(t, 2, 60.0 + next() * 7200.0)
            })
            .collect();
        let rate = 0.5 * GIB as f64;
        let m = PoolModel { refill_rate: rate };
        for bytes in [4 * GIB, 8 * GIB, 16 * GIB] {
            let d = replay(&trace, PS, Policy::Demand { bytes }, rate, 3600.0, false).unwrap();
            let o = model::replay(&trace, Policy::Demand { bytes }, m, 3600.0, false);
            assert_eq!(d.starts, o.starts);
            let diff = d.warm_starts.abs_diff(o.warm_starts);
            assert!(diff <= o.starts / 50, "{bytes}: driver {d:?}\nmodel {o:?}");
            let rel = (d.stranded_gib_h - o.stranded_gib_h).abs() / o.stranded_gib_h;
            assert!(rel < 0.05, "{bytes}: driver {d:?}\nmodel {o:?}");
        }
    }
}
