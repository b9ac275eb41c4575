//! The files a start needs (`core::forecast`). Through the pool, a start is warm only when
//! a warm FILE of at least its size is there: 19 GiB warm in five small files serves no
//! 16 GiB start. So the forecast counts each start's need in files of its *class* (its size
//! rounded up to [`CLASS_BITS`] significant bits: a flavor's size itself, in practice), and
//! plans, per hour bucket, how many files of each class to keep warm.
//!
//! A start takes the smallest warm file at least its size (cut to its size: warm all the
//! same), so a file serves every class up to its own. A start of class `c` is warm when
//! the files of class `c` or larger outnumber those that starts of class `c` or larger took
//! and the refill has not made good yet. Its need is that number, itself included: files
//! *at threshold* `c` (the Lindley recursion of the module `forecast`, per class, counted
//! in whole files over the classes from `c` up). The refill makes the missing files good
//! largest first (as the pool's worker fills the shape's missing files, largest first).
//! A plan of threshold counts becomes files with [`nest`]: the files of class `c` are what
//! the count at `c` asks beyond the files of larger classes; in quiet hours one file of the
//! largest size serves every start, as the refill remakes it between them.

use std::collections::BTreeMap;

use super::forecast::NEED_STEP;

/// Significant bits of a size class: classes are at most 1/32 larger than the start (a
/// start takes a larger file cut to its size, warm all the same).
pub const CLASS_BITS: u32 = 5;

/// Files to keep warm: bytes per class (a whole number of files of that class each).
pub type Files = BTreeMap<u64, u64>;

/// The class of a start of `bytes` (at most `ceiling`): rounded up to [`NEED_STEP`], then
/// to [`CLASS_BITS`] significant bits. A whole number of pages of either size whenever
/// `bytes` is one (a whole number of GiB up to 32 GiB is its own class). At most 32 classes
/// per power of two, so a stream of crafted sizes makes at most a few thousand.
pub fn class_of(bytes: u64, ceiling: u64) -> u64 {
    let b = bytes
        .min(ceiling)
        .max(1)
        .div_ceil(NEED_STEP)
        .saturating_mul(NEED_STEP);
    let bits = 64 - b.leading_zeros();
    if bits <= CLASS_BITS {
        return b;
    }
    let step = 1u64 << (bits - CLASS_BITS);
    b.div_ceil(step).saturating_mul(step)
}

/// A deficit of `d` bytes of class `class` counted as whole files, at most `ceiling` (no
/// target is larger, so a larger need says nothing more; at most `ceiling / class` values).
pub fn whole_files(d: f64, class: u64, ceiling: u64) -> u64 {
    let class = class.max(1);
    let files = (d.max(0.0) / class as f64).ceil();
    let most = (ceiling / class).max(1);
    (files.min(most as f64) as u64).saturating_mul(class)
}

/// The per-class Lindley state: bytes of each class missing from a full pool.
#[derive(Debug, Clone, Default)]
pub struct Deficits {
    /// The last start, local time s.
    at: Option<f64>,
    /// Bytes missing per class (only classes with some missing).
    missing: BTreeMap<u64, f64>,
}

impl Deficits {
    /// The refill makes `budget` bytes good, largest class first.
    fn refill(&mut self, mut budget: f64) {
        for d in self.missing.values_mut().rev() {
            let made = d.min(budget);
            *d -= made;
            budget -= made;
        }
        self.missing.retain(|_, d| *d > 0.0);
    }

    /// A start of class `class` at `at_s`, at `rate` bytes/s, announced `lead_s` before:
    /// the files of class `class` or larger the pool must hold for it to be warm (its own
    /// included; 0: the announcement alone made it warm, the refill being idle then), as
    /// bytes of its class (files times `class`).
    pub fn start(&mut self, at_s: f64, class: u64, rate: f64, lead_s: f64) -> f64 {
        match self.at {
            Some(t) if t <= at_s => self.refill(rate * (at_s - t)),
            // A clock stepped back: nothing before this start is known to be before it.
            Some(_) => self.missing.clear(),
            None => {}
        }
        self.at = Some(at_s);
        let carried = self.missing.get(&class).copied().unwrap_or(0.0);
        let idle = self.missing.is_empty();
        let d = class as f64 + carried;
        // The refill had the lead to make this file warm when it had nothing else to do.
        let need = if idle {
            (d - rate * lead_s).max(0.0)
        } else {
            d
        };
        if need <= 0.0 {
            return 0.0;
        }
        self.missing.insert(class, need);
        let files: f64 = self
            .missing
            .range(class..)
            .map(|(&c, &d)| (d / c.max(1) as f64).ceil())
            .sum();
        files * class as f64
    }

    /// Forgets the starts seen.
    pub fn clear(&mut self) {
        *self = Deficits::default();
    }

    /// The last start's time and the bytes missing per class, to be saved.
    pub fn parts(&self) -> (Option<f64>, Vec<(u64, f64)>) {
        (
            self.at,
            self.missing.iter().map(|(&c, &d)| (c, d)).collect(),
        )
    }

    /// The state [`Deficits::parts`] gave (checked by the caller).
    pub fn from_parts(at: Option<f64>, missing: impl IntoIterator<Item = (u64, f64)>) -> Self {
        Deficits {
            at,
            missing: missing.into_iter().filter(|&(_, d)| d > 0.0).collect(),
        }
    }
}

