//! The libvirt lifecycle through `hugeprep libvirt-hook`, with real libvirtd and QEMU/KVM:
//! `virsh save`/`restore`, `managedsave` then `start`, `reboot` and `reset` (same QEMU, no
//! new lease), `destroy` while another domain is in its `start begin` hook, and a libvirtd restart in
//! the middle of a start. Wherever libvirt starts a new QEMU it maps new hugeprep leases, a
//! restored guest's memory holds what was saved, and every released lease comes back to the
//! pool scrubbed, with nothing left behind.

mod daemon_util;
mod libvirt_util;

use std::time::Duration;

use daemon_util::{map_lease, MIB};
use libvirt_util::{
    domain_xml, files_holding, hook_running, inode, tools_present, wait_until, Lab,
};

const PATTERN: &[u8] = b"hugeprep-lifecycle-pattern";
const AT: usize = 8 << 20;

fn write_at(lease: &hugeprep::pool::LeaseInfo, offset: usize, bytes: &[u8]) {
    let (_f, mut r) = map_lease(lease);
    r.as_mut_slice()[offset..offset + bytes.len()].copy_from_slice(bytes);
}

fn read_at(lease: &hugeprep::pool::LeaseInfo, offset: usize, len: usize) -> Vec<u8> {
    let (_f, r) = map_lease(lease);
    r.as_slice()[offset..offset + len].to_vec()
}

/// The domain's one lease, mapped by its QEMU (pc.ram), which runs as the package's user
/// (the lab's qemu.conf is the package's) and owns the lease.
fn mapped_lease(lab: &Lab, uuid: &str) -> hugeprep::pool::LeaseInfo {
    lab.assert_qemu_owns(uuid, lab.qemu_uid);
    let leases = lab.leases_of(uuid);
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(
        lab.qemu_backing_maps(uuid),
        vec![("pc.ram".to_string(), inode(&leases[0].path))],
        "QEMU maps other files than the lease"
    );
    leases.into_iter().next().unwrap_or_else(|| unreachable!())
}

/// 0 bytes of the guest's pattern in any file of the daemon but `lease`.
fn assert_pattern_only_in(lab: &Lab, lease: &hugeprep::pool::LeaseInfo) {
    let holding = files_holding(&[lab.env.pool_dir(), lab.env.lease_dir()], PATTERN);
    // The lease's own names (the daemon's pool file and its link) share its inode.
    let mine = inode(&lease.path);
    assert!(
        holding.iter().all(|p| inode(p) == mine),
        "the guest's pattern is in {holding:?}"
    );
}

fn virsh(lab: &Lab, args: &[&str]) -> String {
    lab.sandbox
        .virsh_ok(args)
        .unwrap_or_else(|e| panic!("{e}\n{}", tail(&lab.sandbox.log())))
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().rev().take(30).collect();
    lines.join("\n")
}

fn signal_daemon(lab: &Lab, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(lab.daemon.pid() as i32), sig).unwrap();
}

/// The hook prints nothing for the operations whose stdout libvirt takes as the new XML.
#[test]
fn restore_and_migrate_hook_calls_print_nothing() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("libvirt-hookops", 128 * MIB, 64 * MIB);
    let uuid = lab.uuid();
    let xml = domain_xml("quiet", &uuid, 0, true, "");
    for (op, subop) in [("restore", "begin"), ("migrate", "begin")] {
        let out = lab.run_hook("quiet", op, subop, &xml);
        assert!(out.status.success(), "{op}: {out:?}");
        assert!(out.stdout.is_empty(), "{op} {subop} wrote on stdout");
        assert!(out.stderr.is_empty(), "{op}: {out:?}");
    }
    assert!(lab.leases_of(&uuid).is_empty());
    lab.assert_clean();
}

