//! Tests of the core's invariant check: every phase is one pair of state and work, and
//! each broken invariant is refused by name; a refused transition changes nothing.

use super::*;

#[test]
fn every_phase_is_one_pair_of_state_and_work() {
    let leased = FileState::Leased(lease(1, "a", LeaseSource::Cold));
    let cases = [
        (FileState::Filling, Some(Work::Refill), Some(Phase::Filling)),
        (
            FileState::Filling,
            Some(Work::Leasing),
            Some(Phase::ColdLeasing),
        ),
        (FileState::Warm, None, Some(Phase::Warm)),
        (FileState::Warm, Some(Work::Leasing), Some(Phase::Leasing)),
        (FileState::Warm, Some(Work::Scrub), Some(Phase::Cutting)),
        (leased.clone(), None, Some(Phase::Leased)),
        (
            leased.clone(),
            Some(Work::Releasing),
            Some(Phase::Releasing),
        ),
        (
            FileState::Dirty,
            Some(Work::Releasing),
            Some(Phase::Releasing),
        ),
        (FileState::Dirty, None, Some(Phase::Dirty)),
        (
            FileState::Scrubbing,
            Some(Work::Scrub),
            Some(Phase::Scrubbing),
        ),
        (FileState::Dirty, Some(Work::Delete), Some(Phase::Deleting)),
        (FileState::Filling, None, None),
        (FileState::Scrubbing, None, None),
        (leased.clone(), Some(Work::Delete), None),
        (FileState::Dirty, Some(Work::Leasing), None),
        (FileState::Warm, Some(Work::Refill), None),
    ];
    for (state, busy, want) in cases {
        let e = Entry::new(rec(1, M2, state.clone()), busy);
        assert_eq!(e.phase(), want, "{state:?} {busy:?}");
    }
}

#[test]
fn check_refuses_a_pair_that_is_no_phase() {
    let mut c = warm(1);
    c.files.get_mut(&1).unwrap().busy = Some(Work::Refill);
    assert!(matches!(c.check(), Err(Violation::NoPhase { id: 1, .. })));
}

#[test]
fn check_refuses_a_released_lease_remembered_by_a_warm_file() {
    let mut c = warm(1);
    c.files.get_mut(&1).unwrap().released = Some(Released {
        lease: 1,
        name: "a".into(),
        recycle: Recycle::Proven,
        watched: true,
        principal: None,
    });
    assert!(matches!(c.check(), Err(Violation::Owner { id: 1, .. })));
}

#[test]
fn check_refuses_two_leases_of_one_name() {
    let mut c = warm(2);
    lease_warm(&mut c, 1, "vm");
    let twin = FileState::Leased(lease(50, "vm", LeaseSource::WarmExact));
    c.files.get_mut(&2).unwrap().rec.state = twin;
    assert!(matches!(
        c.check(),
        Err(Violation::Twice { what: "name", .. })
    ));
}

#[test]
fn check_refuses_one_lease_id_on_two_files() {
    let mut c = warm(2);
    let l = lease_warm(&mut c, 1, "a");
    let twin = FileState::Leased(lease(l, "b", LeaseSource::WarmExact));
    c.files.get_mut(&2).unwrap().rec.state = twin;
    assert!(matches!(
        c.check(),
        Err(Violation::Twice { what: "id", .. })
    ));
}

#[test]
fn check_refuses_a_request_without_its_file() {
    let mut c = warm(1);
    c.pending.insert("ghost".into(), 1);
    assert!(matches!(c.check(), Err(Violation::Owner { id: 1, .. })));
    let mut c = warm(1);
    c.files.get_mut(&1).unwrap().busy = Some(Work::Leasing);
    assert!(matches!(c.check(), Err(Violation::Owner { id: 1, .. })));
}

#[test]
fn check_refuses_a_size_that_is_not_whole_pages() {
    let mut c = warm(1);
    c.files.get_mut(&1).unwrap().rec.size = M2 + 4096;
    assert!(matches!(c.check(), Err(Violation::Size { id: 1, .. })));
    c.files.get_mut(&1).unwrap().rec.size = 0;
    assert!(matches!(c.check(), Err(Violation::Size { id: 1, .. })));
}

/// A core holding `rec` under `key`, ids from `next_id` (bypassing the transitions).
fn holding(key: u64, rec: FileRecord, next_id: u64) -> Core {
    Core {
        files: [(key, Entry::new(rec, None))].into(),
        pending: BTreeMap::new(),
        next_id,
        releases: 0,
        turns: Default::default(),
    }
}

#[test]
fn check_refuses_an_id_not_below_the_next() {
    let c = holding(5, rec(5, M2, FileState::Warm), 5);
    assert!(matches!(c.check(), Err(Violation::Id { id: 5, next: 5 })));
}

#[test]
fn check_refuses_a_file_under_another_id() {
    let c = holding(4, rec(5, M2, FileState::Warm), 9);
    assert!(matches!(c.check(), Err(Violation::Key { key: 4, id: 5 })));
}

#[test]
fn a_refused_transition_changes_nothing() {
    let mut c = warm(2);
    lease_warm(&mut c, 1, "vm");
    let before = format!("{c:?}");
    assert!(c.take_warm(1, "x").is_err());
    assert!(c.begin_scrub(2, M2).is_err());
    assert!(c.release_done(1).is_err());
    assert!(c.deleted(2).is_err());
    assert!(c.cut_done(2, rec(2, M2, FileState::Warm)).is_err());
    assert_eq!(format!("{c:?}"), before);
}
