//! libvirt through the installed package, in a real systemd (tests/systemd/container.sh):
//! Debian's libvirtd as packaged (its `qemu.conf` with only the lines the package's snippet
//! adds: QEMU runs as `libvirt-qemu`, dynamic ownership, a private /dev), the hook installed as
//! `/usr/share/hugeprep/libvirt/README.md` says. A domain starts on a lease; installing a
//! newer build of the package (`dpkg -i`) restarts the daemon under it: the domain keeps
//! running on the same memory, the new daemon lists its lease, and destroying the domain
//! releases it (the hook) back into the warm pool, with the pages adding up exactly. Then a
//! domain of 1 GiB pages starts with `memory_backing_dir` on the package's `/dev/hugepages1G`
//! (skipped, saying why, when the kernel has no free 1 GiB page).

#[path = "systemd_util/mod.rs"]
mod systemd_util;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hugeprep::hugetlb::pool;
use hugeprep::testing::HugepageReservation;
use hugeprep::PageSize;
use systemd_util::Container;

const CONFIG: &str = "[pool]\nverify = \"sample\"\nreserve = false\n[[pool.target]]\n\
page_size = \"2M\"\nwarm = \"64M\"\nsizes = [\"32M\"]\n";

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// This checkout's package (`deb`) and the same again with a higher Debian revision, a newer
/// build to upgrade to, both copied to a directory of their own (cargo-deb empties
/// target/debian when it runs).
fn with_newer_build(deb: &Path) -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("hugeprep-newer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let current = dir.join("hugeprep-current.deb");
    std::fs::copy(deb, &current).unwrap();
    let out = Command::new("cargo")
        .current_dir(root)
        .args([
            "deb",
            "--no-build",
            "--quiet",
            "--deb-revision",
            "2",
            "--output",
        ])
        .arg(dir.join("hugeprep-newer.deb"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo deb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (current, dir.join("hugeprep-newer.deb"))
}

fn domain_xml(name: &str, mib: u64, page_size: &str) -> String {
    let metadata = if page_size == "1G" {
        "<metadata><hugeprep:memory xmlns:hugeprep='urn:hugeprep:libvirt:1' page_size='1G'/></metadata>"
    } else {
        ""
    };
    format!(
        "<domain type='kvm'><name>{name}</name>{metadata}<memory unit='MiB'>{mib}</memory>\
         <vcpu>1</vcpu><memoryBacking><source type='file'/><access mode='shared'/></memoryBacking>\
         <os><type arch='x86_64' machine='q35'>hvm</type></os>\
         <cpu mode='host-passthrough'><feature policy='disable' name='arch-capabilities'/></cpu>\
         <devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices></domain>"
    )
}

/// Defines and starts (paused) `name`; returns its QEMU's pid.
fn start(c: &Container, name: &str, xml: &str) -> String {
    let file = format!("/tmp/{name}.xml");
    c.write(&file, xml);
    c.ok(&["virsh", "define", &file]);
    let r = c.run(&["virsh", "start", "--paused", name]);
    assert!(
        r.ok,
        "virsh start {name}: {}\n{}",
        r.stderr,
        c.journal("hugeprep")
    );
    c.ok(&["cat", &format!("/run/libvirt/qemu/{name}.pid")])
        .trim()
        .to_string()
}

/// The domain's leases, from the daemon.
fn leases_of(c: &Container, name: &str) -> Vec<serde_json::Value> {
    let uuid = c.ok(&["virsh", "domuuid", name]).trim().to_string();
    json(&c.ok(&["hugeprep", "status", "--json"]))["leases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["name"].as_str().unwrap_or("").contains(&uuid))
        .cloned()
        .collect()
}

/// QEMU `pid` (as `libvirt-qemu`) maps the inode of `path` with pages of `kib` KiB.
fn qemu_maps(c: &Container, pid: &str, path: &str, kib: u64) {
    let user = c.ok(&["ps", "-o", "user=", "-p", pid]).trim().to_string();
    assert_eq!(user, "libvirt-qemu", "QEMU runs as {user}");
    let ino = c.ok(&["stat", "-c", "%i", path]).trim().to_string();
    let smaps = c.ok(&["cat", &format!("/proc/{pid}/smaps")]);
    let mapping = smaps
        .split("\nVmFlags")
        .find(|m| {
            m.lines()
                .any(|l| l.split_whitespace().nth(4) == Some(ino.as_str()))
        })
        .unwrap_or_else(|| panic!("QEMU {pid} does not map inode {ino} of {path}"));
    assert!(
        mapping.contains(&format!("KernelPageSize: {kib:>8} kB")),
        "{mapping}"
    );
}

#[test]
fn libvirt_domain_on_the_installed_package_through_an_upgrade() {
    let Some(deb) = systemd_util::package() else {
        return;
    };
    let (deb, newer) = with_newer_build(&deb);
    let pages = HugepageReservation::ensure_free(PageSize::Size2M, 64)
        .expect("reserving hugepages (run as root)")
        .expect("the kernel cannot supply 64 2 MiB pages");
    let free_before = pages.free_pages();
    let c = Container::boot("libvirt");
    c.ok(&["rm", "-f", "/usr/sbin/policy-rc.d"]);
    c.ok(&["mknod", "-m", "0660", "/dev/kvm", "c", "10", "232"]);
    c.ok(&["chgrp", "kvm", "/dev/kvm"]);
    c.install(&deb);
    c.write("/etc/hugeprep/hugeprep.toml", CONFIG);
    c.ok(&["systemctl", "restart", "hugeprep.service"]);

    // /usr/share/hugeprep/libvirt/README.md, "Install".
    c.ok(&["mkdir", "-p", "/dev/hugepages/libvirt-backing"]);
    c.sh("cat /usr/share/hugeprep/libvirt/qemu.conf.snippet >>/etc/libvirt/qemu.conf");
    c.ok(&["mkdir", "-p", "/etc/libvirt/hooks/qemu.d"]);
    c.ok(&[
        "install",
        "-m",
        "0755",
        "/usr/share/hugeprep/libvirt/hook",
        "/etc/libvirt/hooks/qemu.d/hugeprep",
    ]);
    c.ok(&["systemctl", "restart", "libvirtd"]);
    c.wait_for(
        "hugeprep status --json | grep -q '\"warm_bytes\": 67108864'",
        Duration::from_secs(60),
        "the pool is warm",
    );

    let pid = start(&c, "vm1", &domain_xml("vm1", 32, "2M"));
    let leases = leases_of(&c, "vm1");
    assert_eq!(leases.len(), 1, "{leases:#?}");
    assert_eq!(leases[0]["source"], "warm-exact", "{leases:#?}");
    let path = leases[0]["path"].as_str().unwrap().to_string();
    qemu_maps(&c, &pid, &path, 2048);

    // A newer build of the package: the daemon restarts under the running domain.
    let before = c.prop("hugeprep.service", "MainPID");
    c.upgrade(&newer);
    assert_eq!(
        c.ok(&["dpkg-query", "-W", "-f", "${Version}", "hugeprep"]),
        "0.1.0-2"
    );
    assert_ne!(
        c.prop("hugeprep.service", "MainPID"),
        before,
        "not restarted"
    );
    assert_eq!(c.ok(&["virsh", "domstate", "vm1"]).trim(), "paused");
    let again = leases_of(&c, "vm1");
    assert_eq!(again.len(), 1, "{again:#?}");
    assert_eq!(again[0]["id"], leases[0]["id"]);
    qemu_maps(&c, &pid, &path, 2048);

    // Destroyed: the hook releases the lease, scrubbed back into the warm pool.
    c.ok(&["virsh", "destroy", "vm1"]);
    c.wait_for(
        "hugeprep status --json | grep -q '\"warm_bytes\": 67108864'",
        Duration::from_secs(60),
        "the released lease back in the warm pool",
    );
    assert!(leases_of(&c, "vm1").is_empty());
    c.ok(&["virsh", "undefine", "vm1"]);

    // 1 GiB pages: memory_backing_dir on the package's 1G mount.
    if pool::available(None, PageSize::Size1G).unwrap_or(0) >= 1 {
        c.ok(&["mkdir", "-p", "/dev/hugepages1G/libvirt-backing"]);
        c.sh("sed -i 's|^memory_backing_dir = .*|memory_backing_dir = \"/dev/hugepages1G/libvirt-backing\"|' /etc/libvirt/qemu.conf /etc/hugeprep/libvirt-hook.toml");
        c.ok(&["systemctl", "restart", "libvirtd"]);
        let pid = start(&c, "vm1g", &domain_xml("vm1g", 1024, "1G"));
        let leases = leases_of(&c, "vm1g");
        assert_eq!(leases.len(), 1, "{leases:#?}");
        assert_eq!(leases[0]["page_size"], "1G", "{leases:#?}");
        let path = leases[0]["path"].as_str().unwrap().to_string();
        assert!(path.starts_with("/dev/hugepages1G/"), "{path}");
        qemu_maps(&c, &pid, &path, 1 << 20);
        c.ok(&["virsh", "destroy", "vm1g"]);
        c.wait_for(
            "hugeprep status --json | grep -q '\"leased_bytes\": 0' && ! hugeprep status --json | grep -q '\"leased_bytes\": [1-9]'",
            Duration::from_secs(60),
            "the 1G lease released",
        );
        c.ok(&["virsh", "undefine", "vm1g"]);
    } else {
        eprintln!(
            "1 GiB half skipped: {}",
            hugeprep::testing::shortfall_note(PageSize::Size1G, 1)
        );
    }

    // Exact accounting: drained, the daemon holds no page; the package comes off as the
    // README says (memory_backing_dir out of qemu.conf first).
    c.ok(&["hugeprep", "drain"]);
    let free = pages.wait_free(free_before);
    assert_eq!(free, free_before, "pages left in the daemon's files");
    c.sh("sed -i '/^memory_backing_dir/d' /etc/libvirt/qemu.conf");
    c.ok(&["systemctl", "stop", "libvirtd"]);
    c.ok(&["dpkg", "-P", "hugeprep"]);
    let _ = std::fs::remove_dir_all(newer.parent().unwrap());
}
