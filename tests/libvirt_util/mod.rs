//! Harness for tests against a real libvirtd, virtlogd and QEMU/KVM: a hugeprep daemon on a
//! private hugetlbfs mount, a private libvirtd (`hugeprep::vmm::libvirt::sandbox`) whose
//! `memory_backing_dir` is on that mount and whose QEMU hook is `hugeprep libvirt-hook`, and
//! helpers to write domain XML and look into QEMU.
//!
//! libvirt runs with the package's own qemu.conf, as the distribution ships it (QEMU as
//! `libvirt-qemu` with dynamic ownership and its private /dev on Debian), changed only where
//! integration/libvirt/qemu.conf.snippet says; a lab can run QEMU as root or as another user
//! instead ([`QemuAs`]).

#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use hugeprep::pool::LeaseInfo;
use hugeprep::vmm::libvirt::qemu_conf::QemuConf;
pub use hugeprep::vmm::libvirt::sandbox::QemuAs;
use hugeprep::vmm::libvirt::sandbox::{hook_command, Sandbox};
use hugeprep::vmm::libvirt::HookConfig;

use crate::daemon_util::{Daemon, Env, MIB};

/// Whether libvirtd, virsh, QEMU and /dev/kvm are all here; reports what is missing.
pub fn tools_present() -> bool {
    for (tool, package) in [
        ("/usr/sbin/libvirtd", "libvirt-daemon-system"),
        ("/usr/sbin/virtlogd", "libvirt-daemon-system"),
        ("/usr/bin/virsh", "libvirt-clients"),
        ("/usr/bin/qemu-system-x86_64", "qemu-system-x86"),
        ("/dev/kvm", "KVM (a host with virtualization)"),
    ] {
        if !Path::new(tool).exists() {
            hugeprep::testing::missing_tool(&format!("{tool} missing (install {package})"));
            return false;
        }
    }
    assert_qemu_conf_as_shipped();
    true
}

/// The host's /etc/libvirt/qemu.conf is the package's, unchanged (dpkg's checksum of the
/// conffile): the sandboxes start from it, and the tests claim to run libvirt as shipped.
pub fn assert_qemu_conf_as_shipped() {
    let conf = "/etc/libvirt/qemu.conf";
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${Conffiles}", "libvirt-daemon-system"])
        .output();
    let Ok(out) = out else { return };
    let listed = String::from_utf8_lossy(&out.stdout);
    let Some(sum) = listed
        .lines()
        .map(str::split_whitespace)
        .find_map(|mut f| (f.next() == Some(conf)).then(|| f.next()).flatten())
    else {
        return;
    };
    let md5 = Command::new("md5sum").arg(conf).output().unwrap();
    let actual = String::from_utf8_lossy(&md5.stdout);
    assert!(
        actual.starts_with(sum),
        "{conf} is not the one libvirt-daemon-system ships (md5 {sum}): the libvirt tests run \
         QEMU as the distribution configures it; restore it (apt-get install --reinstall \
         -o Dpkg::Options::=--force-confask libvirt-daemon-system)"
    );
}

/// A hugeprep daemon plus a libvirtd that uses it. Field order is drop order: libvirt and
/// its QEMUs go before the daemon, the daemon before the mount.
pub struct Lab {
    pub sandbox: Sandbox,
    pub daemon: Daemon,
    pub env: Env,
    pub backing: PathBuf,
    pub config_path: PathBuf,
    pub warm: u64,
    /// The uid libvirt runs QEMU as (from the sandbox's qemu.conf).
    pub qemu_uid: u32,
    daemon_args: Vec<String>,
    next_uuid: u32,
}

impl Lab {
    /// A mount of `mount_bytes`, a daemon keeping `warm` bytes warm in 32 MiB files, and a
    /// libvirtd whose hook fails starts on shortage or a missing daemon.
    pub fn new(name: &str, mount_bytes: u64, warm: u64) -> Lab {
        Lab::on(Env::new(name, mount_bytes), warm, 32 * MIB)
    }

