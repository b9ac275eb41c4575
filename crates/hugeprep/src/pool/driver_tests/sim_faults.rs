//! The host's faults the seeded simulation (`driver_tests::sim`) injects, and the keeper's
//! turns.

use super::host::sim::ProofMode;
use super::sim::{Rng, PAGES};
use super::*;

/// A fault of the host from here on.
pub(super) fn fault_step(r: &Rig, rng: &mut Rng, n: u64) -> String {
    match n {
        85..=86 => {
            let full = rng.chance(500).then_some(rng.below(3));
            r.host.inject(|f| f.journal_full_after = full);
            format!("journal full after {full:?} more writes")
        }
        87 => {
            let phantom = rng.below(3) * rng.below(6);
            r.host.inject(|f| f.phantom_pages = phantom);
            format!("kernel counts {phantom} pages it does not have")
        }
        88..=89 => proofs(r, rng),
        98 => {
            let rate = rng.below(3) * 250;
            r.host.inject(|f| f.unlink_error_per_mille = rate);
            format!("{rate}/1000 of pool-file unlinks fail (EIO, EBUSY)")
        }
        97 => {
            let rate = rng.below(3) * 100;
            let seed = rng.next();
            r.host.inject(|f| {
                f.io_error_per_mille = rate;
                f.io_seed = seed;
            });
            format!("{rate}/1000 of links, truncates, resizes, cuts and chowns fail")
        }
        90 => {
            let fails = rng.chance(300);
            r.host.inject(|f| f.scrub_fails = fails);
            format!("scrubs fail: {fails}")
        }
        91 => {
            let fails = rng.chance(300);
            r.host.inject(|f| f.create_fails = fails);
            format!("creates fail: {fails}")
        }
        92 => {
            let pages = rng.below(9) as i64 - 4;
            r.host.take_free(0, PS, pages);
            format!("another user takes {pages} free pages")
        }
        93 => {
            let (memory, fragmented) = (rng.below(2 * PAGES), rng.below(8));
            r.host.set_memory(0, memory * PS.bytes());
            r.host.fragment(0, fragmented * PS.bytes());
            format!("{memory} pages of memory, {fragmented} fragmented")
        }
        94 => keeper_turn(r, rng),
        _ => {
            let secs = rng.below(4000);
            r.host.advance(Duration::from_secs(secs));
            format!("time jumps {secs} s")
        }
    }
}

/// How the proofs answer from here on (a slow one runs [`lease_during_proof`]).
fn proofs(r: &Rig, rng: &mut Rng) -> String {
    let mode = match rng.below(5) {
        0 => ProofMode::Held,
        1 => ProofMode::Fail,
        2 => ProofMode::Slow,
        _ => ProofMode::Pass,
    };
    r.host.inject(|f| f.proof = mode);
    if mode == ProofMode::Slow {
        r.host
            .during_proof(Some(lease_during_proof(r, rng.below(4))));
    }
    format!("proofs: {mode:?}")
}

/// What runs inside a slow proof: another VM leases, writes its bytes and (unless `keep`
/// is 0) releases while the worker waits for the proof, as leases go on meanwhile on a
/// real host. The pool is the one of the proof's run (a weak reference: a crash inside the
/// hook unwinds through the proof, and the next daemon's pool is another).
fn lease_during_proof(r: &Rig, keep: u64) -> super::host::sim::ProofHook {
    let pool = Arc::downgrade(&r.pool);
    let host = Arc::clone(&r.host);
    let mut n = 0u64;
    Box::new(move || {
        let Some(pool) = pool.upgrade() else {
            return;
        };
        n += 1;
        // Past a lease's wait at its first turn: a lease that would wait for the file
        // under proof is refused at once (the proof does not end while the hook runs).
        let tick = Duration::from_secs(200);
        host.inject(|f| f.tick = tick);
        let leased = pool.lease(&request(&format!("during-proof{n}"), 2 + 2 * (n % 2)));
        host.inject(|f| f.tick = Duration::ZERO);
        if let Ok(info) = leased {
            host.write(&info.path, &format!("lessee-{}", info.id));
            if keep != 0 {
                // A refused release leaves the lease, released at the end.
                let _ = pool.release(info.id);
            }
        }
    })
}

/// The keeper's turn; the holders of kept files may let go first.
fn keeper_turn(r: &Rig, rng: &mut Rng) -> String {
    let go = rng.chance(500);
    if go {
        r.host.let_go();
    }
    r.pool.reclaim_kept(None);
    format!("keeper's turn (holders let go: {go})")
}
