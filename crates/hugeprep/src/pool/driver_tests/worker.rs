//! The worker's fill, trim and delete jobs, drains and shutdown.

use super::*;

#[test]
fn the_worker_fills_the_pool_to_its_target() {
    let r = rig(&target(8, &[4]), 16);
    let jobs = r.settle();
    assert_eq!(jobs, 2);
    assert_eq!(r.warm_bytes(), 8 * MIB);
    assert_eq!(r.free(), 12);
    assert!(r.pool.counters().refill_faulted_bytes >= 8 * MIB);
}

#[test]
fn without_a_target_the_worker_has_nothing_to_do() {
    let r = rig("", 16);
    assert_eq!(r.settle(), 0);
    assert!(r.host.files().is_empty());
    assert!(r.pool.is_idle());
}

#[test]
fn the_refill_stops_where_the_kernels_free_pages_end() {
    let r = rig(&target(16, &[4]), 5);
    r.settle();
    assert_eq!(r.warm_bytes(), 8 * MIB);
    assert_eq!(r.free(), 1);
}

#[test]
fn the_pool_refills_after_a_lease_takes_a_warm_file() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    r.lease("vm1", 8).unwrap();
    assert_eq!(r.warm_bytes(), 0);
    r.settle();
    assert_eq!(r.warm_bytes(), 8 * MIB);
    assert_eq!(r.free(), 8);
}

#[test]
fn a_lower_target_trims_the_pool_and_gives_pages_back() {
    let r = rig(&target(16, &[4]), 16);
    r.settle();
    assert_eq!(r.free(), 8);
    let policy = PoolPolicy::from_toml(&format!(
        "reserve = false\nlessee_grace_ms = 0\n{}",
        target(4, &[4])
    ))
    .unwrap();
    r.pool.set_policy(policy);
    r.settle();
    assert_eq!(r.warm_bytes(), 4 * MIB);
    assert_eq!(r.free(), 14);
}

#[test]
fn a_drain_deletes_warm_files_and_keeps_the_kind_empty() {
    let r = rig(&target(8, &[4]), 16);
    r.settle();
    let report = r
        .pool
        .drain(&DrainRequest::default(), Duration::ZERO)
        .unwrap();
    r.check();
    assert_eq!(report.kinds[0].deleted_bytes, 8 * MIB);
    assert!(r.host.files().is_empty());
    assert_eq!(r.free(), 16);
    assert_eq!(r.settle(), 0, "a drained kind is not refilled");
}

#[test]
fn a_drain_keeps_live_leases() {
    let r = rig(&target(8, &[4]), 16);
    r.settle();
    let info = r.lease("vm1", 4).unwrap();
    let report = r
        .pool
        .drain(&DrainRequest::default(), Duration::ZERO)
        .unwrap();
    r.check();
    assert_eq!(report.kinds[0].leased_bytes, 4 * MIB);
    assert_eq!(r.pool.get(info.id).unwrap().size, 4 * MIB);
    assert_eq!(r.states(), ["leased"]);
}

#[test]
fn a_resumed_kind_refills() {
    let r = rig(&target(8, &[4]), 16);
    r.settle();
    r.pool
        .drain(&DrainRequest::default(), Duration::ZERO)
        .unwrap();
    assert_eq!(r.pool.resume(None, None).unwrap(), [(0, PS)]);
    r.settle();
    assert_eq!(r.warm_bytes(), 8 * MIB);
}

#[test]
fn a_drain_of_an_unknown_node_is_a_field_error() {
    let r = rig("", 16);
    let req = DrainRequest {
        node: Some(4096),
        ..DrainRequest::default()
    };
    let err = r.pool.drain(&req, Duration::ZERO).unwrap_err();
    assert!(
        matches!(err, PoolError::Field { field: "node", .. }),
        "{err}"
    );
}

#[test]
fn a_drained_release_is_deleted_by_the_worker() {
    let r = rig(&target(8, &[8]), 16);
    r.settle();
    let info = r.lease("vm1", 8).unwrap();
    r.pool
        .drain(&DrainRequest::default(), Duration::ZERO)
        .unwrap();
    r.host.write(&r.path("vm1"), "tenant-a");
    r.release(&info).unwrap();
    r.settle();
    assert!(r.host.files().is_empty());
    assert_eq!(r.free(), 16);
}

#[test]
fn a_clean_shutdown_is_journaled_when_nothing_is_in_flight() {
    let r = rig(&target(8, &[4]), 16);
    r.settle();
    r.pool.shutdown();
    r.pool.mark_clean_shutdown().unwrap();
    assert!(r.host.clean());
}

#[test]
fn a_clean_shutdown_journals_a_dirty_file_first() {
    let r = rig("", 16);
    let info = r.lease("vm1", 4).unwrap();
    r.release(&info).unwrap();
    r.pool.shutdown();
    r.pool.mark_clean_shutdown().unwrap();
    assert!(r.host.clean());
    let journal = r.host.journal();
    assert!(journal
        .values()
        .all(|rec| matches!(rec.state, FileState::Dirty | FileState::Warm)));
}

#[test]
fn the_worker_does_nothing_after_shutdown() {
    let r = rig(&target(8, &[4]), 16);
    r.pool.shutdown();
    let worker = r.pool.spawn_worker().unwrap();
    worker.join().unwrap();
    assert!(r.host.files().is_empty());
}

#[test]
fn a_lease_waiting_for_a_scrub_is_served_by_the_running_worker() {
    // The kernel has no page to spare: the lease waits for the released file.
    let r = rig(&target(8, &[8]), 4);
    r.settle();
    let a = r.lease("a", 8).unwrap();
    r.host.write(&r.path("a"), "tenant-a");
    r.release(&a).unwrap();
    let worker = r.pool.spawn_worker().unwrap();
    let b = r.pool.lease(&request("b", 8)).unwrap();
    r.pool.shutdown();
    worker.join().unwrap();
    r.check();
    // Scrubbed and handed out, or given up for room and faulted anew: never dirty.
    assert!(
        matches!(b.source, LeaseSource::WarmExact | LeaseSource::Cold),
        "{:?}",
        b.source
    );
    assert!(r.host.leaks().is_empty());
}

#[test]
fn status_counts_warm_and_leased_bytes() {
    let r = rig(&target(8, &[4]), 16);
    r.settle();
    r.lease("vm1", 4).unwrap();
    let status = serde_json::to_value(r.pool.status()).unwrap();
    let text = status.to_string();
    assert!(text.contains("warm"), "{text}");
}
