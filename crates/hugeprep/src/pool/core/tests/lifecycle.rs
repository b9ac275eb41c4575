//! The core's transitions after a lease: release, scrub, delete, refill and cut.

use super::*;

#[test]
fn a_lease_is_released_once() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "vm");
    let (id, dirty) = c.begin_release(l).unwrap();
    assert_eq!(dirty.state, FileState::Dirty);
    assert_eq!(phase(&c, id), Some(Phase::Releasing));
    assert!(
        c.begin_release(l).is_none(),
        "a second release finds nothing"
    );
    assert!(c.begin_release(999).is_none());
}

#[test]
fn a_release_whose_record_was_not_written_leaves_the_lease() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "vm");
    let (id, _) = c.begin_release(l).unwrap();
    c.release_failed(id).unwrap();
    assert_eq!(phase(&c, id), Some(Phase::Leased));
    assert!(c.get(id).unwrap().released().is_none());
    assert!(c.begin_release(l).is_some(), "it can be released again");
}

#[test]
fn a_release_remembers_its_lease_for_the_proof() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "vm");
    let id = release(&mut c, l);
    let r = c.get(id).unwrap().released().unwrap();
    assert_eq!((r.lease, r.name.as_str(), r.watched), (l, "vm", true));
}

#[test]
fn release_done_refuses_before_the_record_is_written() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "vm");
    let (id, _) = c.begin_release(l).unwrap();
    assert!(c.release_done(id).is_err());
    c.release_journaled(id).unwrap();
    assert!(
        c.release_failed(id).is_err(),
        "journaled: no way back to leased"
    );
    c.release_done(id).unwrap();
    assert_eq!(phase(&c, id), Some(Phase::Dirty));
}

#[test]
fn a_lease_from_before_a_restart_is_released_unwatched() {
    let leased = rec(
        1,
        M2,
        FileState::Leased(lease(5, "vm", LeaseSource::WarmExact)),
    );
    let mut c = Core::with_files(vec![leased], 100);
    let id = release(&mut c, 5);
    assert!(!c.get(id).unwrap().released().unwrap().watched);
}

#[test]
fn only_a_dirty_file_is_scrubbed() {
    let mut c = warm(1);
    assert!(c.begin_scrub(1, M2).is_err());
    let l = lease_warm(&mut c, 1, "vm");
    assert!(c.begin_scrub(1, M2).is_err());
    release(&mut c, l);
    let action = c.begin_scrub(1, M2).unwrap();
    assert_eq!(action, Action::Journal(rec(1, M2, FileState::Scrubbing)));
    assert_eq!(phase(&c, 1), Some(Phase::Scrubbing));
}

#[test]
fn a_scrubbed_file_is_warm_and_forgets_its_lease() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "vm");
    release(&mut c, l);
    c.begin_scrub(1, M2).unwrap();
    let w = c.warm_record(1, M2).unwrap();
    c.scrubbed(1, w).unwrap();
    assert_eq!(phase(&c, 1), Some(Phase::Warm));
    assert!(c.get(1).unwrap().released().is_none());
}

#[test]
fn a_cancelled_scrub_is_dirty_again_and_keeps_its_lease() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "vm");
    release(&mut c, l);
    c.begin_scrub(1, M2).unwrap();
    c.scrub_cancelled(1).unwrap();
    assert_eq!(phase(&c, 1), Some(Phase::Dirty));
    assert!(c.get(1).unwrap().released().is_some());
}

#[test]
fn a_file_kept_at_a_smaller_size_is_journaled_at_it() {
    let mut c = Core::with_files(vec![rec(1, 4 * M2, FileState::Dirty)], 100);
    let action = c.begin_scrub(1, M2).unwrap();
    assert_eq!(action, Action::Journal(rec(1, M2, FileState::Scrubbing)));
}

#[test]
fn files_are_given_up_only_when_nobody_else_holds_them() {
    let mut c = warm(4);
    let l = lease_warm(&mut c, 1, "a");
    c.take_warm(2, "b").unwrap();
    let (fill, _) = c.new_fill(0, PS, M2);
    for id in [1, 2, fill] {
        assert!(c.begin_delete(id).is_err(), "file {id}");
    }
    let (id, _) = c.begin_release(l).unwrap();
    assert!(c.begin_delete(id).is_err(), "releasing");
    assert!(c.begin_delete(3).is_ok(), "warm");
    assert_eq!(phase(&c, 3), Some(Phase::Deleting));
    assert!(c.begin_delete(3).is_err(), "deleting twice");
}

#[test]
fn a_deleted_file_is_forgotten_then_unjournaled() {
    let mut c = warm(1);
    let action = c.begin_delete(1).unwrap();
    assert_eq!(
        action,
        Action::RemoveFile {
            rec: rec(1, M2, FileState::Warm),
            released: None
        }
    );
    assert_eq!(c.deleted(1).unwrap(), Action::Unjournal(1));
    assert!(c.get(1).is_none());
}

#[test]
fn a_released_file_is_removed_with_its_lease_for_the_kernel_s_path() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "vm");
    release(&mut c, l);
    let Action::RemoveFile { rec, released } = c.begin_delete(1).unwrap() else {
        panic!("not a removal");
    };
    assert_eq!(rec.state, FileState::Dirty);
    assert_eq!(released.unwrap().lease, l);
}

