//! Who libvirt runs QEMU as, and what the hook's files allow: QEMU as root (still supported),
//! as another distribution's user (`qemu:qemu`, as Fedora and RHEL ship it), and per domain
//! (`<seclabel model='dac'>`); and the bad input that must fail a start cleanly (a hook
//! config naming a user that does not exist, a `memory_backing_dir` QEMU cannot reach).

mod daemon_util;
mod libvirt_util;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use daemon_util::MIB;
use hugeprep::perm::Credentials;
use hugeprep::vmm::libvirt::qemu_conf::QemuConf;
use libvirt_util::{can_open_as, domain_xml, ensure_kvm_user, inode, tools_present, Lab, QemuAs};

/// Writes into a lease from a process that exits (`daemon_util::lessee`).
#[test]
fn lessee_entry() {
    daemon_util::lessee::entry();
}

/// The domain runs on its hook lease: QEMU maps exactly it, as the expected user.
fn runs_on_lease(lab: &Lab, uuid: &str, uid: u32) {
    let leases = lab.leases_of(uuid);
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(
        lab.qemu_backing_maps(uuid),
        vec![("pc.ram".to_string(), inode(&leases[0].path))]
    );
    lab.assert_qemu_owns(uuid, uid);
}

/// QEMU as root stays supported: qemu.conf `user = "root"`.
#[test]
fn qemu_as_root() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new_as("libvirt-root", 256 * MIB, 128 * MIB, &QemuAs::Root);
    assert_eq!(lab.qemu_uid, 0);
    let uuid = lab.uuid();
    lab.start(&domain_xml("as-root", &uuid, 2, true, ""));
    assert_eq!(lab.qemu_ids(&uuid), (0, 0));
    let leases = lab.leases_of(&uuid);
    assert_eq!(leases.len(), 2);
    for l in &leases {
        assert_eq!(std::fs::metadata(&l.path).unwrap().uid(), 0);
    }
    daemon_util::lessee::write_at(&leases[1].path, leases[1].size, MIB as usize, "root-cell");
    assert_eq!(lab.guest_bytes(&uuid, 33 * MIB, 9), b"root-cell");
    lab.destroy(&uuid);
    lab.assert_clean();
}

/// Fedora and RHEL run QEMU as `qemu:qemu`: the hook hands the files to whatever user
/// libvirt names, from the domain's DAC label, or from qemu.conf when run by hand.
#[test]
fn qemu_as_another_distributions_user() {
    if !tools_present() {
        return;
    }
    let qemu = ensure_kvm_user("qemu");
    let as_qemu = QemuAs::User {
        user: "qemu".into(),
        group: "qemu".into(),
    };
    let mut lab = Lab::new_as("libvirt-fedora", 256 * MIB, 128 * MIB, &as_qemu);
    assert_eq!(lab.qemu_uid, qemu);
    let uuid = lab.uuid();
    lab.start(&domain_xml("fedora-like", &uuid, 0, true, ""));
    runs_on_lease(&lab, &uuid, qemu);
    lab.destroy(&uuid);
    lab.assert_clean();

    // Run by hand, without libvirt's label in the XML: qemu.conf's user.
    let uuid = lab.uuid();
    let xml = domain_xml("by-hand", &uuid, 0, true, "")
        .replace("<domain type='kvm'>", "<domain type='kvm' id='77'>");
    let out = lab.run_hook("by-hand", "start", "begin", &xml);
    assert!(out.status.success(), "{out:?}");
    let lease = lab.leases_of(&uuid).remove(0);
    assert_eq!(std::fs::metadata(&lease.path).unwrap().uid(), qemu);
    let dir = lab.backing.join("libvirt/qemu/77-by-hand");
    let m = std::fs::metadata(&dir).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (qemu, 0o700));
    // libvirt removes the directory when the domain stops, then runs `release end`.
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(lab
        .run_hook("by-hand", "release", "end", &xml)
        .status
        .success());
    lab.assert_clean();
}

