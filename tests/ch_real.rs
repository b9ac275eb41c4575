//! hugeprep leases in a real cloud-hypervisor (v53.0): started from `hugeprep ch-args` on its
//! command line, and created over its REST API (`vm.create` with `ch-args --json`, then
//! `vm.boot`, through `ch-remote`), for a 2 MiB-page lease, a 1 GiB-page lease (where the
//! kernel can supply 1 GiB pages) and a guest of two zones on two guest NUMA nodes.
//!
//! Each VM boots a tiny PVH guest (`hugeprep::vmm::pvh_guest`) that checks samples of its
//! memory read zero, fills them with a pattern and reports on its serial port. The test then
//! checks that cloud-hypervisor maps the lease inodes, that the kernel's free hugepage count
//! did not move, that the pattern is in the lease files, and, once cloud-hypervisor has
//! exited, that its leases (made with its pid) were released and scrubbed back in place
//! (the same files return to the pool). cloud-hypervisor runs in a cgroup of its own that is
//! removed when it has gone.

mod ch_util;
mod daemon_util;

use std::path::Path;
use std::process::Command;

use ch_util::{ch_remote, inode, Cgroup, Vmm};
use daemon_util::{Env, MIB};
use hugeprep::pool::{LeaseInfo, LeaseRequest};
use hugeprep::vmm::pvh_guest;
use hugeprep::PageSize;

const KEY: u32 = 0x4855_4745;

/// How the VM is made.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Launch {
    /// `hugeprep ch-args` on cloud-hypervisor's command line.
    CommandLine,
    /// `vm.create` with `hugeprep ch-args --json`, then `vm.boot`.
    Api,
}

