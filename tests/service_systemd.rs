//! The Debian package under a real systemd (tests/systemd/container.sh): install, socket
//! activation, READY after recovery, STATUS=, reload (good and bad), restart keeping leases,
//! stop with the clean-shutdown marker, a watchdog stall, structured journal fields, the
//! security score, and `dpkg -r` / `dpkg -P`. One container for the whole sequence: a boot is
//! 0.4 s but the package install and daemon starts dominate.

#[path = "systemd_util/mod.rs"]
mod systemd_util;

use std::time::Duration;

use hugeprep::testing::HugepageReservation;
use hugeprep::PageSize;
use systemd_util::Container;

const CONFIG: &str = "/etc/hugeprep/hugeprep.toml";

fn config(warm: &str) -> String {
    // reserve = false: the test hands the daemon pages it reserved itself (machine-wide
    // pools are shared with other tests); the daemon must not raise them.
    format!(
        "[pool]\nverify = \"sample\"\nreserve = false\n[[pool.target]]\npage_size = \"2M\"\n\
         warm = \"{warm}\"\nsizes = [\"4M\"]\n"
    )
}

const DROP_IN: &str = "[Service]\n\
ExecStart=\n\
ExecStart=/usr/bin/hugeprep serve --config /etc/hugeprep/hugeprep.toml --calibration off\n\
Environment=HUGEPREP_TEST_WATCHDOG_STALL_FILE=/run/hugeprep-test-stall\n\
WatchdogSec=3\n\
Restart=no\n";

fn status_line(c: &Container) -> String {
    c.prop("hugeprep.service", "StatusText")
}

/// `(clean, warm)` of the last `pool recovered` journal line: whether the start found the
/// clean-shutdown marker, and how many warm files it kept.
fn last_recovery(c: &Container) -> (bool, u64) {
    let j = c.journal("hugeprep");
    let line = j
        .lines()
        .rfind(|l| l.contains("pool recovered"))
        .unwrap_or_else(|| panic!("no recovery line:\n{j}"));
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line}"))
            .to_string()
    };
    (field("clean=") == "true", field("warm=").parse().unwrap())
}

