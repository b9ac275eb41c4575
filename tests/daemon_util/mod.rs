//! Harness for tests of the real daemon process: a hugepage reservation, a private
//! hugetlbfs mount with a size limit (so `statfs` counts the daemon's pages), temp state and
//! socket paths, and the `hugeprep serve` child, waited for through its sd-notify READY.

#![allow(dead_code)]

pub mod lessee;
pub mod users;

use std::fs;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hugeprep::client::{Client, ClientError};
use hugeprep::pool::{LeaseInfo, LeaseRequest, PoolStatus};
use hugeprep::sys::mmap::MmapRegion;
use hugeprep::testing::HugepageReservation;
use hugeprep::PageSize;

pub const MIB: u64 = 1 << 20;

/// A test's private world: hugepages, a mount, directories.
pub struct Env {
    pub dir: PathBuf,
    pub mount: PathBuf,
    pub state: PathBuf,
    pub socket: PathBuf,
    pub mount_bytes: u64,
    _reservation: Option<HugepageReservation>,
    _lock: Option<hugeprep::hugetlb::lock::HugepageLock>,
}

impl Env {
    /// Reserves `mount_bytes` of 2 MiB pages and mounts a hugetlbfs limited to that size.
    /// A machine that cannot supply a few MiB of 2 MiB pages cannot run the suite: that fails
    /// the test rather than skipping it.
    pub fn new(name: &str, mount_bytes: u64) -> Env {
        Env::try_with_page_size(name, PageSize::Size2M, mount_bytes).unwrap_or_else(|| {
            panic!("{name}: the kernel cannot supply {mount_bytes} bytes of 2 MiB pages")
        })
    }

    /// As [`Env::new`] with pages of `page_size`; `None` when the kernel cannot supply them
    /// (1 GiB pages need contiguous memory, which a long-running host may lack).
    pub fn try_with_page_size(name: &str, page_size: PageSize, mount_bytes: u64) -> Option<Env> {
        let pages = mount_bytes / page_size.bytes();
        let reservation = HugepageReservation::ensure_free(page_size, pages)
            .expect("reading/writing the hugepage pool (run as root)")?;
        let mut env = Env::with_mount(
            name,
            &format!("pagesize={},size={mount_bytes}", page_size.name()),
        );
        env.mount_bytes = mount_bytes;
        env._reservation = Some(reservation);
        Some(env)
    }

    /// As [`Env::new`] for `page_size` pages; `None` when the kernel cannot supply them (1 GiB
    /// pages on a fragmented host), having given back what it got.
    pub fn with_page_size(name: &str, page_size: PageSize, mount_bytes: u64) -> Option<Env> {
        let pages = mount_bytes / page_size.bytes();
        let reservation = HugepageReservation::ensure_free(page_size, pages)
            .expect("reading/writing the hugepage pool (run as root)")?;
        let mut env = Env::with_mount(
            name,
            &format!("pagesize={},size={mount_bytes}", page_size.bytes()),
        );
        env.mount_bytes = mount_bytes;
        env._reservation = Some(reservation);
        Some(env)
    }

    /// A fresh host's view: the machine-wide hugepage lock held, no pages reserved for the
    /// test, and a hugetlbfs mount without a size limit, so the daemon itself must raise the
    /// kernel's pool.
    pub fn fresh(name: &str) -> Env {
        Env::fresh_on(name, PageSize::Size2M)
    }

    /// As [`Env::fresh`], on a hugetlbfs of `page_size` pages.
    pub fn fresh_on(name: &str, page_size: PageSize) -> Env {
        let lock = hugeprep::testing::lock().expect("taking the hugepage test lock");
        let mut env = Env::with_mount(name, &format!("pagesize={}", page_size.name()));
        env._lock = Some(lock);
        env
    }

    /// A second world on this machine (a second "host"), with a mount of `mount_bytes` whose
    /// pages come out of `first`'s reservation (which must hold room for both): it takes no
    /// lock or reservation of its own, and its daemon must run with `--no-reserve`.
    #[allow(dead_code)]
    pub fn beside(first: &Env, name: &str, mount_bytes: u64) -> Env {
        assert!(
            first._reservation.is_some(),
            "{name}: the first world reserved nothing"
        );
        let mut env = Env::with_mount(name, &format!("pagesize=2M,size={mount_bytes}"));
        env.mount_bytes = mount_bytes;
        env
    }

