//! Whether a cloud-hypervisor (v53.0) memory zone on a lease can grow from a second lease:
//! it cannot (docs/cloud-hypervisor.md). A zone with `hotplug_size` grows through a
//! virtio-mem region that cloud-hypervisor makes at `vm.create` as an anonymous memfd
//! (`ch_ram`), never from a file. This test boots the tiny guest on a lease with such a zone,
//! resizes the zone with `ch-remote resize-zone`, and checks what the limit says: the VMM maps
//! the lease and a `memfd:ch_ram` region of the hot-plug size, opens no other file on the
//! lease's mount, and takes no hugepage for it; then the lease comes back scrubbed when the VMM
//! exits. Should a later cloud-hypervisor map a file there, this test fails and says so.

mod ch_util;
mod daemon_util;

use std::process::Command;

use ch_util::{ch_remote, inode, Cgroup, Vmm};
use daemon_util::{Env, MIB};
use hugeprep::pool::LeaseRequest;
use hugeprep::vmm::pvh_guest;
use hugeprep::PageSize;

const KEY: u32 = 0x4855_4745;
const ZONE: u64 = 32 * MIB;
/// virtio-mem regions are whole multiples of 128 MiB (cloud-hypervisor refuses others).
const HOTPLUG: u64 = 128 * MIB;

#[test]
fn a_zone_on_a_lease_grows_from_an_anonymous_memfd_not_a_lease() {
    let Some((ch, remote)) = ch_util::binaries() else {
        return;
    };
    let env = Env::new("ch-resize-zone", ZONE);
    let d = env.spawn(&["--warm", "32M", "--sizes", "32M"]);
    d.settle(ZONE);
    let cgroup = Cgroup::new("ch-resize-zone");
    let api = env.dir.join("ch.sock");
    let mut vmm = Vmm::spawn(
        &ch,
        &cgroup,
        &env.dir,
        &["--api-socket".into(), format!("path={}", api.display())],
    );
    let lease = d
        .lease_req(&LeaseRequest {
            name: "zone0".into(),
            size: ZONE,
            page_size: Some(PageSize::Size2M),
            pid: Some(vmm.pid()),
            ..LeaseRequest::default()
        })
        .unwrap();
    d.settle(0);
    let free_before = hugeprep::hugetlb::pool::available(None, PageSize::Size2M).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["ch-args", "--socket"])
        .arg(&env.socket)
        .arg("zone0")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // ch-args' line, the zone made growable by virtio-mem.
    let line = String::from_utf8(out.stdout)
        .unwrap()
        .replace(
            "--memory size=0",
            "--memory size=0,hotplug_method=virtio-mem",
        )
        .trim_end()
        .to_string()
        + &format!(",hotplug_size={HOTPLUG}");
    let samples = pvh_guest::spread(ZONE, 2 * MIB);
    let kernel = env.dir.join("guest.elf");
    std::fs::write(&kernel, pvh_guest::image(&samples, KEY).unwrap()).unwrap();
    let mut rest: Vec<String> = line.split_whitespace().map(String::from).collect();
    rest.extend(
        [
            "--cpus",
            "boot=1",
            "--kernel",
            &kernel.display().to_string(),
            "--serial",
            &format!("file={}", vmm.serial.display()),
            "--console",
            "off",
        ]
        .map(String::from),
    );
    vmm.exec(&rest);
    ch_util::wait_socket(&api, &mut vmm);
    assert_eq!(vmm.serial_line(), pvh_guest::REPORT_OK, "{}", vmm.logs());
    ch_remote(
        &remote,
        &api,
        &[
            "resize-zone",
            "--id",
            "mem0",
            "--size",
            &(ZONE + HOTPLUG).to_string(),
        ],
    );

    let maps = std::fs::read_to_string(format!("/proc/{}/maps", vmm.pid())).unwrap();
    assert!(
        vmm.mapped_inodes().contains(&inode(&lease.path)),
        "the zone's lease is not mapped\n{maps}"
    );
    let memfd: u64 = maps
        .lines()
        .filter(|l| l.contains("memfd:ch_ram"))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some(u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?)
        })
        .sum();
    assert_eq!(
        memfd, HOTPLUG,
        "the zone's hot-plug region is not an anonymous memfd of hotplug_size: has \
         cloud-hypervisor learnt to map a file there? docs/cloud-hypervisor.md says it cannot\n{maps}"
    );
    let mount = env.mount.to_str().unwrap();
    let on_mount: Vec<&str> = maps.lines().filter(|l| l.contains(mount)).collect();
    assert!(
        on_mount
            .iter()
            .all(|l| l.contains(lease.path.to_str().unwrap())),
        "another file of the mount is mapped: {on_mount:?}"
    );
    assert_eq!(
        hugeprep::hugetlb::pool::available(None, PageSize::Size2M).unwrap(),
        free_before,
        "the resize took hugepages"
    );

    vmm.stop();
    cgroup.remove();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !d.leases().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the lease was not released after cloud-hypervisor exited"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    d.settle(ZONE);
    assert_eq!(env.mount_used(), ZONE, "the mount holds more than the pool");
    assert!(Env::names(&env.lease_dir()).is_empty());
    let again = d.lease("again", ZONE).unwrap();
    assert!(daemon_util::lease_is_zero(&again));
}
