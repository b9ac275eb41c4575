//! `hugeprep hotplug-args` against the real daemon and a real QEMU/KVM (paused q35 guest with
//! memory slots and a PCIe root port): the printed QMP commands plug a lease as a `pc-dimm`
//! (QEMU maps the lease's inode, the guest sees hugeprep's bytes at the DIMM's address, no
//! kernel page is taken) and as a `virtio-mem-pci` (QEMU 7.2 discards the backend as it
//! realizes the device: the lease's pages go back to the kernel). When QEMU exits the leases
//! come back through the usual release (`--pid`, and `hugeprep release`): the pool is whole
//! and scrubbed, the mount holds only the pool, nothing is left.

mod daemon_util;
mod libvirt_util;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use daemon_util::{map_lease, Daemon, Env, MIB};
use hugeprep::hugetlb::pool::{self as kpool, Scope};
use hugeprep::pool::LeaseInfo;
use hugeprep::PageSize;
use hugeprep_testkit::qemu::{self, QemuVm};
use libvirt_util::{file_is_zero, wait_until};

const PLUG: u64 = 64 * MIB;
const TAG: &[u8] = b"hugeprep plugged this";

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

/// Runs `hugeprep hotplug-args ARGS`; its JSON, or its stderr.
fn hotplug_args(env: &Env, args: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .arg("hotplug-args")
        .args(args)
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

/// Sends each of `commands` (`{"execute", "arguments"}`) to QEMU.
fn send(vm: &mut QemuVm, commands: &serde_json::Value) {
    for c in commands.as_array().unwrap() {
        vm.execute_with(c["execute"].as_str().unwrap(), c["arguments"].clone())
            .unwrap_or_else(|e| panic!("{c}: {e}"));
    }
}

fn lease_of(out: &serde_json::Value) -> LeaseInfo {
    serde_json::from_value(out["lease"].clone()).unwrap()
}

fn mapped_inodes(pid: u32) -> Vec<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .filter(|&ino| ino != 0)
        .collect()
}

/// A paused q35 guest with 64 MiB of anonymous RAM, two slots, room for 256 MiB more and a
/// free PCIe root port `rp1`.
fn start(env: &Env) -> QemuVm {
    let binary = qemu_binary().unwrap();
    let qmp = env.dir.join("qmp.sock");
    let mut args = qemu::vm_args(&qmp);
    args.extend(
        [
            "-m",
            "64M,slots=2,maxmem=320M",
            "-device",
            "pcie-root-port,id=rp1,bus=pcie.0,chassis=1",
        ]
        .map(String::from),
    );
    let mut vm = QemuVm::spawn_args(&binary, &args, &qmp).unwrap();
    assert_eq!(vm.wait_ready(Duration::from_secs(60)).unwrap(), "prelaunch");
    vm
}

/// No lease left, the pool whole at `warm`, the mount holding only the pool, every pool
/// file zero.
fn assert_clean(env: &Env, d: &Daemon, warm: u64) {
    assert!(
        wait_until("every lease released", Duration::from_secs(30), || d
            .leases()
            .is_empty()),
        "leases left: {:?}",
        d.leases()
    );
    let p = d.settle(warm);
    assert_eq!(p.kinds[0].leased_bytes, 0);
    assert_eq!(env.mount_used(), warm, "mount holds more than the pool");
    assert!(Env::names(&env.lease_dir()).is_empty());
    for name in Env::names(&env.pool_dir()) {
        let path = env.pool_dir().join(&name);
        if path.is_file() {
            assert!(file_is_zero(&path), "pool file {name} is not scrubbed");
        }
    }
}

