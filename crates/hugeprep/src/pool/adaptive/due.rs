//! Which of Placement's unleased allocations are VMs about to start: only what appeared
//! lately. Nova keeps a stopped (`SHUTOFF`) instance's allocation with no lease behind it,
//! so the unleased figure alone would count every stopped VM as due, for as long as it
//! stays stopped, and a tenant could raise the warm target just by stopping VMs. A VM that
//! is due leases within seconds of its allocation; an allocation older than [`DUE_FOR`] is
//! not counted as coming. So the known demand is the unleased bytes, at most what the
//! allocations rose by over the last [`DUE_FOR`] (their readings, every few seconds).
//!
//! Pure: the caller gives the time of each reading.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::page_size::PageSize;

/// How long a new allocation counts as a VM about to start.
pub const DUE_FOR: Duration = Duration::from_secs(120);

/// The most readings kept per page size (one every 5 s: 24 in the window; more only when
/// readings come faster, and the oldest then go first).
const MAX_READINGS: usize = 256;

/// Placement's allocations per page size over the last [`DUE_FOR`], and the last reading.
#[derive(Debug, Default)]
pub struct Due {
    seen: BTreeMap<PageSize, VecDeque<(Instant, u64)>>,
    last: Option<(Instant, BTreeMap<PageSize, u64>)>,
}

impl Due {
    /// The last reading: when it was made and the allocations of each page size, bytes.
    pub fn last(&self) -> Option<&(Instant, BTreeMap<PageSize, u64>)> {
        self.last.as_ref()
    }

    /// Records a reading of the allocations (bytes per page size) at `now`; whether any
    /// page size's rose since the last reading.
    pub fn record(&mut self, now: Instant, allocated: BTreeMap<PageSize, u64>) -> bool {
        let rose = allocated.iter().any(|(ps, &b)| {
            let before = self.last.as_ref().and_then(|(_, m)| m.get(ps).copied());
            b > before.unwrap_or(0)
        });
        for (&ps, &bytes) in &allocated {
            let seen = self.seen.entry(ps).or_default();
            while seen
                .front()
                .is_some_and(|&(t, _)| now.saturating_duration_since(t) > DUE_FOR)
            {
                seen.pop_front();
            }
            if seen.len() == MAX_READINGS {
                seen.pop_front();
            }
            seen.push_back((now, bytes));
        }
        self.last = Some((now, allocated));
        rose
    }

    /// What the allocations of `ps` rose by within [`DUE_FOR`] before `now`: the last
    /// reading above the least of the window (0 with one reading: what was allocated before
    /// the daemon read it is not known to be new).
    pub fn rise(&self, ps: PageSize, now: Instant) -> u64 {
        let Some(seen) = self.seen.get(&ps) else {
            return 0;
        };
        let window = seen
            .iter()
            .filter(|&&(t, _)| now.saturating_duration_since(t) <= DUE_FOR);
        let least = window.map(|&(_, b)| b).min();
        match (seen.back(), least) {
            (Some(&(_, last)), Some(least)) => last.saturating_sub(least),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn an_allocation_is_due_until_it_is_older_than_the_window() {
        let ps = PageSize::Size2M;
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let read = |due: &mut Due, s: u64, bytes: u64| {
            due.record(at(s), BTreeMap::from([(ps, bytes)]));
            due.rise(ps, at(s))
        };
        let mut due = Due::default();
        // Stopped VMs' 8 GiB were allocated before the daemon read them: never due.
        assert_eq!(read(&mut due, 0, 8 * G), 0);
        assert_eq!(read(&mut due, 60, 8 * G), 0);
        // Nova allocates 4 GiB: due at once, and still a minute on.
        assert_eq!(read(&mut due, 65, 12 * G), 4 * G);
        assert_eq!(read(&mut due, 120, 12 * G), 4 * G);
        // Two minutes on, it is not coming any more (stopped, or never started).
        assert_eq!(read(&mut due, 190, 12 * G), 0);
        // Another allocation is due again; a deleted VM's allocation going away is not.
        assert_eq!(read(&mut due, 200, 14 * G), 2 * G);
        assert_eq!(read(&mut due, 205, 6 * G), 0);
        assert_eq!(due.rise(PageSize::Size1G, at(205)), 0);
    }
}
