//! Unit and property tests of the core's transitions, invariants and recovery plan: no
//! root, no hugetlbfs, no clock.

use std::collections::BTreeMap;

use super::*;
use crate::pool::record::{LeaseRecord, LeaseSource};

const M2: u64 = 2 << 20;
const PS: PageSize = PageSize::Size2M;

fn rec(id: u64, size: u64, state: FileState) -> FileRecord {
    FileRecord {
        id,
        page_size: PS,
        node: 0,
        size,
        state,
    }
}

/// A lease record of `name` as a lease request would journal it.
fn lease(id: u64, name: &str, source: LeaseSource) -> LeaseRecord {
    LeaseRecord {
        id,
        name: name.to_string(),
        path: std::path::Path::new("/sim/leases").join(name),
        uid: None,
        gid: None,
        pid: None,
        pid_start: None,
        source,
        ready_ms: 0.0,
        created_unix: 0,
        idempotency: None,
        recycle: crate::policy::pool::Recycle::Proven,
        principal: None,
    }
}

/// A core with warm files 1..=n of 2 MiB each, ids from 100.
fn warm(n: u64) -> Core {
    Core::with_files(
        (1..=n).map(|id| rec(id, M2, FileState::Warm)).collect(),
        100,
    )
}

fn phase(core: &Core, id: u64) -> Option<Phase> {
    core.get(id).and_then(Entry::phase)
}

/// Leases the warm file `id` as `name` through every transition; the lease id.
fn lease_warm(core: &mut Core, id: u64, name: &str) -> u64 {
    core.take_warm(id, name).unwrap();
    let lease_id = core.new_id();
    let r = core
        .lease_record(id, M2, lease(lease_id, name, LeaseSource::WarmExact))
        .unwrap();
    core.leased(id, r).unwrap();
    lease_id
}

/// Releases lease `lease_id` through every transition; its file.
fn release(core: &mut Core, lease_id: u64) -> u64 {
    let (id, _) = core.begin_release(lease_id).unwrap();
    core.release_journaled(id).unwrap();
    core.release_done(id).unwrap();
    id
}

/// Leases the warm file `id` as `name` for `principal`; the lease id.
fn lease_warm_for(core: &mut Core, id: u64, name: &str, principal: &str) -> u64 {
    core.take_warm(id, name).unwrap();
    let lease_id = core.new_id();
    let mut l = lease(lease_id, name, LeaseSource::WarmExact);
    l.principal = Some(principal.to_string());
    let r = core.lease_record(id, M2, l).unwrap();
    core.leased(id, r).unwrap();
    lease_id
}

#[test]
fn the_worker_takes_released_files_by_turns_of_principals_then_release_order() {
    let mut c = warm(5);
    let a: Vec<u64> = (1..=4)
        .map(|id| lease_warm_for(&mut c, id, &format!("a{id}"), "uid:65534"))
        .collect();
    let b = lease_warm_for(&mut c, 5, "b", "uid:65533");
    // The tenant releases its files, the last leased first; then the other principal.
    for l in a.iter().rev() {
        release(&mut c, *l);
    }
    release(&mut c, b);
    let mut order = Vec::new();
    while let Some(id) = c.next_dirty(|_| true) {
        c.begin_scrub(id, M2).unwrap();
        order.push(id);
    }
    // By id the other principal's file (5) came last; by turns it comes second, and the
    // tenant's own files go in the order it released them.
    assert_eq!(order, vec![4, 5, 3, 2, 1]);
}

#[test]
fn a_held_file_cut_to_nothing_is_not_set_aside() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "x");
    release(&mut c, l);
    c.begin_scrub(1, M2).unwrap();
    let err = c.held_aside(1, 0).unwrap_err();
    assert!(matches!(err, CoreError::Size { size: 0, .. }), "{err}");
    assert_eq!(phase(&c, 1), Some(Phase::Scrubbing), "nothing changed");
    c.held_aside(1, M2).unwrap();
    assert_eq!(phase(&c, 1), Some(Phase::Dirty));
}

#[test]
fn files_the_worker_may_not_take_are_passed_over() {
    let mut c = warm(2);
    let l1 = lease_warm(&mut c, 1, "x");
    let l2 = lease_warm(&mut c, 2, "y");
    release(&mut c, l1);
    release(&mut c, l2);
    assert_eq!(c.next_dirty(|id| id != 1), Some(2));
    assert_eq!(c.next_dirty(|_| false), None);
}

#[test]
fn take_warm_moves_a_warm_file_to_leasing_and_claims_the_name() {
    let mut c = warm(1);
    c.take_warm(1, "vm").unwrap();
    assert_eq!(phase(&c, 1), Some(Phase::Leasing));
    assert!(c.name_in_use("vm"));
    assert!(c.any_busy());
}

