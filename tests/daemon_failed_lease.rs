//! A failing request changes nothing: a lease that cannot be served, asked for while another
//! lease's fault is running, deletes no warm file (before the fix a `16T` lease gave back
//! every warm file "to make room" while the fault ran, then failed with 422).

mod daemon_util;

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use daemon_util::{Env, MIB};
use hugeprep::client::ClientError;
use hugeprep::pool::LeaseRequest;

#[test]
fn an_impossible_lease_during_a_fault_leaves_the_warm_pool_whole() {
    const COLD: u64 = 512 * MIB;
    let env = Env::new("failed-lease", COLD + 64 * MIB);
    let d = env.spawn(&["--warm", "16M", "--sizes", "4M"]);
    d.settle(16 * MIB);
    let mut warm = Env::names(&env.pool_dir());
    warm.sort();
    assert_eq!(warm.len(), 4, "{warm:?}");

    // A cold lease of 512 MiB faults for tens of milliseconds; 16T leases are asked for the
    // whole time (at most 2,000, each answered at once).
    let faulting = Arc::new(AtomicBool::new(true));
    let (overlapped, refused) = std::thread::scope(|s| {
        let f = Arc::clone(&faulting);
        let d = &d;
        let asker = s.spawn(move || {
            let (mut overlapped, mut refused) = (0, 0);
            for i in 0..2000 {
                // Counted as during the fault when it was asked for before the fault ended.
                if !f.load(Ordering::SeqCst) {
                    break;
                }
                overlapped += 1;
                let req = LeaseRequest {
                    name: format!("impossible-{i}"),
                    size: 16 << 40,
                    ..Default::default()
                };
                match d.lease_req(&req) {
                    Err(ClientError::Api { status: 422, .. }) => refused += 1,
                    other => panic!("a 16T lease: {other:?}"),
                }
            }
            (overlapped, refused)
        });
        // A warm 4 MiB file grown to 512 MiB: its tail is faulted while 16T leases run.
        let big = d.lease("big", COLD).unwrap();
        faulting.store(false, Ordering::SeqCst);
        let counts = asker.join().unwrap();
        // The pool file it took is the lease's, not lost: leave it out of the comparison.
        let ino = std::fs::metadata(&big.path).map(|m| m.ino()).unwrap();
        warm.retain(|n| std::fs::metadata(env.pool_dir().join(n)).map_or(true, |m| m.ino() != ino));
        d.release(big.id).unwrap();
        counts
    });
    assert!(overlapped > 0, "no 16T lease ran during the fault");
    assert!(refused >= overlapped);
    let mut now = Env::names(&env.pool_dir());
    now.sort();
    for name in &warm {
        assert!(
            now.contains(name),
            "warm file {name} was deleted by a lease that failed: {warm:?} -> {now:?}"
        );
    }
}
