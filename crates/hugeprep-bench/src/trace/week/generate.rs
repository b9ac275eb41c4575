//! A seeded generator of week-long VM traces, shaped by what public-cloud VM workload
//! studies report (see docs/pool.md, "Sizing the pool itself"): arrivals that follow the
//! day and the week, deploys of identical VMs in bursts, a heavy-tailed lifetime, and a mix
//! of 2M and 1G flavors. The parameters are ours; the shapes are theirs.

use serde::Serialize;

use hugeprep::page_size::PageSize;

const GIB: u64 = 1 << 30;
const DAY_S: f64 = 86_400.0;

/// Monday 2026-11-23 00:00 (local time, in seconds since the epoch): traces start on a
/// Monday so their days fall on the weekdays they are meant to.
pub const MONDAY: f64 = 1_795_392_000.0;

/// The 2M flavors (GiB, weight).
pub const FLAVORS_2M: [(u64, f64); 5] = [(1, 0.30), (2, 0.30), (4, 0.20), (8, 0.12), (16, 0.08)];

/// The 1G flavors (GiB, weight).
pub const FLAVORS_1G: [(u64, f64); 3] = [(16, 0.50), (32, 0.35), (64, 0.15)];

/// What to generate.
#[derive(Debug, Clone, Serialize)]
pub struct TraceShape {
    /// The seed: the same seed gives the same trace on every machine.
    pub seed: u64,
    /// Days, from a Monday.
    pub days: u32,
    /// Ordinary starts on an average weekday.
    pub starts_per_weekday: f64,
    /// Weekend days see this share of a weekday's starts.
    pub weekend_share: f64,
    /// The share of starts on 1G pages.
    pub share_1g: f64,
    /// Deploys (bursts of 4-16 identical VMs within seconds) on an average weekday.
    pub deploys_per_weekday: f64,
    /// A nightly batch on weekdays at 02:00: 8 VMs of 8 GiB on 2M pages for an hour.
    pub nightly_batch: bool,
    /// A burst no history shows, in the last week: 12 VMs of 16 GiB on 1G pages, on its
    /// Wednesday at 04:00.
    pub unseen_burst: bool,
    /// The median time from a VM's Placement allocation (the scheduler's claim) to its
    /// lease, s: a cloud's compute service binds ports and fetches the image in between.
    /// Log-normal (sigma 0.6, 1 s to 2 min); a deploy's VMs are all claimed when its first
    /// is. 0: no Placement (a libvirt host), nothing is seen coming.
    pub placement_lead_s: f64,
}

impl Default for TraceShape {
    fn default() -> TraceShape {
        TraceShape {
            seed: 1,
            days: 14,
            starts_per_weekday: 240.0,
            weekend_share: 0.35,
            share_1g: 0.2,
            deploys_per_weekday: 3.0,
            nightly_batch: true,
            unseen_burst: false,
            placement_lead_s: 0.0,
        }
    }
}

/// One VM's life in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct VmLife {
    /// When it starts (local time, seconds since the epoch).
    pub at_s: f64,
    /// Its memory.
    pub bytes: u64,
    /// How long before its start its Placement allocation was made, s (0: no Placement;
    /// see [`TraceShape::placement_lead_s`]).
    pub lead_s: f64,
    /// Its page size.
    pub page_size: PageSize,
    /// How long it runs, s.
    pub life_s: f64,
    /// `steady`, `deploy`, `batch` or `unseen`.
    pub kind: &'static str,
}

/// splitmix64: one seed, one stream, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn exp(&mut self, rate: f64) -> f64 {
        -self.unit().ln() / rate
    }

    fn normal(&mut self) -> f64 {
        (-2.0 * self.unit().ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }

    fn pick(&mut self, weights: &[(u64, f64)]) -> u64 {
        let mut u = self.unit() * weights.iter().map(|w| w.1).sum::<f64>();
        for &(v, w) in weights {
            if u < w {
                return v;
            }
            u -= w;
        }
        weights.last().map_or(0, |w| w.0)
    }
}