#[test]
fn pc_dimm_and_virtio_mem_plug_leases_and_give_them_back() {
    if qemu_binary().is_none() {
        return;
    }
    let warm = 2 * PLUG;
    let env = Env::new("qemu-hotplug", 4 * PLUG + 64 * MIB);
    let d = env.spawn(&["--warm", &format!("{}M", warm >> 20), "--sizes", "64M"]);
    d.settle(warm);
    let mut vm = start(&env);
    let pid = vm.pid().to_string();

    // pc-dimm: the lease's pages as they are; released by the daemon when QEMU exits.
    let dimm = hotplug_args(&env, &["dimm0", "64M", "--pid", &pid]).unwrap();
    let lease = lease_of(&dimm);
    assert_eq!(dimm["plug"][0]["execute"], "object-add");
    assert_eq!(
        dimm["plug"][0]["arguments"]["mem-path"],
        lease.path.to_str().unwrap()
    );
    assert_eq!(dimm["plug"][0]["arguments"]["share"], true);
    assert_eq!(dimm["plug"][1]["arguments"]["driver"], "pc-dimm");
    {
        let (_f, mut r) = map_lease(&lease);
        r.as_mut_slice()[MIB as usize..MIB as usize + TAG.len()].copy_from_slice(TAG);
    }
    d.settle(warm);
    let free = free_pages();
    send(&mut vm, &dimm["plug"]);
    let devices = vm.execute("query-memory-devices").unwrap();
    let d0 = devices
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["data"]["id"] == "hp-dev-dimm0")
        .unwrap_or_else(|| panic!("no DIMM: {devices}"));
    assert_eq!(d0["type"], "dimm");
    assert_eq!(d0["data"]["size"], PLUG);
    let ino = std::fs::metadata(&lease.path).unwrap().ino();
    assert!(
        mapped_inodes(vm.pid()).contains(&ino),
        "QEMU does not map the lease"
    );
    let addr = d0["data"]["addr"].as_u64().unwrap();
    let out = env.dir.join("pmem");
    vm.execute_with(
        "pmemsave",
        serde_json::json!({ "val": addr + MIB, "size": TAG.len(), "filename": out }),
    )
    .unwrap();
    assert_eq!(
        std::fs::read(&out).unwrap(),
        TAG,
        "the guest does not see the lease"
    );
    std::fs::remove_file(&out).unwrap();
    assert_eq!(free_pages(), free, "QEMU took hugepages of its own");

    // virtio-mem-pci on the root port: QEMU discards the whole backend as it realizes the
    // device (every block starts unplugged), so the lease's pages go back to the kernel.
    let vmem = hotplug_args(
        &env,
        &["vmem0", "64M", "--device", "virtio-mem-pci", "--bus", "rp1"],
    )
    .unwrap();
    let vlease = lease_of(&vmem);
    assert_eq!(vmem["plug"][1]["arguments"]["requested-size"], PLUG);
    send(&mut vm, &vmem["plug"]);
    let devices = vm.execute("query-memory-devices").unwrap();
    let v0 = devices
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["data"]["id"] == "hp-dev-vmem0")
        .unwrap_or_else(|| panic!("no virtio-mem: {devices}"));
    assert_eq!(v0["type"], "virtio-mem");
    assert_eq!(v0["data"]["max-size"], PLUG);
    let blocks = std::fs::metadata(&vlease.path).unwrap().blocks();
    eprintln!("virtio-mem-pci lease after device_add: {blocks} blocks of 512 bytes");
    assert_eq!(
        blocks, 0,
        "this QEMU no longer discards a virtio-mem backend at realize: docs/libvirt.md says it does"
    );

    // Unplug needs the guest's eject; this guest runs no OS, so QEMU exits with both plugged.
    vm.quit(Duration::from_secs(10));
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["release", "vmem0", "--socket"])
        .arg(&env.socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_clean(&env, &d, warm);
}

#[test]
fn hotplug_args_refuses_bad_input_and_leases_nothing() {
    let env = Env::new("qemu-hotplug-bad", 64 * MIB);
    let d = env.spawn(&[]);
    let err = hotplug_args(&env, &["x", "3M"]).unwrap_err();
    assert!(err.contains("size"), "{err}");
    let err = hotplug_args(&env, &["x", "8M", "--bus", "rp1"]).unwrap_err();
    assert!(err.contains("--bus: only a virtio-mem-pci"), "{err}");
    let err = hotplug_args(&env, &["x", "8M", "--device", "dimm"]).unwrap_err();
    assert!(err.contains("--device"), "{err}");
    assert!(d.leases().is_empty(), "{:?}", d.leases());
    d.settle(0);
    assert!(Env::names(&env.lease_dir()).is_empty());
}
