//! Harness for the service tests: a real systemd booted by `tests/systemd/container.sh` in
//! private namespaces over a tmpfs overlay of `/`, commands run inside it, and the power-off
//! at drop (nothing stays on the host: mounts die with the mount namespace, writes with the
//! overlay's tmpfs).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A booted container.
pub struct Container {
    dir: PathBuf,
    script: PathBuf,
}

/// Output of a command inside.
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

fn to_run(out: Output) -> Run {
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl Container {
    /// Boots systemd; waits until `systemctl is-system-running` says running.
    pub fn boot(name: &str) -> Container {
        let dir = std::env::temp_dir().join(format!("hugeprep-sd-{name}-{}", std::process::id()));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/systemd/container.sh");
        let out = Command::new(&script).arg("up").arg(&dir).output().unwrap();
        let c = Container { dir, script };
        assert!(
            out.status.success(),
            "container.sh up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    /// Runs `args` inside (as root, in the container's root cgroup).
    pub fn run(&self, args: &[&str]) -> Run {
        let out = Command::new(&self.script)
            .arg("exec")
            .arg(&self.dir)
            .args(args)
            .output()
            .unwrap();
        to_run(out)
    }

    /// Runs a shell command line inside.
    pub fn sh(&self, line: &str) -> Run {
        self.run(&["/bin/sh", "-c", line])
    }

    /// Runs `args` inside and panics with both outputs when it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        let r = self.run(args);
        assert!(r.ok, "{args:?} failed:\n{}\n{}", r.stdout, r.stderr);
        r.stdout
    }

    /// Runs `args` inside as `user` (`runuser`: the user's own groups, no capabilities).
    pub fn run_as(&self, user: &str, args: &[&str]) -> Run {
        let mut all = vec!["runuser", "-u", user, "--"];
        all.extend_from_slice(args);
        self.run(&all)
    }

    /// Adds a user inside (the overlay's /etc), in `groups` besides its own.
    pub fn add_user(&self, name: &str, groups: &[&str]) {
        let mut args = vec!["useradd", "--no-create-home", "--shell", "/bin/sh"];
        let list = groups.join(",");
        if !groups.is_empty() {
            args.extend(["--groups", &list]);
        }
        args.push(name);
        self.ok(&args);
    }

    /// The mode bits of `path` inside, in octal (`stat -c %a`).
    pub fn mode(&self, path: &str) -> String {
        self.ok(&["stat", "-c", "%a %U:%G", path])
            .trim()
            .to_string()
    }

    /// Installs the .deb at `deb` (a host path) with `dpkg -i`; panics when dpkg fails.
    pub fn install(&self, deb: &Path) {
        self.copy_in(deb, "/tmp/hugeprep.deb");
        self.ok(&["dpkg", "-i", "/tmp/hugeprep.deb"]);
    }

    /// Upgrades to the .deb at `deb` as `apt upgrade` does non-interactively: a conffile the
    /// test changed (`/etc/hugeprep/hugeprep.toml`) is kept (`--force-confold`) when the
    /// package ships another version of it, instead of dpkg asking on a terminal.
    pub fn upgrade(&self, deb: &Path) {
        self.copy_in(deb, "/tmp/hugeprep.deb");
        self.ok(&["dpkg", "-i", "--force-confold", "/tmp/hugeprep.deb"]);
    }

    /// Copies a host file into the container's overlay.
    pub fn copy_in(&self, src: &Path, dest: &str) {
        let out = Command::new(&self.script)
            .arg("copy")
            .arg(&self.dir)
            .arg(src)
            .arg(dest)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "copy {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Writes a file inside.
    pub fn write(&self, path: &str, text: &str) {
        let host = self.dir.join("to-copy");
        std::fs::write(&host, text).unwrap();
        self.copy_in(&host, path);
    }

    /// Polls `check` (a shell line) until it succeeds; panics with `what` after `limit`.
    pub fn wait_for(&self, line: &str, limit: Duration, what: &str) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let r = self.sh(line);
            if r.ok {
                return r.stdout;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: `{line}` never succeeded:\n{}{}",
                r.stdout,
                r.stderr
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `systemctl show -p PROP --value UNIT`.
    pub fn prop(&self, unit: &str, prop: &str) -> String {
        self.ok(&["systemctl", "show", "-p", prop, "--value", unit])
            .trim()
            .to_string()
    }

    /// The unit's journal, short format with structured fields (`-o verbose` is too long).
    pub fn journal(&self, unit: &str) -> String {
        self.ok(&["journalctl", "--no-pager", "-u", unit, "-o", "cat"])
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .arg("down")
            .arg(&self.dir)
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The .deb under test: `$HUGEPREP_DEB` when set, else built now with scripts/package-deb
/// (cargo-deb: scripts/test installs it); `None` (after `missing_tool`) otherwise.
pub fn package() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HUGEPREP_DEB") {
        return Some(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let has_cargo_deb = Command::new("cargo")
        .args(["deb", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_cargo_deb {
        hugeprep::testing::missing_tool("cargo-deb is not installed (scripts/test installs it)");
        return None;
    }
    let out = Command::new(root.join("scripts/package-deb"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/package-deb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(PathBuf::from(
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    ))
}