#[test]
fn save_restore_and_managedsave_carry_the_memory_into_new_leases() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("libvirt-save", 256 * MIB, 128 * MIB);

    // virsh save / virsh restore (a transient domain).
    let uuid = lab.uuid();
    lab.start(&domain_xml("saved", &uuid, 0, true, ""));
    let before = mapped_lease(&lab, &uuid);
    write_at(&before, AT, PATTERN);
    assert_eq!(lab.guest_bytes(&uuid, AT as u64, PATTERN.len()), PATTERN);
    let image = lab.env.dir.join("saved.img");
    virsh(&lab, &["save", &uuid, image.to_str().unwrap()]);
    assert!(lab.sandbox.qemu_pid(&uuid).is_none());
    // QEMU is gone and its lease released: the pool is whole, scrubbed, nothing leaked.
    lab.assert_clean();
    virsh(&lab, &["restore", image.to_str().unwrap(), "--paused"]);
    let after = mapped_lease(&lab, &uuid);
    assert_ne!(
        after.id, before.id,
        "restore reused the released lease record"
    );
    assert_eq!(read_at(&after, AT, PATTERN.len()), PATTERN);
    assert_eq!(lab.guest_bytes(&uuid, AT as u64, PATTERN.len()), PATTERN);
    assert_pattern_only_in(&lab, &after);
    lab.destroy(&uuid);
    std::fs::remove_file(&image).unwrap();
    lab.assert_clean();

    // virsh managedsave, then virsh start (a persistent domain).
    let uuid = lab.uuid();
    let file = lab.env.dir.join("managed.xml");
    std::fs::write(&file, domain_xml("managed", &uuid, 0, true, "")).unwrap();
    virsh(&lab, &["define", file.to_str().unwrap()]);
    virsh(&lab, &["start", "--paused", &uuid]);
    let before = mapped_lease(&lab, &uuid);
    write_at(&before, AT, PATTERN);
    virsh(&lab, &["managedsave", &uuid]);
    assert!(lab.sandbox.qemu_pid(&uuid).is_none());
    lab.assert_clean();
    virsh(&lab, &["start", "--paused", &uuid]);
    let after = mapped_lease(&lab, &uuid);
    assert_ne!(after.id, before.id);
    assert_eq!(read_at(&after, AT, PATTERN.len()), PATTERN);
    assert_eq!(lab.guest_bytes(&uuid, AT as u64, PATTERN.len()), PATTERN);
    assert_pattern_only_in(&lab, &after);
    lab.destroy(&uuid);
    virsh(&lab, &["undefine", "--managed-save", &uuid]);
    lab.assert_clean();
}

#[test]
fn reboot_and_reset_keep_the_same_qemu_and_leases() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("libvirt-reset", 256 * MIB, 128 * MIB);
    let uuid = lab.uuid();
    lab.start(&domain_xml("resettable", &uuid, 2, true, ""));
    let pid = lab.sandbox.qemu_pid(&uuid).unwrap();
    let leases = lab.leases_of(&uuid);
    assert_eq!(leases.len(), 2);
    write_at(&leases[0], MIB as usize, PATTERN);
    virsh(&lab, &["reset", &uuid]);
    // ACPI reboot: a guest without an OS never answers it, but libvirt keeps the QEMU.
    let reboot = lab.sandbox.virsh(&["reboot", &uuid]).unwrap();
    eprintln!(
        "virsh reboot of a paused guest without an OS: {} {}",
        reboot.status,
        String::from_utf8_lossy(&reboot.stderr).trim()
    );
    virsh(&lab, &["resume", &uuid]);
    virsh(&lab, &["reset", &uuid]);
    virsh(&lab, &["suspend", &uuid]);
    assert_eq!(lab.sandbox.qemu_pid(&uuid), Some(pid), "a new QEMU");
    assert_eq!(lab.leases_of(&uuid), leases, "a new lease");
    let maps = lab.qemu_backing_maps(&uuid);
    let expected: Vec<(String, u64)> = ["ram-node0", "ram-node1"]
        .iter()
        .zip(&leases)
        .map(|(a, l)| (a.to_string(), inode(&l.path)))
        .collect();
    assert_eq!(maps, expected);
    // Same memory: a reset does not clear guest RAM, so the pattern is still there.
    assert_eq!(read_at(&leases[0], MIB as usize, PATTERN.len()), PATTERN);
    lab.destroy(&uuid);
    lab.assert_clean();
}