/// Regression: a scrub that failed and whose file could not be deleted stayed "scrubbing"
/// and idle for good (no job picks a scrubbing file, and the pool never settled).
#[test]
fn a_scrub_whose_file_cannot_be_deleted_is_dirty_again() {
    let mut c = warm(1);
    let l = lease_warm(&mut c, 1, "vm");
    release(&mut c, l);
    c.begin_scrub(1, M2).unwrap();
    c.begin_delete(1).unwrap();
    assert_eq!(
        c.delete_failed(1, Some(M2)).unwrap(),
        Some(Action::Journal(c.get(1).unwrap().rec().clone()))
    );
    assert_eq!(phase(&c, 1), Some(Phase::Dirty));
}

#[test]
fn a_warm_file_that_cannot_be_deleted_stays_warm() {
    let mut c = warm(1);
    c.begin_delete(1).unwrap();
    c.delete_failed(1, None).unwrap();
    assert_eq!(phase(&c, 1), Some(Phase::Warm));
}

/// Regression (found by the simulator, seed 161): a cut that failed before the file was
/// cut, whose file then could not be deleted, stayed warm at the smaller size in memory.
#[test]
fn a_file_that_cannot_be_deleted_keeps_its_size_on_the_mount() {
    let mut c = Core::with_files(vec![rec(1, 2 * M2, FileState::Warm)], 100);
    c.begin_cut(1, M2).unwrap();
    c.begin_delete(1).unwrap();
    let fix = c.delete_failed(1, Some(2 * M2)).unwrap();
    assert_eq!(fix, Some(Action::Journal(rec(1, 2 * M2, FileState::Warm))));
    assert_eq!(c.get(1).unwrap().rec().size, 2 * M2);
}

#[test]
fn a_refill_is_filling_then_warm() {
    let mut c = warm(0);
    let (id, action) = c.new_fill(0, PS, M2);
    assert_eq!(action, Action::Journal(rec(id, M2, FileState::Filling)));
    assert_eq!(phase(&c, id), Some(Phase::Filling));
    let w = c.warm_record(id, M2).unwrap();
    c.filled(id, w).unwrap();
    assert_eq!(phase(&c, id), Some(Phase::Warm));
}

#[test]
fn a_failed_refill_is_removed_then_unjournaled() {
    let mut c = warm(0);
    let (id, _) = c.new_fill(0, PS, M2);
    let undo = c.fill_failed(id).unwrap();
    assert_eq!(undo.len(), 2);
    assert_eq!(undo[1], Action::Unjournal(id));
    assert!(c.get(id).is_none());
    assert!(c.fill_failed(id).is_err());
}

#[test]
fn a_cut_warm_file_is_journaled_at_its_new_size() {
    let mut c = Core::with_files(vec![rec(1, 4 * M2, FileState::Warm)], 100);
    let journal = c.begin_cut(1, M2).unwrap();
    assert_eq!(phase(&c, 1), Some(Phase::Cutting));
    let Action::Journal(r) = journal else {
        panic!("a cut journals")
    };
    c.cut_done(1, r).unwrap();
    assert_eq!(c.get(1).unwrap().rec().size, M2);
    assert_eq!(phase(&c, 1), Some(Phase::Warm));
}

#[test]
fn to_warm_refuses_a_record_that_is_not_warm() {
    let mut c = warm(0);
    let (id, _) = c.new_fill(0, PS, M2);
    assert!(c.filled(id, rec(id, M2, FileState::Dirty)).is_err());
    assert!(
        c.scrubbed(id, rec(id, M2, FileState::Warm)).is_err(),
        "not scrubbing"
    );
    assert_eq!(phase(&c, id), Some(Phase::Filling));
}

#[test]
fn no_warm_record_for_a_leased_file() {
    let mut c = warm(1);
    lease_warm(&mut c, 1, "vm");
    assert!(c.warm_record(1, M2).is_err());
}

#[test]
fn ids_are_never_given_twice() {
    let mut c = Core::with_files(vec![rec(7, M2, FileState::Warm)], 8);
    let a = c.new_id();
    let (b, _) = c.new_fill(0, PS, M2);
    let (d, _) = c.new_cold(0, PS, M2, "x").unwrap();
    assert_eq!((a, b, d), (8, 9, 10));
}

/// Regression (found by the simulator, seed 15028 of 30000): a lease whose commit could not
/// be journaled, aborted while the journal still refused writes, stayed journaled warm; a
/// clean shutdown then made the next start trust it, and hand out the lessee's bytes.
#[test]
fn a_clean_shutdown_journals_every_dirty_file_first() {
    let mut c = warm(2);
    c.take_warm(1, "vm").unwrap();
    let released = Released {
        lease: 0,
        name: "vm".into(),
        recycle: Recycle::Proven,
        watched: true,
        principal: None,
    };
    c.abort_warm(1, M2, released).unwrap();
    assert_eq!(
        c.prepare_clean_shutdown(),
        vec![Action::Journal(rec(1, M2, FileState::Dirty))]
    );
}
