//! Tests of the worker's decisions (`core::decide`): time driven by hand, the kernel's
//! figures and the policy handed in. No clock, no sysfs, no hugetlbfs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::{rec, M2, PS};
use crate::policy::pool::{PoolPolicy, Shape};
use crate::pool::core::aside::AsideQueue;
use crate::pool::core::decide::{
    next_fixed_size, Decision, Figures, Inputs, Job, Kind, Note, Schedule, IDLE_POLL,
    REFILL_BACKOFF, RESERVE_BACKOFF, STARTING_POLL,
};
use crate::pool::core::reshape::View;
use crate::pool::core::Core;
use crate::pool::record::FileState;
use crate::pool::shape::History;

const M: u64 = 1 << 20;
const KIND: Kind = (0, PS);
const GRACE: Duration = Duration::from_secs(2);

/// The kernel's figures, fixed.
#[derive(Debug, Clone, Copy)]
struct Kernel {
    free: u64,
    mount_free_pages: Option<u64>,
    pool_free_pages: u64,
}

impl Figures for Kernel {
    fn free_bytes(&mut self, _: Kind) -> u64 {
        self.free
    }
    fn mount_free_pages(&mut self, _: crate::page_size::PageSize) -> Option<u64> {
        self.mount_free_pages
    }
    fn pool_free_pages(&mut self, _: Kind) -> u64 {
        self.pool_free_pages
    }
}

/// Plenty of free pages.
fn plenty() -> Kernel {
    Kernel {
        free: 1 << 40,
        mount_free_pages: None,
        pool_free_pages: 1 << 20,
    }
}

/// A fixed-shape policy keeping `warm` bytes of 2M pages warm in files of `sizes`.
fn fixed(warm: u64, sizes: &[u64]) -> PoolPolicy {
    let mut p = PoolPolicy::embedded();
    p.set_warm(PS, warm, sizes.to_vec());
    p.shape = Shape::Fixed;
    p.reserve.enabled = true;
    p
}

/// The pool's state a decision reads, owned.
#[derive(Default)]
struct World {
    core: Core,
    aside: AsideQueue,
    drained: BTreeSet<Kind>,
    demand: BTreeMap<Kind, History>,
}

impl World {
    fn with(files: &[(u64, u64, FileState)]) -> World {
        let recs = files.iter().map(|(id, s, st)| rec(*id, *s, st.clone()));
        World {
            core: Core::with_files(recs.collect(), 100),
            ..World::default()
        }
    }

    fn view(&self) -> View<'_> {
        View {
            core: &self.core,
            aside: &self.aside,
            drained: &self.drained,
            demand: &self.demand,
        }
    }
}

/// One decision at `now`.
fn decide(
    s: &mut Schedule,
    w: &World,
    policy: &PoolPolicy,
    now: Instant,
    (urgent, starting): (bool, bool),
    mut k: Kernel,
) -> Decision {
    let inputs = Inputs {
        now,
        policy,
        kinds: &[KIND],
        urgent,
        starting,
    };
    s.decide(&w.view(), &inputs, &mut k)
}

const QUIET: (bool, bool) = (false, false);

#[test]
fn below_target_a_refill_of_the_next_size_in_the_mix() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let policy = fixed(16 * M, &[4 * M, 8 * M]);
    let w = World::with(&[(1, 4 * M, FileState::Warm)]);
    let d = decide(&mut s, &w, &policy, t0, QUIET, plenty());
    assert_eq!(
        d.job,
        Some(Job::Fill {
            kind: KIND,
            size: 4 * M
        })
    );
    // The fixed shape turns: the next refill is of the next size.
    let d = decide(&mut s, &w, &policy, t0, QUIET, plenty());
    assert_eq!(
        d.job,
        Some(Job::Fill {
            kind: KIND,
            size: 8 * M
        })
    );
}

#[test]
fn at_target_nothing_to_do_and_the_target_is_met() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let policy = fixed(4 * M, &[4 * M]);
    let w = World::with(&[(1, 4 * M, FileState::Warm)]);
    let d = decide(&mut s, &w, &policy, t0, QUIET, plenty());
    assert_eq!(d.job, None);
    assert_eq!(d.notes, vec![(KIND, Note::Met)]);
    assert_eq!(d.wake, t0 + IDLE_POLL);
}

#[test]
fn above_target_the_largest_idle_warm_file_is_given_back() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let policy = fixed(4 * M, &[4 * M]);
    let w = World::with(&[
        (1, 4 * M, FileState::Warm),
        (2, 8 * M, FileState::Warm),
        (3, 2 * M, FileState::Warm),
    ]);
    let d = decide(&mut s, &w, &policy, t0, QUIET, plenty());
    assert_eq!(d.job, Some(Job::Delete(2)));
}