#[test]
fn package_under_real_systemd() {
    let Some(deb) = systemd_util::package() else {
        return;
    };
    let _pages = HugepageReservation::ensure_free(PageSize::Size2M, 24)
        .expect("reserving hugepages (run as root)")
        .expect("the kernel cannot supply 24 2 MiB pages");
    let c = Container::boot("pkg");
    // A policy-rc.d on the host image would veto every start inside too.
    c.ok(&["rm", "-f", "/usr/sbin/policy-rc.d"]);
    c.copy_in(&deb, "/tmp/hugeprep.deb");
    c.ok(&["dpkg", "-i", "/tmp/hugeprep.deb"]);
    for unit in [
        "hugeprep.service",
        "hugeprep.socket",
        "hugeprep-reserve.service",
        "hugeprep-libvirt-reconcile.timer",
    ] {
        assert_eq!(c.prop(unit, "UnitFileState"), "enabled", "{unit}");
    }
    assert_eq!(
        c.prop("hugeprep-libvirt-reconcile.timer", "ActiveState"),
        "active",
        "postinst starts the reconcile timer"
    );
    assert_eq!(
        c.prop("hugeprep.socket", "ActiveState"),
        "active",
        "postinst starts the socket"
    );
    assert_eq!(
        c.prop("hugeprep.service", "ActiveState"),
        "inactive",
        "only the socket starts"
    );
    assert!(c.ok(&["getent", "group", "kvm"]).starts_with("kvm:"));
    assert!(c
        .ok(&["man", "-w", "hugeprep-serve"])
        .contains("hugeprep-serve.1"));
    // The configuration files' pages (hugeprep::daemon::config_page).
    assert!(c
        .ok(&["man", "-w", "5", "hugeprep.toml"])
        .contains("hugeprep.toml.5"));
    assert!(c
        .ok(&["man", "-w", "5", "libvirt-hook.toml"])
        .contains("libvirt-hook.toml.5"));

    // hugeprep-reserve: reserve = false leaves the pools; it says so.
    c.write(CONFIG, &config("8M"));
    c.ok(&["systemctl", "start", "hugeprep-reserve.service"]);
    assert!(c.journal("hugeprep-reserve").contains("reserve = false"));

    // Socket activation: the first API call starts the daemon.
    c.ok(&["mkdir", "-p", "/etc/systemd/system/hugeprep.service.d"]);
    c.write("/etc/systemd/system/hugeprep.service.d/test.conf", DROP_IN);
    c.ok(&["systemctl", "daemon-reload"]);
    c.ok(&["systemctl", "start", "hugeprep.socket"]);
    assert_eq!(c.prop("hugeprep.service", "ActiveState"), "inactive");
    c.ok(&["hugeprep", "status"]);
    assert_eq!(c.prop("hugeprep.service", "ActiveState"), "active");
    // READY=1 after recovery: the recovery line comes before systemd's "Started".
    let j = c.journal("hugeprep");
    let recovered = j.find("pool recovered").expect("recovery logged");
    let listening = j.find("listening").expect("listening logged");
    assert!(recovered < listening, "{j}");

    // STATUS= with warm, leased and dirty bytes.
    c.wait_for(
        "systemctl show -p StatusText --value hugeprep | grep -q 'warm 8 MiB'",
        Duration::from_secs(30),
        "warm pool filled",
    );
    let s = status_line(&c);
    assert!(s.contains("leased 0 B") && s.contains("dirty"), "{s}");

    // A lease; its id, name and size are key=value fields of the journal line.
    let lease = c.ok(&["hugeprep", "lease", "vm-one", "4M", "--json"]);
    let lease: serde_json::Value = serde_json::from_str(&lease).unwrap();
    let id = lease["id"].as_u64().unwrap().to_string();
    let j = c.journal("hugeprep");
    let line = j
        .lines()
        .find(|l| l.contains("leased") && l.contains("name=vm-one"));
    let line = line.unwrap_or_else(|| panic!("no lease line:\n{j}"));
    assert!(
        line.contains(&format!("id={id}")) && line.contains("size=4194304"),
        "{line}"
    );

    // Reload: new targets, the lease untouched.
    c.write(CONFIG, &config("4M"));
    c.ok(&["systemctl", "reload", "hugeprep"]);
    c.wait_for(
        "systemctl show -p StatusText --value hugeprep | grep -q 'target 4 MiB'",
        Duration::from_secs(10),
        "reload applied",
    );
    // The run directory keeps its mode: the socket's group must reach the socket in it.
    assert_eq!(c.mode("/run/hugeprep"), "755 root:root");
    assert!(c.ok(&["hugeprep", "status"]).contains("vm-one"));
    // A bad config is refused with file, line and field; the old one stays.
    c.write(CONFIG, "[pool]\nverify = \"sample\"\nwarmm = 3\n");
    c.ok(&["systemctl", "reload", "hugeprep"]);
    c.wait_for(
        "journalctl -u hugeprep -o cat | grep 'reload refused' | grep -q 'line 3'",
        Duration::from_secs(10),
        "bad reload refused",
    );
    let j = c.journal("hugeprep");
    assert!(j.contains(CONFIG) && j.contains("warmm"), "{j}");
    assert!(status_line(&c).contains("target 4 MiB"));
    assert_eq!(c.prop("hugeprep.service", "ActiveState"), "active");
    c.write(CONFIG, &config("4M"));

    // Restart keeps the lease and the warm files (clean shutdown, then recovery).
    c.ok(&["systemctl", "restart", "hugeprep"]);
    assert!(c.ok(&["hugeprep", "status"]).contains("vm-one"));
    let j = c.journal("hugeprep");
    assert!(j.contains("clean=true kept_leases=1"), "{j}");
    let (clean, warm) = last_recovery(&c);
    assert!(clean && warm >= 1, "restart kept no warm file:\n{j}");

    // Stop: drains, writes the clean-shutdown marker, within TimeoutStopSec.
    c.ok(&["systemctl", "stop", "hugeprep.service"]);
    assert_eq!(c.prop("hugeprep.service", "Result"), "success");
    c.ok(&["test", "-e", "/var/lib/hugeprep/clean-shutdown"]);

    // Watchdog: a stalled daemon is killed with result 'watchdog'.
    c.ok(&["systemctl", "start", "hugeprep.service"]);
    // The stop kept the warm files (release_on_stop = false, the default).
    let (clean, warm) = last_recovery(&c);
    assert!(clean && warm >= 1, "stop kept no warm file");
    c.ok(&["touch", "/run/hugeprep-test-stall"]);
    c.wait_for(
        "test \"$(systemctl show -p Result --value hugeprep)\" = watchdog",
        Duration::from_secs(20),
        "watchdog stall detected",
    );
    c.ok(&["rm", "/run/hugeprep-test-stall"]);

    // The hardening score (reported, not asserted: it depends on the systemd version).
    let sec = c.run(&[
        "systemd-analyze",
        "security",
        "--no-pager",
        "hugeprep.service",
    ]);
    eprintln!(
        "systemd-analyze security: {}",
        sec.stdout.lines().last().unwrap_or("")
    );

    // The reconcile service, hardened, in this systemd: it runs while the daemon runs, and
    // skips its run (starting nothing) while the daemon is stopped.
    c.ok(&["systemctl", "reset-failed", "hugeprep.service"]);
    c.ok(&["systemctl", "start", "hugeprep.service"]);
    c.ok(&["systemctl", "start", "hugeprep-libvirt-reconcile.service"]);
    assert_eq!(
        c.prop("hugeprep-libvirt-reconcile.service", "Result"),
        "success",
        "{}",
        c.journal("hugeprep-libvirt-reconcile")
    );
    assert!(c.ok(&["hugeprep", "status"]).contains("vm-one"));

    // Removal refuses while a lease lives, even with the daemon stopped (its journal says
    // so), and neither the check nor the drain starts the stopped daemon through its socket.
    c.ok(&["systemctl", "stop", "hugeprep.service"]);
    assert_eq!(c.prop("hugeprep.socket", "ActiveState"), "active");
    c.ok(&["systemctl", "start", "hugeprep-libvirt-reconcile.service"]);
    assert_eq!(c.prop("hugeprep.service", "ActiveState"), "inactive");
    let r = c.run(&["dpkg", "-r", "hugeprep"]);
    assert!(!r.ok && r.stderr.contains("vm-one"), "{}", r.stderr);
    assert_eq!(
        c.prop("hugeprep.service", "ActiveState"),
        "inactive",
        "the refused removal started the daemon"
    );
    // The refusal leaves the package installed and, once dpkg has let go of its lock,
    // selected for installation again (not `ri`).
    c.wait_for(
        "test \"$(dpkg-query -W -f '${db:Status-Abbrev}' hugeprep)\" = 'ii '",
        Duration::from_secs(10),
        "the refused removal's selection set back to install",
    );
    c.ok(&["hugeprep", "release", "vm-one"]);

    // dpkg -r with the daemon running: it drains, stops the units and the timer, and
    // removes the empty run directory; the conffiles stay. dpkg -P leaves nothing: no
    // file, no enablement link or mask, no state of deb-systemd-helper.
    assert_eq!(c.prop("hugeprep.service", "ActiveState"), "active");
    let r = c.run(&["dpkg", "-r", "hugeprep"]);
    assert!(r.ok, "{}\n{}", r.stdout, r.stderr);
    let j = c.journal("hugeprep");
    assert!(j.contains("drain"), "no drain before the removal:\n{j}");
    for unit in [
        "hugeprep.service",
        "hugeprep.socket",
        "hugeprep-libvirt-reconcile.timer",
    ] {
        assert_eq!(c.prop(unit, "ActiveState"), "inactive", "{unit}");
    }
    c.ok(&["test", "!", "-e", "/run/hugeprep"]);
    c.ok(&["test", "-e", CONFIG]);
    c.ok(&["test", "!", "-e", "/usr/bin/hugeprep"]);
    c.ok(&["test", "!", "-e", "/lib/systemd/system/hugeprep.service"]);
    c.ok(&[
        "test",
        "!",
        "-e",
        "/lib/systemd/system/hugeprep-libvirt-reconcile.timer",
    ]);
    c.ok(&["dpkg", "-P", "hugeprep"]);
    c.ok(&["test", "!", "-e", "/etc/hugeprep"]);
    c.ok(&["test", "!", "-e", "/var/lib/hugeprep"]);
    let left = c.sh(
        "ls -d /etc/systemd/system/*/hugeprep*.service /etc/systemd/system/*/hugeprep*.socket \
         /etc/systemd/system/*/hugeprep*.timer \
         /var/lib/systemd/deb-systemd-helper-enabled/*hugeprep* \
         /var/lib/systemd/deb-systemd-helper-enabled/*/*hugeprep* \
         /var/lib/systemd/deb-systemd-helper-masked/*hugeprep* 2>/dev/null; \
         find /etc/systemd/system -maxdepth 1 -name 'hugeprep*' -lname /dev/null",
    );
    assert!(
        left.stdout.trim().is_empty(),
        "unit links, masks or state left: {}",
        left.stdout
    );
    c.ok(&["systemctl", "daemon-reload"]);
    assert_eq!(
        c.prop("hugeprep-libvirt-reconcile.timer", "LoadState"),
        "not-found"
    );
}