fn ch_args(socket: &Path, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .arg("ch-args")
        .arg("--socket")
        .arg(socket)
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn free_pages(ps: PageSize) -> u64 {
    hugeprep::hugetlb::pool::available(None, ps).unwrap()
}

/// Boots the tiny guest on `zones` leases of `zone_bytes` each and checks everything the
/// module documents.
fn run(name: &str, launch: Launch, ps: PageSize, zone_bytes: u64, zones: usize) {
    let Some((ch, remote)) = ch_util::binaries() else {
        return;
    };
    let total = zone_bytes * zones as u64;
    // The mount holds exactly the leases: nothing refills behind them while the VM runs, so
    // the kernel's free count is the VM's alone to move.
    let Some(env) = Env::with_page_size(name, ps, total) else {
        let why = hugeprep::testing::shortfall_note(ps, total / ps.bytes());
        eprintln!("SKIPPED: {why}");
        return;
    };
    let d = env.spawn(&[
        "--page-size",
        &ps.to_string(),
        "--warm",
        &total.to_string(),
        "--sizes",
        &zone_bytes.to_string(),
    ]);
    d.settle(total);
    let cgroup = Cgroup::new(name);
    let api = env.dir.join("ch.sock");
    let mut vmm = Vmm::spawn(
        &ch,
        &cgroup,
        &env.dir,
        &["--api-socket".into(), format!("path={}", api.display())],
    );
    // A control plane's order: the VMM's pid first, then leases made with it.
    let leases: Vec<LeaseInfo> = (0..zones)
        .map(|i| {
            d.lease_req(&LeaseRequest {
                name: format!("{name}-{i}"),
                size: zone_bytes,
                page_size: Some(ps),
                pid: Some(vmm.pid()),
                ..LeaseRequest::default()
            })
            .unwrap()
        })
        .collect();
    d.settle(0);
    let free_before = free_pages(ps);

    let samples = pvh_guest::spread(total, 2 * MIB);
    let kernel = env.dir.join("guest.elf");
    std::fs::write(&kernel, pvh_guest::image(&samples, KEY).unwrap()).unwrap();
    let names: Vec<&str> = leases.iter().map(|l| l.name.as_str()).collect();
    let numa: &[&str] = if zones > 1 { &["--numa"] } else { &[] };
    match launch {
        Launch::CommandLine => {
            let line = ch_args(&env.socket, &[numa, &names].concat());
            assert!(!line.contains("host_numa_node"), "{line}");
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
        }
        Launch::Api => {
            vmm.exec(&[]);
            ch_util::wait_socket(&api, &mut vmm);
            let members: serde_json::Value =
                serde_json::from_str(&ch_args(&env.socket, &[&["--json"], numa, &names].concat()))
                    .unwrap();
            let mut body = serde_json::json!({
                "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
                "payload": {"kernel": kernel},
                "serial": {"mode": "File", "file": vmm.serial},
                "console": {"mode": "Off"},
            });
            for (k, v) in members.as_object().unwrap() {
                body[k] = v.clone();
            }
            let body_path = env.dir.join("vm.json");
            std::fs::write(&body_path, body.to_string()).unwrap();
            ch_remote(&remote, &api, &["create", body_path.to_str().unwrap()]);
            ch_remote(&remote, &api, &["boot"]);
        }
    }
    let report = vmm.serial_line();
    assert_eq!(report, pvh_guest::REPORT_OK, "{}", vmm.logs());
    let info: serde_json::Value =
        serde_json::from_str(&ch_remote(&remote, &api, &["info"])).unwrap();
    assert_eq!(info["state"], "Running", "{info}");
    if zones > 1 {
        assert_eq!(
            info["config"]["numa"].as_array().map(Vec::len),
            Some(zones),
            "{info}"
        );
    }

    // Mapped: every lease inode is in the VMM's shared mappings.
    let mapped = vmm.mapped_inodes();
    let inodes: Vec<u64> = leases.iter().map(|l| inode(&l.path)).collect();
    for (l, ino) in leases.iter().zip(&inodes) {
        assert!(
            mapped.contains(ino),
            "{} (inode {ino}) not mapped: {mapped:?}",
            l.path.display()
        );
    }
    // No new hugepage: the guest ran on the lease's pages.
    assert_eq!(
        free_pages(ps),
        free_before,
        "the kernel's free {ps} pages moved"
    );
    // The guest's pattern, through the files (read from inside the VMM's cgroup).
    let files: Vec<Vec<u8>> = leases.iter().map(|l| cgroup.read(&l.path)).collect();
    for &addr in &samples {
        let zone = (addr / zone_bytes) as usize;
        let at = (addr % zone_bytes) as usize;
        let bytes = &files[zone];
        let want = pvh_guest::pattern(addr, KEY).to_le_bytes();
        let end = at + pvh_guest::SAMPLE_BYTES as usize;
        assert_eq!(bytes[at..at + 4], want, "sample {addr:#x}");
        assert_eq!(bytes[end - 4..end], want, "sample {addr:#x}");
    }
    drop(files);

    // Gone: the leases go with the VMM's pid, and come back scrubbed in place.
    match launch {
        Launch::CommandLine => vmm.stop(),
        Launch::Api => {
            ch_remote(&remote, &api, &["shutdown-vmm"]);
            vmm.child.wait().unwrap();
        }
    }
    cgroup.remove();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !d.leases().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "leases not released after cloud-hypervisor exited"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let status = d.settle(total);
    assert!(status.last_scrub.is_some(), "{status:?}");
    let mut pool: Vec<u64> = Env::names(&env.pool_dir())
        .iter()
        .map(|n| inode(&env.pool_dir().join(n)))
        .collect();
    pool.sort_unstable();
    let mut leased = inodes.clone();
    leased.sort_unstable();
    assert_eq!(pool, leased, "the pool's files are not the scrubbed leases");
    let again = d
        .lease_req(&LeaseRequest {
            name: "again".into(),
            size: zone_bytes,
            page_size: Some(ps),
            ..LeaseRequest::default()
        })
        .unwrap();
    assert!(daemon_util::lease_is_zero(&again));
}

#[test]
fn ch_args_2m_lease_on_the_command_line() {
    run(
        "ch-cli-2m",
        Launch::CommandLine,
        PageSize::Size2M,
        64 * MIB,
        1,
    );
}

#[test]
fn ch_args_2m_lease_over_the_api() {
    run("ch-api-2m", Launch::Api, PageSize::Size2M, 64 * MIB, 1);
}

#[test]
fn ch_args_1g_lease_on_the_command_line() {
    run(
        "ch-cli-1g",
        Launch::CommandLine,
        PageSize::Size1G,
        1 << 30,
        1,
    );
}

#[test]
fn ch_args_1g_lease_over_the_api() {
    run("ch-api-1g", Launch::Api, PageSize::Size1G, 1 << 30, 1);
}

#[test]
fn ch_args_two_zones_two_guest_nodes_on_the_command_line() {
    run(
        "ch-cli-2z",
        Launch::CommandLine,
        PageSize::Size2M,
        32 * MIB,
        2,
    );
}

#[test]
fn ch_args_two_zones_two_guest_nodes_over_the_api() {
    run("ch-api-2z", Launch::Api, PageSize::Size2M, 32 * MIB, 2);
}

/// The guest's zero check is real: a lease with one dirty byte at a sample makes it report
/// `NOT-ZERO` (a lease is never handed out dirty; this one is dirtied by the test).
#[test]
fn tiny_guest_reports_a_dirty_lease() {
    let Some((ch, _remote)) = ch_util::binaries() else {
        return;
    };
    let size = 16 * MIB;
    let env = Env::new("ch-dirty", size);
    let d = env.spawn(&["--warm", "16M", "--sizes", "16M"]);
    d.settle(size);
    let lease = d.lease("dirty", size).unwrap();
    let samples = pvh_guest::spread(size, 2 * MIB);
    let dirty_at = samples[2] + 100;
    {
        let (_f, mut map) = daemon_util::map_lease(&lease);
        map.as_mut_slice()[dirty_at as usize] = 1;
    }
    let kernel = env.dir.join("guest.elf");
    std::fs::write(&kernel, pvh_guest::image(&samples, KEY).unwrap()).unwrap();
    let cgroup = Cgroup::new("ch-dirty");
    let mut vmm = Vmm::spawn(&ch, &cgroup, &env.dir, &[]);
    let mut rest: Vec<String> = ch_args(&env.socket, &["dirty"])
        .split_whitespace()
        .map(String::from)
        .collect();
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
    assert_eq!(
        vmm.serial_line(),
        pvh_guest::REPORT_NOT_ZERO,
        "{}",
        vmm.logs()
    );
    vmm.stop();
    cgroup.remove();
    d.release(lease.id).unwrap();
}
