//! Harness for tests against a real cloud-hypervisor (v53.0, built from source by
//! `../shared/third_party/build-cloud-hypervisor.sh`, which `scripts/test` runs and whose path
//! it passes in `HUGEPREP_CLOUD_HYPERVISOR`): finding the binary, a cgroup of its own for each
//! VMM (so the daemon may scrub its lease back in place once it is gone), the VMM process,
//! and what the tests read of it (its mappings, its serial output).

#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the build script caches the binary when `HUGEPREP_CLOUD_HYPERVISOR` is not set.
const CACHED: &str =
    "/var/cache/hugeprep-tests/cloud-hypervisor-v53.0/src/target/release/cloud-hypervisor";

/// The cloud-hypervisor binary and `ch-remote` beside it, or `None` (after
/// [`hugeprep::testing::missing_tool`], which fails the test under `scripts/test`).
pub fn binaries() -> Option<(PathBuf, PathBuf)> {
    let ch = std::env::var_os("HUGEPREP_CLOUD_HYPERVISOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(CACHED));
    let remote = ch.with_file_name("ch-remote");
    if !ch.is_file() || !remote.is_file() {
        hugeprep::testing::missing_tool(&format!(
            "cloud-hypervisor: {} or {} missing (run ../shared/third_party/build-cloud-hypervisor.sh and set HUGEPREP_CLOUD_HYPERVISOR to the path it prints)",
            ch.display(),
            remote.display()
        ));
        return None;
    }
    if !Path::new("/dev/kvm").exists() {
        hugeprep::testing::missing_tool("/dev/kvm (cloud-hypervisor needs KVM)");
        return None;
    }
    Some((ch, remote))
}

/// A fresh child of the cgroup2 hierarchy (found in /proc/self/mountinfo); removed on drop
/// once empty. A VMM started in it leaves nothing behind in a cgroup shared with the test.
pub struct Cgroup {
    pub path: PathBuf,
}

impl Cgroup {
    pub fn new(name: &str) -> Cgroup {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let root = info
            .lines()
            .find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                right
                    .starts_with("cgroup2 ")
                    .then(|| left.split(' ').nth(4).map(PathBuf::from))?
            })
            .expect("a cgroup2 mount in /proc/self/mountinfo");
        let path = root.join(format!("hugeprep-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir(&path);
        fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Cgroup { path }
    }

    /// The bytes of `path`, read by a `cat` inside this cgroup: a lease file the test reads
    /// itself would carry an opener (the test, in a cgroup that never goes) the daemon
    /// cannot see leave, and would not be scrubbed back in place.
    pub fn read(&self, path: &Path) -> Vec<u8> {
        let out = Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec cat "$1""#)
            .arg(&self.path)
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "cat {}: {out:?}", path.display());
        out.stdout
    }

    /// Removes the directory (the cgroup must be empty: its processes reaped).
    pub fn remove(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.path.exists() {
            match fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if Instant::now() >= deadline => {
                    panic!("rmdir {}: {e}", self.path.display())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.path);
    }
}

/// A shell that has moved itself into `cgroup` and waits on its stdin for the rest of
/// cloud-hypervisor's command line, then execs it: the VMM's pid is known (to lease with)
/// before its arguments are, as a control plane's is.
pub struct Vmm {
    pub child: Child,
    stdin: Option<ChildStdin>,
    pub serial: PathBuf,
    pub log: PathBuf,
}

impl Vmm {
    /// Starts the waiting shell; `fixed` are arguments known now (quoted by the shell). The
    /// guest's serial port goes to [`Vmm::serial`] when the caller passes `--serial
    /// file=` that path (or the API's `serial.file`).
    pub fn spawn(ch: &Path, cgroup: &Cgroup, dir: &Path, fixed: &[String]) -> Vmm {
        let serial = dir.join("serial.out");
        let log = dir.join("ch.log");
        let _ = fs::remove_file(&serial);
        let child = Command::new("sh")
            .arg("-c")
            // Word splitting of the line read is intended: paths here have no spaces.
            .arg(r#"echo $$ > "$0/cgroup.procs" && read -r rest && exec "$@" $rest"#)
            .arg(&cgroup.path)
            .arg(ch)
            .args(fixed)
            .arg("-v")
            .arg("--log-file")
            .arg(&log)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("ch.stderr")).unwrap())
            .spawn()
            .unwrap();
        let mut vmm = Vmm {
            stdin: None,
            serial,
            log,
            child,
        };
        vmm.stdin = vmm.child.stdin.take();
        // The pid must be in the cgroup before anything is leased with it.
        let procs = cgroup.path.join("cgroup.procs");
        let pid = vmm.pid().to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !fs::read_to_string(&procs)
            .unwrap_or_default()
            .lines()
            .any(|l| l == pid)
        {
            assert!(
                Instant::now() < deadline,
                "pid {pid} not in {}",
                procs.display()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        vmm
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Execs cloud-hypervisor with `rest` appended.
    pub fn exec(&mut self, rest: &[String]) {
        let mut stdin = self.stdin.take().expect("exec once");
        writeln!(stdin, "{}", rest.join(" ")).unwrap();
    }

    /// What cloud-hypervisor logged, for failure messages.
    pub fn logs(&self) -> String {
        let dir = self.log.parent().unwrap();
        format!(
            "stderr:\n{}\nlog (tail):\n{}",
            fs::read_to_string(dir.join("ch.stderr")).unwrap_or_default(),
            fs::read_to_string(&self.log)
                .unwrap_or_default()
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        )
    }

    /// Waits (a liveness bound) until the guest wrote a whole line on its serial port.
    pub fn serial_line(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = fs::read_to_string(&self.serial).unwrap_or_default();
            if let Some(line) = text.lines().next().filter(|_| text.contains('\n')) {
                return line.to_string();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "cloud-hypervisor exited ({status}) before the guest reported\n{}",
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no serial report within 60 s\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The (device, inode) of every hugetlbfs file the process maps.
    pub fn mapped_inodes(&self) -> Vec<u64> {
        let maps = fs::read_to_string(format!("/proc/{}/maps", self.pid())).unwrap();
        let mut inodes: Vec<u64> = maps
            .lines()
            .filter_map(|l| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                let inode: u64 = fields.get(4)?.parse().ok()?;
                (inode != 0 && fields.get(1)?.contains('s')).then_some(inode)
            })
            .collect();
        inodes.sort_unstable();
        inodes.dedup();
        inodes
    }

    /// SIGTERM (cloud-hypervisor exits on it), then reap.
    pub fn stop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The inode of `path`.
pub fn inode(path: &Path) -> u64 {
    fs::metadata(path).unwrap().ino()
}

/// Runs `ch-remote --api-socket SOCKET ARGS`, panicking with its output on failure.
pub fn ch_remote(remote: &Path, socket: &Path, args: &[&str]) -> String {
    let out = Command::new(remote)
        .arg("--api-socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ch-remote {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits (a liveness bound) until `socket` exists.
pub fn wait_socket(socket: &Path, vmm: &mut Vmm) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        if let Ok(Some(status)) = vmm.child.try_wait() {
            panic!("cloud-hypervisor exited ({status})\n{}", vmm.logs());
        }
        assert!(Instant::now() < deadline, "no API socket\n{}", vmm.logs());
        std::thread::sleep(Duration::from_millis(5));
    }
}
