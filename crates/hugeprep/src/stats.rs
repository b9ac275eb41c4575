//! Summaries of repeated measurements (benchmarks, calibration): median and range, never a
//! single run.

use serde::Serialize;

/// Median, minimum and maximum of a set of samples (GB/s, ms, ...).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// The median (mean of the two middle samples for an even count).
    pub median: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
}

impl Summary {
    /// Summarises `samples`; `None` when there are none or one is NaN.
    ///
    /// ```
    /// use hugeprep::stats::Summary;
    /// let s = Summary::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
    /// assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 10.0));
    /// ```
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() || samples.iter().any(|s| s.is_nan()) {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }

    /// The median of `a[i] / b[i]` over samples taken in pairs (interleaved in the same
    /// repetition): a slow moment of a shared host slows both sides of a pair, so this ratio
    /// is steadier than the ratio of the two medians. `None` without a usable pair.
    ///
    /// ```
    /// use hugeprep::stats::Summary;
    /// // Both sides slowed down together in the second pair.
    /// assert_eq!(Summary::paired_ratio(&[90.0, 45.0, 88.0], &[100.0, 50.0, 80.0]), Some(0.9));
    /// ```
    pub fn paired_ratio(a: &[f64], b: &[f64]) -> Option<f64> {
        let ratios: Vec<f64> = a
            .iter()
            .zip(b)
            .filter(|(_, b)| **b > 0.0)
            .map(|(a, b)| a / b)
            .collect();
        Summary::of(&ratios).map(|s| s.median)
    }

    /// The `q` quantile (0.0..=1.0) of `samples` by nearest rank, e.g. 0.99 for p99.
    pub fn quantile(samples: &[f64], q: f64) -> Option<f64> {
        if samples.is_empty() {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).max(1);
        Some(v[rank - 1])
    }
}

impl std::fmt::Display for Summary {
    /// `73.1 (70.2-74.0)`: median, then the range.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} ({:.1}-{:.1})", self.median, self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_count_and_quantiles() {
        let s = Summary::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!(s.median, 3.0);
        assert_eq!(s.to_string(), "3.0 (1.0-5.0)");
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(Summary::quantile(&v, 0.99), Some(99.0));
        assert_eq!(Summary::quantile(&v, 0.5), Some(50.0));
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[f64::NAN]).is_none());
    }
}