/// The total bytes of `files`.
pub fn total(files: &Files) -> u64 {
    files.values().fold(0u64, |a, &b| a.saturating_add(b))
}

/// The largest of `a` and `b` per class, into `a`.
pub fn max_into(a: &mut Files, b: &Files) {
    for (&c, &bytes) in b {
        let e = a.entry(c).or_insert(0);
        *e = (*e).max(bytes);
    }
}

/// `files` cut to at most `cap` bytes: whole files, smallest classes first (the most starts
/// per byte kept). Returns whether anything was cut.
pub fn cut_to(files: &mut Files, cap: u64) -> bool {
    let mut left = cap;
    let mut cut = false;
    for (&class, bytes) in files.iter_mut() {
        let keep = (left / class.max(1)).saturating_mul(class).min(*bytes);
        cut |= keep < *bytes;
        *bytes = keep;
        left -= keep;
    }
    files.retain(|_, b| *b > 0);
    cut
}

/// Threshold counts (bytes per class: at least that many bytes' worth of files of the class
/// *or larger*) as files: largest class first, each class adds the files its count asks
/// beyond those of the larger classes.
pub fn nest(thresholds: &Files) -> Files {
    let mut out = Files::new();
    let mut larger = 0u64;
    for (&c, &bytes) in thresholds.iter().rev() {
        let want = bytes / c.max(1);
        if want > larger {
            out.insert(c, (want - larger).saturating_mul(c));
            larger = want;
        }
    }
    out
}

/// `files` as (file size, count), largest first: what the pool keeps warm.
pub fn as_counts(files: &Files) -> Vec<(u64, u64)> {
    files
        .iter()
        .rev()
        .filter(|(&c, &b)| c > 0 && b >= c)
        .map(|(&c, &b)| (c, b / c))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn classes_are_flavor_sizes_rounded_to_five_significant_bits() {
        for g in [1, 2, 3, 4, 6, 8, 12, 16, 24, 31, 32, 48, 64] {
            assert_eq!(class_of(g * GIB, u64::MAX), g * GIB);
        }
        assert_eq!(class_of(65 * GIB, u64::MAX), 68 * GIB);
        assert_eq!(class_of(100 << 20, u64::MAX), 100 << 20);
        assert_eq!(class_of(1, u64::MAX), NEED_STEP);
        assert_eq!(class_of(64 * GIB, 8 * GIB), 8 * GIB);
    }

    #[test]
    fn the_refill_makes_the_largest_missing_files_good_first() {
        let mut d = Deficits::default();
        let rate = GIB as f64;
        assert_eq!(d.start(0.0, 16 * GIB, rate, 0.0), (16 * GIB) as f64);
        // Two files of 2 GiB or more out: the 16 GiB one and its own.
        assert_eq!(d.start(0.0, 2 * GIB, rate, 0.0), (4 * GIB) as f64);
        // 8 s later: 8 GiB of the 16 GiB made good, none of the 2 GiB: three files of
        // 2 GiB or more are out (16, 2, 2), counted as 2 GiB ones.
        assert_eq!(d.start(8.0, 2 * GIB, rate, 0.0), (6 * GIB) as f64);
        // A 16 GiB start counts only the 16 GiB file still missing.
        assert_eq!(d.start(8.0, 16 * GIB, rate, 0.0), (32 * GIB) as f64);
        assert_eq!(whole_files((4 * GIB) as f64, 2 * GIB, u64::MAX), 4 * GIB);
        assert_eq!(whole_files((3 * GIB) as f64, 2 * GIB, u64::MAX), 4 * GIB);
        assert_eq!(whole_files((9 * GIB) as f64, 2 * GIB, 5 * GIB), 4 * GIB);
        // Announced 10 s before when the refill was idle: nothing needed of the pool.
        let mut d = Deficits::default();
        assert_eq!(d.start(100.0, 8 * GIB, rate, 10.0), 0.0);
    }

    #[test]
    fn thresholds_nest_into_files_of_the_largest_classes_first() {
        // One file of 16 GiB or more, one of 2 GiB or more, three of 1 GiB or more: a 16 GiB
        // file serves the 2 GiB threshold; two 1 GiB files make the third.
        let t = Files::from([(GIB, 3 * GIB), (2 * GIB, 2 * GIB), (16 * GIB, 16 * GIB)]);
        assert_eq!(
            nest(&t),
            Files::from([(GIB, 2 * GIB), (16 * GIB, 16 * GIB)])
        );
        assert_eq!(nest(&Files::new()), Files::new());
    }

    #[test]
    fn a_cut_keeps_whole_files_of_the_smallest_classes() {
        let mut f = Files::from([(GIB, 2 * GIB), (16 * GIB, 16 * GIB), (4 * GIB, 8 * GIB)]);
        assert!(cut_to(&mut f, 12 * GIB));
        assert_eq!(f, Files::from([(GIB, 2 * GIB), (4 * GIB, 8 * GIB)]));
        assert_eq!(as_counts(&f), vec![(4 * GIB, 2), (GIB, 2)]);
        assert!(!cut_to(&mut f, 100 * GIB));
    }
}
