//! The isolation invariant: no byte written through one lease is readable through a later
//! one.

mod daemon_util;

use daemon_util::lessee::Lessee;
use daemon_util::{map_lease, Env, MIB};
use hugeprep::pool::LeaseSource;

#[test]
fn lessee_entry() {
    daemon_util::lessee::entry();
}

#[test]
fn released_memory_leased_again_holds_no_byte_of_the_pattern() {
    // The mount holds exactly one 8 MiB file, so the second lease must reuse its pages.
    let env = Env::new("leak", 8 * MIB);
    for verify in ["full", "sample"] {
        let d = env.spawn(&["--warm", "8M", "--verify", verify]);
        d.settle(8 * MIB);
        let first = d
            .lease_req(&hugeprep::pool::LeaseRequest {
                name: "first".into(),
                size: 8 * MIB,
                owner: Some("nobody".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(first.source, LeaseSource::WarmExact);
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&first.path).unwrap());
        // The VMM writes its guest's memory and exits, from a cgroup of its own (as libvirt
        // runs QEMU): the released file is proven out of reach and recycled in place.
        let mut vmm = Lessee::spawn("write", &first.path, first.size, true, &[]);
        vmm.nonzero();
        vmm.ready();
        vmm.exit();
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
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&lease.path).unwrap());
    let (f, r) = map_lease(&lease);
    d.release(lease.id).unwrap();
    // This process still maps the file: it takes the kernel's path, not a scrub for someone
    // else. Truncation takes the pages from our mapping (a mapping holds no pages of its
    // own) and the refill makes a new file of them.
    d.settle(8 * MIB);
    let files = Env::names(&env.pool_dir());
    assert_eq!(files.len(), 1);
    let now = std::os::unix::fs::MetadataExt::ino(
        &std::fs::metadata(env.pool_dir().join(&files[0])).unwrap(),
    );
    assert_ne!(now, ino, "the held file was recycled in place");
    let c = d.pool().counters;
    assert_eq!(
        (c.kernel_path_releases, c.unreturned_pages),
        (1, 0),
        "{c:?}"
    );
    assert!(
        env.log().contains("reason=\"open-elsewhere\""),
        "{}",
        env.log()
    );
    assert_eq!(std::fs::metadata(&lease.path).map(|m| m.len()).ok(), None);
    drop((r, f));
}
