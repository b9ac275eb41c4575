//! Incoming migration through the hook: two libvirtd sandboxes on this machine as two
//! "hosts" (separate mount namespaces, distinct host UUIDs), each with its own hugeprep
//! daemon and mount, as two hosts would have. `virsh migrate --live` runs the destination's
//! `migrate begin` (the hook prints nothing: its stdout would replace the XML) and
//! `prepare begin`: the incoming QEMU maps a lease of the destination's daemon, the guest's
//! memory arrives in it, and the source's lease goes back to its pool scrubbed.

mod daemon_util;
mod libvirt_util;

use daemon_util::{map_lease, Env, MIB};
use hugeprep::vmm::libvirt::sandbox::{hook_command, Sandbox};
use hugeprep::vmm::libvirt::HookConfig;
use libvirt_util::{domain_xml, inode, tools_present, Lab};

const PATTERN: &[u8] = b"hugeprep-migrated-pattern";
const AT: usize = 4 << 20;
const DEST_HOST_UUID: &str = "5e1f0000-0000-4000-8000-00000000d357";

#[test]
fn incoming_migration_maps_the_destination_daemons_lease() {
    if !tools_present() {
        return;
    }
    // The source host's world reserves room for both mounts.
    let mut lab = Lab::new("libvirt-migrate-src", 256 * MIB, 64 * MIB);
    let warm = 64 * MIB;
    let dest_env = Env::beside(&lab.env, "libvirt-migrate-dst", 128 * MIB);
    let dest_daemon = dest_env.spawn(&["--no-reserve", "--warm", "64M", "--sizes", "32M"]);
    dest_daemon.settle(warm);
    let dest_backing = dest_env.mount.join("libvirt-backing");
    let dest_config = dest_env.dir.join("libvirt-hook.toml");
    let mut config = HookConfig::new(&dest_backing);
    config.socket = dest_env.socket.clone();
    config.stale_after_s = 0;
    std::fs::write(&dest_config, config.to_toml()).unwrap();
    let hook = hook_command(
        std::path::Path::new(env!("CARGO_BIN_EXE_hugeprep")),
        &dest_config,
    );
    // The only test of this binary: no other thread reads the environment.
    std::env::set_var("HUGEPREP_SANDBOX_HOST_UUID", DEST_HOST_UUID);
    let dest = Sandbox::up(&dest_env.dir.join("libvirt"), &dest_backing, Some(&hook));
    std::env::remove_var("HUGEPREP_SANDBOX_HOST_UUID");
    let dest = dest.unwrap_or_else(|e| panic!("destination sandbox: {e}"));

    let uuid = lab.uuid();
    lab.start(&domain_xml("migrant", &uuid, 0, true, ""));
    let src_lease = lab.leases_of(&uuid).remove(0);
    {
        let (_f, mut r) = map_lease(&src_lease);
        r.as_mut_slice()[AT..AT + PATTERN.len()].copy_from_slice(PATTERN);
    }
    let out = lab
        .sandbox
        .virsh(&[
            "migrate",
            "--live",
            &uuid,
            dest.uri(),
            "--migrateuri",
            "tcp://127.0.0.1",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "virsh migrate: {}\nsource libvirtd:\n{}\ndestination libvirtd:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&lab.sandbox.log()),
        tail(&dest.log())
    );

    // The destination's QEMU maps its daemon's lease, which holds the guest's memory.
    let leases: Vec<_> = dest_daemon
        .leases()
        .into_iter()
        .filter(|l| l.name.contains(&uuid))
        .collect();
    assert_eq!(leases.len(), 1, "{leases:?}");
    let pid = dest.qemu_pid(&uuid).expect("no QEMU on the destination");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let ino = inode(&leases[0].path).to_string();
    assert!(
        maps.lines()
            .any(|l| l.contains(dest_backing.to_str().unwrap())
                && l.split_whitespace().nth(4) == Some(ino.as_str())),
        "the incoming QEMU does not map the lease\n{maps}"
    );
    {
        let (_f, r) = map_lease(&leases[0]);
        assert_eq!(&r.as_slice()[AT..AT + PATTERN.len()], PATTERN);
    }
    // The source's QEMU is gone and its lease back in the pool, scrubbed.
    assert!(lab.sandbox.qemu_pid(&uuid).is_none());
    lab.assert_clean();

    dest.virsh_ok(&["destroy", &uuid]).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while dest_daemon.leases().iter().any(|l| l.name.contains(&uuid)) {
        assert!(
            std::time::Instant::now() < deadline,
            "destination lease kept"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    dest_daemon.settle(warm);
    assert_eq!(dest_env.mount_used(), warm);
    dest.down().unwrap();
    drop(dest_daemon);
    drop(dest_env);
    lab.assert_clean();
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().rev().take(30).collect();
    lines.join("\n")
}
