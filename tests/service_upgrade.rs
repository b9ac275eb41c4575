//! Upgrade with a VM running, in a real systemd (tests/systemd/container.sh): the package of
//! an earlier commit of main (`scripts/old-deb`, built once per machine) serves a lease to a
//! QEMU/KVM guest running as libvirt's QEMU user; `dpkg -i` of this checkout's package
//! restarts the daemon under it. The guest keeps running on its memory (its bytes intact), the
//! new daemon lists the lease the old one journaled (the state directory has no format file
//! yet: format 0, read as format 1), and releasing it after the guest stops scrubs it: the
//! next lease of those pages reads zeros, and the pool and the kernel's pages add up exactly.
//! A state directory of a format newer than the build is refused at start with a clear error
//! in the journal, leases kept, and read again by a build that knows it. Through the upgrade,
//! and through a reinstall that restarts the new daemon, a client calls the API every 50 ms
//! and no call fails: postinst restarts the service under its listening socket.

#[path = "systemd_util/mod.rs"]
mod systemd_util;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use hugeprep::testing::HugepageReservation;
use hugeprep::PageSize;
use systemd_util::{Container, Run};

const CONFIG: &str = "[pool]\nverify = \"sample\"\nreserve = false\n[[pool.target]]\n\
page_size = \"2M\"\nwarm = \"64M\"\nsizes = [\"32M\"]\n";