    fn with_mount(name: &str, options: &str) -> Env {
        let dir = std::env::temp_dir().join(format!("hugeprep-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mount = dir.join("mnt");
        let state = dir.join("state");
        fs::create_dir_all(&mount).unwrap();
        nix::mount::mount(
            Some("hugetlbfs"),
            &mount,
            Some("hugetlbfs"),
            nix::mount::MsFlags::empty(),
            Some(options),
        )
        .unwrap();
        Env {
            socket: dir.join("hugeprep.sock"),
            dir,
            mount,
            state,
            mount_bytes: 0,
            _reservation: None,
            _lock: None,
        }
    }

    /// Starts `hugeprep serve` on this world with `extra` flags and waits for READY=1.
    /// Calibration (200 ms of timing at every start) is off unless `extra` asks for it: the
    /// crash test restarts the daemon fifty times. So is the lessee grace (2 s without a
    /// refill after every lease and release, which only a starting VMM needs; the service
    /// test runs the packaged default): tests that settle after each lease would wait it out.
    pub fn spawn(&self, extra: &[&str]) -> Daemon {
        self.spawn_wrapped(&[], extra)
    }

    /// As [`Env::spawn`], with the daemon started through `wrapper` (a command that execs
    /// its arguments, e.g. `setpriv ... prlimit ...`).
    pub fn spawn_wrapped(&self, wrapper: &[&str], extra: &[&str]) -> Daemon {
        let calibration: &[&str] = if extra.contains(&"--calibration") {
            &[]
        } else {
            &["--calibration", "off"]
        };
        // A world from `Env::new` hands the daemon pages it reserved itself and gives back
        // exactly those: its daemon must not raise the kernel's pools on top (a raise would
        // outlive a killed daemon). `Env::fresh` worlds test the raise itself.
        let reserve: &[&str] = if self._reservation.is_some() && !extra.contains(&"--no-reserve") {
            &["--no-reserve"]
        } else {
            &[]
        };
        let grace: &[&str] = if extra.contains(&"--lessee-grace-ms") {
            &[]
        } else {
            &["--lessee-grace-ms", "0"]
        };
        let notify = self.dir.join("notify.sock");
        let _ = fs::remove_file(&notify);
        let listener = UnixDatagram::bind(&notify).unwrap();
        listener
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("daemon.log"))
            .unwrap();
        let bin = env!("CARGO_BIN_EXE_hugeprep");
        let (program, pre) = match wrapper.split_first() {
            Some((first, rest)) => (*first, [rest, &[bin]].concat()),
            None => (bin, Vec::new()),
        };
        let mut child = Command::new(program)
            .args(pre)
            .arg("serve")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--mount")
            .arg(&self.mount)
            .args(calibration)
            .args(grace)
            .args(reserve)
            .args(extra)
            .env("NOTIFY_SOCKET", &notify)
            .env("RUST_LOG", "hugeprep=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut buf = [0u8; 4096];
        loop {
            if let Ok(n) = listener.recv(&mut buf) {
                if String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .any(|l| l == "READY=1")
                {
                    break;
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("daemon exited before READY: {status}\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "no READY=1 within 30 s\n{}",
                self.log()
            );
        }
        Daemon {
            child,
            client: Client::new(&self.socket).with_timeout(Duration::from_secs(30)),
        }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// Free 2 MiB pages in the kernel's pool right now.
    pub fn free_pages(&self) -> u64 {
        hugeprep::hugetlb::pool::available(None, PageSize::Size2M).unwrap()
    }

    /// Bytes of the mount in use (its size limit minus free blocks).
    pub fn mount_used(&self) -> u64 {
        let st = nix::sys::statfs::statfs(&self.mount).unwrap();
        (st.blocks() - st.blocks_free()) * st.block_size() as u64
    }

    pub fn pool_dir(&self) -> PathBuf {
        self.mount.join("hugeprep/pool")
    }

    pub fn lease_dir(&self) -> PathBuf {
        self.mount.join("hugeprep/leases")
    }

    /// Names in a directory.
    /// The lease links in the lease directory, those in the per-principal directories of
    /// non-admin principals (`.uid-N/`, `.p-HEX/`, which stay once made) included, as
    /// `DIR/NAME`: empty when no lease is left.
    pub fn lease_links(&self) -> Vec<String> {
        let dir = self.lease_dir();
        let mut v = Vec::new();
        for name in Self::names(&dir) {
            let path = dir.join(&name);
            if name.starts_with('.') && path.is_dir() {
                v.extend(
                    Self::names(&path)
                        .into_iter()
                        .map(|n| format!("{name}/{n}")),
                );
            } else {
                v.push(name);
            }
        }
        v
    }

    pub fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.mount, nix::mount::MntFlags::MNT_DETACH);
        if std::thread::panicking() {
            eprintln!("daemon log:\n{}", self.log());
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The daemon child process; killed (by its pid) on drop.
pub struct Daemon {
    pub child: Child,
    pub client: Client,
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(&mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "daemon exited with {status}");
    }

    pub fn lease(&self, name: &str, size: u64) -> Result<LeaseInfo, ClientError> {
        self.lease_req(&LeaseRequest {
            name: name.into(),
            size,
            ..Default::default()
        })
    }

    pub fn lease_req(&self, req: &LeaseRequest) -> Result<LeaseInfo, ClientError> {
        self.client.blocking(self.client.lease(req))
    }

    pub fn release(&self, id: u64) -> Result<LeaseInfo, ClientError> {
        self.client.blocking(self.client.release(id))
    }

    pub fn leases(&self) -> Vec<LeaseInfo> {
        self.client.blocking(self.client.leases()).unwrap()
    }

    /// The pool's running totals (faults, scrubs, proofs, the kernel's path).
    pub fn counters(&self) -> hugeprep::pool::CounterSnapshot {
        self.pool().counters
    }

    pub fn pool(&self) -> PoolStatus {
        self.client.blocking(self.client.pool()).unwrap()
    }

    /// Raw request: (status, body).
    pub fn raw(&self, method: &str, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
        let (status, bytes) = self
            .client
            .blocking(
                self.client
                    .request(method.parse().unwrap(), path, Some(body.to_vec())),
            )
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    /// Waits until nothing is dirty, scrubbing or filling and warm memory equals `warm`
    /// (a liveness bound, not a speed assertion).
    pub fn settle(&self, warm: u64) -> PoolStatus {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let p = self.pool();
            let k = &p.kinds[0];
            if k.dirty_bytes == 0
                && k.scrubbing_bytes == 0
                && k.filling_bytes == 0
                && k.warm_bytes == warm
            {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "pool did not settle at {warm} warm: {k:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        match self.child.try_wait() {
            Ok(None) => self.kill(),
            // A daemon that died under a failing test: how (a signal leaves no line in its log).
            Ok(Some(status)) if std::thread::panicking() => {
                eprintln!("the daemon had exited: {status}")
            }
            _ => {}
        }
    }
}

/// Maps a lease file.
pub fn map_lease(lease: &LeaseInfo) -> (fs::File, MmapRegion) {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&lease.path)
        .unwrap();
    let r = MmapRegion::shared_file(std::os::fd::AsFd::as_fd(&f), 0, lease.size as usize).unwrap();
    (f, r)
}

/// Whether every byte of the lease reads zero (full scan).
pub fn lease_is_zero(lease: &LeaseInfo) -> bool {
    let (_f, r) = map_lease(lease);
    hugeprep::scrub::first_nonzero(r.as_slice()).is_none()
}

/// Fills the lease with a distinctive pattern.
pub fn write_pattern(lease: &LeaseInfo, seed: u8) {
    let (_f, mut r) = map_lease(lease);
    for (i, b) in r.as_mut_slice().iter_mut().enumerate() {
        *b = seed ^ (i as u8) | 0x80;
    }
}

/// One HTTP/1.1 exchange on a daemon socket with extra request headers, for what
/// [`Daemon::raw`] cannot send or see: (status, the response head in lower case, the JSON
/// body or `Null`).
pub fn http(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, serde_json::Value) {
    let (status, head, text) = http_text(socket, method, path, headers, body);
    (
        status,
        head,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

/// As [`http`], with the body as text.
pub fn http_text(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    // The daemon answers with a content-length body (no chunked encoding) for these routes.
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// The standard output of a command that must have succeeded (both streams shown if not).
pub fn succeeded(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `hugeprep bench vm-start` with `args` (a bench run through the real binary): its JSON
/// report, after checking that it succeeded and that no release took the kernel's path. Each
/// VMM runs in a cgroup of its own (the bench's for QEMU alone, libvirt's machine cgroup), so
/// every release is proven and scrubbed, as none was while the bench's QEMUs shared its
/// never-emptying cgroups.
pub fn vm_start_report(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["bench", "vm-start"])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("takes the kernel's path"),
        "a release took the kernel's path: {stderr}"
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Whether QEMU/KVM and libvirt are installed; when not, says so (a failure under
/// `scripts/test`, see `hugeprep::testing::missing_tool`) and the caller returns.
pub fn qemu_and_libvirt_present() -> bool {
    for tool in [
        "/usr/bin/qemu-system-x86_64",
        "/dev/kvm",
        "/usr/sbin/libvirtd",
        "/usr/sbin/virtlogd",
        "/usr/bin/virsh",
    ] {
        if !std::path::Path::new(tool).exists() {
            hugeprep::testing::missing_tool(&format!("{tool} missing"));
            return false;
        }
    }
    true
}
