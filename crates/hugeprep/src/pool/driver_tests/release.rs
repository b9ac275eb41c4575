//! Giving leases back: dirty, proven, scrubbed, warm again; or the kernel's path.

use super::host::sim::ProofMode;
use super::*;
use crate::policy::pool::Recycle;

#[test]
fn a_released_file_is_scrubbed_and_warm_again() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    let info = r.lease("vm1", 8).unwrap();
    r.host.write(&r.path("vm1"), "tenant-a");
    r.release(&info).unwrap();
    assert_eq!(r.states(), ["dirty"]);
    r.settle();
    assert_eq!(r.warm_bytes(), 8 * MIB);
    let files = r.host.files();
    assert!(files.values().all(|(_, f)| f.marks.is_empty()), "{files:?}");
    assert!(r.pool.counters().scrubbed_bytes >= 8 * MIB);
}

#[test]
fn a_lessees_bytes_never_reach_the_next_lessee() {
    let r = rig(&target(8, &[8]), 8);
    r.settle();
    for (i, who) in ["a", "b", "c", "d"].iter().enumerate() {
        let name = format!("vm{i}");
        let info = r.lease(&name, 8).unwrap();
        r.host.write(&r.path(&name), who);
        r.release(&info).unwrap();
        r.settle();
    }
    assert!(r.host.leaks().is_empty());
    assert_eq!(r.warm_bytes(), 8 * MIB);
}

#[test]
fn a_lease_taken_before_the_scrub_gets_fresh_pages_not_the_dirty_file() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    let a = r.lease("a", 8).unwrap();
    r.host.write(&r.path("a"), "tenant-a");
    r.release(&a).unwrap();
    let b = r.lease("b", 8).unwrap();
    assert_eq!(b.source, LeaseSource::Cold);
    assert!(r.host.leaks().is_empty());
}

#[test]
fn a_release_removes_the_lease_path() {
    let r = rig("", 16);
    let info = r.lease("vm1", 4).unwrap();
    assert!(r.host.lease_paths().contains_key(&r.path("vm1")));
    r.release(&info).unwrap();
    assert!(r.host.lease_paths().is_empty());
}

#[test]
fn an_unknown_lease_cannot_be_released() {
    let r = rig("", 16);
    assert!(matches!(
        r.pool.release(7),
        Err(PoolError::NotFound { id: 7 })
    ));
}

#[test]
fn a_lease_is_released_once() {
    let r = rig("", 16);
    let info = r.lease("vm1", 4).unwrap();
    r.release(&info).unwrap();
    assert!(matches!(r.release(&info), Err(PoolError::NotFound { .. })));
}

#[test]
fn an_unproven_release_takes_the_kernels_path_and_the_refill_faults_new_pages() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    let info = r.lease("vm1", 8).unwrap();
    r.host.write(&r.path("vm1"), "tenant-a");
    r.host.inject(|f| f.proof = ProofMode::Fail);
    r.release(&info).unwrap();
    let old = r.host.lease_paths();
    assert!(old.is_empty());
    r.settle();
    assert_eq!(r.pool.counters().kernel_path_releases, 1);
    assert_eq!(r.warm_bytes(), 8 * MIB);
    assert!(r.host.files().values().all(|(_, f)| f.marks.is_empty()));
    assert_eq!(r.free(), 12);
}

#[test]
fn a_release_the_lease_sent_to_the_kernels_path_is_not_scrubbed() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    let mut req = request("vm1", 8);
    req.recycle = Some(Recycle::Kernel);
    let info = r.pool.lease(&req).unwrap();
    r.release(&info).unwrap();
    r.settle();
    assert_eq!(r.pool.counters().kernel_path_releases, 1);
    assert_eq!(r.pool.counters().scrubbed_bytes, 0);
}

#[test]
fn a_held_file_waits_aside_instead_of_being_scrubbed() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    let info = r.lease("vm1", 8).unwrap();
    r.host.write(&r.path("vm1"), "tenant-a");
    r.host.inject(|f| f.proof = ProofMode::Held);
    r.release(&info).unwrap();
    assert!(r.pool.work_once());
    r.check();
    let st = r.pool.lock();
    assert_eq!(st.aside.totals().0, 1);
    drop(st);
    assert_eq!(r.pool.counters().kernel_path_releases, 0);
    // Its bytes are still in it, and nobody is handed it.
    let other = r.lease("vm2", 8).unwrap();
    assert_eq!(other.source, LeaseSource::Cold);
}

#[test]
fn a_failed_scrub_deletes_the_file_and_gives_its_pages_back() {
    let r = rig(&target(8, &[8]), 8);
    r.settle();
    let info = r.lease("vm1", 8).unwrap();
    r.host.write(&r.path("vm1"), "tenant-a");
    r.host.inject(|f| f.scrub_fails = true);
    r.release(&info).unwrap();
    assert!(r.pool.work_once());
    r.check();
    assert!(r.host.files().is_empty());
    assert_eq!(r.free(), 8);
    assert_eq!(r.pool.counters().failed_releases, 1);
}

/// Attacker's review: a file that cannot be taken back from its lessee (owner, mode) is
/// never recycled: it takes the kernel's path.
#[test]
fn a_file_not_taken_back_from_its_lessee_is_deleted_not_scrubbed() {
    let r = rig(&target(8, &[8]), 8);
    r.settle();
    let info = r.lease("vm1", 8).unwrap();
    r.host.write(&r.path("vm1"), "tenant-a");
    r.host.inject(|f| f.take_back_fails = true);
    r.release(&info).unwrap();
    assert!(r.pool.work_once());
    r.check();
    assert!(r.host.files().is_empty());
    assert_eq!(r.free(), 8);
    assert_eq!(r.pool.counters().failed_releases, 1);
}

#[test]
fn a_release_above_the_target_is_given_back_not_scrubbed() {
    let r = rig(&target(8, &[8]), 32);
    r.settle();
    let a = r.lease("a", 8).unwrap();
    let b = r.lease("b", 8).unwrap();
    r.settle();
    r.release(&a).unwrap();
    r.release(&b).unwrap();
    r.settle();
    assert_eq!(r.warm_bytes(), 8 * MIB);
    assert_eq!(r.free(), 32 - 4);
}

#[test]
fn an_owner_gets_the_file_and_the_release_takes_it_back() {
    let r = rig("", 16);
    let mut req = request("vm1", 4);
    req.owner = Some("0".into());
    let info = r.pool.lease(&req).unwrap();
    let id = r.host.lease_paths()[&r.path("vm1")];
    assert_eq!(r.host.files()[&id].1.owner, Some(0));
    r.release(&info).unwrap();
    assert_eq!(r.host.files()[&id].1.owner, None);
}
