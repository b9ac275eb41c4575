//! Released lease files with holes: QEMU `discard-data=on` (libvirt `<discard/>`) punches
//! every page out when it exits, a balloon punches single pages. The pool refills the holes
//! with kernel-zeroed pages, scrubs only what is still present, and its accounting stays
//! exact against the kernel's free pages and the mount's blocks.

mod daemon_util;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use daemon_util::lessee::{in_cgroup, nonzero_then_dirty, Lessee, TestCgroup};
use daemon_util::{Daemon, Env, MIB};
use hugeprep::hugetlb::pool::{self as kpool, Scope};
use hugeprep::pool::{LeaseInfo, LeaseSource};
use hugeprep::vmm::{qemu as vmm_qemu, GuestMemoryFile};
use hugeprep::PageSize;
use hugeprep_testkit::qemu::{self, QemuVm};

const LEASE: u64 = 64 * MIB;

#[test]
fn lessee_entry() {
    daemon_util::lessee::entry();
}
const PAGE: u64 = 2 * MIB;

fn free_pages() -> u64 {
    kpool::read(Scope::System, PageSize::Size2M).unwrap().free
}

fn blocks(lease: &LeaseInfo) -> u64 {
    std::fs::metadata(&lease.path).unwrap().blocks() * 512 / PAGE
}

/// A daemon whose target (192 MiB in one size, the fixed shape: no learning of the leases'
/// 64 MiB) the 128 MiB mount can never fill, so the refill worker stays out of the way and
/// a released file is kept and scrubbed.
fn daemon(env: &Env) -> Daemon {
    let config = env.dir.join("fixed-shape.toml");
    std::fs::write(&config, "[pool]\nshape = \"fixed\"\n").unwrap();
    env.spawn(&[
        "--config",
        config.to_str().unwrap(),
        "--warm",
        "192M",
        "--sizes",
        "192M",
        "--verify",
        "full",
    ])
}

/// Releases `lease` and checks the pool is whole again: the file kept warm with every page
/// present, the kernel's free pages back at `free`, the mount's blocks equal to the pool's.
fn release_and_check(env: &Env, d: &Daemon, lease: &LeaseInfo, free: u64, filled: u64) {
    d.release(lease.id).unwrap();
    let status = d.settle(LEASE);
    let k = &status.kinds[0];
    assert_eq!(k.mount_used_bytes, Some(LEASE), "{k:?}");
    assert_eq!(free_pages(), free, "kernel free pages vs pool");
    let log = env.log();
    assert!(
        log.contains(&format!("filled={filled} present={}", LEASE - filled)),
        "no refill of {filled} bytes in the log:\n{log}"
    );
    // The same file comes back as a warm lease: every page present and zero.
    let again = d.lease("again", LEASE).unwrap();
    assert_eq!(again.source, LeaseSource::WarmExact);
    assert_eq!(blocks(&again), LEASE / PAGE);
    assert_eq!(
        nonzero_then_dirty(&again.path, LEASE),
        0,
        "guest data survived the release"
    );
    d.release(again.id).unwrap();
    d.settle(LEASE);
}

#[test]
fn a_lease_qemu_discarded_on_exit_is_refilled_not_scrubbed() {
    let Some(binary) = qemu::find_binary() else {
        hugeprep::testing::missing_tool(
            "qemu-system-x86_64 not installed (apt install qemu-system-x86)",
        );
        return;
    };
    if !Path::new("/dev/kvm").exists() {
        hugeprep::testing::missing_tool("/dev/kvm missing: QEMU cannot use accel=kvm");
        return;
    }
    let env = Env::new("pool-holes-qemu", 128 * MIB);
    let d = daemon(&env);
    let lease = d.lease("vm", LEASE).unwrap();
    nonzero_then_dirty(&lease.path, LEASE);
    let free = free_pages();

    let qmp = env.dir.join("qmp.sock");
    let mut args = qemu::vm_args(&qmp);
    let mut memory = vmm_qemu::machine_args(&GuestMemoryFile {
        id: "mem0",
        path: &lease.path,
        size: lease.size,
        node: Some(lease.node),
    });
    memory[3].push_str(",discard-data=on");
    args.extend(memory);
    // QEMU runs in a cgroup of its own, as libvirt starts it: once it has exited the
    // release is proven and the file is kept (docs/security.md).
    let cgroup = TestCgroup::new("pool-holes-qemu");
    let argv = [vec![binary.display().to_string()], args].concat();
    let mut vm =
        QemuVm::spawn_args(Path::new("/bin/sh"), &in_cgroup(&cgroup, &argv), &qmp).unwrap();
    assert_eq!(vm.wait_ready(Duration::from_secs(60)).unwrap(), "prelaunch");
    assert_eq!(free_pages(), free, "QEMU took hugepages of its own");
    vm.quit(Duration::from_secs(30));

    // QEMU punched every page out although the pool holds another link.
    assert_eq!(blocks(&lease), 0);
    assert_eq!(free_pages(), free + LEASE / PAGE);
    release_and_check(&env, &d, &lease, free, LEASE);
}

#[test]
fn a_lease_with_some_pages_punched_out_is_scrubbed_only_where_present() {
    let env = Env::new("pool-holes-punch", 128 * MIB);
    let d = daemon(&env);
    let lease = d.lease("balloon", LEASE).unwrap();
    let free = free_pages();
    let punched = [3u64, 4, 5, 20, 31];
    // The guest's balloon, in the VM's own cgroup: fills, punches, exits.
    let mut balloon = Lessee::spawn(
        "punch",
        &lease.path,
        LEASE,
        true,
        &[("HUGEPREP_LESSEE_PAGES", "3,4,5,20,31")],
    );
    balloon.ready();
    balloon.exit();
    assert_eq!(blocks(&lease), LEASE / PAGE - punched.len() as u64);
    assert_eq!(free_pages(), free + punched.len() as u64);
    release_and_check(&env, &d, &lease, free, punched.len() as u64 * PAGE);
}
