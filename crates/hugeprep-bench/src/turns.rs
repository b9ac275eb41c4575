//! The order of an interleaved comparison: every case once untimed (the first touch of
//! memory, a cold VMM binary and a cold page cache cost many times a warm run), then each
//! repetition runs every case once, the first case rotating, so that no case always runs
//! right after the same neighbour's cleanup, and the machine's noise falls on all cases alike.

/// One run of one case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The repetition: 0 for the warm-up and for the first measured repetition.
    pub rep: usize,
    /// The index of the case that runs.
    pub case: usize,
    /// Whether the run is measured (`false`: the warm-up).
    pub timed: bool,
}

impl Turn {
    /// `warm-up`, or `rep 2/5` (counted from 1) out of `reps`, for progress lines.
    pub fn when(&self, reps: usize) -> String {
        if self.timed {
            format!("rep {}/{reps}", self.rep + 1)
        } else {
            "warm-up".into()
        }
    }
}

/// The runs of `cases` cases over `reps` measured repetitions, in order: the warm-up of each
/// case in turn, then for repetition `r` the cases `r, r + 1, ...` (mod `cases`).
pub fn turns(reps: usize, cases: usize) -> impl Iterator<Item = Turn> {
    std::iter::once((0, false))
        .chain((0..reps).map(|rep| (rep, true)))
        .flat_map(move |(rep, timed)| {
            (0..cases).map(move |i| Turn {
                rep,
                case: if timed { (rep + i) % cases } else { i },
                timed,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_up_in_order_then_the_first_case_rotates() {
        let order: Vec<(usize, usize, bool)> =
            turns(3, 3).map(|t| (t.rep, t.case, t.timed)).collect();
        assert_eq!(
            order,
            [
                (0, 0, false),
                (0, 1, false),
                (0, 2, false),
                (0, 0, true),
                (0, 1, true),
                (0, 2, true),
                (1, 1, true),
                (1, 2, true),
                (1, 0, true),
                (2, 2, true),
                (2, 0, true),
                (2, 1, true),
            ]
        );
    }

    #[test]
    fn every_case_is_measured_reps_times() {
        let mut measured = [0; 4];
        for t in turns(5, 4).filter(|t| t.timed) {
            measured[t.case] += 1;
        }
        assert_eq!(measured, [5; 4]);
        assert_eq!(turns(2, 0).count(), 0);
    }

    #[test]
    fn progress_names_the_repetition_from_one() {
        let mut all = turns(2, 1);
        assert_eq!(all.next().unwrap().when(2), "warm-up");
        assert_eq!(all.next().unwrap().when(2), "rep 1/2");
        assert_eq!(all.next().unwrap().when(2), "rep 2/2");
    }
}
