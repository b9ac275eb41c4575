//! `hugeprep doctor` checks what the operator's processes see, run where libvirtd runs (the
//! sandbox's mount namespace: its /etc/libvirt and /run/libvirt): libvirtd running, the
//! `memory_backing_dir` QEMU's user (from qemu.conf) can reach and the hook shares, the
//! hook's program present; and whether a member of the socket's group can really connect
//! (checked against a real unprivileged client).

mod daemon_util;
mod libvirt_util;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use daemon_util::MIB;
use libvirt_util::{tools_present, Lab};

/// `doctor --json` inside the sandbox; its findings.
fn doctor(lab: &Lab, socket: &Path, hook_config: &Path) -> Vec<serde_json::Value> {
    let out = lab
        .sandbox
        .command_inside(env!("CARGO_BIN_EXE_hugeprep"))
        .unwrap()
        .args(["doctor", "--json", "--no-probe", "--socket"])
        .arg(socket)
        .arg("--hook-config")
        .arg(hook_config)
        .output()
        .unwrap();
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    report["findings"].as_array().unwrap().clone()
}

/// The one finding of `check` about `subject`.
fn finding<'a>(all: &'a [serde_json::Value], check: &str, subject: &str) -> &'a serde_json::Value {
    let found: Vec<&serde_json::Value> = all
        .iter()
        .filter(|f| f["check"] == check && f["subject"].as_str().unwrap().contains(subject))
        .collect();
    assert_eq!(found.len(), 1, "{check} {subject}: {all:#?}");
    found[0]
}

fn says(f: &serde_json::Value, severity: &str, text: &str) {
    assert_eq!(f["severity"], severity, "{f:#}");
    assert!(f["message"].as_str().unwrap().contains(text), "{f:#}");
    if severity != "ok" && severity != "info" {
        // Remedies name installed paths, never the source tree.
        let remedy = f["remedy"].as_str().unwrap();
        assert!(
            !remedy.contains("scripts/") && !remedy.contains("integration/"),
            "{f:#}"
        );
    }
}

#[test]
fn doctor_sees_what_libvirt_and_qemu_see() {
    if !tools_present() {
        return;
    }
    let lab = Lab::new("libvirt-doctor", 128 * MIB, 64 * MIB);
    let f = doctor(&lab, &lab.env.socket, &lab.config_path);
    says(
        finding(&f, "libvirt", "libvirtd"),
        "ok",
        "libvirtd running (pid",
    );
    says(
        finding(&f, "libvirt", "memory_backing_dir"),
        "ok",
        "on hugetlbfs",
    );
    says(finding(&f, "libvirt", "QEMU's user"), "ok", "libvirt-qemu");
    says(
        finding(&f, "libvirt", "hook"),
        "ok",
        "installed and executable",
    );

    // QEMU's user cannot search memory_backing_dir: VM starts fail, so it blocks.
    std::fs::set_permissions(&lab.backing, std::fs::Permissions::from_mode(0o700)).unwrap();
    let f = doctor(&lab, &lab.env.socket, &lab.config_path);
    std::fs::set_permissions(&lab.backing, std::fs::Permissions::from_mode(0o755)).unwrap();
    says(
        finding(&f, "libvirt", "QEMU's user"),
        "blocking",
        &format!("{} (root:root, mode 0700)", lab.backing.display()),
    );

    // The hook's settings name another directory than qemu.conf.
    let other = lab.env.dir.join("other-hook.toml");
    let mut config = hugeprep::vmm::libvirt::HookConfig::load(&lab.config_path).unwrap();
    config.memory_backing_dir = lab.env.mount.join("elsewhere");
    std::fs::write(&other, config.to_toml()).unwrap();
    let f = doctor(&lab, &lab.env.socket, &other);
    says(
        finding(&f, "libvirt", "memory_backing_dir"),
        "warning",
        "the hook links leases where QEMU does not look",
    );

    // The hook's program is gone (a removed package): every start would fail.
    let hook = lab.sandbox.dir().join("etc/hooks/qemu.d/hugeprep");
    let shipped = std::fs::read_to_string(&hook).unwrap();
    std::fs::write(
        &hook,
        "#!/bin/sh\nexec /usr/bin/hugeprep-removed libvirt-hook \"$@\"\n",
    )
    .unwrap();
    let f = doctor(&lab, &lab.env.socket, &lab.config_path);
    std::fs::write(&hook, shipped).unwrap();
    says(
        finding(&f, "libvirt", "hook"),
        "blocking",
        "runs /usr/bin/hugeprep-removed, which is missing",
    );
}

/// The socket is 0660 root:kvm: doctor says whether kvm's members reach it along the whole
/// path, and a real client running as a member (not root) agrees.
#[test]
fn socket_group_access_is_checked_along_the_path() {
    if !tools_present() {
        return;
    }
    let env = daemon_util::Env::new("doctor-socket", 32 * MIB);
    let dir = env.dir.clone();
    let socket = env.socket.clone();
    let mut daemon = env.spawn(&["--socket-group", "kvm"]);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    let kvm = nix::unistd::Group::from_name("kvm")
        .unwrap()
        .unwrap()
        .gid
        .as_raw();
    let member = |cmd: &str| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534"])
            .arg(format!("--groups={kvm}"))
            .args(["--", env!("CARGO_BIN_EXE_hugeprep"), cmd, "--socket"])
            .arg(&socket)
            .output()
            .unwrap()
    };
    let check = |expect_ok: bool| {
        let f = hugeprep::doctor::socket_group(&socket);
        let client = member("status");
        assert_eq!(client.status.success(), expect_ok, "{client:?}");
        if expect_ok {
            assert_eq!(f.severity, hugeprep::doctor::Severity::Ok, "{f:?}");
        } else {
            assert_eq!(f.severity, hugeprep::doctor::Severity::Warning, "{f:?}");
            let want = format!("{} (root:root, mode 0750)", dir.display());
            assert!(f.message.contains(&want), "{f:?}");
        }
    };
    check(false);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    check(true);
    daemon.stop();
}
