//! `integration/cloud-hypervisor/start-vm.sh`, the control-plane example, runs as written
//! against the real daemon and a real cloud-hypervisor: a lease with the VMM's pid,
//! `vm.create` with `ch-args --json` and `vm.boot` over plain HTTP, a tiny guest that fills
//! samples of the lease, and the lease released and scrubbed back when the VMM exits.

mod ch_util;
mod daemon_util;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ch_util::{ch_remote, inode};
use daemon_util::{Env, MIB};
use hugeprep::vmm::pvh_guest;

const KEY: u32 = 0x6368_6970;

#[test]
fn control_plane_example_leases_with_the_vmm_pid_and_gets_it_back() {
    let Some((ch, remote)) = ch_util::binaries() else {
        return;
    };
    let size = 64 * MIB;
    let env = Env::new("ch-example", size);
    let d = env.spawn(&["--warm", "64M", "--sizes", "64M"]);
    d.settle(size);
    let samples = pvh_guest::spread(size, 4 * MIB);
    let kernel = env.dir.join("guest.elf");
    std::fs::write(&kernel, pvh_guest::image(&samples, KEY).unwrap()).unwrap();
    let run = env.dir.join("run");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/integration/cloud-hypervisor/start-vm.sh"
    );
    let mut child = Command::new(script)
        .args(["vm-example", "64M"])
        .arg(&kernel)
        .env("HUGEPREP", env!("CARGO_BIN_EXE_hugeprep"))
        .env("HUGEPREP_SOCKET", &env.socket)
        .env("CLOUD_HYPERVISOR", &ch)
        .env("RUN_DIR", &run)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(env.dir.join("script.log")).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(env.dir.join("script.log")).unwrap_or_default();
    let serial = run.join("serial.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&serial)
        .unwrap_or_default()
        .ends_with('\n')
    {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "start-vm.sh exited ({status}) before the guest reported\n{}",
                log()
            );
        }
        assert!(Instant::now() < deadline, "no guest report\n{}", log());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        std::fs::read_to_string(&serial).unwrap().trim_end(),
        pvh_guest::REPORT_OK
    );
    let leases = d.leases();
    assert_eq!(leases.len(), 1);
    let lease = &leases[0];
    let pid = lease.pid.expect("the lease carries the VMM's pid");
    assert!(std::fs::read_link(format!("/proc/{pid}/exe"))
        .unwrap()
        .ends_with("cloud-hypervisor"));
    // Read by a process in a cgroup that goes away, as the VMM's does: an opener that stays
    // (this test) would keep the lease from being scrubbed back in place.
    let reader = ch_util::Cgroup::new("ch-example-reader");
    let bytes = reader.read(&lease.path);
    reader.remove();
    for &addr in &samples {
        let at = addr as usize;
        assert_eq!(
            bytes[at..at + 4],
            pvh_guest::pattern(addr, KEY).to_le_bytes()
        );
    }
    let lease_inode = inode(&lease.path);

    // The control plane stops the VMM; the script waits for it and removes its cgroup.
    ch_remote(&remote, &run.join("api.sock"), &["shutdown-vmm"]);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}\n{}", log());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !d.leases().is_empty() {
        assert!(Instant::now() < deadline, "lease not released\n{}", log());
        std::thread::sleep(Duration::from_millis(10));
    }
    let pool = d.settle(size);
    assert!(pool.last_scrub.is_some(), "{pool:?}");
    let files = Env::names(&env.pool_dir());
    assert_eq!(files.len(), 1);
    assert_eq!(inode(&env.pool_dir().join(&files[0])), lease_inode);
}
