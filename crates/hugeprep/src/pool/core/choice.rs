//! A lease's choice of memory as a pure function: what the lease sees of its kind (read
//! under the lock, the kernel's free pages and the clock among it) in, what it does next
//! out. See `docs/pool.md`, "Choosing memory for a lease".

use crate::pool::record::LeaseSource;

/// What a lease sees of its kind (node and page size) when it chooses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LeaseView {
    /// Bytes asked for.
    pub(crate) size: u64,
    /// The kernel's free bytes of the kind, less what faults in progress were promised and
    /// its counters do not show yet.
    pub(crate) avail: u64,
    /// Bytes promised to faults in progress (they come back should the faults fail).
    pub(crate) faulting: u64,
    /// Idle warm files: (id, size).
    pub(crate) warm: Vec<(u64, u64)>,
    /// Idle released files waiting for the worker: (id, size).
    pub(crate) dirty: Vec<(u64, u64)>,
    /// Bytes being scrubbed or refilled, and of idle released files: warm soon, or room
    /// once given back.
    pub(crate) pending: u64,
    /// Whether the lease may still wait (its deadline has not passed).
    pub(crate) may_wait: bool,
}

/// What a lease does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// Fail: the kind can supply at most `available` bytes.
    Refuse {
        /// Bytes the kind could supply.
        available: u64,
    },
    /// Wait for memory being cleaned or faulted (`for_faults`: only a fault in progress can
    /// make the room).
    Wait {
        /// Whether it waits on faults in progress.
        for_faults: bool,
    },
    /// Give back this idle file first, then choose again.
    MakeRoom(u64),
    /// Take this warm file, (id, size) (`None`: a new one), faulting `need` bytes.
    Take {
        /// The warm file.
        file: Option<(u64, u64)>,
        /// Where the memory comes from.
        source: LeaseSource,
        /// Bytes to fault.
        need: u64,
    },
}

/// A lease's next step: a warm file of exactly the size, else the smallest larger one
/// (shrunk), else the largest smaller one (grown), else a new one; room made by giving back
/// other warm files, then released ones, but only when that is enough; a lease that only
/// memory being cleaned or faulted could serve waits while it may; nothing changes for a
/// lease that fails.
pub(crate) fn choose(v: &LeaseView) -> Choice {
    let warm_bytes: u64 = v.warm.iter().map(|w| w.1).sum();
    let supply = v.avail + warm_bytes + v.pending;
    // A lease larger than all the kind could ever supply (faults in progress included,
    // should they fail) is refused before any file is touched; one that only the end of a
    // fault could make room for waits for it without deleting anything meanwhile.
    if v.size > supply.saturating_add(v.faulting)
        || (v.size > supply && !(v.faulting > 0 && v.may_wait))
    {
        return Choice::Refuse { available: supply };
    }
    if v.size > supply {
        return Choice::Wait { for_faults: true };
    }
    let exact = v.warm.iter().find(|w| w.1 == v.size);
    let larger = v.warm.iter().filter(|w| w.1 > v.size).min_by_key(|w| w.1);
    let smaller = v.warm.iter().filter(|w| w.1 < v.size).max_by_key(|w| w.1);
    let (file, source, need) = match (exact, larger, smaller) {
        (Some(w), _, _) => (Some(*w), LeaseSource::WarmExact, 0),
        (None, Some(w), _) => (Some(*w), LeaseSource::WarmShrunk, 0),
        (None, None, Some(w)) => (Some(*w), LeaseSource::WarmGrown, v.size - w.1),
        (None, None, None) => (None, LeaseSource::Cold, v.size),
    };
    if need <= v.avail {
        return Choice::Take { file, source, need };
    }
    // Make room: another warm file, else a released file still waiting for the worker (its
    // pages go back to the kernel, which zeroes them again in this lease's fault), else wait
    // for the memory being cleaned now. A lease never queues behind the worker's backlog.
    let others = || v.warm.iter().filter(|w| Some(w.0) != file.map(|c| c.0));
    let deletable = others().map(|w| w.1).sum::<u64>() + v.dirty.iter().map(|d| d.1).sum::<u64>();
    let victim = others()
        .min_by_key(|w| w.1)
        .map(|w| w.0)
        .or_else(|| dirty_victim(&v.dirty, need - v.avail))
        .filter(|_| v.avail + deletable >= need);
    let settling = v.pending > 0 || v.faulting > 0;
    match victim {
        Some(id) => Choice::MakeRoom(id),
        None if settling && v.may_wait => Choice::Wait { for_faults: false },
        None => Choice::Refuse {
            available: v.avail + warm_bytes,
        },
    }
}

