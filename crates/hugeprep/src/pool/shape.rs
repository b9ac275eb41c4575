//! The pool's shape: which file sizes each (node, page size) keeps warm, and the worker's
//! reshaping decisions under `shape = "demand"` (see `docs/pool.md`, "Shape").
//!
//! The wanted shape is a multiset of file sizes that fills the kind's warm target: the
//! target's flavors first; what the target has beyond them goes first to as many files of
//! each size leased recently (a bounded history) as were held at once at its peak, one file
//! of every size in turn, so that a released file comes back before the next lease of its
//! size needs it; the rest is split among those sizes by their share of the bytes leased,
//! topped up greedily with the most leased size that still fits, and the last bytes as one
//! file of the remainder; without any history, the `sizes` mix as the fixed shape fills it.

use std::collections::{BTreeMap, VecDeque};

use super::{FileState, State};
use crate::page_size::PageSize;
use crate::policy::pool::{Shape, Target};

/// Leases remembered per (node, page size) to learn the shape from.
pub const HISTORY: usize = 64;

/// One remembered lease: its size and how many leases of that size were held at once when
/// it was taken, itself included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// Bytes.
    pub size: u64,
    /// Leases of `size` held at once, this one included.
    pub held: u64,
}

/// The recent leases of one kind, oldest first.
pub type History = VecDeque<Demand>;

impl State {
    /// Records a lease in its kind's history (bounded to [`HISTORY`]), with the leases of its
    /// size already held.
    pub(super) fn note_demand(&mut self, node: u32, ps: PageSize, size: u64) {
        let held = 1 + self
            .of_kind(node, ps)
            .filter(|e| matches!(e.rec().state, FileState::Leased(_)) && e.rec().size == size)
            .count() as u64;
        let h = self.demand.entry((node, ps)).or_default();
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(Demand { size, held });
    }
}

/// `budget` bytes filled from `sizes` in turn (each size that still fits), the rest as one
/// file of the remainder in whole pages: the fixed shape.
fn cycle(sizes: &[u64], mut budget: u64, page: u64, out: &mut Vec<u64>) {
    let mut progress = true;
    while progress && budget > 0 {
        progress = false;
        for &s in sizes {
            if s > 0 && s <= budget {
                out.push(s);
                budget -= s;
                progress = true;
            }
        }
    }
    let rest = budget / page * page;
    if rest > 0 {
        out.push(rest);
    }
}

/// Fills `budget` from the demand history: as many files of each size as were held at once
/// (`peaks`), then shares by weight (size times `counts`), then the most leased sizes that
/// still fit, then the rest as one file of whole pages.
fn by_demand(
    counts: &BTreeMap<u64, u64>,
    peaks: &BTreeMap<u64, u64>,
    mut budget: u64,
    page: u64,
    out: &mut Vec<u64>,
) {
    // As many files of each size as were held at once, one of every size in turn (the
    // most leased first), while they fit.
    let mut turn: Vec<(u64, u64)> = counts.iter().map(|(s, c)| (*s, *c)).collect();
    turn.sort_by_key(|(s, c)| std::cmp::Reverse((*c, *s)));
    let mut kept: BTreeMap<u64, u64> = BTreeMap::new();
    let mut progress = true;
    while progress {
        progress = false;
        for &(s, _) in &turn {
            let k = kept.entry(s).or_insert(0);
            if *k < peaks.get(&s).copied().unwrap_or(0) && s <= budget {
                out.push(s);
                budget -= s;
                *k += 1;
                progress = true;
            }
        }
    }
    let weight: u128 = counts.iter().map(|(s, c)| u128::from(*s * c)).sum();
    let start = budget;
    let mut by_weight: Vec<(u64, u64)> = counts.iter().map(|(s, c)| (*s, *c)).collect();
    by_weight.sort_by_key(|(s, c)| std::cmp::Reverse((s * c, *s)));
    for &(s, c) in &by_weight {
        let share = u128::from(start) * u128::from(s * c) / weight.max(1);
        let n = (share / u128::from(s)) as u64;
        for _ in 0..n {
            if s <= budget {
                out.push(s);
                budget -= s;
            }
        }
    }
    let mut by_count = by_weight;
    by_count.sort_by_key(|(s, c)| std::cmp::Reverse((*c, *s)));
    while let Some(&(s, _)) = by_count.iter().find(|(s, _)| *s <= budget) {
        out.push(s);
        budget -= s;
    }
    let rest = budget / page * page;
    if rest > 0 {
        out.push(rest);
    }
}

/// The wanted warm files of a kind, largest first: see the module documentation.
pub fn wanted(target: &Target, shape: Shape, history: &[Demand], page: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut budget = target.warm;
    for f in &target.flavors {
        for _ in 0..f.count {
            if f.size <= budget {
                out.push(f.size);
                budget -= f.size;
            }
        }
    }
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    let mut peaks: BTreeMap<u64, u64> = BTreeMap::new();
    if shape == Shape::Demand && target.flavors.is_empty() {
        for d in history.iter().filter(|d| d.size > 0 && d.size <= budget) {
            *counts.entry(d.size).or_insert(0) += 1;
            let p = peaks.entry(d.size).or_insert(0);
            *p = (*p).max(d.held);
        }
    }
    if counts.is_empty() {
        cycle(&target.sizes, budget, page, &mut out);
    } else {
        by_demand(&counts, &peaks, budget, page, &mut out);
    }
    out.sort_unstable_by(|a, b| b.cmp(a));
    out
}