#[test]
fn a_released_file_is_scrubbed_below_target_and_given_back_above() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let w = World::with(&[(1, 4 * M, FileState::Warm), (2, 4 * M, FileState::Dirty)]);
    let d = decide(&mut s, &w, &fixed(8 * M, &[4 * M]), t0, QUIET, plenty());
    assert_eq!(d.job, Some(Job::Scrub { id: 2, size: 4 * M }));
    let d = decide(&mut s, &w, &fixed(4 * M, &[4 * M]), t0, QUIET, plenty());
    assert_eq!(d.job, Some(Job::Delete(2)));
}

#[test]
fn the_lessee_grace_holds_refills_until_it_expires() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    // At 8M of a 16M target the pool lacks a wanted file: under the grace, only work that
    // faults nothing runs (none here), and no refill.
    let policy = fixed(16 * M, &[8 * M]);
    let w = World::with(&[(1, 8 * M, FileState::Warm)]);
    s.grace_from(t0, GRACE);
    let d = decide(&mut s, &w, &policy, t0 + GRACE / 2, QUIET, plenty());
    assert_eq!(d.job, None, "graced: no refill");
    assert!(d.pressing);
    assert_eq!(d.wake, t0 + GRACE / 2 + IDLE_POLL, "the poll comes first");
    let d = decide(&mut s, &w, &policy, t0 + GRACE, QUIET, plenty());
    assert_eq!(
        d.job,
        Some(Job::Fill {
            kind: KIND,
            size: 8 * M
        }),
        "expired"
    );
}

#[test]
fn a_zero_grace_holds_nothing() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let policy = fixed(8 * M, &[8 * M]);
    s.grace_from(t0, Duration::ZERO);
    let d = decide(&mut s, &World::default(), &policy, t0, QUIET, plenty());
    assert_eq!(
        d.job,
        Some(Job::Fill {
            kind: KIND,
            size: 8 * M
        })
    );
}

#[test]
fn an_urgent_lease_overrides_the_grace_and_a_start_under_way() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let policy = fixed(8 * M, &[8 * M]);
    let w = World::default();
    s.grace_from(t0, GRACE);
    assert_eq!(decide(&mut s, &w, &policy, t0, QUIET, plenty()).job, None);
    assert_eq!(
        decide(&mut s, &w, &policy, t0, (false, true), plenty()).job,
        None
    );
    let d = decide(&mut s, &w, &policy, t0, (true, true), plenty());
    assert_eq!(
        d.job,
        Some(Job::Fill {
            kind: KIND,
            size: 8 * M
        })
    );
}

#[test]
fn a_missed_lease_lets_refills_run_under_the_grace() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let policy = fixed(8 * M, &[8 * M]);
    let w = World::default();
    s.grace_from(t0, GRACE);
    assert_eq!(decide(&mut s, &w, &policy, t0, QUIET, plenty()).job, None);
    s.missed();
    let d = decide(&mut s, &w, &policy, t0, QUIET, plenty());
    assert_eq!(
        d.job,
        Some(Job::Fill {
            kind: KIND,
            size: 8 * M
        })
    );
}

#[test]
fn a_start_under_way_holds_released_files_unless_the_pool_lacks_a_wanted_one() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let w = World::with(&[(1, 4 * M, FileState::Warm), (2, 4 * M, FileState::Dirty)]);
    // Complete (4M of a 4M target): the released file waits for the start.
    let d = decide(
        &mut s,
        &w,
        &fixed(4 * M, &[4 * M]),
        t0,
        (false, true),
        plenty(),
    );
    assert_eq!(d.job, None);
    assert_eq!(d.wake, t0 + STARTING_POLL);
    // Lacking one: it is scrubbed (that faults nothing).
    let d = decide(
        &mut s,
        &w,
        &fixed(8 * M, &[4 * M]),
        t0,
        (false, true),
        plenty(),
    );
    assert_eq!(d.job, Some(Job::Scrub { id: 2, size: 4 * M }));
}

#[test]
fn a_kernel_short_of_pages_asks_for_a_raise_then_backs_off() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let policy = fixed(8 * M, &[8 * M]);
    let w = World::default();
    let short = Kernel {
        free: 2 * M,
        mount_free_pages: None,
        pool_free_pages: 1,
    };
    let d = decide(&mut s, &w, &policy, t0, QUIET, short);
    assert_eq!(
        d.job,
        Some(Job::Reserve {
            kind: KIND,
            pages: 3
        })
    );
    // The raise fell short: no raise again until its backoff runs out; refills back off.
    s.reserve_short(KIND, t0);
    let d = decide(&mut s, &w, &policy, t0, QUIET, short);
    assert_eq!(d.job, None);
    assert_eq!(d.wake, t0 + IDLE_POLL);
    let later = t0 + REFILL_BACKOFF;
    assert_eq!(decide(&mut s, &w, &policy, later, QUIET, short).job, None);
    let after = t0 + RESERVE_BACKOFF;
    let d = decide(&mut s, &w, &policy, after, QUIET, short);
    assert_eq!(
        d.job,
        Some(Job::Reserve {
            kind: KIND,
            pages: 3
        })
    );
}