/// The released file to give back for `short` bytes: the smallest that covers them, else
/// the largest.
fn dirty_victim(dirty: &[(u64, u64)], short: u64) -> Option<u64> {
    dirty
        .iter()
        .filter(|d| d.1 >= short)
        .min_by_key(|d| d.1)
        .or_else(|| dirty.iter().max_by_key(|d| d.1))
        .map(|d| d.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn view(size: u64, avail: u64, warm: &[(u64, u64)]) -> LeaseView {
        LeaseView {
            size,
            avail,
            warm: warm.to_vec(),
            may_wait: true,
            ..LeaseView::default()
        }
    }

    fn take(file: Option<(u64, u64)>, source: LeaseSource, need: u64) -> Choice {
        Choice::Take { file, source, need }
    }

    #[test]
    fn an_exact_warm_file_comes_first() {
        let v = view(8 * M, 0, &[(1, 16 * M), (2, 8 * M), (3, 4 * M)]);
        assert_eq!(
            choose(&v),
            take(Some((2, 8 * M)), LeaseSource::WarmExact, 0)
        );
    }

    #[test]
    fn then_the_smallest_larger_file_shrunk() {
        let v = view(8 * M, 0, &[(1, 32 * M), (2, 16 * M), (3, 4 * M)]);
        assert_eq!(
            choose(&v),
            take(Some((2, 16 * M)), LeaseSource::WarmShrunk, 0)
        );
    }

    #[test]
    fn then_the_largest_smaller_file_grown_by_the_difference() {
        let v = view(8 * M, 8 * M, &[(1, 2 * M), (3, 4 * M)]);
        assert_eq!(
            choose(&v),
            take(Some((3, 4 * M)), LeaseSource::WarmGrown, 4 * M)
        );
    }

    #[test]
    fn then_a_cold_file() {
        assert_eq!(
            choose(&view(8 * M, 8 * M, &[])),
            take(None, LeaseSource::Cold, 8 * M)
        );
    }

    #[test]
    fn room_is_made_by_giving_back_the_smallest_other_warm_file() {
        // Grown 4M -> 8M needs 4M; 2M free; the 2M file (not the one grown) goes.
        let v = view(8 * M, 2 * M, &[(1, 2 * M), (3, 4 * M), (4, 2 * M)]);
        assert_eq!(choose(&v), Choice::MakeRoom(1));
    }

    #[test]
    fn then_a_released_file_that_covers_the_shortfall() {
        let mut v = view(8 * M, 2 * M, &[]);
        v.dirty = vec![(5, 2 * M), (6, 8 * M), (7, 16 * M)];
        v.pending = 26 * M;
        // Short by 6M: the smallest released file that covers it.
        assert_eq!(choose(&v), Choice::MakeRoom(6));
        v.dirty = vec![(5, 2 * M), (7, 4 * M)];
        v.pending = 6 * M;
        assert_eq!(choose(&v), Choice::MakeRoom(7), "else the largest");
    }

    #[test]
    fn nothing_is_given_back_unless_that_is_enough() {
        let mut v = view(8 * M, 2 * M, &[(1, 2 * M)]);
        v.pending = 4 * M;
        // 2M free + 2M warm could not serve 8M now: wait for the 4M being cleaned.
        assert_eq!(choose(&v), Choice::Wait { for_faults: false });
        v.may_wait = false;
        assert_eq!(choose(&v), Choice::Refuse { available: 4 * M });
    }

    #[test]
    fn a_lease_larger_than_the_kind_could_ever_supply_is_refused_at_once() {
        let mut v = view(64 * M, 8 * M, &[(1, 8 * M)]);
        v.pending = 8 * M;
        v.faulting = 8 * M;
        assert_eq!(choose(&v), Choice::Refuse { available: 24 * M });
    }

    #[test]
    fn a_lease_only_a_fault_in_progress_can_serve_waits_for_it() {
        let mut v = view(16 * M, 8 * M, &[]);
        v.faulting = 8 * M;
        assert_eq!(choose(&v), Choice::Wait { for_faults: true });
        v.may_wait = false;
        assert_eq!(choose(&v), Choice::Refuse { available: 8 * M });
    }

    #[test]
    fn every_take_fits_what_the_kernel_has_free() {
        // Property, over a small grid: a lease that takes faults no more than is free, and a
        // victim is always an idle file of the kind.
        for size in [2 * M, 4 * M, 8 * M] {
            for avail in [0, 2 * M, 6 * M] {
                let mut v = view(size, avail, &[(1, 2 * M), (2, 4 * M)]);
                v.dirty = vec![(3, 4 * M)];
                v.pending = 4 * M;
                match choose(&v) {
                    Choice::Take { need, .. } => assert!(need <= avail),
                    Choice::MakeRoom(id) => assert!([1, 2, 3].contains(&id)),
                    other => panic!("{size} {avail}: {other:?}"),
                }
            }
        }
    }
}