    /// As [`Lab::new`], with QEMU run as `qemu` says.
    pub fn new_as(name: &str, mount_bytes: u64, warm: u64, qemu: &QemuAs) -> Lab {
        Lab::on_as(Env::new(name, mount_bytes), warm, 32 * MIB, qemu)
    }

    /// A lab on `env` (its mount's page size), the daemon keeping `warm` bytes warm in files
    /// of `file_size`, QEMU run as the package configures it.
    pub fn on(env: Env, warm: u64, file_size: u64) -> Lab {
        Lab::on_as(env, warm, file_size, &QemuAs::Packaged)
    }

    /// As [`Lab::on`], with QEMU run as `qemu` says.
    pub fn on_as(env: Env, warm: u64, file_size: u64, qemu: &QemuAs) -> Lab {
        let page_size = hugeprep::hugetlb::hugetlbfs_page_size(&env.mount)
            .unwrap()
            .unwrap();
        let daemon_args: Vec<String> = [
            "--page-size".to_string(),
            page_size.name().to_string(),
            "--warm".to_string(),
            format!("{}M", warm / MIB),
            "--sizes".to_string(),
            format!("{}M", file_size / MIB),
        ]
        .to_vec();
        let daemon = env.spawn(&daemon_args.iter().map(String::as_str).collect::<Vec<_>>());
        daemon.settle(warm);
        let backing = env.mount.join("libvirt-backing");
        let config_path = env.dir.join("libvirt-hook.toml");
        let mut config = HookConfig::new(&backing);
        config.socket = env.socket.clone();
        config.stale_after_s = 0;
        // A hook run by hand (no DAC label in its XML) reads the sandbox's qemu.conf.
        config.qemu_conf = env.dir.join("libvirt/etc/qemu.conf");
        std::fs::write(&config_path, config.to_toml()).unwrap();
        let hook = hook_command(Path::new(env!("CARGO_BIN_EXE_hugeprep")), &config_path);
        let sandbox = Sandbox::up_as(&env.dir.join("libvirt"), &backing, Some(&hook), qemu)
            .unwrap_or_else(|e| panic!("libvirt sandbox: {e}"));
        let qemu_uid = QemuConf::read(&config.qemu_conf)
            .unwrap()
            .qemu_user()
            .unwrap()
            .creds
            .uid;
        Lab {
            sandbox,
            daemon,
            env,
            backing,
            config_path,
            warm,
            qemu_uid,
            daemon_args,
            next_uuid: 1,
        }
    }

    /// Rewrites the hook's config (read on every hook call), even one that no longer loads.
    pub fn configure(&self, change: impl FnOnce(&mut HookConfig)) {
        let text = std::fs::read_to_string(&self.config_path).unwrap();
        let mut config: HookConfig = toml::from_str(&text).unwrap();
        change(&mut config);
        std::fs::write(&self.config_path, config.to_toml()).unwrap();
    }

    /// Starts the daemon again (after a test stopped it) on the same state.
    pub fn respawn_daemon(&mut self) {
        let args: Vec<&str> = self.daemon_args.iter().map(String::as_str).collect();
        self.daemon = self.env.spawn(&args);
        self.daemon.settle(self.warm);
    }

    /// A fresh domain UUID.
    pub fn uuid(&mut self) -> String {
        self.next_uuid += 1;
        format!("5e1f0000-0000-4000-8000-{:012x}", self.next_uuid)
    }

    /// `virsh create --paused` of `xml`; the output, whatever the status.
    pub fn create(&self, xml: &str) -> Output {
        let file = self.env.dir.join("domain.xml");
        std::fs::write(&file, xml).unwrap();
        self.sandbox
            .virsh(&["create", "--paused", file.to_str().unwrap()])
            .unwrap()
    }

    /// Creates a domain that must start.
    pub fn start(&self, xml: &str) {
        let out = self.create(xml);
        if !out.status.success() {
            let log = self.sandbox.log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            panic!(
                "virsh create failed: {}\nlibvirtd.log (last lines, newest first):\n{}",
                String::from_utf8_lossy(&out.stderr),
                tail.join("\n")
            );
        }
    }

