//! The simulated replay agrees with real time: an hour of the generated trace's 2M VMs
//! (Tuesday from 13:00, its busiest), run 60 times faster and with memory 128 times
//! smaller, is replayed in real time against the real daemon on real hugetlbfs (leases
//! over its API, demand shape, a fixed target), and through the real driver on the
//! simulated host in simulated time, at the refill rate the daemon measured. The figures
//! must agree: the warm starts within a tenth of the starts (and two), the stranded
//! GiB·hours within a quarter. No timing is asserted: counts and rates only.

mod daemon_util;

use std::time::Duration;

use daemon_util::{Env, MIB};
use hugeprep::PageSize;
use hugeprep_bench::trace::week::generate::{generate, TraceShape, MONDAY};
use hugeprep_bench::trace::week::replay::Policy;
use hugeprep_bench::trace::week::{driven, realtime};

#[test]
fn an_hour_replayed_in_real_time_agrees_with_the_simulated_replay() {
    let ps = PageSize::Size2M;
    let trace = generate(&TraceShape {
        days: 7,
        ..TraceShape::default()
    });
    let (speed, shrink) = (30.0, 128);
    let from = MONDAY + 86_400.0 + 13.0 * 3600.0;
    let slice = realtime::slice(&trace, ps, from, 1.0, speed, shrink);
    assert!(slice.len() >= 10, "{} starts in the slice", slice.len());
    let target = 256 * MIB;
    let peak = hugeprep_bench::trace::held_at_arrival(
        &slice
            .iter()
            .map(|v| hugeprep_bench::trace::TraceEvent {
                at_ms: (v.at_s * 1000.0) as u64,
                size: v.bytes,
                hold_ms: (v.life_s * 1000.0) as u64,
                phase: String::new(),
            })
            .collect::<Vec<_>>(),
    )
    .into_iter()
    .map(|h| h.0)
    .max()
    .unwrap_or(0);
    let largest = slice.iter().map(|v| v.bytes).max().unwrap_or(0);
    let env = Env::new("trace-agree", peak + 2 * target + 2 * largest);
    let daemon = env.spawn(&[
        "--page-size",
        "2M",
        "--warm",
        "256M",
        "--scrub-bandwidth",
        "0",
    ]);
    daemon.settle(target);
    let policy = Policy::Demand { bytes: target };
    let real = realtime::replay(
        &daemon.client,
        &slice,
        ps,
        policy,
        "trace",
        Duration::from_millis(50),
    )
    .unwrap();
    let rate = if real.refill_rate > 0.0 {
        real.refill_rate
    } else {
        1e9
    };
    let sim = driven::replay(&slice, ps, policy, rate, slice[0].at_s, false).unwrap();
    eprintln!(
        "real time: {:?} (refill {:.2} GiB/s, lag {:.1} s, {} polls)\nsimulated: {:?}",
        real.outcome,
        rate / (1u64 << 30) as f64,
        real.lag_s,
        real.polls,
        sim
    );
    let r = &real.outcome;
    assert_eq!(r.starts, sim.starts);
    let tolerance = (r.starts / 10).max(2);
    assert!(
        r.warm_starts.abs_diff(sim.warm_starts) <= tolerance,
        "warm starts: real {} vs simulated {} (tolerance {tolerance})",
        r.warm_starts,
        sim.warm_starts
    );
    let rel = (r.stranded_gib_h - sim.stranded_gib_h).abs() / sim.stranded_gib_h.max(1e-12);
    assert!(
        rel <= 0.25,
        "stranded GiB·h: real {} vs simulated {}",
        r.stranded_gib_h,
        sim.stranded_gib_h
    );
}
