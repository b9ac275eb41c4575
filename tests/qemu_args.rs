//! `hugeprep qemu-args` against the real daemon and a real QEMU/KVM: QEMU started with the
//! printed arguments maps the lease's inode, sees what hugeprep wrote, and takes no new
//! hugepages.

mod daemon_util;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use daemon_util::{map_lease, Daemon, Env, MIB};
use hugeprep::hugetlb::pool::{self as kpool, Scope};
use hugeprep::pool::LeaseInfo;
use hugeprep::PageSize;
use hugeprep_testkit::qemu::{self, QemuVm};

const LEASE: u64 = 64 * MIB;

fn qemu_binary() -> Option<PathBuf> {
    let Some(binary) = qemu::find_binary() else {
        hugeprep::testing::missing_tool(
            "qemu-system-x86_64 not installed (apt install qemu-system-x86)",
        );
        return None;
    };
    if !Path::new("/dev/kvm").exists() {
        hugeprep::testing::missing_tool("/dev/kvm missing: QEMU cannot use accel=kvm");
        return None;
    }
    Some(binary)
}

fn free_pages() -> u64 {
    kpool::read(Scope::System, PageSize::Size2M).unwrap().free
}

/// Runs `hugeprep qemu-args ARGS --json` and returns (success, words or stderr).
fn qemu_args(env: &Env, args: &[&str]) -> Result<Vec<String>, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .arg("qemu-args")
        .args(args)
        .arg("--json")
        .arg("--socket")
        .arg(&env.socket)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Writes `tag` at `offset` of the lease.
fn write_tag(lease: &LeaseInfo, offset: usize, tag: &[u8]) {
    let (_f, mut r) = map_lease(lease);
    r.as_mut_slice()[offset..offset + tag.len()].copy_from_slice(tag);
}

/// Reads guest-physical memory at `gpa` through QEMU (`pmemsave`).
fn guest_bytes(vm: &mut QemuVm, dir: &Path, gpa: u64, len: usize) -> Vec<u8> {
    let out = dir.join("pmem");
    vm.execute_with(
        "pmemsave",
        serde_json::json!({ "val": gpa, "size": len, "filename": out }),
    )
    .unwrap();
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    bytes
}

/// The inodes of files QEMU maps.
fn mapped_inodes(pid: u32) -> Vec<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .filter(|&ino| ino != 0)
        .collect()
}

fn start(env: &Env, words: &[String]) -> QemuVm {
    let binary = qemu_binary().unwrap();
    let qmp = env.dir.join("qmp.sock");
    let mut args = qemu::vm_args(&qmp);
    args.extend(words.iter().cloned());
    let mut vm = QemuVm::spawn_args(&binary, &args, &qmp).unwrap();
    assert_eq!(vm.wait_ready(Duration::from_secs(60)).unwrap(), "prelaunch");
    vm
}

fn warm_daemon(env: &Env, warm: u64) -> Daemon {
    let d = env.spawn(&["--warm", &format!("{}M", warm >> 20), "--sizes", "64M"]);
    d.settle(warm);
    d
}

#[test]
fn qemu_started_with_qemu_args_maps_the_lease_and_takes_no_pages() {
    if qemu_binary().is_none() {
        return;
    }
    let env = Env::new("qemu-args-one", 192 * MIB);
    let d = warm_daemon(&env, LEASE);
    let lease = d.lease("vm one's ram", LEASE).unwrap();
    write_tag(&lease, MIB as usize, b"hugeprep was here");
    d.settle(LEASE); // the pool refills behind the lease
    let free = free_pages();

    // By name and by id: the same arguments.
    let words = qemu_args(&env, &["vm one's ram"]).unwrap();
    assert_eq!(qemu_args(&env, &[&lease.id.to_string()]).unwrap(), words);
    let line = words.join(" ");
    assert!(line.starts_with("-m 64M -object memory-backend-file,id=mem0,size=67108864,mem-path="));
    assert!(line
        .contains(",share=on,prealloc=off,host-nodes=0,policy=bind -machine memory-backend=mem0"));

    let mut vm = start(&env, &words);
    let ino = std::fs::metadata(&lease.path).unwrap().ino();
    assert!(
        mapped_inodes(vm.pid()).contains(&ino),
        "QEMU does not map the lease's inode"
    );
    assert_eq!(
        guest_bytes(&mut vm, &env.dir, MIB, 17),
        b"hugeprep was here"
    );
    assert_eq!(free_pages(), free, "QEMU took hugepages of its own");
    vm.quit(Duration::from_secs(10));

    d.release(lease.id).unwrap();
    d.settle(LEASE);
    // Above target once the lease is back: one 64 MiB file goes back to the kernel.
    assert_eq!(
        free_pages(),
        free + LEASE / (2 * MIB),
        "kernel free pages vs pool"
    );
}

#[test]
fn qemu_args_numa_gives_one_guest_node_per_lease() {
    if qemu_binary().is_none() {
        return;
    }
    let env = Env::new("qemu-args-numa", 320 * MIB);
    let d = warm_daemon(&env, 2 * LEASE);
    let a = d.lease("cell0", LEASE).unwrap();
    let b = d.lease("cell1", LEASE).unwrap();
    write_tag(&b, 0, b"second cell");
    d.settle(2 * LEASE);
    let free = free_pages();

    let words = qemu_args(&env, &["--numa", "cell0", "cell1"]).unwrap();
    let line = words.join(" ");
    assert!(line.starts_with("-m 128M "), "{line}");
    assert!(line.contains("-numa node,nodeid=0,memdev=mem0"), "{line}");
    assert!(line.contains("-numa node,nodeid=1,memdev=mem1"), "{line}");
    assert!(!line.contains("memory-backend="), "{line}");

    let mut vm = start(&env, &words);
    let inodes = mapped_inodes(vm.pid());
    for l in [&a, &b] {
        let ino = std::fs::metadata(&l.path).unwrap().ino();
        assert!(inodes.contains(&ino), "QEMU does not map {}", l.name);
    }
    // Guest node 1's memory follows node 0's in guest-physical space.
    assert_eq!(guest_bytes(&mut vm, &env.dir, LEASE, 11), b"second cell");
    assert_eq!(free_pages(), free, "QEMU took hugepages of its own");
    vm.quit(Duration::from_secs(10));
    for l in [a, b] {
        d.release(l.id).unwrap();
    }
    d.settle(2 * LEASE);
}

#[test]
fn qemu_args_rejects_unknown_leases_and_two_without_numa() {
    let env = Env::new("qemu-args-bad", 64 * MIB);
    let d = env.spawn(&[]);
    let lease = d.lease("only", 8 * MIB).unwrap();
    let err = qemu_args(&env, &["nope"]).unwrap_err();
    assert!(err.contains("no lease with id or name \"nope\""), "{err}");
    let err = qemu_args(&env, &["only", "only"]).unwrap_err();
    assert!(err.contains("without --numa (limit 1)"), "{err}");
    d.release(lease.id).unwrap();
    d.settle(0);
    let down = Env::names(&env.lease_dir());
    assert!(down.is_empty(), "{down:?}");
}