    pub fn destroy(&self, uuid: &str) {
        self.sandbox.virsh_ok(&["destroy", uuid]).unwrap();
    }

    /// The hook's leases of a domain.
    pub fn leases_of(&self, uuid: &str) -> Vec<LeaseInfo> {
        let prefix = format!("libvirt-{uuid}-");
        let mut v: Vec<LeaseInfo> = self
            .daemon
            .leases()
            .into_iter()
            .filter(|l| l.name.starts_with(&prefix))
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// The real uid and gid the QEMU of domain `uuid` runs as.
    pub fn qemu_ids(&self, uuid: &str) -> (u32, u32) {
        let pid = self.sandbox.qemu_pid(uuid).unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |name: &str| -> u32 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap()
        };
        (field("Uid:"), field("Gid:"))
    }

    /// QEMU of domain `uuid` runs as `uid`, and libvirt's per-domain directory and the
    /// hook's lease files in it are that user's, closed to everyone else.
    pub fn assert_qemu_owns(&self, uuid: &str, uid: u32) {
        assert_eq!(self.qemu_ids(uuid).0, uid, "QEMU's uid");
        let leases = self.leases_of(uuid);
        assert!(!leases.is_empty());
        for l in &leases {
            let m = std::fs::metadata(&l.path).unwrap();
            assert_eq!((m.uid(), m.mode() & 0o777), (uid, 0o600), "{}", l.name);
        }
        let dirs = Env::names(&self.backing.join("libvirt/qemu"));
        let mine: Vec<&String> = dirs
            .iter()
            .filter(|d| {
                let dir = self.backing.join("libvirt/qemu").join(d);
                Env::names(&dir)
                    .iter()
                    .any(|f| leases.iter().any(|l| inode(&dir.join(f)) == inode(&l.path)))
            })
            .collect();
        assert_eq!(mine.len(), 1, "{dirs:?}");
        let m = std::fs::metadata(self.backing.join("libvirt/qemu").join(mine[0])).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (uid, 0o700), "{}", mine[0]);
    }

    /// (file name, inode) of every file the QEMU of domain `uuid` maps under `memory_backing_dir`.
    pub fn qemu_backing_maps(&self, uuid: &str) -> Vec<(String, u64)> {
        let pid = self.sandbox.qemu_pid(uuid).unwrap_or_else(|| {
            panic!(
                "no QEMU for {uuid}: {:?}",
                Env::names(&self.sandbox.dir().join("run/qemu"))
            )
        });
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let prefix = self.backing.to_str().unwrap();
        let mut v: Vec<(String, u64)> = maps
            .lines()
            .filter_map(|l| {
                // The path is the rest of the line and may hold spaces.
                let f: Vec<&str> = l.split_whitespace().collect();
                let path = &l[l.find(" /")? + 1..];
                path.starts_with(prefix).then(|| {
                    let name = path.rsplit('/').next().unwrap_or_default().to_string();
                    (name, f[4].parse().unwrap())
                })
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// The memory backends on the command line of domain `uuid`'s QEMU: every `-object`
    /// whose `qom-type` is a memory backend, as the JSON libvirt wrote.
    pub fn qemu_memory_backends(&self, uuid: &str) -> Vec<serde_json::Value> {
        let pid = self.sandbox.qemu_pid(uuid).unwrap();
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<String> = raw
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let backends: Vec<serde_json::Value> = args
            .windows(2)
            .filter(|w| w[0] == "-object")
            .filter_map(|w| serde_json::from_str::<serde_json::Value>(&w[1]).ok())
            .filter(|o| {
                o["qom-type"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("memory-backend")
            })
            .collect();
        assert!(!backends.is_empty(), "no JSON memory backend in {args:?}");
        backends
    }

    /// QEMU's NUMA policy line for its mapping of `alias` (`/proc/PID/numa_maps`).
    pub fn qemu_numa_map(&self, uuid: &str, alias: &str) -> String {
        let pid = self.sandbox.qemu_pid(uuid).unwrap();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).unwrap();
        maps.lines()
            .find(|l| l.contains(self.backing.to_str().unwrap()) && l.contains(alias))
            .unwrap_or_default()
            .to_string()
    }

    /// Reads `len` bytes of guest-physical memory at `gpa` through QEMU's monitor.
    pub fn guest_bytes(&self, uuid: &str, gpa: u64, len: usize) -> Vec<u8> {
        let out = self
            .sandbox
            .virsh_ok(&[
                "qemu-monitor-command",
                uuid,
                "--hmp",
                &format!("xp /{len}xb {gpa:#x}"),
            ])
            .unwrap();
        hmp_bytes(&out)
    }

    /// Runs `hugeprep libvirt-hook --reconcile` on the lab's configuration (what a timer does
    /// in production; `stale_after_s = 0` here), which must succeed.
    pub fn reconcile(&self) {
        let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
            .args(["libvirt-hook", "--reconcile", "--config"])
            .arg(&self.config_path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }

    /// Runs the hook binary directly, as libvirt would.
    pub fn run_hook(&self, name: &str, op: &str, subop: &str, xml: &str) -> Output {
        run_hook(&self.config_path, name, op, subop, xml)
    }

    /// Nothing of the hook is left: no lease, no per-domain directory, the pool whole and
    /// settled at its warm target, the mount holding only the warm pool, and every pool
    /// file zero (scrubbed).
    pub fn assert_clean(&self) {
        let leftover: Vec<String> = self
            .daemon
            .leases()
            .into_iter()
            .map(|l| l.name)
            .filter(|n| n.starts_with("libvirt-"))
            .collect();
        assert!(leftover.is_empty(), "leases left: {leftover:?}");
        let dirs = Env::names(&self.backing.join("libvirt/qemu"));
        assert!(dirs.is_empty(), "domain directories left: {dirs:?}");
        let p = self.daemon.settle(self.warm);
        assert_eq!(p.kinds[0].leased_bytes, 0);
        assert_eq!(
            self.env.mount_used(),
            self.warm,
            "mount holds more than the pool"
        );
        assert!(Env::names(&self.env.lease_dir()).is_empty());
        for name in Env::names(&self.env.pool_dir()) {
            let path = self.env.pool_dir().join(&name);
            if path.is_file() {
                assert!(file_is_zero(&path), "pool file {name} is not scrubbed");
            }
        }
    }
}

/// Whether every byte of a hugetlbfs file reads zero.
pub fn file_is_zero(path: &Path) -> bool {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let r = hugeprep::sys::mmap::MmapRegion::shared_file(std::os::fd::AsFd::as_fd(&f), 0, len);
    match r {
        Ok(r) => hugeprep::scrub::first_nonzero(r.as_slice()).is_none(),
        Err(e) => panic!("map {}: {e}", path.display()),
    }
}

/// Every regular file under `dirs` whose bytes hold `needle`.
pub fn files_holding(dirs: &[PathBuf], needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in dirs {
        for name in Env::names(dir) {
            let path = dir.join(&name);
            if !path.is_file() {
                continue;
            }
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let len = f.metadata().unwrap().len() as usize;
            if len == 0 {
                continue;
            }
            let r =
                hugeprep::sys::mmap::MmapRegion::shared_file(std::os::fd::AsFd::as_fd(&f), 0, len)
                    .unwrap();
            if r.as_slice().windows(needle.len()).any(|w| w == needle) {
                found.push(path);
            }
        }
    }
    found
}

/// The inode of a path.
pub fn inode(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

/// XML text escaping for names.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// A diskless domain that stays paused: `cells` guest NUMA cells of 32 MiB each (none: one
/// 32 MiB backend), file-backed shared memory when `file_backed`, `extra` appended inside
/// `<domain>` (numatune, metadata).
pub fn domain_xml(name: &str, uuid: &str, cells: u32, file_backed: bool, extra: &str) -> String {
    let memory = 32 * cells.max(1);
    let backing = if file_backed {
        "<memoryBacking><source type='file'/><access mode='shared'/></memoryBacking>"
    } else {
        ""
    };
    let numa = if cells == 0 {
        String::new()
    } else {
        let c: String = (0..cells)
            .map(|i| format!("<cell id='{i}' cpus='{i}' memory='32' unit='MiB'/>"))
            .collect();
        format!("<numa>{c}</numa>")
    };
    // arch-capabilities off: KVM on AMD hosts refuses QEMU's MSR 0x10a write with -cpu host.
    format!(
        "<domain type='kvm'>
  <name>{}</name>
  <uuid>{uuid}</uuid>
  <memory unit='MiB'>{memory}</memory>
  <vcpu>{}</vcpu>
  {backing}
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <cpu mode='host-passthrough'><feature policy='disable' name='arch-capabilities'/>{numa}</cpu>
  {extra}
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <video><model type='none'/></video>
    <memballoon model='none'/>
  </devices>
</domain>
",
        escape(name),
        cells.max(1)
    )
}

/// Runs `hugeprep libvirt-hook --config CONFIG NAME OP SUBOP -` with `xml` on its stdin, as
/// libvirtd does.
pub fn run_hook(config: &Path, name: &str, op: &str, subop: &str, xml: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["libvirt-hook", "--config"])
        .arg(config)
        .args([name, op, subop, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(xml.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The bytes of an HMP `xp /Nxb` dump ("0000000002000000: 0x81 0x80 ...").
pub fn hmp_bytes(text: &str) -> Vec<u8> {
    text.lines()
        .flat_map(|l| {
            l.split_once(':')
                .map(|x| x.1)
                .unwrap_or("")
                .split_whitespace()
        })
        .map(|b| u8::from_str_radix(b.trim_start_matches("0x"), 16).unwrap())
        .collect()
}

/// Polls `done` every 20 ms for up to `limit` (a liveness bound, not a timing claim); says
/// what was not seen.
pub fn wait_until(what: &str, limit: std::time::Duration, done: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while !done() {
        if std::time::Instant::now() > deadline {
            eprintln!("not seen within {limit:?}: {what}");
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

/// Whether a `hugeprep libvirt-hook NAME OP ...` process is running now.
pub fn hook_running(name: &str, op: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
            let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
            args.iter().any(|a| a.ends_with(b"libvirt-hook"))
                && args.contains(&name.as_bytes())
                && args.contains(&op.as_bytes())
        })
    })
}

/// A system user `name` (its own group, no home, no login) that is also in group `kvm`, as
/// Fedora's `qemu` user is; made when missing, added to `kvm` when not in it yet. Returns
/// its uid.
pub fn ensure_kvm_user(name: &str) -> u32 {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _held = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let run = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{cmd:?}: {out:?}");
    };
    match nix::unistd::User::from_name(name).unwrap() {
        None => run(Command::new("useradd").args([
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--groups",
            "kvm",
            name,
        ])),
        Some(u) => {
            let kvm = nix::unistd::Group::from_name("kvm").unwrap().unwrap();
            if !kvm.mem.contains(&u.name) && u.gid != kvm.gid {
                run(Command::new("usermod").args(["-a", "-G", "kvm", name]));
            }
        }
    }
    nix::unistd::User::from_name(name)
        .unwrap()
        .unwrap()
        .uid
        .as_raw()
}

/// Whether a process with `creds` can open `path` for reading and writing (run through
/// `setpriv`, so the kernel decides, not a reading of mode bits).
pub fn can_open_as(creds: &hugeprep::perm::Credentials, path: &Path) -> bool {
    let groups: Vec<String> = creds.groups.iter().map(u32::to_string).collect();
    let groups = if groups.is_empty() {
        "--clear-groups".to_string()
    } else {
        format!("--groups={}", groups.join(","))
    };
    let out = Command::new("setpriv")
        .arg(format!("--reuid={}", creds.uid))
        .arg(format!("--regid={}", creds.gid))
        .arg(groups)
        .args(["--", "sh", "-c", "exec 3<>\"$1\"", "sh"])
        .arg(path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || err.contains("Permission denied"),
        "setpriv: {out:?}"
    );
    out.status.success()
}