/// The day's shape of arrivals at hour `h` (0-24): 1 at 14h, 0.2 at 2h, a raised cosine.
fn day_curve(h: f64) -> f64 {
    0.2 + 0.8 * (0.5 + 0.5 * (std::f64::consts::TAU * (h - 14.0) / 24.0).cos())
}

/// The mean of [`day_curve`] over a day.
const DAY_CURVE_MEAN: f64 = 0.6;

fn is_weekend(t_s: f64) -> bool {
    (((t_s - MONDAY) / DAY_S).floor() as i64).rem_euclid(7) >= 5
}

/// The arrival rate at `t_s`, per second, for `per_weekday` arrivals on a weekday.
fn rate(shape: &TraceShape, per_weekday: f64, t_s: f64) -> f64 {
    let hour = ((t_s - MONDAY) / 3600.0).rem_euclid(24.0);
    let week = if is_weekend(t_s) {
        shape.weekend_share
    } else {
        1.0
    };
    per_weekday / DAY_S / DAY_CURVE_MEAN * day_curve(hour) * week
}

/// A lifetime: log-normal with a median of 30 min (most VMs are short-lived, a few run for
/// days), within a minute and two weeks.
fn lifetime(rng: &mut Rng, median_s: f64) -> f64 {
    (median_s * (1.8 * rng.normal()).exp()).clamp(60.0, 14.0 * DAY_S)
}

fn flavor(rng: &mut Rng, shape: &TraceShape) -> (u64, PageSize) {
    if rng.unit() < shape.share_1g {
        (rng.pick(&FLAVORS_1G) * GIB, PageSize::Size1G)
    } else {
        (rng.pick(&FLAVORS_2M) * GIB, PageSize::Size2M)
    }
}

/// Generates the trace, sorted by start.
pub fn generate(shape: &TraceShape) -> Vec<VmLife> {
    let mut rng = Rng(shape.seed);
    let end = MONDAY + f64::from(shape.days) * DAY_S;
    let mut out = Vec::new();
    // Ordinary starts and deploys: non-homogeneous Poisson processes, by thinning.
    let peak = |per_day: f64| per_day / DAY_S / DAY_CURVE_MEAN;
    for (per_day, deploy) in [
        (shape.starts_per_weekday, false),
        (shape.deploys_per_weekday, true),
    ] {
        if per_day <= 0.0 {
            continue;
        }
        let mut t = MONDAY;
        loop {
            t += rng.exp(peak(per_day));
            if t >= end {
                break;
            }
            if rng.unit() * peak(per_day) > rate(shape, per_day, t) {
                continue;
            }
            let (bytes, page_size) = flavor(&mut rng, shape);
            if !deploy {
                let life_s = lifetime(&mut rng, 1800.0);
                out.push(VmLife {
                    at_s: t,
                    bytes,
                    lead_s: 0.0,
                    page_size,
                    life_s,
                    kind: "steady",
                });
                continue;
            }
            // A deploy: 4-16 identical VMs, one every 1-3 s, living as long as each other
            // (a day, in the median).
            let n = 4 + (rng.unit() * 13.0) as u32;
            let life_s = lifetime(&mut rng, DAY_S);
            let mut at = t;
            for _ in 0..n {
                out.push(VmLife {
                    at_s: at,
                    bytes,
                    lead_s: 0.0,
                    page_size,
                    life_s,
                    kind: "deploy",
                });
                at += 1.0 + 2.0 * rng.unit();
            }
        }
    }
    if shape.nightly_batch {
        for day in 0..shape.days {
            let start = MONDAY + f64::from(day) * DAY_S;
            if is_weekend(start) {
                continue;
            }
            let at = start + 2.0 * 3600.0 + 600.0 * (rng.unit() - 0.5);
            for i in 0..8 {
                out.push(VmLife {
                    at_s: at + f64::from(i) * 2.0,
                    bytes: 8 * GIB,
                    lead_s: 0.0,
                    page_size: PageSize::Size2M,
                    life_s: 3600.0,
                    kind: "batch",
                });
            }
        }
    }
    if shape.unseen_burst && shape.days >= 7 {
        // The Wednesday of the last whole week.
        let wednesday = MONDAY + f64::from((shape.days - 7) / 7 * 7 + 2) * DAY_S;
        for i in 0..12 {
            out.push(VmLife {
                at_s: wednesday + 4.0 * 3600.0 + f64::from(i) * 1.5,
                bytes: 16 * GIB,
                lead_s: 0.0,
                page_size: PageSize::Size1G,
                life_s: 2.0 * 3600.0,
                kind: "unseen",
            });
        }
    }
    out.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    if shape.placement_lead_s > 0.0 {
        with_leads(&mut out, shape);
    }
    out
}

