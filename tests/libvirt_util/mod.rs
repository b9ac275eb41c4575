//! Harness for tests against a real libvirtd, virtlogd and QEMU/KVM: a hugeprep daemon on a
//! private hugetlbfs mount, a private libvirtd (`hugeprep::vmm::libvirt::sandbox`) whose
//! `memory_backing_dir` is on that mount and whose QEMU hook is `hugeprep libvirt-hook`, and
//! helpers to write domain XML and look into QEMU.

#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use hugeprep::pool::LeaseInfo;
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
    true
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
    daemon_args: Vec<String>,
    next_uuid: u32,
}

impl Lab {
    /// A mount of `mount_bytes`, a daemon keeping `warm` bytes warm in 32 MiB files, and a
    /// libvirtd whose hook fails starts on shortage or a missing daemon.
    pub fn new(name: &str, mount_bytes: u64, warm: u64) -> Lab {
        Lab::on(Env::new(name, mount_bytes), warm, 32 * MIB)
    }

    /// A lab on `env` (its mount's page size), the daemon keeping `warm` bytes warm in files
    /// of `file_size`.
    pub fn on(env: Env, warm: u64, file_size: u64) -> Lab {
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
        std::fs::write(&config_path, config.to_toml()).unwrap();
        let hook = hook_command(Path::new(env!("CARGO_BIN_EXE_hugeprep")), &config_path);
        let sandbox = Sandbox::up(&env.dir.join("libvirt"), &backing, Some(&hook))
            .unwrap_or_else(|e| panic!("libvirt sandbox: {e}"));
        Lab {
            sandbox,
            daemon,
            env,
            backing,
            config_path,
            warm,
            daemon_args,
            next_uuid: 1,
        }
    }

    /// Rewrites the hook's config (read on every hook call).
    pub fn configure(&self, change: impl FnOnce(&mut HookConfig)) {
        let mut config = HookConfig::load(&self.config_path).unwrap();
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