#[test]
fn the_refill_backoff_expires_or_ends_when_pages_come_back() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let policy = fixed(8 * M, &[8 * M]);
    let w = World::default();
    s.refill_failed(t0);
    let d = decide(&mut s, &w, &policy, t0, QUIET, plenty());
    assert_eq!(d.job, None);
    let almost = t0 + REFILL_BACKOFF - Duration::from_millis(1);
    assert_eq!(
        decide(&mut s, &w, &policy, almost, QUIET, plenty()).job,
        None
    );
    let fill = Some(Job::Fill {
        kind: KIND,
        size: 8 * M,
    });
    let d = decide(&mut s, &w, &policy, t0 + REFILL_BACKOFF, QUIET, plenty());
    assert_eq!(d.job, fill);
    s.refill_failed(t0);
    s.pages_returned();
    assert_eq!(decide(&mut s, &w, &policy, t0, QUIET, plenty()).job, fill);
}

#[test]
fn a_full_mount_or_a_policy_without_raises_says_why() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let mut policy = fixed(8 * M, &[8 * M]);
    let w = World::default();
    let full = Kernel {
        free: 0,
        mount_free_pages: Some(1),
        pool_free_pages: 0,
    };
    let d = decide(&mut s, &w, &policy, t0, QUIET, full);
    assert_eq!(d.job, None);
    assert_eq!(d.notes, vec![(KIND, Note::MountFull { free: M2 })]);
    policy.reserve.enabled = false;
    let no_raise = Kernel {
        mount_free_pages: None,
        ..full
    };
    let d = decide(&mut s, &w, &policy, t0 + REFILL_BACKOFF, QUIET, no_raise);
    assert_eq!(d.notes, vec![(KIND, Note::ReserveDisabled { short: 4 })]);
}

#[test]
fn a_drained_kind_keeps_nothing() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let mut w = World::with(&[(1, 4 * M, FileState::Warm)]);
    w.drained.insert(KIND);
    let d = decide(&mut s, &w, &fixed(8 * M, &[4 * M]), t0, QUIET, plenty());
    assert_eq!(d.job, Some(Job::Delete(1)));
}

#[test]
fn a_file_aside_waits_for_its_due_time_and_sets_the_wake() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let mut w = World::with(&[(1, 4 * M, FileState::Warm), (2, 4 * M, FileState::Dirty)]);
    let crate::pool::core::aside::Verdict::Wait(due) = w.aside.held(2, None, 4 * M, None, t0)
    else {
        panic!("a first hold waits");
    };
    let policy = fixed(4 * M, &[4 * M]);
    let d = decide(&mut s, &w, &policy, t0, QUIET, plenty());
    assert_eq!(d.job, None, "not due yet");
    assert_eq!(d.wake, due, "the wake is the earliest due");
    let d = decide(&mut s, &w, &policy, due, QUIET, plenty());
    assert_eq!(d.job, Some(Job::Delete(2)), "due: above target, given back");
}

#[test]
fn the_wake_time_is_the_earliest_timer_running() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    assert_eq!(s.poll_timeout(t0, false, None), t0 + IDLE_POLL);
    assert_eq!(s.poll_timeout(t0, true, None), t0 + STARTING_POLL);
    s.grace_from(t0, Duration::from_millis(300));
    assert_eq!(
        s.poll_timeout(t0, false, None),
        t0 + Duration::from_millis(300)
    );
    s.refill_failed(t0 - REFILL_BACKOFF + Duration::from_millis(100));
    assert_eq!(
        s.poll_timeout(t0, false, None),
        t0 + Duration::from_millis(100)
    );
    let aside = t0 + Duration::from_millis(10);
    assert_eq!(s.poll_timeout(t0, false, Some(aside)), aside);
    // Timers that ran out wake nobody.
    s.handle_timeout(t0 + Duration::from_secs(1));
    assert_eq!(s.poll_timeout(t0, false, None), t0 + IDLE_POLL);
}

