//! Raises of the kernel's pools for the warm target and for leases, and their release, on
//! the simulated kernel: it gives what its memory allows (fewer pages than asked when short
//! or fragmented), gives back only free pages, and other users change the pools meanwhile.
//! The ledger never claims more than the pool got (checked after every step by the rig).

use super::*;

/// A rig whose pool raises the kernel's pools (no margin kept), with `memory` pages of
/// memory beyond its `free` free pages, `fragmented` of them usable only after a compaction.
fn reserving(toml: &str, free: u64, memory: u64, fragmented: u64) -> Rig {
    let mut r = rig(toml, free);
    r.host.set_memory(0, memory * PS.bytes());
    r.host.fragment(0, fragmented * PS.bytes());
    r.policy.reserve.enabled = true;
    r.policy.reserve.margin = 0;
    r.pool.set_policy(r.policy.clone());
    r
}

fn drain(r: &Rig, release_pools: bool) -> DrainReport {
    let req = DrainRequest {
        release_pools,
        ..DrainRequest::default()
    };
    let report = r.pool.drain(&req, Duration::ZERO).expect("a drain");
    r.settle();
    r.check();
    report
}

#[test]
fn the_worker_raises_the_kernels_pool_for_its_target_and_records_it() {
    let r = reserving(&target(16, &[4]), 2, 32, 0);
    r.settle();
    assert_eq!(r.warm_bytes(), 16 * MIB);
    assert_eq!(r.host.ledger(0, PS), 6, "the pages the target lacked");
    assert_eq!(r.pool.reservations().added(0, PS), 6);
    assert_eq!(r.host.total_pages(0, PS), 8);
}

#[test]
fn a_short_kernel_adds_fewer_pages_and_the_ledger_records_only_those() {
    // Memory for 3 more pages: the target of 8 pages stays short, and says why.
    let r = reserving(&target(16, &[4]), 2, 3, 0);
    r.settle();
    assert_eq!(r.host.ledger(0, PS), 3);
    assert_eq!(r.host.total_pages(0, PS), 5);
    let status = r.pool.status();
    let reasons: Vec<_> = status
        .kinds
        .iter()
        .filter_map(|k| k.reason.clone())
        .collect();
    assert!(!reasons.is_empty(), "the shortfall is explained");
}

#[test]
fn compaction_makes_fragmented_memory_usable_for_a_raise() {
    // 8 pages of memory, all fragmented: each compaction halves it.
    let r = reserving(&target(16, &[4]), 0, 8, 8);
    r.settle();
    assert!(r.pool.compaction_counts().compactions > 0);
    let added = r.host.ledger(0, PS);
    assert!(added > 0 && added <= 8, "{added}");
    assert_eq!(r.host.total_pages(0, PS), added);
}

#[test]
fn a_lease_beyond_the_free_pages_raises_the_pool_and_a_drain_gives_it_back() {
    let r = reserving("", 2, 16, 0);
    let info = r.lease("vm1", 8).expect("a lease the raise covers");
    assert_eq!(r.host.ledger(0, PS), 2);
    // Leased pages stay with the lease: the drain gives back only free ones.
    let report = drain(&r, true);
    assert_eq!(report.released.iter().map(|x| x.kept).sum::<u64>(), 2);
    assert_eq!(r.host.ledger(0, PS), 2);
    r.release(&info).unwrap();
    r.settle();
    let report = drain(&r, true);
    assert_eq!(report.released.iter().map(|x| x.released).sum::<u64>(), 2);
    assert_eq!(r.host.ledger(0, PS), 0);
    assert_eq!(r.host.total_pages(0, PS), 2, "the pool as it was");
}

#[test]
fn a_lease_the_memory_cannot_cover_raises_nothing() {
    let r = reserving("", 2, 1, 0);
    assert!(r.lease("vm1", 8).is_err());
    assert_eq!(r.host.ledger(0, PS), 0);
    assert_eq!(r.host.total_pages(0, PS), 2);
}

#[test]
fn pages_other_users_took_stay_recorded_until_they_are_free() {
    let r = reserving(&target(8, &[4]), 0, 16, 0);
    r.settle();
    assert_eq!(r.host.ledger(0, PS), 4);
    drain(&r, false);
    // Another user maps 3 of the free pages hugeprep added.
    r.host.take_free(0, PS, 3);
    drain(&r, true);
    assert_eq!(r.host.ledger(0, PS), 3, "only the free page went back");
    r.host.take_free(0, PS, -3);
    drain(&r, true);
    assert_eq!(r.host.ledger(0, PS), 0);
}

#[test]
fn a_crash_between_the_raise_and_the_ledger_leaves_pages_unrecorded_never_overrecorded() {
    let mut r = reserving(&target(8, &[4]), 0, 16, 0);
    // The next effects: the pool's resize, then the ledger's write.
    r.host.inject(|f| f.crash_after = Some(1));
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.pool.work_once()));
    assert!(crashed.is_err(), "the crash before the ledger write");
    assert_eq!(r.host.ledger(0, PS), 0);
    assert_eq!(r.host.total_pages(0, PS), 4, "the kernel added them");
    r.restart();
    r.check();
    assert_eq!(r.pool.reservations().added(0, PS), 0);
}

/// Compactions a raise of 64 fragmented pages makes when every reading of the host's
/// clock moves it on `tick`.
fn compactions_with_tick(tick: Duration) -> u32 {
    use super::host::Host;
    let r = reserving("", 0, 64, 64);
    r.host.inject(|f| f.tick = tick);
    let host = Arc::clone(&r.host);
    let raise = r
        .pool
        .reservations()
        .raise_compacting((0, PS), 64, 0, &|| host.now())
        .expect("a raise");
    r.host.inject(|f| f.tick = Duration::ZERO);
    r.check();
    raise.compactions
}

#[test]
fn the_compaction_budget_is_measured_on_the_hosts_clock() {
    // Each compaction makes half the fragmented memory whole: on a steady clock the raise
    // compacts until it has what it asked for.
    let steady = compactions_with_tick(Duration::ZERO);
    assert!(steady > 2, "{steady}");
    // A clock that jumps 2 s at each reading spends the 5 s budget after two rounds.
    assert_eq!(compactions_with_tick(Duration::from_secs(2)), 2);
}