#[test]
fn a_dirty_file_is_never_taken_for_a_lease() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "a");
    release(&mut c, l);
    let err = c.take_warm(1, "b").unwrap_err();
    assert!(
        matches!(
            err,
            CoreError::Phase {
                phase: Some(Phase::Dirty),
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(phase(&c, 1), Some(Phase::Dirty));
    assert!(!c.name_in_use("b"));
}

#[test]
fn a_live_lease_name_is_refused() {
    let mut c = warm(2);
    lease_warm(&mut c, 1, "vm");
    assert!(matches!(c.take_warm(2, "vm"), Err(CoreError::Name { .. })));
    assert!(matches!(
        c.new_cold(0, PS, M2, "vm"),
        Err(CoreError::Name { .. })
    ));
    assert_eq!(phase(&c, 2), Some(Phase::Warm));
}

#[test]
fn a_name_being_taken_is_refused() {
    let mut c = warm(2);
    c.take_warm(1, "vm").unwrap();
    assert!(matches!(c.take_warm(2, "vm"), Err(CoreError::Name { .. })));
}

#[test]
fn a_cold_lease_journals_filling_before_anything_else() {
    let mut c = warm(0);
    let (id, action) = c.new_cold(0, PS, 2 * M2, "vm").unwrap();
    assert_eq!(action, Action::Journal(rec(id, 2 * M2, FileState::Filling)));
    assert_eq!(phase(&c, id), Some(Phase::ColdLeasing));
    assert!(c.name_in_use("vm"));
}

#[test]
fn an_unjournaled_new_file_is_forgotten_with_its_name() {
    let mut c = warm(0);
    let (id, _) = c.new_cold(0, PS, M2, "vm").unwrap();
    c.forget_unjournaled(id).unwrap();
    assert!(c.get(id).is_none());
    assert!(!c.name_in_use("vm"));
    let (fill, _) = c.new_fill(0, PS, M2);
    c.forget_unjournaled(fill).unwrap();
    assert_eq!(c.files().count(), 0);
}

#[test]
fn forget_unjournaled_refuses_a_journaled_file() {
    let mut c = warm(1);
    assert!(c.forget_unjournaled(1).is_err());
    assert_eq!(phase(&c, 1), Some(Phase::Warm));
}

#[test]
fn a_lease_record_must_match_where_the_file_came_from() {
    let mut c = warm(1);
    c.take_warm(1, "a").unwrap();
    assert!(c
        .lease_record(1, M2, lease(100, "a", LeaseSource::Cold))
        .is_err());
    let (cold, _) = c.new_cold(0, PS, M2, "b").unwrap();
    assert!(c
        .lease_record(cold, M2, lease(101, "b", LeaseSource::WarmExact))
        .is_err());
    assert!(c
        .lease_record(cold, M2, lease(101, "b", LeaseSource::Cold))
        .is_ok());
}

#[test]
fn no_lease_record_for_a_file_not_being_leased() {
    let c = warm(1);
    let err = c.lease_record(1, M2, lease(100, "a", LeaseSource::WarmExact));
    assert!(matches!(
        err,
        Err(CoreError::Phase {
            phase: Some(Phase::Warm),
            ..
        })
    ));
    assert!(matches!(
        c.lease_record(7, M2, lease(100, "a", LeaseSource::WarmExact)),
        Err(CoreError::NoFile { .. })
    ));
}

#[test]
fn leased_makes_the_name_the_lease_s() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "vm");
    assert_eq!(phase(&c, 1), Some(Phase::Leased));
    assert!(c.name_in_use("vm"));
    assert!(!c.any_busy());
    assert!(c.pending.is_empty());
    assert!(l >= 100);
}

#[test]
fn leased_refuses_a_record_that_is_not_a_lease() {
    let mut c = warm(1);
    c.take_warm(1, "vm").unwrap();
    assert!(c.leased(1, rec(1, M2, FileState::Warm)).is_err());
    assert_eq!(phase(&c, 1), Some(Phase::Leasing));
}

#[test]
fn a_failed_cold_lease_removes_the_file_then_its_record() {
    let mut c = warm(0);
    let (id, _) = c.new_cold(0, PS, M2, "vm").unwrap();
    let undo = c.abort_cold(id).unwrap();
    assert!(matches!(undo[0], Action::RemoveFile { .. }));
    assert_eq!(undo[1], Action::Unjournal(id));
    assert!(c.get(id).is_none());
    assert!(!c.name_in_use("vm"));
}

#[test]
fn a_failed_warm_lease_is_dirty_at_its_size_on_the_mount() {
    let mut c = warm(1);
    c.take_warm(1, "vm").unwrap();
    let released = Released {
        lease: 0,
        name: "vm".into(),
        recycle: Recycle::Proven,
        watched: true,
        principal: None,
    };
    let action = c.abort_warm(1, 2 * M2, released.clone()).unwrap();
    assert_eq!(action, Action::Journal(rec(1, 2 * M2, FileState::Dirty)));
    assert_eq!(phase(&c, 1), Some(Phase::Dirty));
    assert_eq!(c.get(1).unwrap().released(), Some(&released));
    assert!(!c.name_in_use("vm"));
}

mod decide;
mod deletion;
mod invariants;
mod lifecycle;
mod recovery;
