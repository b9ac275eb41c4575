//! Taking leases: warm exact, shrunk, grown and cold, and requests refused whole.

use super::*;

#[test]
fn a_cold_lease_faults_a_new_file_and_links_its_path() {
    let r = rig("", 16);
    let info = r.lease("vm1", 8).unwrap();
    assert_eq!(info.source, LeaseSource::Cold);
    assert_eq!(info.size, 8 * MIB);
    assert_eq!(r.free(), 12);
    let file = r.host.lease_paths()[&r.path("vm1")];
    assert_eq!(r.host.files()[&file].1.pages, 4);
    assert_eq!(r.states(), ["leased"]);
}

#[test]
fn a_warm_file_of_the_size_is_handed_out_as_it_is() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    assert_eq!(r.warm_bytes(), 8 * MIB);
    let free = r.free();
    let info = r.lease("vm1", 8).unwrap();
    assert_eq!(info.source, LeaseSource::WarmExact);
    assert_eq!(r.free(), free, "a warm lease faults nothing");
}

#[test]
fn a_larger_warm_file_is_cut_to_the_lease_and_its_pages_go_back() {
    let r = rig(&target(16, &[16]), 16);
    r.settle();
    let info = r.lease("vm1", 4).unwrap();
    assert_eq!(info.source, LeaseSource::WarmShrunk);
    assert_eq!(r.free(), 16 - 2);
}

#[test]
fn a_smaller_warm_file_is_grown_by_the_missing_pages() {
    let r = rig(&target(4, &[4]), 6);
    r.settle();
    assert_eq!(r.free(), 4);
    let info = r.lease("vm1", 8).unwrap();
    assert!(
        matches!(info.source, LeaseSource::WarmGrown | LeaseSource::Cold),
        "{:?}",
        info.source
    );
    assert_eq!(info.size, 8 * MIB);
}

#[test]
fn a_lease_the_kernel_cannot_supply_is_refused_and_leaves_nothing() {
    let r = rig("", 2);
    let err = r.lease("vm1", 8).unwrap_err();
    assert!(matches!(err, PoolError::Insufficient { .. }), "{err}");
    assert_eq!(r.free(), 2);
    assert!(r.host.files().is_empty());
    assert!(r.host.journal().is_empty());
    assert!(r.host.lease_paths().is_empty());
}

#[test]
fn a_name_in_use_is_refused_and_the_first_lease_stays() {
    let r = rig("", 16);
    let first = r.lease("vm1", 4).unwrap();
    let err = r.lease("vm1", 4).unwrap_err();
    assert!(matches!(err, PoolError::DuplicateName { .. }), "{err}");
    assert_eq!(r.pool.get(first.id).unwrap().name, "vm1");
    assert_eq!(r.free(), 14);
}

#[test]
fn a_bad_name_is_refused_before_anything_is_taken() {
    let r = rig("", 16);
    for name in ["", "../x", "a/b"] {
        assert!(r.lease(name, 4).is_err(), "{name:?}");
    }
    assert_eq!(r.free(), 16);
    assert!(r.host.files().is_empty());
}

#[test]
fn a_size_of_no_whole_pages_is_a_field_error() {
    let r = rig("", 16);
    let mut req = request("vm1", 4);
    req.size += 4096;
    let err = r.pool.lease(&req).unwrap_err();
    assert!(
        matches!(err, PoolError::Field { field: "size", .. }),
        "{err}"
    );
    assert!(r.host.files().is_empty());
}

#[test]
fn a_page_size_without_a_mount_is_a_field_error() {
    let r = rig("", 16);
    let mut req = request("vm1", 1024);
    req.page_size = Some(PageSize::Size1G);
    let err = r.pool.lease(&req).unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::Field {
                field: "page_size",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn an_unknown_node_is_a_field_error() {
    let r = rig("", 16);
    let mut req = request("vm1", 4);
    req.node = Some(4096);
    let err = r.pool.lease(&req).unwrap_err();
    assert!(
        matches!(err, PoolError::Field { field: "node", .. }),
        "{err}"
    );
}

#[test]
fn leases_are_listed_and_found_by_id() {
    let r = rig("", 16);
    let a = r.lease("a", 2).unwrap();
    let b = r.lease("b", 4).unwrap();
    let ids: Vec<u64> = r.pool.leases().iter().map(|l| l.id).collect();
    assert_eq!(ids, [a.id, b.id]);
    assert_eq!(r.pool.get(b.id).unwrap().size, 4 * MIB);
    assert!(matches!(r.pool.get(12345), Err(PoolError::NotFound { .. })));
}

#[test]
fn a_lease_after_shutdown_is_refused() {
    let r = rig("", 16);
    r.pool.shutdown();
    let err = r.lease("vm1", 4).unwrap_err();
    assert!(matches!(err, PoolError::ShuttingDown), "{err}");
    assert!(r.host.files().is_empty());
}

#[test]
fn a_lease_journals_its_record_before_it_is_returned() {
    let r = rig("", 16);
    let info = r.lease("vm1", 4).unwrap();
    let journal = r.host.journal();
    let rec = journal.values().next().unwrap();
    match &rec.state {
        FileState::Leased(l) => assert_eq!(l.id, info.id),
        s => panic!("journaled {s:?}"),
    }
}

#[test]
fn cold_leases_take_only_the_pages_they_need() {
    let r = rig("", 16);
    for i in 0..4 {
        r.lease(&format!("vm{i}"), 4).unwrap();
    }
    assert_eq!(r.free(), 8);
    assert!(r.lease("vm4", 18).is_err());
    assert_eq!(r.free(), 8);
}

#[test]
fn capacity_reports_the_warm_bytes_and_the_kernels_free_bytes() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    let cap = r.pool.capacity();
    let kind = cap.kinds.iter().find(|k| k.node == 0).unwrap();
    assert_eq!(kind.warm_bytes, 8 * MIB);
    assert_eq!(kind.kernel_available_bytes, 12 * 2 * MIB);
}

#[test]
fn a_pinned_lease_is_pinned_until_its_release() {
    let r = rig("", 16);
    let mut req = request("vm1", 4);
    req.pin = true;
    let info = r.pool.lease(&req).unwrap();
    assert!(info.pinned);
    assert_eq!(r.host.pins().len(), 1, "the lease's file is pinned");
    let listed = r.pool.leases();
    assert!(listed.iter().all(|l| l.pinned));
    r.release(&info).unwrap();
    assert!(r.host.pins().is_empty(), "unpinned at the release");
    r.settle();
}

#[test]
fn a_pin_that_fails_or_a_commit_after_it_leaves_no_pin_and_no_lease() {
    let r = rig("", 16);
    let mut req = request("vm1", 4);
    req.pin = true;
    // Every effect that may fail does: the pin (or the link before it) is refused.
    r.host.inject(|f| f.io_error_per_mille = 1000);
    assert!(r.pool.lease(&req).is_err());
    r.check();
    assert!(r.host.pins().is_empty());
    assert!(r.pool.leases().is_empty());
    // The pin holds, the lease's journal write does not.
    r.host.inject(|f| f.io_error_per_mille = 0);
    r.host.inject(|f| f.journal_full_after = Some(1));
    assert!(r.pool.lease(&req).is_err());
    r.check();
    assert!(
        r.host.pins().is_empty(),
        "the commit's failure drops the pin"
    );
    assert!(r.pool.leases().is_empty());
}
