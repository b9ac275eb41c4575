//! The pool shaped by demand, against the real daemon: the quick start's `--warm 4G` serves
//! repeated 4 GiB leases warm-exact, a pool learns a lease size its `sizes` mix lacks, and
//! flavors from the configuration file are kept as files of exactly their sizes, and a
//! released file the shape lacks is scrubbed within the lessee grace.

mod daemon_util;

use daemon_util::{Env, MIB};
use hugeprep::pool::LeaseSource;

const GIB: u64 = 1 << 30;

/// The first complaint: `serve --warm 4G` then repeated 4 GiB leases grew each lease
/// cold from 1 GiB files. Every lease from the second on must be warm-exact (the first too,
/// once the pool has filled).
#[test]
fn warm_4g_serves_repeated_4g_leases_warm_exact() {
    // One leased 4 GiB file plus the 4 GiB refilled beside it, and room for a scrub.
    let env = Env::new("shape4g", 9 * GIB);
    let d = env.spawn(&["--warm", "4G"]);
    d.settle(4 * GIB);
    for i in 0..4 {
        let l = d.lease(&format!("vm{i}"), 4 * GIB).unwrap();
        assert_eq!(l.source, LeaseSource::WarmExact, "lease {i}");
        d.release(l.id).unwrap();
        let p = d.settle(4 * GIB);
        assert_eq!(p.kinds[0].warm_files, 1, "{:?}", p.kinds[0]);
    }
    assert_eq!(env.mount_used(), 4 * GIB);
}

/// A size the `sizes` mix does not have: the first lease grows a file, its released file is
/// scrubbed and kept, the 16 MiB files nobody asks for are given back, and every later lease
/// of that size is warm-exact.
#[test]
fn the_pool_learns_a_leased_size_and_gives_back_the_others() {
    let env = Env::new("shapelearn", 160 * MIB);
    // A lessee grace, as in production: a warm-exact lease's refill waits for it, so the
    // release that follows finds the pool short and its file is scrubbed and kept (with no
    // grace the refill can win the race and the released file is the one given back).
    let d = env.spawn(&[
        "--warm",
        "64M",
        "--sizes",
        "16M",
        "--lessee-grace-ms",
        "1000",
    ]);
    let p = d.settle(64 * MIB);
    assert_eq!(p.kinds[0].warm_files, 4);
    let first = d.lease("first", 32 * MIB).unwrap();
    assert_eq!(first.source, LeaseSource::WarmGrown);
    d.release(first.id).unwrap();
    // Without a lessee grace the worker reshapes in several rounds, and the pool passes
    // through 64 MiB in three files (the kept 32 MiB file and two 16 MiB ones) on its way:
    // wait for the shape (a liveness bound, not a speed assertion).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let p = d.settle(64 * MIB);
        if p.kinds[0].warm_files == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "two 32 MiB files: {:?}",
            p.kinds[0]
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for i in 0..4 {
        let l = d.lease(&format!("vm{i}"), 32 * MIB).unwrap();
        assert_eq!(l.source, LeaseSource::WarmExact, "lease {i}");
        d.release(l.id).unwrap();
        d.settle(64 * MIB);
    }
    assert!(
        env.log().contains("scrubbed and verified"),
        "released files are kept"
    );
    assert_eq!(env.mount_used(), 64 * MIB);
}

/// Flavors name the files to keep; a configuration file sets them; recovered files of the
/// old shape are reshaped at the next start by cutting, not by faulting new ones.
#[test]
fn flavors_from_the_config_file_and_recovered_files_are_cut_to_them() {
    let env = Env::new("shapeflavors", 96 * MIB);
    let d = env.spawn(&["--warm", "48M", "--sizes", "24M"]);
    d.settle(48 * MIB);
    let mut d = d;
    d.stop(); // a clean stop: the warm files are trusted at the next start
    let config = env.dir.join("config.toml");
    std::fs::write(
        &config,
        "[pool]\n[[pool.target]]\npage_size = \"2M\"\n\
         flavors = [{ size = \"16M\", count = 2 }, { size = \"8M\", count = 2 }]\n",
    )
    .unwrap();
    let d = env.spawn(&["--config", config.to_str().unwrap()]);
    // The recovered files already make 48 MiB: settling alone may answer before the cuts.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let p = d.settle(48 * MIB);
        if p.kinds[0].warm_files == 4 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{:?}", p.kinds[0]);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let log = env.log();
    assert!(log.contains("cut to a size in demand"), "{log}");
    for (i, size) in [16, 16, 8, 8].iter().enumerate() {
        let l = d.lease(&format!("f{i}"), size * MIB).unwrap();
        assert_eq!(l.source, LeaseSource::WarmExact, "{size} MiB");
    }
}

/// Under a stream of leases the lessee grace (here 60 s, restarted by every lease and
/// release) never ends: a released file that the shape lacks is still scrubbed and kept
/// within it, so the next lease of its size is warm-exact, while the refill of a file taken
/// by a warm-exact lease still waits for the grace (nothing missed).
#[test]
fn a_released_file_the_shape_lacks_is_scrubbed_within_the_lessee_grace() {
    let env = Env::new("shapegrace", 160 * MIB);
    let d = env.spawn(&[
        "--warm",
        "64M",
        "--sizes",
        "32M",
        "--lessee-grace-ms",
        "60000",
    ]);
    d.settle(64 * MIB);
    let a = d.lease("a", 32 * MIB).unwrap();
    assert_eq!(a.source, LeaseSource::WarmExact);
    // The grace holds the refill: the pool served the lease warm-exact.
    let k = &d.pool().kinds[0];
    assert_eq!((k.warm_bytes, k.filling_bytes), (32 * MIB, 0), "{k:?}");
    d.release(a.id).unwrap();
    // Well within the grace (a liveness bound, not a timing): scrubbed and kept.
    let p = d.settle(64 * MIB);
    assert_eq!(p.kinds[0].warm_files, 2, "{:?}", p.kinds[0]);
    for i in 0..3 {
        let l = d.lease(&format!("vm{i}"), 32 * MIB).unwrap();
        assert_eq!(l.source, LeaseSource::WarmExact, "lease {i}");
        d.release(l.id).unwrap();
        d.settle(64 * MIB);
    }
    assert!(env.log().contains("scrubbed and verified"));
    assert_eq!(env.mount_used(), 64 * MIB);
}