/// Wanted minus warm: the sizes missing (largest first, with repeats) and the sizes in
/// excess, by size.
pub(super) fn compare(
    want: &[u64],
    have: &BTreeMap<u64, usize>,
) -> (Vec<u64>, BTreeMap<u64, usize>) {
    let mut want_n: BTreeMap<u64, usize> = BTreeMap::new();
    for &s in want {
        *want_n.entry(s).or_insert(0) += 1;
    }
    let mut missing = Vec::new();
    for (&s, &n) in want_n.iter().rev() {
        let h = have.get(&s).copied().unwrap_or(0);
        missing.extend(std::iter::repeat(s).take(n.saturating_sub(h)));
    }
    let excess = have
        .iter()
        .filter_map(|(&s, &h)| {
            let w = want_n.get(&s).copied().unwrap_or(0);
            (h > w).then(|| (s, h - w))
        })
        .collect();
    (missing, excess)
}

/// What the demand-shaped worker does next (before refilling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reshape {
    /// Scrub the dirty file and keep it, cut to this size first.
    Keep(u64, u64),
    /// Delete the file.
    Delete(u64),
    /// Cut the warm file to this size (frees the tail; faults nothing).
    Shrink(u64, u64),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pool::Flavor;

    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;

    fn target(warm: u64, sizes: Vec<u64>, flavors: Vec<Flavor>) -> Target {
        Target {
            page_size: PageSize::Size2M,
            node: None,
            warm,
            sizes,
            flavors,
            adaptive: None,
        }
    }

    /// A history of leases of `sizes`, each held alone.
    fn alone(sizes: &[u64]) -> Vec<Demand> {
        sizes.iter().map(|&size| Demand { size, held: 1 }).collect()
    }

    #[test]
    fn without_history_the_sizes_mix_fills_the_target() {
        let t = target(4 * G, vec![G, 2 * G], vec![]);
        assert_eq!(wanted(&t, Shape::Demand, &[], 2 * M), vec![2 * G, G, G]);
        let t = target(5 * G, vec![2 * G], vec![]);
        assert_eq!(wanted(&t, Shape::Demand, &[], 2 * M), vec![2 * G, 2 * G, G]);
    }

    #[test]
    fn flavors_come_first_and_history_is_ignored_with_them() {
        let f = vec![
            Flavor {
                size: 4 * G,
                count: 2,
            },
            Flavor { size: G, count: 1 },
        ];
        let t = target(9 * G, vec![G], f);
        assert_eq!(
            wanted(&t, Shape::Demand, &alone(&[512 * M; 10]), 2 * M),
            vec![4 * G, 4 * G, G]
        );
    }

    #[test]
    fn history_shares_the_target_by_bytes_leased() {
        let t = target(4 * G, vec![4 * G], vec![]);
        // Only 4 GiB leases: one 4 GiB file, as --warm 4G should keep.
        assert_eq!(
            wanted(&t, Shape::Demand, &alone(&[4 * G; 3]), 2 * M),
            vec![4 * G]
        );
        // 1 GiB and 2 GiB leases alike: one of each, then a third of the bytes left to 1 GiB,
        // two thirds to 2 GiB (none), then the most leased size that fits.
        let h = alone(&[G, 2 * G, G, 2 * G]);
        assert_eq!(wanted(&t, Shape::Demand, &h, 2 * M), vec![2 * G, G, G]);
        // Sizes above the target cannot be kept and do not count.
        assert_eq!(
            wanted(&t, Shape::Demand, &alone(&[8 * G, 3 * G]), 2 * M),
            vec![3 * G, G]
        );
        // The fixed shape never learns.
        assert_eq!(wanted(&t, Shape::Fixed, &h, 2 * M), vec![4 * G]);
    }

    #[test]
    fn sizes_held_at_once_get_as_many_files_as_fit() {
        let t = target(512 * M, vec![512 * M], vec![]);
        let d = |size, held| Demand { size, held };
        // 32M leased most, but 128M was held four at once: four 128M files before any share
        // by bytes leased, one of every size in turn.
        let h = [
            d(32 * M, 1),
            d(32 * M, 2),
            d(32 * M, 1),
            d(64 * M, 1),
            d(64 * M, 2),
            d(128 * M, 1),
            d(128 * M, 4),
        ];
        let w = wanted(&t, Shape::Demand, &h, 2 * M);
        assert_eq!(w.iter().filter(|&&s| s == 128 * M).count(), 2, "{w:?}");
        assert_eq!(w.iter().sum::<u64>(), 512 * M);
        // With room, every peak is met.
        let t = target(G, vec![G], vec![]);
        let w = wanted(&t, Shape::Demand, &h, 2 * M);
        assert!(w.iter().filter(|&&s| s == 128 * M).count() >= 4, "{w:?}");
        assert!(w.iter().filter(|&&s| s == 32 * M).count() >= 2, "{w:?}");
        assert_eq!(w.iter().sum::<u64>(), G);
    }

    #[test]
    fn compare_finds_missing_and_excess() {
        let have = BTreeMap::from([(G, 3), (4 * G, 1)]);
        let (missing, excess) = compare(&[4 * G, 2 * G, G], &have);
        assert_eq!(missing, vec![2 * G]);
        assert_eq!(excess, BTreeMap::from([(G, 2)]));
    }
}