#[test]
fn destroy_during_another_start_hook_and_libvirtd_restart_mid_start() {
    if !tools_present() {
        return;
    }
    use nix::sys::signal::Signal;
    let mut lab = Lab::new("libvirt-race", 256 * MIB, 128 * MIB);

    // Domain A runs; B's start hook is held in the daemon (stopped) while A is destroyed, so
    // both hook calls wait on the daemon at once.
    let a = lab.uuid();
    let b = lab.uuid();
    lab.start(&domain_xml("racer-a", &a, 0, true, ""));
    let a_leases = lab.leases_of(&a);
    signal_daemon(&lab, Signal::SIGSTOP);
    let (created, destroyed, overlap) = std::thread::scope(|s| {
        let create = s.spawn(|| lab.create(&domain_xml("racer-b", &b, 0, true, "")));
        let in_start = wait_until("B's start hook", Duration::from_secs(20), || {
            hook_running("racer-b", "start")
        });
        let destroy = s.spawn(|| lab.sandbox.virsh(&["destroy", &a]).unwrap());
        // A's release hook runs while B's start hook still waits.
        let overlap = in_start
            && wait_until("A's stop hook", Duration::from_secs(10), || {
                hook_running("racer-a", "stopped") || hook_running("racer-a", "release")
            })
            && hook_running("racer-b", "start");
        signal_daemon(&lab, Signal::SIGCONT);
        (create.join().unwrap(), destroy.join().unwrap(), overlap)
    });
    assert!(overlap, "the two hook calls did not overlap");
    assert!(
        created.status.success(),
        "{created:?}\n{}",
        tail(&lab.sandbox.log())
    );
    assert!(destroyed.status.success(), "{destroyed:?}");
    assert!(lab.sandbox.qemu_pid(&a).is_none());
    assert!(
        wait_until("A's leases released", Duration::from_secs(20), || lab
            .leases_of(&a)
            .is_empty()),
        "A's leases {a_leases:?} kept"
    );
    mapped_lease(&lab, &b);
    lab.destroy(&b);
    lab.assert_clean();

    // libvirtd restarts while C's start hook waits on the daemon: whatever libvirt then makes
    // of the start, nothing leaks once it settles.
    let c = lab.uuid();
    signal_daemon(&lab, Signal::SIGSTOP);
    let (created, restarted) = std::thread::scope(|s| {
        let create = s.spawn(|| lab.create(&domain_xml("racer-c", &c, 0, true, "")));
        assert!(wait_until(
            "C's start hook",
            Duration::from_secs(20),
            || hook_running("racer-c", "start")
        ));
        let restart = s.spawn(|| lab.sandbox.restart_libvirtd());
        std::thread::sleep(Duration::from_secs(1));
        signal_daemon(&lab, Signal::SIGCONT);
        (create.join().unwrap(), restart.join().unwrap())
    });
    restarted.unwrap_or_else(|e| panic!("libvirtd restart: {e}"));
    eprintln!(
        "virsh create across the libvirtd restart: {} {}",
        created.status,
        String::from_utf8_lossy(&created.stderr).trim()
    );
    assert!(wait_until(
        "the hook of the interrupted start to end",
        Duration::from_secs(40),
        || !hook_running("racer-c", "start")
    ));
    let running = lab.sandbox.qemu_pid(&c).is_some();
    eprintln!(
        "after the restart, racer-c running: {running}, leases {:?}",
        lab.leases_of(&c)
    );
    if running {
        mapped_lease(&lab, &c);
        lab.destroy(&c);
    }
    // Leases of a start libvirt forgot are released by reconciliation (a timer in
    // production; stale_after_s = 0 here).
    lab.reconcile();
    lab.assert_clean();
}

/// `virsh attach-device --live` of a DIMM runs no hook: `hugeprep libvirt-attach` leases it
/// beforehand and links it where libvirt points QEMU's backend (the device's user alias in
/// the per-domain directory); QEMU, unprivileged, maps the lease and the guest sees its bytes
/// at the DIMM's address; `release end` gives it back with the domain's other lease.
#[test]
fn attach_device_of_a_dimm_maps_a_lease_placed_beforehand() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("libvirt-attach", 256 * MIB, 64 * MIB);
    let uuid = lab.uuid();
    let extra = "<maxMemory slots='2' unit='MiB'>256</maxMemory><features><acpi/></features>";
    lab.start(&domain_xml("attached", &uuid, 1, true, extra));
    let attach = |alias: &str, size: &str| {
        let live = virsh(&lab, &["dumpxml", &uuid]);
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hugeprep"))
            .args(["libvirt-attach", alias, size, "--config"])
            .arg(&lab.config_path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), live.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    // Bad input: refused with the field named, nothing taken.
    for (alias, size, says) in [
        ("dimm0", "32M", "user alias"),
        ("ua-a/b", "32M", "user alias"),
        ("ua-hp0", "3M", "whole number"),
    ] {
        let out = attach(alias, size);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{alias}: {err}"
        );
    }
    assert_eq!(lab.leases_of(&uuid).len(), 1);

    let out = attach("ua-hp0", "32M");
    assert!(out.status.success(), "{out:?}");
    let device = String::from_utf8(out.stdout).unwrap();
    assert!(device.contains("<alias name='ua-hp0'/>"), "{device}");
    let again = attach("ua-hp0", "32M");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already"),
        "{again:?}"
    );
    let dimm = lab
        .leases_of(&uuid)
        .into_iter()
        .find(|l| l.name.ends_with("-ua-hp0"))
        .unwrap();
    write_at(&dimm, MIB as usize, PATTERN);
    let file = lab.env.dir.join("dimm.xml");
    std::fs::write(&file, &device).unwrap();
    virsh(
        &lab,
        &["attach-device", &uuid, file.to_str().unwrap(), "--live"],
    );
    let maps = lab.qemu_backing_maps(&uuid);
    assert!(
        maps.contains(&("ua-hp0".to_string(), inode(&dimm.path))),
        "QEMU does not map the DIMM's lease: {maps:?}"
    );
    assert_eq!(lab.qemu_ids(&uuid).0, lab.qemu_uid);
    // Hot-plugged DIMMs start at 4 GiB of guest-physical space.
    assert_eq!(
        lab.guest_bytes(&uuid, (4u64 << 30) + MIB, PATTERN.len()),
        PATTERN
    );
    lab.destroy(&uuid);
    assert!(wait_until(
        "the domain's leases released",
        Duration::from_secs(20),
        || lab.leases_of(&uuid).is_empty()
    ));
    lab.assert_clean();
}
