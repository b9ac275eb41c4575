//! A lessee process for isolation tests: the test binary run again as the lease's owner
//! (uid 65534 in the attacks, as every QEMU of a libvirt host shares one user), in a cgroup of its own when asked, that uses a
//! lease file the way the test says and keeps a way to its pages afterwards. The test then
//! asks it how many bytes of the next lessee's pattern it can read.
//!
//! A test file that uses it has `#[test] fn lessee_entry() { daemon_util::lessee::entry() }`:
//! it does nothing unless the environment names a mode.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use hugeprep::sys::mmap::MmapRegion;

const MODE: &str = "HUGEPREP_LESSEE";
const PATH: &str = "HUGEPREP_LESSEE_PATH";
const SIZE: &str = "HUGEPREP_LESSEE_SIZE";
const SOCKET: &str = "HUGEPREP_LESSEE_SOCKET";
const GONE: &str = "HUGEPREP_LESSEE_GONE";
/// The test binary's arguments that run only `lessee_entry`, quietly.
const ENTRY: [&str; 5] = [
    "lessee_entry",
    "--exact",
    "--nocapture",
    "--test-threads=1",
    "-q",
];

/// The byte the next lessee writes everywhere: what the attacker looks for.
pub const SECRET: u8 = 0xa5;

/// A cgroup v2 directory of the test's own, removed on drop (once empty).
pub struct TestCgroup {
    pub dir: PathBuf,
}

