//! The isolation invariant: no byte written through one lease is readable through a later
//! one.

mod daemon_util;

use daemon_util::{map_lease, write_pattern, Env, MIB};
use hugeprep::pool::LeaseSource;

#[test]
fn released_memory_leased_again_holds_no_byte_of_the_pattern() {
    // The mount holds exactly one 8 MiB file, so the second lease must reuse its pages.
    let env = Env::new("leak", 8 * MIB);
    for verify in ["full", "sample"] {
        let d = env.spawn(&["--warm", "8M", "--verify", verify]);
        d.settle(8 * MIB);
        let first = d.lease("first", 8 * MIB).unwrap();
        assert_eq!(first.source, LeaseSource::WarmExact);
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&first.path).unwrap());
        write_pattern(&first, 0x5a);
        d.release(first.id).unwrap();
        d.settle(8 * MIB);
        let second = d.lease("second", 8 * MIB).unwrap();
        assert_eq!(second.source, LeaseSource::WarmExact);
        let ino2 = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&second.path).unwrap());
        assert_eq!(ino, ino2, "the same file was handed out again");
        let (f, r) = map_lease(&second);
        let leaked = r.as_slice().iter().filter(|&&b| b != 0).count();
        assert_eq!(leaked, 0, "{leaked} bytes of the first lease are readable");
        drop((r, f));
        d.release(second.id).unwrap();
        d.settle(8 * MIB);
    }
}

#[test]
fn a_file_still_mapped_by_its_last_holder_is_not_recycled() {
    let env = Env::new("holder", 8 * MIB);
    let d = env.spawn(&["--warm", "8M"]);
    d.settle(8 * MIB);
    let lease = d.lease("held", 8 * MIB).unwrap();
    let (f, r) = map_lease(&lease);
    d.release(lease.id).unwrap();
    // This process still maps the file: the daemon deletes it rather than scrub it for
    // someone else; its pages stay with us until we unmap.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let p = d.pool();
        let k = &p.kinds[0];
        if k.dirty_bytes == 0 && k.scrubbing_bytes == 0 && k.warm_bytes == 0 && k.filling_bytes == 0
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{k:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(Env::names(&env.pool_dir()).is_empty());
    drop((r, f));
    // Now the pages are free and the refill worker makes a fresh warm file.
    d.settle(8 * MIB);
}
