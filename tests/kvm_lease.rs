//! The rust-vmm path against the real daemon and /dev/kvm: a KVM guest whose RAM is a
//! (pinned) lease checks the memory is zero, writes a value across it and halts; the host
//! reads the values through the lease file; the released lease comes back scrubbed.

#![cfg(feature = "kvm")]

mod daemon_util;

use daemon_util::{Env, MIB};
use hugeprep::hugetlb::BackingFile;
use hugeprep::pool::LeaseRequest;
use hugeprep::vmm::kvm_guest::{check_zero_and_write, spread_addresses, KvmGuestError};
use hugeprep::vmm::vm_memory::guest_memory;
use vm_memory::GuestAddress;

const VALUE: u32 = 0x4855_4745;

fn kvm_available() -> bool {
    if std::path::Path::new("/dev/kvm").exists() {
        return true;
    }
    hugeprep::testing::missing_tool("/dev/kvm");
    false
}

#[test]
fn kvm_guest_on_a_pinned_lease_writes_through_to_the_file() {
    if !kvm_available() {
        return;
    }
    let env = Env::new("kvm-lease", 16 * MIB);
    let d = env.spawn(&["--warm", "8M", "--sizes", "8M"]);
    d.settle(8 * MIB);
    let size = 8 * MIB;
    let lease = d
        .lease_req(&LeaseRequest {
            name: "kvm".into(),
            size,
            pin: true,
            ..LeaseRequest::default()
        })
        .unwrap();
    assert!(lease.pinned);
    let file = BackingFile::open(&lease.path, lease.page_size).unwrap();
    let addrs = spread_addresses(size);
    assert_eq!(addrs.len(), 3);
    let mem = guest_memory(&file, GuestAddress(0)).unwrap();
    check_zero_and_write(mem, size, &addrs, VALUE).unwrap();
    let view = file.map().unwrap();
    let bytes = view.as_slice();
    for &a in &addrs {
        let at = a as usize;
        assert_eq!(bytes[at..at + 4], VALUE.to_le_bytes(), "at {a:#x}");
        // Only the value was written: the rest of the checked page is still zero.
        assert!(
            bytes[at + 4..at + 4096].iter().all(|&b| b == 0),
            "at {a:#x}"
        );
    }
    drop(view);
    drop(file);
    d.release(lease.id).unwrap();
    d.settle(8 * MIB);
    let again = d.lease("again", size).unwrap();
    assert!(daemon_util::lease_is_zero(&again));
}

#[test]
fn kvm_guest_reports_dirty_memory() {
    if !kvm_available() {
        return;
    }
    let env = Env::new("kvm-dirty", 8 * MIB);
    let d = env.spawn(&[]);
    let lease = d.lease("dirty", 4 * MIB).unwrap();
    let file = BackingFile::open(&lease.path, lease.page_size).unwrap();
    file.map().unwrap().as_mut_slice()[(2 << 20) + 100] = 1;
    let mem = guest_memory(&file, GuestAddress(0)).unwrap();
    let err = check_zero_and_write(mem, 4 * MIB, &[2 << 20], VALUE).unwrap_err();
    let KvmGuestError::NotZero { near } = err else {
        panic!("{err}");
    };
    assert!((2 << 20..(2 << 20) + 4096).contains(&near), "{near:#x}");
}
