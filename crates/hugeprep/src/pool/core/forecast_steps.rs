//! The steps of the forecast's plan (`core::forecast`): each bucket's needs smoothed over
//! the hours around it and mixed with the pooled shape of all, the convex hull of a bucket's
//! (target, warm starts) points, and the look-ahead horizon.

use super::forecast::{MAX_HORIZON_S, MIN_HORIZON_S, POOLED};

/// The weights of a sample for the hours around its own (-2 to +2).
const KERNEL: [f64; 5] = [0.25, 0.5, 1.0, 0.5, 0.25];

/// Bucket `b`'s needs smoothed over the hours around it on the same kind of day (the
/// [`KERNEL`]), sorted, with their weights.
fn smoothed<T: Copy>(own: &[Vec<(T, f64)>], b: usize) -> Vec<(T, f64)> {
    let kernel_sum: f64 = KERNEL.iter().sum();
    let mut weighted = Vec::new();
    for (i, k) in KERNEL.iter().enumerate() {
        let hour = (b % 24 + 24 + i - 2) % 24;
        let from = b - b % 24 + hour;
        weighted.extend(own[from].iter().map(|&(s, w)| (s, w * k / kernel_sum)));
    }
    weighted
}

/// Every bucket's needs together, their weights summing to 1: the shape of a start's need
/// whatever its hour.
pub(super) fn pooled<T: Copy>(own: &[Vec<(T, f64)>]) -> Vec<(T, f64)> {
    let all: Vec<(T, f64)> = own.iter().flatten().copied().collect();
    let sum: f64 = all.iter().map(|&(_, w)| w).sum();
    all.into_iter()
        .map(|(s, w)| (s, w / sum.max(f64::MIN_POSITIVE)))
        .collect()
}

/// Bucket `b`'s samples for the plan, sorted by need: half its own (smoothed), half the
/// pooled shape scaled to its starts. A start's need depends on its hour mostly through
/// how many starts come then: a deploy seen once at 11h speaks, in proportion, for every
/// hour as busy, which one week of an hour's own samples cannot.
pub(super) fn mixed<T: Copy + Ord>(
    own: &[Vec<(T, f64)>],
    global: &[(T, f64)],
    b: usize,
) -> Vec<(T, f64)> {
    let local = smoothed(own, b);
    let starts: f64 = local.iter().map(|&(_, w)| w).sum();
    let mut out: Vec<(T, f64)> = local
        .into_iter()
        .map(|(s, w)| (s, w * (1.0 - POOLED)))
        .collect();
    if starts > 0.0 {
        out.extend(global.iter().map(|&(s, w)| (s, w * starts * POOLED)));
    }
    out.sort_unstable_by_key(|&(s, _)| s);
    out
}

/// The horizon for starts of `mean_bytes` at `refill_rate` bytes/s: twice the time to make
/// one start's memory warm, within [`MIN_HORIZON_S`] and [`MAX_HORIZON_S`].
pub fn horizon(mean_bytes: f64, refill_rate: f64) -> f64 {
    if refill_rate <= 0.0 || !refill_rate.is_finite() {
        return MAX_HORIZON_S;
    }
    (2.0 * mean_bytes / refill_rate).clamp(MIN_HORIZON_S, MAX_HORIZON_S)
}

/// The steps of one bucket, from its samples sorted by demand with their weights (warm
/// starts a week each): (bytes added, warm starts gained), along the upper convex hull of
/// (target, warm starts), so each step gains fewer starts per byte than the one before.
pub(super) fn hull(sorted: &[(u64, f64)]) -> Vec<(u64, f64)> {
    // The points (target, starts warm at that target): a target of a sample's demand makes
    // it and every smaller one warm.
    let mut points: Vec<(u64, f64)> = vec![(0, 0.0)];
    let mut warm = 0.0;
    for (i, &(demand, weight)) in sorted.iter().enumerate() {
        warm += weight;
        let last_of_value = sorted.get(i + 1).map_or(true, |&(d, _)| d != demand);
        if last_of_value {
            points.push((demand, warm));
        }
    }
    let mut upper: Vec<(u64, f64)> = Vec::with_capacity(points.len());
    for p in points {
        while upper.len() >= 2 {
            let (a, b) = (upper[upper.len() - 2], upper[upper.len() - 1]);
            // Drop `b` when it lies on or under the line from `a` to `p`.
            let cross = (b.0 - a.0) as f64 * (p.1 - a.1) - (b.1 - a.1) * (p.0 - a.0) as f64;
            if cross >= 0.0 {
                upper.pop();
            } else {
                break;
            }
        }
        upper.push(p);
    }
    upper
        .windows(2)
        .map(|w| (w[1].0 - w[0].0, w[1].1 - w[0].1))
        // A first step of 0 bytes: the starts that need nothing of the pool (announced
        // early enough) are warm at any target.
        .filter(|&(_, starts)| starts > 0.0)
        .collect()
}