/// Gives each VM its Placement lead (see [`TraceShape::placement_lead_s`]), from a stream
/// of its own, so that a trace with leads is the same trace with leads added.
fn with_leads(trace: &mut [VmLife], shape: &TraceShape) {
    let mut rng = Rng(shape.seed ^ 0x5eed_1ead);
    // A deploy's VMs (same kind, bytes and lifetime, seconds apart) share one claim.
    let mut claim: Option<(f64, u64, f64, f64)> = None;
    for v in trace.iter_mut() {
        let lead = (shape.placement_lead_s * (0.6 * rng.normal()).exp()).clamp(1.0, 120.0);
        let claimed = match claim {
            Some((at, bytes, life, claimed))
                if v.kind == "deploy"
                    && bytes == v.bytes
                    && life == v.life_s
                    && v.at_s - at < 4.0 =>
            {
                claimed
            }
            _ => v.at_s - lead,
        };
        v.lead_s = v.at_s - claimed;
        if v.kind == "deploy" {
            claim = Some((v.at_s, v.bytes, v.life_s, claimed));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_trace_and_the_shape_it_asks_for() {
        let shape = TraceShape::default();
        let a = generate(&shape);
        assert_eq!(a, generate(&shape));
        assert_ne!(
            a,
            generate(&TraceShape {
                seed: 2,
                ..shape.clone()
            })
        );
        let steady: Vec<&VmLife> = a.iter().filter(|v| v.kind == "steady").collect();
        // 10 weekdays and 4 weekend days at 35%: about 2736 ordinary starts.
        let expected = 240.0 * (10.0 + 4.0 * 0.35);
        assert!(
            (steady.len() as f64 - expected).abs() < 0.1 * expected,
            "{}",
            steady.len()
        );
        // The afternoon is busier than the night.
        let at_hour = |h: f64| {
            steady
                .iter()
                .filter(|v| ((v.at_s - MONDAY) / 3600.0).rem_euclid(24.0).floor() == h)
                .count()
        };
        assert!(at_hour(14.0) > 3 * at_hour(2.0));
        // About a fifth on 1G pages, every size a flavor.
        let g = steady
            .iter()
            .filter(|v| v.page_size == PageSize::Size1G)
            .count();
        assert!((g as f64 / steady.len() as f64 - 0.2).abs() < 0.04);
        assert!(a.iter().all(|v| v.bytes % GIB == 0 && v.life_s >= 60.0));
        assert!(a.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        assert_eq!(a.iter().filter(|v| v.kind == "batch").count(), 80);
        let unseen = generate(&TraceShape {
            unseen_burst: true,
            ..shape
        });
        let burst: Vec<&VmLife> = unseen.iter().filter(|v| v.kind == "unseen").collect();
        assert_eq!(burst.len(), 12);
        // In the last week, on its Wednesday at 04:00.
        let day = ((burst[0].at_s - MONDAY) / DAY_S).floor();
        assert_eq!(day, 9.0);
    }
}