#[test]
fn the_fixed_shape_cycles_through_its_sizes() {
    let sizes = [4 * M, 8 * M];
    assert_eq!(next_fixed_size(&sizes, 0, 64 * M, 2 * M), 4 * M);
    assert_eq!(next_fixed_size(&sizes, 1, 64 * M, 2 * M), 8 * M);
    assert_eq!(next_fixed_size(&sizes, 2, 64 * M, 2 * M), 4 * M);
}

#[test]
fn a_deficit_below_every_size_is_filled_exactly_in_whole_pages() {
    let sizes = [4 * M, 8 * M];
    // 8M does not fit a 6M deficit: the next size that does.
    assert_eq!(next_fixed_size(&sizes, 1, 6 * M, 2 * M), 4 * M);
    assert_eq!(next_fixed_size(&sizes, 0, 3 * M, 2 * M), 2 * M);
    assert_eq!(next_fixed_size(&[], 0, 5 * M, 2 * M), 4 * M);
    assert_eq!(next_fixed_size(&sizes, 0, M, 2 * M), 0);
}

#[test]
fn under_the_demand_shape_a_warm_file_of_a_size_in_excess_is_cut_to_a_missing_one() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let mut policy = fixed(8 * M, &[4 * M]);
    policy.shape = Shape::Demand;
    // Wanted: 4M + 4M; warm: one 8M file: cut it to the missing 4M.
    let w = World::with(&[(1, 8 * M, FileState::Warm)]);
    let d = decide(&mut s, &w, &policy, t0, QUIET, plenty());
    assert_eq!(d.job, Some(Job::Cut { id: 1, size: 4 * M }));
}

#[test]
fn under_the_grace_a_released_file_is_still_scrubbed_while_a_wanted_one_lacks() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let w = World::with(&[(2, 4 * M, FileState::Dirty)]);
    s.grace_from(t0, GRACE);
    // The pool lacks a wanted file: the scrub (it faults nothing) runs under the grace.
    let d = decide(&mut s, &w, &fixed(4 * M, &[4 * M]), t0, QUIET, plenty());
    assert_eq!(d.job, Some(Job::Scrub { id: 2, size: 4 * M }));
    // Complete (the target is zero): the grace holds everything.
    let d = decide(&mut s, &w, &fixed(0, &[4 * M]), t0, QUIET, plenty());
    assert_eq!(d.job, None);
    assert_eq!(d.wake, t0 + IDLE_POLL);
}

#[test]
fn under_the_demand_shape_a_released_file_is_kept_cut_to_a_missing_size() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let mut policy = fixed(4 * M, &[4 * M]);
    policy.shape = Shape::Demand;
    // Wanted: one 4M file; released: an 8M one: scrubbed at 4M (its tail given back).
    let w = World::with(&[(2, 8 * M, FileState::Dirty)]);
    let d = decide(&mut s, &w, &policy, t0, QUIET, plenty());
    assert_eq!(d.job, Some(Job::Scrub { id: 2, size: 4 * M }));
}

#[test]
fn a_file_aside_past_its_bound_goes_before_fresh_releases() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let mut w = World::with(&[(1, 4 * M, FileState::Dirty), (2, 4 * M, FileState::Dirty)]);
    w.aside.held(1, Some("uid:65534"), 4 * M, None, t0);
    let policy = fixed(16 * M, &[4 * M]);
    let d = decide(&mut s, &w, &policy, t0, QUIET, plenty());
    assert_eq!(
        d.job,
        Some(Job::Scrub { id: 2, size: 4 * M }),
        "fresh first"
    );
    // A stream of fresh releases (file 2 stands for it) no longer holds file 1 past its
    // bound: its proof, which sends it down the kernel's path, goes first.
    let late = t0 + crate::pool::core::aside::BOUND;
    let d = decide(&mut s, &w, &policy, late, QUIET, plenty());
    assert_eq!(d.job, Some(Job::Scrub { id: 1, size: 4 * M }));
}

#[test]
fn a_stream_of_releases_leaves_a_turn_to_the_refill() {
    let (t0, mut s) = (Instant::now(), Schedule::default());
    let w = World::with(&[(1, 4 * M, FileState::Dirty)]);
    let policy = fixed(64 * M, &[4 * M]);
    let scrub = Some(Job::Scrub { id: 1, size: 4 * M });
    for _ in 0..crate::pool::core::decide::SHARE_EVERY {
        assert_eq!(decide(&mut s, &w, &policy, t0, QUIET, plenty()).job, scrub);
    }
    let d = decide(&mut s, &w, &policy, t0, QUIET, plenty());
    assert!(matches!(d.job, Some(Job::Fill { .. })), "{:?}", d.job);
    assert_eq!(decide(&mut s, &w, &policy, t0, QUIET, plenty()).job, scrub);
}
