//! Failures the host injects: a full journal, a kernel that supplies fewer pages than its
//! counters said, files that cannot be made. Each leaves no page, file or record behind.

use super::*;

#[test]
fn a_full_journal_refuses_a_cold_lease_and_leaves_nothing() {
    let r = rig("", 16);
    r.host.inject(|f| f.journal_full_after = Some(0));
    let err = r.lease("vm1", 4).unwrap_err();
    assert!(matches!(err, PoolError::Journal(_)), "{err}");
    assert!(r.host.files().is_empty());
    assert!(r.host.lease_paths().is_empty());
    assert_eq!(r.free(), 16);
}

#[test]
fn a_full_journal_at_the_commit_unlinks_the_lease_and_removes_the_cold_file() {
    let r = rig("", 16);
    // The cold lease's first record goes in; its lease record does not.
    r.host.inject(|f| f.journal_full_after = Some(1));
    let err = r.lease("vm1", 4).unwrap_err();
    assert!(matches!(err, PoolError::Journal(_)), "{err}");
    assert!(r.host.lease_paths().is_empty());
    r.host.inject(|f| f.journal_full_after = None);
    r.settle();
    assert!(r.host.files().is_empty());
    assert_eq!(r.free(), 16);
}

#[test]
fn a_full_journal_at_a_warm_leases_commit_sends_the_file_to_the_scrubber() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    r.host.inject(|f| f.journal_full_after = Some(0));
    let err = r.lease("vm1", 8).unwrap_err();
    assert!(matches!(err, PoolError::Journal(_)), "{err}");
    assert!(r.host.lease_paths().is_empty());
    r.host.inject(|f| f.journal_full_after = None);
    r.settle();
    assert_eq!(r.warm_bytes(), 8 * MIB);
    assert_eq!(r.free(), 12);
}

#[test]
fn a_full_journal_refuses_a_release_and_the_lease_stays() {
    let r = rig("", 16);
    let info = r.lease("vm1", 4).unwrap();
    r.host.inject(|f| f.journal_full_after = Some(0));
    let err = r.release(&info).unwrap_err();
    assert!(matches!(err, PoolError::Journal(_)), "{err}");
    assert_eq!(r.states(), ["leased"]);
    assert!(r.host.lease_paths().contains_key(&r.path("vm1")));
    r.host.inject(|f| f.journal_full_after = None);
    r.release(&info).unwrap();
}

#[test]
fn a_full_journal_stops_refills_without_leaving_a_file() {
    let r = rig(&target(8, &[4]), 16);
    r.host.inject(|f| f.journal_full_after = Some(0));
    r.settle();
    assert!(r.host.files().is_empty());
    assert_eq!(r.free(), 16);
    assert!(r.pool.lock().schedule.refill_backoff().is_some());
}

#[test]
fn a_full_journal_before_a_scrub_deletes_the_released_file() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    let info = r.lease("vm1", 8).unwrap();
    r.host.write(&r.path("vm1"), "tenant-a");
    r.release(&info).unwrap();
    r.host.inject(|f| f.journal_full_after = Some(0));
    r.pool.work_once();
    r.check();
    r.host.inject(|f| f.journal_full_after = None);
    r.settle();
    assert!(r.host.files().values().all(|(_, f)| f.marks.is_empty()));
    assert!(r.host.leaks().is_empty());
}

#[test]
fn a_kernel_that_supplies_fewer_pages_than_counted_fails_the_lease_cleanly() {
    let r = rig("", 4);
    r.host.inject(|f| f.phantom_pages = 8);
    let err = r.lease("vm1", 16).unwrap_err();
    assert!(matches!(err, PoolError::Fault(_)), "{err}");
    assert!(r.host.files().is_empty());
    assert!(r.host.journal().is_empty());
    assert_eq!(r.free(), 4);
}

#[test]
fn a_kernel_that_supplies_fewer_pages_than_counted_fails_the_refill_cleanly() {
    let r = rig(&target(16, &[16]), 4);
    r.host.inject(|f| f.phantom_pages = 8);
    r.settle();
    assert!(r.host.files().is_empty());
    assert_eq!(r.free(), 4);
    assert!(r.pool.lock().schedule.refill_backoff().is_some());
}

#[test]
fn pages_taken_by_another_user_of_the_machine_are_not_promised() {
    let r = rig(&target(8, &[4]), 16);
    r.host.take_free(0, PS, 14);
    r.settle();
    assert_eq!(r.warm_bytes(), 4 * MIB);
    assert_eq!(r.free(), 0);
    assert!(r.lease("vm1", 8).is_err());
}

#[test]
fn a_file_that_cannot_be_created_fails_the_cold_lease_cleanly() {
    let r = rig("", 16);
    r.host.inject(|f| f.create_fails = true);
    assert!(r.lease("vm1", 4).is_err());
    assert!(r.host.files().is_empty());
    assert!(r.host.journal().is_empty());
}

#[test]
fn a_file_that_cannot_be_created_backs_the_refill_off() {
    let r = rig(&target(8, &[4]), 16);
    r.host.inject(|f| f.create_fails = true);
    r.settle();
    assert!(r.host.files().is_empty());
    assert!(r.host.journal().is_empty());
    assert!(r.pool.lock().schedule.refill_backoff().is_some());
}

