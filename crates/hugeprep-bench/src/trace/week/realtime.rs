//! Replays a VM trace in real time against a running daemon over its API: each start is a
//! lease (`POST /v1/leases`), each stop its release, at the trace's times on the wall
//! clock; the daemon's warm bytes are read (`GET /v1/pool`) every `poll` between events
//! for the stranded GiB·hours. The check of the simulated replay ([`super::driven`]):
//! the same trace, the same target, the real daemon on real hugetlbfs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::generate::VmLife;
use super::replay::{Outcome, Policy};
use hugeprep::client::{Client, ClientError};
use hugeprep::page_size::PageSize;
use hugeprep::pool::{LeaseRequest, LeaseSource};

/// A real-time replay failed.
#[derive(Debug, thiserror::Error)]
pub enum RealTimeError {
    /// The daemon refused or failed a request.
    #[error("real-time replay, {what}: {source}")]
    Daemon {
        /// Which request.
        what: String,
        /// The client's error.
        source: ClientError,
    },
}

/// What a real-time replay measured.
#[derive(Debug, Clone, Serialize)]
pub struct RealTimeRun {
    /// The figures, as the simulated replays give them.
    pub outcome: Outcome,
    /// The daemon's refill rate over the run (bytes faulted by its worker per second of
    /// faulting), for the simulated replay of the same trace.
    pub refill_rate: f64,
    /// How late the replay ran behind the trace at its end, s.
    pub lag_s: f64,
    /// Warm-byte readings taken.
    pub polls: u64,
}

/// Replays `trace` (sorted by start; times in seconds, any epoch) against the daemon of
/// `client`, leasing on `ps` node 0 as `prefix`-named leases; `policy` is what the daemon
/// was configured with (for the report). Every lease is released before this returns.
pub fn replay(
    client: &Client,
    trace: &[VmLife],
    ps: PageSize,
    policy: Policy,
    prefix: &str,
    poll: Duration,
) -> Result<RealTimeRun, RealTimeError> {
    let daemon = |what: String| move |source| RealTimeError::Daemon { what, source };
    let warm_now = || -> Result<(u64, u64), RealTimeError> {
        let st = client
            .blocking(client.pool())
            .map_err(daemon("reading the pool".into()))?;
        Ok(st
            .kinds
            .iter()
            .find(|k| k.page_size == ps && k.node == 0)
            .map_or((0, 0), |k| (k.warm_bytes, k.leased_bytes)))
    };
    let before = client
        .blocking(client.pool())
        .map_err(daemon("reading the pool".into()))?
        .counters;
    let t0 = trace.first().map_or(0.0, |v| v.at_s);
    let began = Instant::now();
    let now_s = || began.elapsed().as_secs_f64();
    let mut ends: BinaryHeap<Reverse<(u64, u64, u64)>> = BinaryHeap::new();
    let (mut starts, mut warm_starts, mut held_peak, mut leased) = (0u64, 0u64, 0u64, 0u64);
    let (mut area, mut peak, mut polls) = (0.0f64, 0u64, 0u64);
    let (mut last_t, mut last_warm) = (0.0f64, 0u64);
    let mut i = 0;
    let mut result = Ok(());
    while i < trace.len() || !ends.is_empty() {
        let next_start = trace.get(i).map(|v| v.at_s - t0);
        let next_end = ends.peek().map(|Reverse((ms, _, _))| *ms as f64 / 1000.0);
        let end_first = match (next_start, next_end) {
            (Some(s), Some(e)) => e <= s,
            (None, Some(_)) => true,
            _ => false,
        };
        let due = if end_first { next_end } else { next_start }.unwrap_or(0.0);
        // Read the warm bytes until the event is due; counted until the last start, as the
        // simulated replay counts.
        loop {
            let (warm, _) = warm_now()?;
            let t = now_s();
            if i < trace.len() {
                area += last_warm as f64 * (t - last_t);
                peak = peak.max(warm);
            }
            (last_t, last_warm) = (t, warm);
            polls += 1;
            let wait = due - now_s();
            if wait <= 0.0 {
                break;
            }
            std::thread::sleep(poll.min(Duration::from_secs_f64(wait)));
        }
        if end_first {
            if let Some(Reverse((_, id, bytes))) = ends.pop() {
                client
                    .blocking(client.release(id))
                    .map_err(daemon(format!("releasing lease {id}")))?;
                leased -= bytes;
            }
            continue;
        }
        let v = trace[i];
        let req = LeaseRequest {
            name: format!("{prefix}{i}"),
            size: v.bytes,
            page_size: Some(ps),
            node: Some(0),
            ..Default::default()
        };
        i += 1;
        match client.blocking(client.lease(&req)) {
            Ok(lease) => {
                starts += 1;
                warm_starts += u64::from(matches!(
                    lease.source,
                    LeaseSource::WarmExact | LeaseSource::WarmShrunk
                ));
                leased += v.bytes;
                held_peak = held_peak.max(leased);
                let at = (v.at_s - t0 + v.life_s) * 1000.0;
                ends.push(Reverse((at as u64, lease.id, v.bytes)));
            }
            Err(e) => {
                result = Err(daemon(format!("lease {}", req.name))(e));
                break;
            }
        }
    }
    // Give every lease back, whatever happened.
    while let Some(Reverse((_, id, _))) = ends.pop() {
        let _ = client.blocking(client.release(id));
    }
    result?;
    let lag_s = now_s() - trace.last().map_or(0.0, |v| v.at_s - t0 + v.life_s);
    let after = client
        .blocking(client.pool())
        .map_err(daemon("reading the pool".into()))?
        .counters;
    let faulted = after.refill_faulted_bytes - before.refill_faulted_bytes;
    let seconds = after.refill_fault_seconds - before.refill_fault_seconds;
    Ok(RealTimeRun {
        outcome: Outcome {
            policy,
            starts,
            warm_starts,
            warm_start_rate: if starts > 0 {
                warm_starts as f64 / starts as f64
            } else {
                1.0
            },
            stranded_gib_h: area / (1u64 << 30) as f64 / 3600.0,
            stranded_peak: peak,
            held_peak,
            series: Vec::new(),
        },
        refill_rate: if seconds > 0.0 {
            faulted as f64 / seconds
        } else {
            0.0
        },
        lag_s: lag_s.max(0.0),
        polls,
    })
}

