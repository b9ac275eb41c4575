//! The Debian package as a new operator meets it, in a real systemd (tests/systemd/container.sh),
//! with the configuration as shipped:
//! - the first lease is served on a host with nothing warm: the daemon raises the kernel's pool
//!   for it (the packaged defaults keep nothing warm, `reserve = true`);
//! - a non-root member of the socket's group (`kvm`) leases and releases; a user outside it is
//!   refused at `connect`; `/run/hugeprep` keeps mode 0755 through `systemctl reload`;
//! - a 1 GiB lease made through the service is a path that QEMU, running as libvirt's QEMU
//!   user outside the service's mount namespace, maps (the leased pages, no new ones);
//! - removal refuses, naming what to do, while it would lose leases or adopted definitions or
//!   keep domains from starting; once removed, the libvirt hook left behind does nothing and
//!   every page the daemon added is back; reinstalling starts the socket again.
//!
//! The daemon raises the host's hugepage pools (the container shares them): the machine-wide
//! hugepage test lock is held throughout, and the pools must end as they began.

#[path = "systemd_util/mod.rs"]
mod systemd_util;

use hugeprep::hugetlb::pool::{self, Scope};
use hugeprep::PageSize;
use systemd_util::Container;

/// `nr_hugepages` of each page size, machine-wide.
fn pools() -> Vec<u64> {
    PageSize::ALL
        .iter()
        .map(|ps| pool::read(Scope::System, *ps).map_or(0, |p| p.total))
        .collect()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `dpkg -r hugeprep` expected to be refused, naming `what`; the package stays, the socket
/// keeps listening.
fn removal_refused(c: &Container, what: &str) {
    let r = c.run(&["dpkg", "-r", "hugeprep"]);
    assert!(!r.ok, "removal went ahead:\n{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains(what) && r.stderr.contains("not removed"),
        "{}",
        r.stderr
    );
    assert!(c
        .ok(&["dpkg-query", "-W", "-f", "${Status}", "hugeprep"])
        .contains("install ok installed"));
    assert_eq!(c.prop("hugeprep.socket", "ActiveState"), "active");
}

/// QEMU as `libvirt-qemu` maps the 1 GiB lease at `path` (outside the service's mount
/// namespace): the mapping is the lease's inode on 1 GiB pages, and no new page was taken.
fn qemu_maps_1g_lease(c: &Container, path: &str) {
    let free = || pool::available(None, PageSize::Size1G).unwrap();
    let before = free();
    let backend =
        format!("memory-backend-file,id=m0,size=1G,mem-path={path},share=on,prealloc=off");
    c.ok(&["rm", "-f", "/tmp/qemu-1g.pid"]);
    let r = c.run_as(
        "libvirt-qemu",
        &[
            "qemu-system-x86_64",
            "-machine",
            "none",
            "-nodefaults",
            "-display",
            "none",
            "-monitor",
            "none",
            "-S",
            "-object",
            &backend,
            "-daemonize",
            "-pidfile",
            "/tmp/qemu-1g.pid",
        ],
    );
    assert!(
        r.ok,
        "QEMU could not open the 1G lease {path}:\n{}",
        r.stderr
    );
    let pid = c.ok(&["cat", "/tmp/qemu-1g.pid"]).trim().to_string();
    let ino = c.ok(&["stat", "-c", "%i", path]).trim().to_string();
    // smaps: the mapping of the lease's inode, on 1 GiB kernel pages.
    let smaps = c.ok(&["cat", &format!("/proc/{pid}/smaps")]);
    let mapping = smaps
        .split("\nVmFlags")
        .find(|m| {
            m.lines()
                .any(|l| l.contains(path) && l.split_whitespace().nth(4) == Some(&ino))
        })
        .unwrap_or_else(|| panic!("QEMU does not map inode {ino} of {path}:\n{smaps}"));
    assert!(mapping.contains("KernelPageSize:  1048576 kB"), "{mapping}");
    assert_eq!(free(), before, "QEMU took 1 GiB pages of its own");
    c.ok(&["kill", &pid]);
    c.wait_for(
        &format!("! kill -0 {pid} 2>/dev/null"),
        std::time::Duration::from_secs(10),
        "QEMU exits",
    );
}

#[test]
fn first_install_unprivileged_clients_1g_removal_and_reinstall() {
    let Some(deb) = systemd_util::package() else {
        return;
    };
    let _lock = hugeprep::testing::lock().expect("the hugepage test lock");
    let before = pools();
    let c = Container::boot("install");
    c.ok(&["rm", "-f", "/usr/sbin/policy-rc.d"]);
    c.install(&deb);
    assert_eq!(c.mode("/run/hugeprep"), "755 root:root");
    assert_eq!(c.mode("/run/hugeprep/hugeprep.sock"), "660 root:kvm");
    c.add_user("alice", &["kvm"]);
    c.add_user("mallory", &[]);

    // A non-root member of kvm: the first API call starts the daemon; nothing is warm and, as
    // on a fresh host, no page is free (others' free pages held meanwhile): the daemon raises
    // the kernel's pool and serves the lease cold.
    let occupied = hugeprep::testing::occupy_free_pages().unwrap();
    let r = c.run_as("alice", &["hugeprep", "lease", "t1", "16M", "--json"]);
    drop(occupied);
    assert!(r.ok, "{}\n{}", r.stderr, c.journal("hugeprep"));
    let lease = json(&r.stdout);
    assert_eq!(lease["source"], "cold", "{lease:#}");
    let alice = c.ok(&["id", "-u", "alice"]).trim().to_string();
    assert_eq!(lease["principal"], format!("uid:{alice}"), "{lease:#}");
    let status = json(&c.ok(&["hugeprep", "status", "--json"]));
    eprintln!("first lease: {lease}\npool: {}", status["pool"]);
    // Outside the group: refused by the socket's mode, before the daemon sees anything.
    let r = c.run_as("mallory", &["hugeprep", "status"]);
    assert!(
        !r.ok && r.stderr.contains("Permission denied"),
        "{}{}",
        r.stdout,
        r.stderr
    );
    // Reload (the packaged ExecReload=) keeps the directory's mode; the client still reaches it.
    c.ok(&["systemctl", "reload", "hugeprep"]);
    assert_eq!(c.mode("/run/hugeprep"), "755 root:root");
    assert_eq!(c.mode("/run/hugeprep/hugeprep.sock"), "660 root:kvm");
    c.ok(&["runuser", "-u", "alice", "--", "hugeprep", "release", "t1"]);
    assert!(c
        .journal("hugeprep")
        .contains("raised the kernel's hugepage pool for a lease"));

    // 1 GiB pages: the package's dev-hugepages1G.mount is the host's, so the lease's path is
    // there for QEMU too.
    if pool::available(None, PageSize::Size1G).unwrap_or(0) >= 1 {
        c.ok(&["mountpoint", "-q", "/dev/hugepages1G"]);
        let g = json(&c.ok(&[
            "hugeprep",
            "lease",
            "g1",
            "1G",
            "--page-size",
            "1G",
            "--owner",
            "libvirt-qemu",
            "--json",
        ]));
        let path = g["path"].as_str().unwrap().to_string();
        assert!(path.starts_with("/dev/hugepages1G/"), "{g:#}");
        qemu_maps_1g_lease(&c, &path);
        c.ok(&["hugeprep", "release", "g1"]);
    } else {
        eprintln!(
            "1 GiB half skipped: {}",
            hugeprep::testing::shortfall_note(PageSize::Size1G, 1)
        );
    }

    // The first package's hook wrapper, installed by an operator, is replaced by an upgrade
    // (it would fail every domain start once the package is gone).
    let first_hook = "#!/bin/sh\n# /etc/libvirt/hooks/qemu.d/hugeprep (mode 0755): libvirt runs every file in qemu.d with\n# `DOMAIN OP SUBOP EXTRA` and the domain XML on stdin. Restart libvirtd after installing:\n# it looks for hooks only when it starts.\nexec /usr/bin/hugeprep libvirt-hook --config /etc/hugeprep/libvirt-hook.toml \"$@\"\n";
    c.ok(&["mkdir", "-p", "/etc/libvirt/hooks/qemu.d"]);
    c.write("/etc/libvirt/hooks/qemu.d/hugeprep", first_hook);
    c.ok(&["chmod", "0755", "/etc/libvirt/hooks/qemu.d/hugeprep"]);
    c.install(&deb);
    c.ok(&[
        "cmp",
        "/usr/share/hugeprep/libvirt/hook",
        "/etc/libvirt/hooks/qemu.d/hugeprep",
    ]);

    // Removal refuses what it would break, each time naming what to do.
    c.ok(&[
        "runuser", "-u", "alice", "--", "hugeprep", "lease", "t2", "8M",
    ]);
    removal_refused(&c, "live lease(s) (t2)");
    c.ok(&["hugeprep", "release", "t2"]);
    c.sh("echo 'memory_backing_dir = \"/dev/hugepages/libvirt-backing\"' >>/etc/libvirt/qemu.conf");
    removal_refused(&c, "memory_backing_dir");
    let uuid = "4dea22b3-1d52-d8f3-2516-782e98ab3fa0";
    c.ok(&[
        "mkdir",
        "-p",
        "-m",
        "0700",
        "/var/lib/hugeprep/libvirt-adopt",
    ]);
    c.write(
        &format!("/var/lib/hugeprep/libvirt-adopt/{uuid}.xml"),
        &format!("<domain type='kvm'><name>vm-adopted</name><uuid>{uuid}</uuid></domain>"),
    );
    removal_refused(&c, "hugeprep libvirt-adopt --revert vm-adopted");
    c.ok(&["rm", "-r", "/var/lib/hugeprep/libvirt-adopt"]);
    c.write("/etc/libvirt/hooks/qemu", first_hook);
    removal_refused(&c, "/etc/libvirt/hooks/qemu runs hugeprep without checking");
    c.ok(&["rm", "/etc/libvirt/hooks/qemu"]);
    c.sh("sed -i '/^memory_backing_dir/d' /etc/libvirt/qemu.conf");

    // Removed: units stopped, the 1G mount gone, the pages the daemon added given back; the
    // hook left in libvirt's directory does nothing (exit 0, nothing on stdout).
    // The daemon runs (the reinstall restarted it): prerm drains it before the stop.
    assert_eq!(c.prop("hugeprep.service", "ActiveState"), "active");
    let removal = c.run(&["dpkg", "-r", "hugeprep"]);
    assert!(removal.ok, "{}{}", removal.stdout, removal.stderr);
    c.ok(&["test", "!", "-e", "/usr/bin/hugeprep"]);
    assert_eq!(c.prop("hugeprep.socket", "ActiveState"), "inactive");
    assert!(!c.run(&["mountpoint", "-q", "/dev/hugepages1G"]).ok);
    assert_eq!(
        pools(),
        before,
        "the pages the daemon added were not given back:\n{}{}\n{}",
        removal.stdout,
        removal.stderr,
        c.journal("hugeprep")
    );
    let hook = c.sh("echo '<domain/>' | /etc/libvirt/hooks/qemu.d/hugeprep vm1 prepare begin -");
    assert!(
        hook.ok && hook.stdout.is_empty(),
        "{}{}",
        hook.stdout,
        hook.stderr
    );

    // Reinstalled after the removal: the socket listens again, the group's members lease.
    c.install(&deb);
    assert_eq!(c.prop("hugeprep.socket", "ActiveState"), "active");
    assert_eq!(c.mode("/run/hugeprep"), "755 root:root");
    c.ok(&[
        "runuser", "-u", "alice", "--", "hugeprep", "lease", "t3", "16M",
    ]);
    c.ok(&["runuser", "-u", "alice", "--", "hugeprep", "release", "t3"]);
    c.ok(&["dpkg", "-P", "hugeprep"]);
    assert_eq!(
        pools(),
        before,
        "the pages the daemon added were not given back"
    );
}