#[test]
fn a_time_jump_does_not_break_a_lease() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    r.host.advance(Duration::from_secs(3600 * 24));
    let info = r.lease("vm1", 8).unwrap();
    assert!(info.ready_ms >= 0.0);
    r.release(&info).unwrap();
    r.settle();
    assert_eq!(r.warm_bytes(), 8 * MIB);
}

#[test]
fn a_crash_before_a_cold_leases_fault_is_recovered_without_its_file() {
    let mut r = rig("", 16);
    // Before its second effect: the filling record is journaled, the file created, not faulted.
    r.host.inject(|f| f.crash_after = Some(2));
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        r.pool.lease(&request("vm1", 4))
    }));
    assert!(crashed.is_err());
    let facts = r.host.recovery_facts(false).unwrap();
    let plan = core::recovery::plan(&facts);
    assert!(!plan.steps.is_empty(), "{facts:?}");
    r.restart();
    r.check();
    assert!(r.host.files().is_empty());
    assert!(r.host.journal().is_empty());
    assert_eq!(r.free(), 16);
}

/// Issue 35: a cold lease whose file could not be faulted, then not unlinked (`EIO`,
/// `EBUSY`), dropped its record anyway: the file and its pages were nobody's until the next
/// start. Its record stays now, dirty, and the worker removes the file once it can.
#[test]
fn a_failed_cold_lease_whose_file_cannot_be_unlinked_keeps_its_record_until_removed() {
    let r = rig("", 16);
    // The kernel counts 8 pages it cannot give: the lease's fault fails after the create.
    r.host.inject(|f| {
        f.phantom_pages = 8;
        f.unlink_error_per_mille = 1000;
    });
    // `Rig::lease` checks that every file on the host is the pool's.
    r.lease("vm1", 40).unwrap_err();
    let files = r.host.files();
    assert!(!files.is_empty(), "the file could not be unlinked");
    assert!(r.states().iter().all(|s| s == "dirty"), "{:?}", r.states());
    for id in files.keys() {
        assert_eq!(r.host.journal()[id].state, FileState::Dirty);
    }
    assert!(r.host.injected().contains_key("unlink a pool file fails"));
    // Still failing: the worker's tries leave them as they are.
    r.pool.work_once();
    r.check();
    assert_eq!(r.host.files().len(), files.len());
    r.host.inject(|f| *f = Default::default());
    r.settle();
    assert!(r.host.files().is_empty());
    assert!(r.host.journal().is_empty());
    assert_eq!(r.free(), 16);
}

/// The same for a refill whose fault failed.
#[test]
fn a_failed_refill_whose_file_cannot_be_unlinked_keeps_its_record_until_removed() {
    let r = rig(&target(8, &[8]), 2);
    r.host.inject(|f| {
        f.phantom_pages = 4;
        f.unlink_error_per_mille = 1000;
    });
    assert!(r.pool.work_once(), "a refill ran");
    r.check();
    assert_eq!(r.states(), ["dirty"]);
    r.host.inject(|f| *f = Default::default());
    r.settle();
    assert!(r
        .host
        .journal()
        .values()
        .all(|j| j.state != FileState::Dirty));
    assert_eq!(r.free(), 2);
}

/// Issue 35: recovery that could not remove a file (a refill's, found filling after a
/// crash) dropped its record anyway, leaving the file and its pages to nobody until the
/// next start. The record stays now, dirty, and the worker removes the file once it can.
#[test]
fn a_file_recovery_cannot_unlink_keeps_its_record_until_the_worker_removes_it() {
    // The refill's filling record and its file, then the crash before its warm record.
    let mut r = (0..10)
        .map(|effects| {
            let r = rig(&target(8, &[8]), 16);
            r.host.inject(|f| f.crash_after = Some(effects));
            let run = std::panic::AssertUnwindSafe(|| while r.pool.work_once() {});
            let crashed = std::panic::catch_unwind(run).is_err();
            (crashed, r)
        })
        .find_map(|(crashed, r)| {
            (crashed && r.host.crashed_at().contains_key("journal warm")).then_some(r)
        })
        .expect("a crash before the refill's warm record");
    let id = *r.host.files().keys().next().expect("the refill's file");
    assert_eq!(r.host.journal()[&id].state, FileState::Filling);
    r.host.inject(|f| f.unlink_error_per_mille = 1000);
    // `Rig::restart` and `Rig::check`: every file on the host is the pool's.
    r.restart();
    r.check();
    assert!(r
        .host
        .injected()
        .contains_key("recovery: unlink a pool file fails"));
    assert_eq!(r.states(), ["dirty"]);
    assert_eq!(r.host.journal()[&id].state, FileState::Dirty);
    r.host.inject(|f| *f = Default::default());
    r.settle();
    assert!(!r.host.files().contains_key(&id), "removed by the worker");
    assert_eq!(r.warm_bytes(), 8 * MIB);
    assert_eq!(r.free(), 12);
}