/// A slice of `trace` (one page size's VMs) for a real-time replay on a small host: the
/// VMs starting in `[from_s, from_s + hours)`, their times divided by `speed` (60: an hour
/// in a minute) and their memory by `shrink` (rounded up to whole pages of `ps`), each
/// stopped by the slice's end at the latest, so the slice's figures can be compared with a
/// simulated replay of the same slice.
pub fn slice(
    trace: &[VmLife],
    ps: PageSize,
    from_s: f64,
    hours: f64,
    speed: f64,
    shrink: u64,
) -> Vec<VmLife> {
    let page = ps.bytes();
    trace
        .iter()
        .filter(|v| v.page_size == ps && v.at_s >= from_s && v.at_s < from_s + hours * 3600.0)
        .map(|v| VmLife {
            at_s: (v.at_s - from_s) / speed,
            bytes: (v.bytes / shrink.max(1)).div_ceil(page).max(1) * page,
            life_s: v.life_s.min(from_s + hours * 3600.0 - v.at_s) / speed,
            ..*v
        })
        .collect()
}

/// A real-time replay and the simulated replay of the same slice, side by side.
#[derive(Debug, Clone, Serialize)]
pub struct Agreement {
    /// The slice: starts, from when (s since the epoch), hours, speed and shrink.
    pub starts: usize,
    /// The slice's start in the generated trace, s since the epoch.
    pub from_s: f64,
    /// Hours of the trace.
    pub hours: f64,
    /// How many times faster than the trace it ran.
    pub speed: f64,
    /// How many times smaller the VMs' memory was.
    pub shrink: u64,
    /// Against the daemon.
    pub real: RealTimeRun,
    /// Through the driver on the simulated host at the daemon's measured refill rate.
    pub simulated: Outcome,
}

impl Agreement {
    /// The two side by side.
    pub fn table(&self) -> String {
        let row = |name: &str, o: &Outcome| {
            format!(
                "{name:<10} {:>6} {:>6} {:>8.2}% {:>14.6} {:>10}\n",
                o.starts,
                o.warm_starts,
                o.warm_start_rate * 100.0,
                o.stranded_gib_h,
                o.stranded_peak >> 20
            )
        };
        format!(
            "{} h of the trace from {:.0}, {}x faster, memory /{}; refill {:.2} GiB/s measured, lag {:.1} s\n\
             {:<10} {:>6} {:>6} {:>9} {:>14} {:>10}\n{}{}",
            self.hours,
            self.from_s,
            self.speed,
            self.shrink,
            self.real.refill_rate / (1u64 << 30) as f64,
            self.real.lag_s,
            "replay",
            "starts",
            "warm",
            "rate",
            "stranded GiBh",
            "peak MiB",
            row("real time", &self.real.outcome),
            row("simulated", &self.simulated)
        )
    }
}