impl TestCgroup {
    pub fn new(name: &str) -> TestCgroup {
        let hierarchies = hugeprep::pool::reach::cgroup::Hierarchies::detect().unwrap();
        let root = hierarchies
            .v2_mount()
            .expect("a cgroup2 hierarchy is mounted");
        let dir = root.join(format!("hugeprep-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).unwrap();
        TestCgroup { dir }
    }

    /// Delegates the cgroup to `uid`, as systemd does for a user session: its processes may
    /// move themselves between cgroups of the subtree.
    pub fn delegate(&self, uid: u32) {
        let procs = self.dir.join("cgroup.procs");
        std::os::unix::fs::chown(&procs, Some(uid), None).unwrap();
        std::os::unix::fs::chown(&self.dir, Some(uid), None).unwrap();
    }

    pub fn add(&self, pid: u32) {
        fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for _ in 0..200 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// Writes `text` at `offset` of the lease file at `path` from a short-lived process in a
/// cgroup of its own, as a VM's own process would: the test process itself never opens the
/// file, so the release can be proven (docs/security.md) once the writer has exited.
pub fn write_at(path: &Path, size: u64, offset: usize, text: &str) {
    let off = offset.to_string();
    let mut w = Lessee::spawn(
        "write-at",
        path,
        size,
        true,
        &[
            ("HUGEPREP_LESSEE_SOCKET", text),
            ("HUGEPREP_LESSEE_OFFSET", &off),
        ],
    );
    w.ready();
    w.exit();
}

/// The command line that runs `argv` in a cgroup of its own, as libvirt or a control plane
/// starts a VMM: a shell puts itself into `cgroup`, then execs.
pub fn in_cgroup(cgroup: &TestCgroup, argv: &[String]) -> Vec<String> {
    let mut v = vec![
        "-c".to_string(),
        r#"echo $$ > "$0/cgroup.procs" && exec "$@""#.to_string(),
        cgroup.dir.display().to_string(),
    ];
    v.extend_from_slice(argv);
    v
}

/// Counts the bytes of the lease file at `path` that are not zero, from a process in a
/// cgroup of its own that then dirties the whole file and exits (a VM that ran on it).
pub fn nonzero_then_dirty(path: &Path, size: u64) -> u64 {
    let mut w = Lessee::spawn("write", path, size, true, &[]);
    let n = w.nonzero();
    w.ready();
    w.exit();
    n
}

/// A running lessee.
pub struct Lessee {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pub cgroup: Option<TestCgroup>,
}

impl Lessee {
    /// Starts `mode` on `path` as the file's owner (uid 65534 for leases made for `nobody`),
    /// in a cgroup of its own when `own_cgroup`.
    pub fn spawn(
        mode: &str,
        path: &Path,
        size: u64,
        own_cgroup: bool,
        extra: &[(&str, &str)],
    ) -> Lessee {
        let cgroup = own_cgroup.then(|| TestCgroup::new(mode));
        Lessee::spawn_in(mode, path, size, cgroup, extra)
    }

    /// [`Lessee::spawn`] in `cgroup` (made by the caller), or in the test's own.
    pub fn spawn_in(
        mode: &str,
        path: &Path,
        size: u64,
        cgroup: Option<TestCgroup>,
        extra: &[(&str, &str)],
    ) -> Lessee {
        let exe = std::env::current_exe().unwrap();
        use std::os::unix::fs::MetadataExt;
        let owner = fs::metadata(path).unwrap();
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", owner.uid()))
            .arg(format!("--regid={}", owner.gid()))
            .args(["--clear-groups", "--"])
            .arg(exe)
            .args(ENTRY)
            .env(MODE, mode)
            .env(PATH, path)
            .env(SIZE, size.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        if let Some(cg) = &cgroup {
            cg.add(child.id());
        }
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut l = Lessee {
            child,
            stdin,
            stdout,
            cgroup,
        };
        l.say("go");
        l
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// The next line the lessee reports (`lessee: ...`); `None` when it exited.
    fn report(&mut self) -> Option<String> {
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line).unwrap_or(0) == 0 {
                return None;
            }
            if let Some(r) = line.trim().strip_prefix("lessee: ") {
                return Some(r.to_string());
            }
        }
    }

    /// Waits until a receiving lessee listens on its socket.
    pub fn listening(&mut self) {
        let r = self.report();
        assert_eq!(r.as_deref(), Some("listening"), "lessee does not listen");
    }

    /// A `write` lessee's count of bytes that were not zero when it mapped its lease.
    pub fn nonzero(&mut self) -> u64 {
        let r = self.report().expect("lessee exited");
        r.strip_prefix("nonzero ").unwrap().parse().unwrap()
    }

    /// Waits until the lessee has set up its way to the pages.
    pub fn ready(&mut self) {
        let r = self.report();
        assert_eq!(r.as_deref(), Some("ready"), "lessee did not get ready");
    }

    /// How many bytes of [`SECRET`] the lessee reads through what it kept. A lessee killed
    /// by SIGBUS read nothing: its mapping lost its pages.
    pub fn seen(&mut self) -> u64 {
        self.say("read");
        match self.report() {
            Some(r) => r.strip_prefix("seen ").unwrap().parse().unwrap(),
            None => {
                use std::os::unix::process::ExitStatusExt;
                let status = self.child.wait().unwrap();
                assert_eq!(status.signal(), Some(libc::SIGBUS), "lessee died: {status}");
                0
            }
        }
    }

    /// Lets the lessee exit and waits for it.
    pub fn exit(mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

impl Drop for Lessee {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What the lessee kept.
enum Kept {
    Nothing,
    /// A path that reaches the file again (an `O_PATH` descriptor's `/proc/self/fd/N`, a
    /// bind mount), opened only when asked to read.
    Reopen(PathBuf, Option<OwnedFd>),
    /// An io_uring with the mapping's pages registered, and the registered address.
    Ring(Box<io_uring::IoUring>, u64, usize),
    Pipe(OwnedFd),
    Map(MmapRegion),
    /// An open file of the lease, read with `pread` when asked.
    Open(fs::File),
    /// An open file (with a read lease), a shared read-only mapping of all of it (left
    /// mapped until the process ends) and a pipe holding a `vmsplice`d piece of its first
    /// page: read through the pipe when asked.
    Held(fs::File, OwnedFd),
}

fn map(path: &Path, size: usize) -> (fs::File, MmapRegion) {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let r = MmapRegion::shared_file(f.as_fd(), 0, size).unwrap();
    (f, r)
}

/// Bytes an unprivileged lessee pins: its RLIMIT_MEMLOCK (8 MiB here, and root here may
/// not raise it) bounds a ring's registered buffers.
pub const PINNED: u64 = 4 << 20;

/// Registers the first [`PINNED`] bytes of `map` as a fixed buffer of a new ring; those
/// pages stay pinned by the ring.
fn register(map: &MmapRegion) -> (io_uring::IoUring, u64, usize) {
    let ring = io_uring::IoUring::new(2).unwrap();
    let iov = libc::iovec {
        iov_base: map.as_ptr().cast(),
        iov_len: PINNED as usize,
    };
    // SAFETY: the iovec covers the live mapping; the attacker keeps the registration past
    // the mapping's end on purpose (the kernel pins the pages, user memory is never touched
    // through it again but by the kernel).
    unsafe { ring.submitter().register_buffers(&[iov]) }.unwrap();
    (ring, map.as_ptr() as u64, PINNED as usize)
}

fn count(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == SECRET).count() as u64
}

impl Kept {
    fn seen(&mut self, size: usize) -> u64 {
        match self {
            Kept::Nothing => 0,
            Kept::Ring(ring, addr, len) => {
                // Copy the pinned pages into a memfd with WRITE_FIXED, then read them.
                let memfd = nix::sys::memfd::memfd_create(
                    c"hugeprep-peek",
                    nix::sys::memfd::MemFdCreateFlag::empty(),
                )
                .unwrap();
                let sqe = io_uring::opcode::WriteFixed::new(
                    io_uring::types::Fd(memfd.as_raw_fd()),
                    *addr as *const u8,
                    *len as u32,
                    0,
                )
                .offset(0)
                .build();
                // SAFETY: the entry names a registered buffer and a live descriptor.
                unsafe { ring.submission().push(&sqe) }.unwrap();
                ring.submit_and_wait(1).unwrap();
                let cqe = ring.completion().next().unwrap();
                assert!(cqe.result() >= 0, "WRITE_FIXED: {}", cqe.result());
                let mut f = fs::File::from(memfd);
                let mut out = Vec::new();
                use std::io::Seek;
                f.seek(std::io::SeekFrom::Start(0)).unwrap();
                f.read_to_end(&mut out).unwrap();
                count(&out)
            }
            Kept::Pipe(fd) | Kept::Held(_, fd) => {
                let mut f = fs::File::from(fd.try_clone().unwrap());
                let mut out = vec![0u8; 64 << 10];
                let n = f.read(&mut out).unwrap();
                count(&out[..n])
            }
            Kept::Reopen(path, _) => {
                match fs::OpenOptions::new().read(true).write(true).open(&*path) {
                    Ok(f) => {
                        let len = f.metadata().unwrap().len() as usize;
                        if len == 0 {
                            return 0;
                        }
                        let r = MmapRegion::shared_file(f.as_fd(), 0, len.min(size)).unwrap();
                        count(r.as_slice())
                    }
                    Err(_) => 0,
                }
            }
            Kept::Map(r) => count(r.as_slice()),
            Kept::Open(f) => {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; 2 << 20];
                let mut seen = 0;
                let mut at = 0u64;
                while let Ok(n) = f.read_at(&mut buf, at) {
                    if n == 0 {
                        break;
                    }
                    seen += count(&buf[..n]);
                    at += n as u64;
                }
                seen
            }
        }
    }
}

/// The lessee's side; a no-op in an ordinary test run.
pub fn entry() {
    let Ok(mode) = std::env::var(MODE) else {
        return;
    };
    let path = PathBuf::from(std::env::var(PATH).unwrap());
    let size: usize = std::env::var(SIZE).unwrap().parse().unwrap();
    let mut input = std::io::stdin().lock();
    let mut line = String::new();
    // A lessee that carries on another's run by exec was told to go already.
    if std::env::var(GONE).is_err() {
        input.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "go");
    }
    let mut kept = match mode.as_str() {
        // An ordinary VMM: writes its guest's memory, then exits.
        // First says how many bytes it found not zero.
        "write" => {
            let (_f, mut r) = map(&path, size);
            let dirty = r.as_slice().iter().filter(|&&b| b != 0).count();
            println!("lessee: nonzero {dirty}");
            r.as_mut_slice().fill(0x5a);
            Kept::Nothing
        }
        // Writes HUGEPREP_LESSEE_SOCKET's bytes at HUGEPREP_LESSEE_OFFSET, then exits: a
        // process of the VM's that touches its memory (a test's write into a guest).
        "write-at" => {
            let offset: usize = std::env::var("HUGEPREP_LESSEE_OFFSET")
                .unwrap()
                .parse()
                .unwrap();
            let bytes = std::env::var(SOCKET).unwrap().into_bytes();
            let (_f, mut r) = map(&path, size);
            r.as_mut_slice()[offset..offset + bytes.len()].copy_from_slice(&bytes);
            Kept::Nothing
        }
        // A balloon: fills the lease, then punches out the 2 MiB pages HUGEPREP_LESSEE_PAGES
        // lists (comma-separated indexes).
        "punch" => {
            let (f, mut r) = map(&path, size);
            r.as_mut_slice().fill(0x5a);
            drop(r);
            for p in std::env::var("HUGEPREP_LESSEE_PAGES").unwrap().split(',') {
                let p: i64 = p.parse().unwrap();
                nix::fcntl::fallocate(
                    f.as_raw_fd(),
                    nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                        | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                    p << 21,
                    1 << 21,
                )
                .unwrap();
            }
            Kept::Nothing
        }
        "iouring" => {
            let (f, mut r) = map(&path, size);
            r.as_mut_slice().fill(0x5a);
            let ring = register(&r);
            drop((r, f));
            Kept::Ring(Box::new(ring.0), ring.1, ring.2)
        }
        "vmsplice" => {
            let (f, r) = map(&path, size);
            let (rd, wr) = nix::unistd::pipe().unwrap();
            let iov = [std::io::IoSlice::new(&r.as_slice()[..64 << 10])];
            let n =
                nix::fcntl::vmsplice(wr.as_fd(), &iov, nix::fcntl::SpliceFFlags::empty()).unwrap();
            assert_eq!(n, 64 << 10);
            drop((r, f));
            Kept::Pipe(rd)
        }
        "link" => {
            let link = PathBuf::from(std::env::var(SOCKET).unwrap());
            fs::hard_link(&path, &link).unwrap();
            Kept::Reopen(link, None)
        }
        // Keeps an O_PATH descriptor: no open file, no open event; reopened through
        // /proc/self/fd when asked to read.
        "opath" => {
            let fd = nix::fcntl::open(
                &path,
                nix::fcntl::OFlag::O_PATH,
                nix::sys::stat::Mode::empty(),
            )
            .unwrap();
            // SAFETY: the descriptor just opened is ours alone.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let reopen = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
            Kept::Reopen(reopen, Some(fd))
        }
        // Binds the lease file onto a file of its own in a user and mount namespace it makes
        // (no privilege needed), then becomes a `reopen` lessee in there, which opens the
        // mount point only when asked to read. (unshare(2) refuses a threaded process: the
        // util-linux tool makes the namespace, this process carries on in it by exec.)
        "bind" => {
            use std::os::unix::process::CommandExt;
            let target = std::env::temp_dir().join(format!("hugeprep-bind-{}", std::process::id()));
            fs::write(&target, b"").unwrap();
            let err = Command::new("unshare")
                .args(["--user", "--map-root-user", "--mount", "--", "sh", "-c"])
                .arg(r#"mount --bind "$0" "$1" && shift && exec "$@""#)
                .arg(&path)
                .arg(&target)
                .arg(std::env::current_exe().unwrap())
                .args(ENTRY)
                .env(MODE, "reopen")
                .env(SOCKET, &target)
                .env(GONE, "1")
                .exec();
            panic!("exec unshare: {err}");
        }
        // Takes a read lease (`F_SETLEASE`, `F_RDLCK`) on its lease file and keeps it: the
        // daemon's opens for writing fail (`O_NONBLOCK`) instead of waiting for it.
        "rdlease" => {
            // The daemon's open for writing breaks the lease (and fails at once): the
            // kernel signals the holder with SIGIO, whose default action would end it.
            // SAFETY: SIG_IGN installs no handler: no code runs on the signal.
            unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
            let f = fs::File::open(&path).unwrap();
            // SAFETY: F_SETLEASE takes an integer argument; no memory is passed.
            let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
            assert_eq!(rc, 0, "F_SETLEASE: {}", std::io::Error::last_os_error());
            Kept::Open(f)
        }
        // The attack on kept files: grows its file to SIZE bytes (a length, no page), takes
        // a read lease, maps all of it shared and read-only (a read fault past the leased
        // size would take a free hugepage of the host) and `vmsplice`s 64 KiB of its first
        // page into a pipe it keeps: once the kernel takes its lease away, the file is
        // pinned and still reached (the open file, the mapping).
        "rdlease-grow-pin" => {
            // SAFETY: SIG_IGN installs no handler: no code runs on the signal.
            unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
            fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(size as u64)
                .unwrap();
            let f = fs::File::open(&path).unwrap();
            // SAFETY: F_SETLEASE takes an integer argument; no memory is passed.
            let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
            assert_eq!(rc, 0, "F_SETLEASE: {}", std::io::Error::last_os_error());
            // SAFETY: a new shared read-only mapping of a file this process has open; it is
            // never unmapped (the process ends with it), so the slice below stays valid.
            let at = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    size,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(at, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
            // SAFETY: the first 64 KiB of the live mapping above.
            let piece = unsafe { std::slice::from_raw_parts(at.cast::<u8>(), 64 << 10) };
            let (rd, wr) = nix::unistd::pipe().unwrap();
            let iov = [std::io::IoSlice::new(piece)];
            let n =
                nix::fcntl::vmsplice(wr.as_fd(), &iov, nix::fcntl::SpliceFFlags::empty()).unwrap();
            assert_eq!(n, 64 << 10);
            Kept::Held(f, rd)
        }
        "reopen" => Kept::Reopen(PathBuf::from(std::env::var(SOCKET).unwrap()), None),
        // Opens the link only when asked to read: a later process of the same user.
        "link-read" => Kept::Reopen(PathBuf::from(std::env::var(SOCKET).unwrap()), None),
        "map" => {
            let (f, r) = map(&path, size);
            drop(f);
            Kept::Map(r)
        }
        // Hands its open lease file to another process over a unix socket, then exits.
        "send-fd" => {
            let f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let s = UnixStream::connect(std::env::var(SOCKET).unwrap()).unwrap();
            let fds = [f.as_raw_fd()];
            let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
            let iov = [std::io::IoSlice::new(b"f")];
            nix::sys::socket::sendmsg::<()>(
                s.as_raw_fd(),
                &iov,
                &cmsg,
                nix::sys::socket::MsgFlags::empty(),
                None,
            )
            .unwrap();
            Kept::Nothing
        }
        // The other end: receives the file, registers it with an io_uring, lets go of the
        // file and the mapping, keeps the ring.
        "recv-iouring" => {
            let listener = UnixListener::bind(std::env::var(SOCKET).unwrap()).unwrap();
            println!("lessee: listening");
            let (s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            let msg = nix::sys::socket::recvmsg::<()>(
                s.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                nix::sys::socket::MsgFlags::empty(),
            )
            .unwrap();
            let fd = msg
                .cmsgs()
                .unwrap()
                .find_map(|c| match c {
                    nix::sys::socket::ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
                    _ => None,
                })
                .unwrap();
            // SAFETY: the descriptor just received is ours alone.
            let f = fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
            let r = MmapRegion::shared_file(f.as_fd(), 0, size).unwrap();
            let ring = register(&r);
            drop((r, f));
            Kept::Ring(Box::new(ring.0), ring.1, ring.2)
        }
        other => panic!("unknown lessee mode {other}"),
    };
    println!("lessee: ready");
    std::io::stdout().flush().unwrap();
    loop {
        line.clear();
        if input.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        match line.trim() {
            "read" => {
                println!("lessee: seen {}", kept.seen(size));
                std::io::stdout().flush().unwrap();
            }
            _ => break,
        }
    }
}
