//! Incoming migration through the hook: two libvirtd sandboxes on this machine as two
//! "hosts" (separate mount namespaces, distinct host UUIDs), each with its own hugeprep
//! daemon and mount, as two hosts would have, and both with libvirt as the distribution ships
//! it (qemu.conf as packaged: QEMU runs as `libvirt-qemu`, dynamic ownership, private /dev).
//! `virsh migrate --live` runs the destination's `migrate begin` (the hook prints nothing:
//! its stdout would replace the XML) and `prepare begin`: the incoming QEMU, unprivileged,
//! maps a lease of the destination's daemon handed to its user, the guest's memory arrives
//! in it, the source's lease goes back to its pool scrubbed, and the guest's pattern is in no
//! other file of either daemon. Twice: the example domain's memory backing, and the shape
//! OpenStack Nova's file-backed memory writes (`<allocation mode='immediate'/>` and
//! `<discard/>`, whose source QEMU punches its lease's pages out as it exits).

mod daemon_util;
mod libvirt_util;

use std::path::Path;

use daemon_util::{map_lease, Daemon, Env, MIB};
use hugeprep::vmm::libvirt::sandbox::{hook_command, Sandbox};
use hugeprep::vmm::libvirt::HookConfig;
use libvirt_util::{domain_xml, files_holding, inode, tools_present, Lab};

const PATTERN: &[u8] = b"hugeprep-migrated-pattern";
const AT: usize = 4 << 20;
const DEST_HOST_UUID: &str = "5e1f0000-0000-4000-8000-00000000d357";
const SHAPE: &str = "<memoryBacking><source type='file'/><access mode='shared'/></memoryBacking>";
const NOVA: &str = "<memoryBacking><source type=\"file\"/><access mode=\"shared\"/><allocation mode=\"immediate\"/><discard/></memoryBacking>";

/// The uid of the user the package runs QEMU as.
fn packaged_qemu_uid() -> u32 {
    nix::unistd::User::from_name("libvirt-qemu")
        .unwrap()
        .expect("no libvirt-qemu user: libvirt-daemon-system makes it")
        .uid
        .as_raw()
}

/// Migrates a fresh domain with `backing` from `lab` to `dest` and checks both sides.
fn migrate_one(
    lab: &mut Lab,
    dest: &Sandbox,
    dest_daemon: &Daemon,
    dest_env: &Env,
    dest_backing: &Path,
    backing: &str,
    warm: u64,
) {
    let uuid = lab.uuid();
    let xml = domain_xml("migrant", &uuid, 0, true, "").replace(SHAPE, backing);
    assert!(xml.contains(backing));
    lab.start(&xml);
    let qemu_uid = packaged_qemu_uid();
    assert_eq!(lab.qemu_ids(&uuid).0, qemu_uid, "the source QEMU's user");
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

    // The destination's QEMU, unprivileged, maps its daemon's lease, which holds the guest's
    // memory and is handed to QEMU's user.
    let leases: Vec<_> = dest_daemon
        .leases()
        .into_iter()
        .filter(|l| l.name.contains(&uuid))
        .collect();
    assert_eq!(leases.len(), 1, "{leases:?}");
    let pid = dest.qemu_pid(&uuid).expect("no QEMU on the destination");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert_eq!(
        uid, qemu_uid,
        "the incoming QEMU runs as {uid}, not libvirt-qemu"
    );
    let meta = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&leases[0].path).unwrap());
    assert_eq!(meta, qemu_uid, "the destination lease is not QEMU's user's");
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
    // 0 bytes of the guest's pattern anywhere else: only the destination's lease holds it.
    let dirs = [
        lab.env.pool_dir(),
        lab.env.lease_dir(),
        dest_env.pool_dir(),
        dest_env.lease_dir(),
    ];
    let holding = files_holding(&dirs, PATTERN);
    // The lease's own names (the daemon's pool file and its link) share its inode.
    let lease_ino = inode(&leases[0].path);
    assert!(
        holding.iter().all(|p| inode(p) == lease_ino),
        "the guest's pattern is in {holding:?}"
    );

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
    assert!(
        files_holding(&dirs, PATTERN).is_empty(),
        "the guest's pattern outlived its lease"
    );
}

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

    for backing in [SHAPE, NOVA] {
        migrate_one(
            &mut lab,
            &dest,
            &dest_daemon,
            &dest_env,
            &dest_backing,
            backing,
            warm,
        );
    }
    dest.down().unwrap();
    drop(dest_daemon);
    drop(dest_env);
    lab.assert_clean();
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().rev().take(30).collect();
    lines.join("\n")
}