/// The .deb of an earlier commit: `$HUGEPREP_OLD_DEB`, else `scripts/old-deb` (cached).
fn old_package() -> PathBuf {
    if let Some(p) = std::env::var_os("HUGEPREP_OLD_DEB") {
        return PathBuf::from(p);
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("scripts/old-deb")).output().unwrap();
    assert!(
        out.status.success(),
        "scripts/old-deb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Starts a client inside that calls `GET /v1/version` every 50 ms (curl: the same client
/// before, during and after the upgrade) and logs each call's outcome.
fn start_poller(c: &Container) {
    c.ok(&["rm", "-f", "/tmp/poll.log", "/tmp/poll.stop"]);
    let r = c.sh("setsid sh -c 'while [ ! -e /tmp/poll.stop ]; do \
           if out=$(curl -sS -f --max-time 30 --unix-socket /run/hugeprep/hugeprep.sock \
                 http://localhost/v1/version 2>&1 >/dev/null); then echo ok; \
           else echo \"failed $(date +%T.%N): $out\"; fi; \
           sleep 0.05; done; echo end' </dev/null >/tmp/poll.log 2>&1 &");
    assert!(r.ok, "{}", r.stderr);
}

/// Stops the poller; the number of calls that worked and the failures' lines.
fn stop_poller(c: &Container) -> (usize, Vec<String>) {
    c.ok(&["touch", "/tmp/poll.stop"]);
    c.wait_for(
        "grep -q '^end$' /tmp/poll.log",
        Duration::from_secs(40),
        "the poller ends",
    );
    let log = c.ok(&["cat", "/tmp/poll.log"]);
    let ok = log.lines().filter(|l| *l == "ok").count();
    let failed = log
        .lines()
        .filter(|l| l.starts_with("failed"))
        .map(str::to_string)
        .collect();
    (ok, failed)
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Writes `bytes` at offset 0 of the hugetlbfs file `path` through a shared mapping of one
/// page (hugetlbfs has no write(2)), or reads them back when `bytes` is empty.
fn poke(c: &Container, path: &str, bytes: &str) -> Run {
    let script = format!(
        "import mmap, os, sys\n\
         fd = os.open({path:?}, os.O_RDWR)\n\
         m = mmap.mmap(fd, 2 << 20)\n\
         w = {bytes:?}.encode()\n\
         if w: m[0:len(w)] = w\n\
         sys.stdout.write(m[0:16].hex())\n\
         m.close(); os.close(fd)\n"
    );
    c.run(&["python3", "-c", &script])
}

fn leases(c: &Container) -> Vec<serde_json::Value> {
    json(&c.ok(&["hugeprep", "status", "--json"]))["leases"]
        .as_array()
        .unwrap()
        .clone()
}

/// The guest's QEMU, as libvirt runs it (its user and group, KVM), on the lease at `path`.
fn start_guest(c: &Container, path: &str) -> String {
    let backend =
        format!("memory-backend-file,id=ram,size=32M,mem-path={path},share=on,prealloc=off");
    let r = c.run_as(
        "libvirt-qemu",
        &[
            "qemu-system-x86_64",
            "-accel",
            "kvm",
            "-cpu",
            "host,-arch-capabilities",
            "-machine",
            "q35,memory-backend=ram",
            "-m",
            "32M",
            "-object",
            &backend,
            "-nodefaults",
            "-display",
            "none",
            "-monitor",
            "none",
            "-S",
            "-daemonize",
            "-pidfile",
            "/tmp/guest.pid",
        ],
    );
    assert!(r.ok, "QEMU on the lease: {}", r.stderr);
    c.ok(&["cat", "/tmp/guest.pid"]).trim().to_string()
}

/// Whether process `pid` maps the inode of `path`.
fn maps(c: &Container, pid: &str, path: &str) -> bool {
    let ino = c.ok(&["stat", "-c", "%i", path]).trim().to_string();
    c.ok(&["cat", &format!("/proc/{pid}/maps")])
        .lines()
        .any(|l| l.contains(path) || l.split_whitespace().nth(4) == Some(ino.as_str()))
}

#[test]
fn upgrade_from_an_earlier_build_with_a_guest_running() {
    let Some(deb) = systemd_util::package() else {
        return;
    };
    let old = old_package();
    // 64 MiB warm, a 32 MiB lease out and its refill: 128 MiB, handed to the daemon
    // (reserve = false), given back when the test ends.
    let pages = HugepageReservation::ensure_free(PageSize::Size2M, 64)
        .expect("reserving hugepages (run as root)")
        .expect("the kernel cannot supply 64 2 MiB pages");
    let free_before = pages.free_pages();
    let c = Container::boot("upgrade");
    c.ok(&["rm", "-f", "/usr/sbin/policy-rc.d"]);
    // What udev does on a real host (the container's /dev is a bare tmpfs).
    c.ok(&["mknod", "-m", "0660", "/dev/kvm", "c", "10", "232"]);
    c.ok(&["chgrp", "kvm", "/dev/kvm"]);

    c.install(&old);
    let version = c.ok(&["dpkg-query", "-W", "-f", "${Version}", "hugeprep"]);
    assert!(version.starts_with("0.1.0-0~git"), "{version}");
    c.write("/etc/hugeprep/hugeprep.toml", CONFIG);
    c.ok(&["systemctl", "restart", "hugeprep.service"]);
    c.wait_for(
        "hugeprep status --json | grep -q '\"warm_bytes\": 67108864'",
        Duration::from_secs(60),
        "the old build's pool is warm",
    );
    c.ok(&["test", "!", "-e", "/var/lib/hugeprep/format"]);
    // The old package's run directory hid the socket from its group.
    assert_eq!(c.mode("/run/hugeprep"), "750 root:root");

    // A guest on a lease of the old build, with bytes of its own in its memory.
    let lease = json(&c.ok(&[
        "hugeprep",
        "lease",
        "vm-a",
        "32M",
        "--owner",
        "libvirt-qemu",
        "--json",
    ]));
    let path = lease["path"].as_str().unwrap().to_string();
    let pid = start_guest(&c, &path);
    let marker = "guest-memory-A!";
    assert!(poke(&c, &path, marker).ok);

    // The upgrade: the new files, the daemon restarted under the running guest, and a
    // client calling all along.
    let before = c.prop("hugeprep.service", "MainPID");
    start_poller(&c);
    std::thread::sleep(Duration::from_millis(500));
    c.upgrade(&deb);
    std::thread::sleep(Duration::from_millis(500));
    let (ok, failed) = stop_poller(&c);
    eprintln!("upgrade: {ok} calls answered, {} failed", failed.len());
    assert!(
        failed.is_empty(),
        "calls failed during the upgrade ({ok} answered):\n{}\n{}",
        failed.join("\n"),
        c.journal("hugeprep")
    );
    assert!(ok >= 10, "only {ok} calls during the upgrade");
    let version = c.ok(&["dpkg-query", "-W", "-f", "${Version}", "hugeprep"]);
    assert_eq!(version, "0.1.0-1");
    assert_ne!(
        c.prop("hugeprep.service", "MainPID"),
        before,
        "not restarted"
    );
    assert_eq!(c.prop("hugeprep.service", "ActiveState"), "active");
    assert_eq!(c.mode("/run/hugeprep"), "755 root:root");
    let j = c.journal("hugeprep");
    assert!(j.contains("kept_leases=1"), "{j}");
    // The new build read the old state and recorded its format.
    assert_eq!(c.ok(&["cat", "/var/lib/hugeprep/format"]).trim(), "1");
    let listed = leases(&c);
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(listed[0]["id"], lease["id"]);
    assert_eq!(listed[0]["path"], lease["path"]);
    // The guest runs on, on the same memory.
    c.ok(&["kill", "-0", &pid]);
    assert!(maps(&c, &pid, &path), "the guest no longer maps its lease");
    let read = poke(&c, &path, "");
    assert_eq!(read.stdout, hex(marker), "the guest's memory changed");

    // A reinstall of the same package restarts the new daemon (postinst's try-restart): no
    // call fails either, though this daemon answers 503 to connections it cannot serve at
    // stop when the socket is its own; systemd's socket keeps them queued for the next one.
    let before = c.prop("hugeprep.service", "MainPID");
    start_poller(&c);
    std::thread::sleep(Duration::from_millis(500));
    c.upgrade(&deb);
    std::thread::sleep(Duration::from_millis(500));
    let (ok, failed) = stop_poller(&c);
    eprintln!("reinstall: {ok} calls answered, {} failed", failed.len());
    assert!(
        failed.is_empty(),
        "calls failed during the reinstall ({ok} answered):\n{}",
        failed.join("\n")
    );
    assert_ne!(
        c.prop("hugeprep.service", "MainPID"),
        before,
        "not restarted"
    );
    assert_eq!(leases(&c).len(), 1);

    // A format this build does not know: refused at start, with the reason, nothing lost.
    c.ok(&["sh", "-c", "echo 2 >/var/lib/hugeprep/format"]);
    let r = c.run(&["systemctl", "restart", "hugeprep.service"]);
    assert!(!r.ok, "a newer format was accepted");
    let j = c.journal("hugeprep");
    assert!(
        j.contains("format 2 was written by a newer hugeprep; this build reads formats up to 1"),
        "{j}"
    );
    c.ok(&["sh", "-c", "echo 1 >/var/lib/hugeprep/format"]);
    c.ok(&["systemctl", "reset-failed", "hugeprep.service"]);
    c.ok(&["systemctl", "start", "hugeprep.service"]);
    let listed = leases(&c);
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(listed[0]["id"], lease["id"]);
    assert_eq!(poke(&c, &path, "").stdout, hex(marker));

    // The guest stops; its lease is released and scrubbed: the next lease of that memory
    // holds no byte of it.
    c.ok(&["kill", &pid]);
    c.wait_for(
        &format!("! kill -0 {pid} 2>/dev/null"),
        Duration::from_secs(10),
        "the guest exits",
    );
    c.ok(&["hugeprep", "release", "vm-a"]);
    c.wait_for(
        "hugeprep status --json | grep -q '\"warm_bytes\": 67108864'",
        Duration::from_secs(60),
        "the released lease back in the warm pool",
    );
    // Both warm files (one of them the guest's, scrubbed).
    for name in ["vm-b", "vm-c"] {
        let next = json(&c.ok(&["hugeprep", "lease", name, "32M", "--json"]));
        assert_ne!(next["source"], "cold", "{next:#}");
        let read = poke(&c, next["path"].as_str().unwrap(), "");
        assert!(
            read.ok && read.stdout.chars().all(|ch| ch == '0'),
            "{name}: {}",
            read.stdout
        );
    }
    c.ok(&["hugeprep", "release", "vm-b"]);
    c.ok(&["hugeprep", "release", "vm-c"]);

    // Exact accounting: after a drain the daemon holds no page, and every page the test
    // reserved is free again; the package comes off cleanly.
    c.ok(&["hugeprep", "drain"]);
    let free = pages.wait_free(free_before);
    assert_eq!(
        free,
        free_before,
        "pages left in the daemon's files:\n{}\n{}",
        c.ok(&["hugeprep", "status", "--json"]),
        c.journal("hugeprep")
    );
    c.ok(&["dpkg", "-P", "hugeprep"]);
    assert_eq!(pages.wait_free(free_before), free_before);
}

fn hex(s: &str) -> String {
    let mut bytes = s.as_bytes().to_vec();
    bytes.resize(16, 0);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
