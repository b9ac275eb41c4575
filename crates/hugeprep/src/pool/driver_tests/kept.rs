//! Released files a lessee still holds (pages it pins, a read lease) are kept under their
//! `kept-` name, charged to it, until it lets go; then the keeper truncates and removes
//! them. The rig checks after every step that each kept file is the keeper's alone.

use super::host::sim::{Hold, ProofMode};
use super::*;

const PINNED: Hold = Hold {
    read_lease: false,
    pinned: 1,
};
const READ_LEASE: Hold = Hold {
    read_lease: true,
    pinned: 0,
};

/// A rig whose lease "vm1" of 4 MiB (2 pages) its lessee holds as `hold` past its release,
/// released; the proof fails, so the worker gives it the kernel's path.
fn released_held(hold: Hold) -> Rig {
    let r = rig("", 16);
    let info = r.lease("vm1", 4).unwrap();
    r.host.write(&r.path("vm1"), "vm1");
    r.host.hold(&r.path("vm1"), hold);
    r.host.inject(|f| f.proof = ProofMode::Fail);
    r.release(&info).unwrap();
    r.settle();
    r
}

/// The keeper's turn, then the rig's checks.
fn keeper_turn(r: &Rig) {
    r.pool.reclaim_kept(None);
    r.check();
}

#[test]
fn a_pinned_release_is_kept_then_reclaimed_when_unpinned() {
    let r = released_held(PINNED);
    assert_eq!(r.host.kept_files().len(), 1, "kept under its kept name");
    // The page nobody pins went back at once; the pinned one stays charged.
    assert_eq!(r.free(), 15);
    assert_eq!(r.pool.kept_totals(), (1, 2 * MIB));
    keeper_turn(&r);
    assert_eq!(r.host.kept_files().len(), 1, "still pinned");
    r.host.let_go();
    keeper_turn(&r);
    assert!(r.host.kept_files().is_empty());
    assert!(r.host.files().is_empty());
    assert_eq!(r.pool.kept_totals(), (0, 0));
    assert_eq!(r.free(), 16);
}

#[test]
fn a_release_under_a_read_lease_is_kept_until_the_lease_is_gone() {
    let r = released_held(READ_LEASE);
    assert_eq!(r.host.kept_files().len(), 1);
    assert_eq!(r.free(), 14, "its pages are all held");
    keeper_turn(&r);
    assert_eq!(r.host.kept_files().len(), 1, "the lease still holds it");
    r.host.let_go();
    keeper_turn(&r);
    assert!(r.host.files().is_empty());
    assert_eq!(r.free(), 16);
}

#[test]
fn kept_files_are_adopted_after_a_restart() {
    let mut r = released_held(PINNED);
    r.restart();
    r.check();
    // Charged by its length until the keeper finds it pinned again, then by its pages.
    assert_eq!(r.pool.kept_totals(), (1, 4 * MIB), "kept again");
    keeper_turn(&r);
    assert_eq!(r.pool.kept_totals(), (1, 2 * MIB));
    r.host.let_go();
    keeper_turn(&r);
    assert!(r.host.files().is_empty());
    assert_eq!(r.free(), 16);
}

/// A crash before each effect of a held file's release and kernel's path (between its
/// rename and the removal of its record among them): after recovery, nothing leaks.
#[test]
fn a_crash_anywhere_in_keeping_a_file_leaks_nothing() {
    let mut between = false;
    for effects in 0..40 {
        let mut r = rig("", 16);
        let info = r.lease("vm1", 4).unwrap();
        r.host.hold(&r.path("vm1"), PINNED);
        r.host.inject(|f| {
            f.proof = ProofMode::Fail;
            f.crash_after = Some(effects);
        });
        let run = std::panic::AssertUnwindSafe(|| {
            r.pool.release(info.id).unwrap();
            while r.pool.work_once() {}
        });
        if std::panic::catch_unwind(run).is_ok() {
            break;
        }
        let crashed = r.host.crashed_at();
        between |= crashed.contains_key("unjournal") && !r.host.kept_files().is_empty();
        r.host.inject(|f| f.proof = ProofMode::Pass);
        r.restart();
        r.check();
        r.settle();
        r.host.let_go();
        keeper_turn(&r);
        // A lease recovery kept is released and its file kept or recycled as usual.
        let leased = r
            .pool
            .lock()
            .core
            .files()
            .find_map(|e| match &e.rec().state {
                FileState::Leased(l) => Some(l.id),
                _ => None,
            });
        if let Some(id) = leased {
            r.pool.release(id).unwrap();
        }
        r.settle();
        r.pool
            .drain(&DrainRequest::default(), Duration::ZERO)
            .unwrap();
        r.settle();
        keeper_turn(&r);
        assert!(
            r.host.files().is_empty(),
            "crash after {effects}: {:?}",
            r.host.files()
        );
        assert_eq!(r.free(), 16, "crash after {effects}");
    }
    assert!(
        between,
        "no crash between a rename and the record's removal"
    );
}