/// DAC separates domains only when they run as different users: with a per-domain label
/// (`<seclabel type='static' model='dac'>`) each QEMU can open its own lease and not the
/// other's, through libvirt's directory or the daemon's. Domains that share the packaged
/// user are not separated by DAC at all (docs/security.md).
#[test]
fn per_domain_dac_labels_keep_domains_apart() {
    if !tools_present() {
        return;
    }
    let qemu = ensure_kvm_user("qemu");
    let mut lab = Lab::new("libvirt-labels", 256 * MIB, 128 * MIB);
    let a = lab.uuid();
    let b = lab.uuid();
    lab.start(&domain_xml("packaged-user", &a, 0, true, ""));
    let label =
        "<seclabel type='static' model='dac' relabel='yes'><label>qemu:qemu</label></seclabel>";
    lab.start(&domain_xml("own-user", &b, 0, true, label));
    runs_on_lease(&lab, &a, lab.qemu_uid);
    runs_on_lease(&lab, &b, qemu);

    // Each QEMU's credentials as libvirt sets them: the label's ids, and the supplementary
    // groups of qemu.conf's user for both.
    let conf = QemuConf::read(&lab.sandbox.dir().join("etc/qemu.conf")).unwrap();
    let groups = conf.qemu_user().unwrap().creds.groups;
    let creds = |uuid: &str| {
        let (uid, gid) = lab.qemu_ids(uuid);
        Credentials {
            uid,
            gid,
            groups: groups.clone(),
        }
    };
    for (me, other) in [(&a, &b), (&b, &a)] {
        let lease = lab.leases_of(other).remove(0);
        let linked = lab
            .backing
            .join("libvirt/qemu")
            .read_dir()
            .unwrap()
            .flatten()
            .map(|d| d.path().join("pc.ram"))
            .find(|p| p.exists() && inode(p) == inode(&lease.path))
            .unwrap();
        for path in [&linked, &lease.path] {
            assert!(
                !can_open_as(&creds(me), path),
                "the QEMU of {me} opens {}",
                path.display()
            );
        }
    }
    lab.destroy(&a);
    lab.destroy(&b);
    lab.assert_clean();
}

/// A hook config naming a user that does not exist, and a `memory_backing_dir` QEMU's user
/// cannot reach, fail the start with an error naming the field: no QEMU, no lease, no
/// directory left.
#[test]
fn bad_owner_and_unreachable_backing_dir_fail_cleanly() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("libvirt-badinput", 256 * MIB, 128 * MIB);
    let nothing_started = |lab: &Lab, uuid: &str, out: &std::process::Output| {
        assert!(!out.status.success(), "{out:?}");
        assert!(lab.sandbox.qemu_pid(uuid).is_none(), "a QEMU runs");
        assert!(lab
            .sandbox
            .virsh_ok(&["list", "--uuid"])
            .unwrap()
            .trim()
            .is_empty());
        lab.assert_clean();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };

    lab.configure(|c| c.owner = Some("no-such-user-hugeprep".into()));
    let uuid = lab.uuid();
    let out = lab.create(&domain_xml("bad-owner", &uuid, 0, true, ""));
    let err = nothing_started(&lab, &uuid, &out);
    assert!(
        err.contains("owner: no user \"no-such-user-hugeprep\""),
        "{err}"
    );
    lab.configure(|c| c.owner = None);

    // The directory libvirt was told to use is root's and closed to QEMU's user.
    let closed = std::fs::Permissions::from_mode(0o700);
    std::fs::set_permissions(&lab.backing, closed).unwrap();
    let uuid = lab.uuid();
    let out = lab.create(&domain_xml("unreachable", &uuid, 0, true, ""));
    std::fs::set_permissions(&lab.backing, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = nothing_started(&lab, &uuid, &out);
    assert!(
        err.contains("memory_backing_dir")
            && err.contains(&format!("{} (root:root, mode 0700)", lab.backing.display()))
            && err.contains("search"),
        "{err}"
    );

    // And with both fixed, the same domain starts.
    lab.start(&domain_xml("unreachable", &uuid, 0, true, ""));
    runs_on_lease(&lab, &uuid, lab.qemu_uid);
    lab.destroy(&uuid);
    lab.assert_clean();
}
