//! A hostile lessee, as a property (docs/security.md): the lessee runs as its own user (uid
//! 65534, the lease's owner) in a cgroup of its own and does a seeded random sequence of what
//! it may do to its lease file: `ftruncate` down and up; `fallocate` in every mode, past the
//! end included; `mmap` at any offset, and writes through any mapping (one made before a
//! truncate included, from a forked child that a `SIGBUS` may end); `munmap`; `mbind` with
//! `MPOL_MF_MOVE` to another node (any node on a one-node host); fork and exit. Some
//! lessees keep everything they made across the release and then look for the next
//! lessee's bytes through it.
//!
//! After each release, the next lease must read all zeros, have every page on its node,
//! be the same file (inode) when the release was proven and recycled in place and another
//! when it took the kernel's path, and a lingering lessee must see none of its bytes. At
//! the end the kernel has every page back. Both ways of proving a release run: the
//! kernel's counts (BPF) and the walk of `/proc` (`HUGEPREP_REACH=walk`).
//!
//! Each failure prints a one-line replay (the method, the seed and the operations); run it
//! with `HUGEPREP_HOSTILE_REPLAY='...' cargo test --test hostile_lessee replay`.
//! `HUGEPREP_HOSTILE_SEQUENCES` sets the number of sequences per method (default
//! [`DEFAULT_SEQUENCES`]; the two methods run side by side, each against a daemon of its own,
//! at about 0.4 s a sequence on a loaded 2-CPU machine), `HUGEPREP_HOSTILE_SEED` the first
//! seed (default: from the clock, printed); `HUGEPREP_HOSTILE_VERBOSE` prints each
//! sequence's outcome and time. Where the time goes (lease, the lessee's operations, release,
//! the next lease's check, giving back) is printed at the end.
//!
//! A lingering lessee's release waits aside (still held), and the next lease, which finds no
//! other room on the mount, gives it back to the kernel at once: the property is the same as
//! at the aside's bound, without waiting 10 s for it.

mod daemon_util;

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use daemon_util::lessee::{TestCgroup, SECRET};
use daemon_util::{Daemon, Env, MIB};
use hugeprep::pool::{LeaseInfo, LeaseRequest};

const PAGE: u64 = 2 * MIB;
/// Pages of a lease.
const PAGES: u64 = 4;
const SIZE: u64 = PAGES * PAGE;
/// The mount: less than two files, so that the released file is the one the next lease
/// gets when it is recycled in place (with room for a second file the refill would fault
/// one meanwhile, and the released file would be deleted unproven), and room beside the
/// lease for what a lingering lessee keeps mapped (at most [`LINGER_PAGES`]), so that the
/// kernel's path can fault a new file meanwhile.
const ROOM: u64 = 2 * SIZE - PAGE;
/// Pages a lingering lessee keeps mapped across the release: its first slot, cut to this.
const LINGER_PAGES: u64 = PAGES - 1;
/// Sequences per method unless `HUGEPREP_HOSTILE_SEQUENCES` says otherwise.
const DEFAULT_SEQUENCES: u64 = 400;
/// Mapping slots a lessee juggles.
const SLOTS: u64 = 3;

const ROLE: &str = "HUGEPREP_HOSTILE";
const PATH: &str = "HUGEPREP_HOSTILE_PATH";
const OPS: &str = "HUGEPREP_HOSTILE_OPS";
const FILL: &str = "HUGEPREP_HOSTILE_FILL";
/// The test binary's arguments that run only `hostile_entry`, quietly.
const ENTRY: [&str; 5] = [
    "hostile_entry",
    "--exact",
    "--nocapture",
    "--test-threads=1",
    "-q",
];

/// `fallocate` modes, by index: every mode and the combinations the kernel takes (hugetlbfs
/// refuses all but the first three, with `EOPNOTSUPP`).
const FALLOCATE_MODES: [i32; 8] = [
    0,
    libc::FALLOC_FL_KEEP_SIZE,
    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    libc::FALLOC_FL_ZERO_RANGE,
    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
    libc::FALLOC_FL_COLLAPSE_RANGE,
    libc::FALLOC_FL_INSERT_RANGE,
    libc::FALLOC_FL_UNSHARE_RANGE,
];

/// One thing the lessee does; offsets and lengths in pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `ftruncate` to this many pages.
    Truncate(u64),
    /// `fallocate(mode index, offset, len)`.
    Fallocate(usize, u64, u64),
    /// `mmap` (shared, read-write) of `len` pages at `offset` into a slot (the slot's old
    /// mapping is kept: a mapping left behind).
    Map(u64, u64, u64),
    /// A forked child writes a page of a slot's mapping, then exits (a `SIGBUS` may end it).
    Write(u64, u64),
    /// `munmap` of a slot.
    Unmap(u64),
    /// `mbind(MPOL_BIND, node index, MPOL_MF_MOVE)` of a slot.
    Bind(u64, u64),
    /// A forked child writes every mapped page, then exits, unwaited for.
    Fork,
    /// Closes the descriptor and opens the lease path again.
    Reopen,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Truncate(n) => write!(f, "t{n}"),
            Op::Fallocate(m, o, l) => write!(f, "f{m}:{o}:{l}"),
            Op::Map(s, o, l) => write!(f, "m{s}:{o}:{l}"),
            Op::Write(s, p) => write!(f, "w{s}:{p}"),
            Op::Unmap(s) => write!(f, "u{s}"),
            Op::Bind(s, n) => write!(f, "b{s}:{n}"),
            Op::Fork => write!(f, "k"),
            Op::Reopen => write!(f, "o"),
        }
    }
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        let (kind, rest) = s.split_at(1);
        let n: Vec<u64> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split(':')
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?
        };
        Some(match (kind, n.as_slice()) {
            ("t", [a]) => Op::Truncate(*a),
            ("f", [m, o, l]) => Op::Fallocate(*m as usize % FALLOCATE_MODES.len(), *o, *l),
            ("m", [s, o, l]) => Op::Map(*s, *o, *l),
            ("w", [s, p]) => Op::Write(*s, *p),
            ("u", [s]) => Op::Unmap(*s),
            ("b", [s, n]) => Op::Bind(*s, *n),
            ("k", []) => Op::Fork,
            ("o", []) => Op::Reopen,
            _ => return None,
        })
    }
}

/// splitmix64: a small seeded generator, enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One lessee's life: what it does, and whether it keeps what it made across the release.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sequence {
    seed: u64,
    ops: Vec<Op>,
    linger: bool,
}

impl Sequence {
    fn generate(seed: u64) -> Sequence {
        let mut r = Rng(seed);
        let n = 1 + r.below(12);
        // Offsets and lengths reach past the lease's end, up to twice its size.
        let span = 2 * PAGES + 1;
        let ops = (0..n)
            .map(|_| match r.below(10) {
                0 => Op::Truncate(r.below(span)),
                1 | 2 => Op::Fallocate(
                    r.below(FALLOCATE_MODES.len() as u64) as usize,
                    r.below(span),
                    1 + r.below(PAGES),
                ),
                3 | 4 => Op::Map(r.below(SLOTS), r.below(span), 1 + r.below(PAGES)),
                5 | 6 => Op::Write(r.below(SLOTS), r.below(PAGES)),
                7 => Op::Unmap(r.below(SLOTS)),
                8 => Op::Bind(r.below(SLOTS), r.below(8)),
                _ => {
                    if r.below(2) == 0 {
                        Op::Fork
                    } else {
                        Op::Reopen
                    }
                }
            })
            .collect();
        Sequence {
            seed,
            ops,
            linger: r.below(4) == 0,
        }
    }

    fn ops_text(&self) -> String {
        self.ops
            .iter()
            .map(|o| o.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `METHOD SEED OPS [linger]`, what `HUGEPREP_HOSTILE_REPLAY` takes.
    fn replay(&self, by: By) -> String {
        format!(
            "replay: HUGEPREP_HOSTILE_REPLAY='{} {} {}{}' cargo test --test hostile_lessee replay -- --nocapture",
            by.label(),
            self.seed,
            self.ops_text(),
            if self.linger { " linger" } else { "" }
        )
    }

    fn parse(text: &str) -> Option<(By, Sequence)> {
        let mut w = text.split_whitespace();
        let by = match w.next()? {
            "counts" => By::Counts,
            "walk" => By::Walk,
            _ => return None,
        };
        let seed = w.next()?.parse().ok()?;
        let ops = w
            .next()?
            .split(',')
            .filter(|s| !s.is_empty())
            .map(Op::parse)
            .collect::<Option<_>>()?;
        let linger = w.next() == Some("linger");
        Some((by, Sequence { seed, ops, linger }))
    }
}

/// How the daemon proves releases.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum By {
    Counts,
    Walk,
}

impl By {
    fn label(self) -> &'static str {
        match self {
            By::Counts => "counts",
            By::Walk => "walk",
        }
    }
}

#[test]
fn hostile_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let path = PathBuf::from(std::env::var(PATH).unwrap());
    match role.as_str() {
        "ops" => {
            let seq = Sequence::parse(&format!("counts 0 {}", std::env::var(OPS).unwrap()))
                .unwrap()
                .1;
            lessee(&path, &seq.ops, seq.linger);
        }
        "check" => checker(&path),
        other => panic!("unknown role {other}"),
    }
}

/// The online NUMA nodes.
fn nodes() -> Vec<u32> {
    let text = std::fs::read_to_string("/sys/devices/system/node/online").unwrap_or_default();
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    if out.is_empty() {
        out.push(0);
    }
    out
}

/// A mapping the lessee made: address and length.
type Slot = Option<(usize, usize)>;

fn map(fd: i32, offset: u64, len: u64) -> Slot {
    // SAFETY: a new shared mapping of the lessee's own descriptor; the kernel picks the
    // address. Failures (past the end, no pages left) are tolerated: the lessee tries.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            (len * PAGE) as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            (offset * PAGE) as libc::off_t,
        )
    };
    (p != libc::MAP_FAILED).then_some((p as usize, (len * PAGE) as usize))
}

/// Runs `f` in a forked child that then exits at once; waits for it when `wait` (a child
/// that a `SIGBUS` ends is fine).
fn in_child(wait: bool, f: impl FnOnce()) {
    // SAFETY: the child only writes or reads memory the parent mapped and calls `_exit`,
    // which is all a forked child of a threaded process may do.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        f();
        // SAFETY: ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(0) };
    }
    if wait && pid > 0 {
        let mut status = 0;
        // SAFETY: waits for the child just forked; `status` lives for the call.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
}

/// Writes `byte` to the first byte of page `page` of `slot`, from a child.
fn write_page(slot: Slot, page: u64, byte: u8, wait: bool) {
    let Some((addr, len)) = slot else { return };
    let at = (page * PAGE) as usize;
    if at >= len {
        return;
    }
    in_child(wait, || {
        // SAFETY: inside the mapping; a page past the file's end raises SIGBUS, which ends
        // this child only.
        unsafe { std::ptr::write_volatile((addr + at) as *mut u8, byte) };
    });
}

/// The lessee: does `ops` on its lease file at `path`, then exits, or, when `linger`, keeps
/// everything, says `ready`, and on `read` says how many bytes of [`SECRET`] its mappings
/// show (page by page, each read by a child that a `SIGBUS` may end).
fn lessee(path: &Path, ops: &[Op], linger: bool) {
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    };
    let mut file = open();
    let mut slots: Vec<Slot> = vec![None; SLOTS as usize];
    let mut kept: Vec<Slot> = Vec::new();
    let nodes = nodes();
    for op in ops {
        let fd = file.as_raw_fd();
        match *op {
            Op::Truncate(n) => {
                let _ = file.set_len(n * PAGE);
            }
            Op::Fallocate(m, o, l) => {
                // SAFETY: fallocate on the lessee's own descriptor; no memory is passed.
                let _ = unsafe {
                    libc::fallocate(
                        fd,
                        FALLOCATE_MODES[m],
                        (o * PAGE) as libc::off_t,
                        (l * PAGE) as libc::off_t,
                    )
                };
            }
            Op::Map(s, o, l) => {
                let old = std::mem::replace(&mut slots[s as usize], map(fd, o, l));
                kept.push(old);
            }
            Op::Write(s, p) => write_page(slots[s as usize], p, 0x5a, true),
            Op::Unmap(s) => {
                if let Some((addr, len)) = slots[s as usize].take() {
                    // SAFETY: a mapping this process made and no longer uses.
                    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
                }
            }
            Op::Bind(s, n) => {
                if let Some((addr, len)) = slots[s as usize] {
                    let node = nodes[n as usize % nodes.len()];
                    let mask: [libc::c_ulong; 16] = {
                        let mut m = [0; 16];
                        m[node as usize / 64] |= 1 << (node % 64);
                        m
                    };
                    // SAFETY: mbind of a mapping this process made; the node mask lives
                    // for the call and holds 1024 bits.
                    let _ = unsafe {
                        libc::syscall(
                            libc::SYS_mbind,
                            addr,
                            len,
                            2usize, // MPOL_BIND
                            mask.as_ptr(),
                            1025usize,
                            2usize, // MPOL_MF_MOVE
                        )
                    };
                }
            }
            Op::Fork => {
                let all: Vec<Slot> = slots.clone();
                in_child(false, || {
                    for (addr, len) in all.into_iter().flatten() {
                        for at in (0..len).step_by(PAGE as usize) {
                            // SAFETY: inside a mapping; SIGBUS past the end ends the child.
                            unsafe { std::ptr::write_volatile((addr + at) as *mut u8, 0x5b) };
                        }
                    }
                });
            }
            Op::Reopen => {
                drop(file);
                file = open();
            }
        }
    }
    if !linger {
        println!("hostile: done");
        std::io::stdout().flush().unwrap();
        return;
    }
    // Keeps its first slot only, at most LINGER_PAGES of it ([`ROOM`]).
    for (i, slot) in slots.iter_mut().enumerate() {
        let Some((addr, len)) = *slot else { continue };
        let keep = if i == 0 {
            len.min((LINGER_PAGES * PAGE) as usize)
        } else {
            0
        };
        if keep < len {
            // SAFETY: the tail of a mapping this process made and no longer uses.
            unsafe { libc::munmap((addr + keep) as *mut libc::c_void, len - keep) };
        }
        *slot = (keep > 0).then_some((addr, keep));
    }
    for (addr, len) in kept.drain(..).flatten() {
        // SAFETY: a mapping this process made and no longer uses.
        unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    }
    println!("hostile: ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "read");
    let mut seen = 0u64;
    for (addr, len) in slots.iter().chain(kept.iter()).flatten().copied() {
        for at in (0..len).step_by(PAGE as usize) {
            seen += secret_in_page(addr + at);
        }
    }
    println!("hostile: seen {seen}");
    std::io::stdout().flush().unwrap();
    let _ = file;
}

/// Bytes of [`SECRET`] in the page at `addr`, read by a child (0 when a `SIGBUS` ends it).
fn secret_in_page(addr: usize) -> u64 {
    use std::io::Read;
    let (rd, wr) = nix::unistd::pipe().unwrap();
    let mut wr = std::fs::File::from(wr);
    in_child(true, || {
        // SAFETY: a page of a mapping of this process; SIGBUS ends the child.
        let page = unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE as usize) };
        let n = page.iter().filter(|&&b| b == SECRET).count() as u64;
        let _ = wr.write_all(&n.to_ne_bytes());
    });
    drop(wr);
    let mut buf = [0u8; 8];
    match std::fs::File::from(rd).read_exact(&mut buf) {
        Ok(()) => u64::from_ne_bytes(buf),
        Err(_) => 0,
    }
}

/// The next lessee's check, in a process of its own: says how many bytes of its lease are
/// not zero and on which node each page is, then fills it with [`SECRET`] when asked.
fn checker(path: &Path) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = file.metadata().unwrap().len();
    let (addr, len) = map(file.as_raw_fd(), 0, len / PAGE).expect("map the next lease");
    // SAFETY: the whole mapping just made, of a file of this length.
    let bytes = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
    // Word by word (the test binary is not optimised): a word that is not zero counts
    // its bytes that are not.
    let nonzero: usize = bytes
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().unwrap()))
        .filter(|&w| w != 0)
        .map(|w| w.to_ne_bytes().iter().filter(|&&b| b != 0).count())
        .sum();
    let pages: Vec<*mut libc::c_void> = (0..len)
        .step_by(PAGE as usize)
        .map(|at| (addr + at) as *mut libc::c_void)
        .collect();
    let mut status = vec![-1i32; pages.len()];
    // SAFETY: move_pages with no target nodes only reports each page's node into `status`,
    // which has one entry per page address; both live for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            pages.len(),
            pages.as_ptr(),
            std::ptr::null::<i32>(),
            status.as_mut_ptr(),
            0,
        )
    };
    assert_eq!(rc, 0, "move_pages: {}", std::io::Error::last_os_error());
    let mut out = format!("hostile: nonzero {nonzero} nodes");
    for s in &status {
        let _ = write!(out, " {s}");
    }
    if std::env::var(FILL).is_ok() {
        bytes.fill(SECRET);
    }
    println!("{out}");
    std::io::stdout().flush().unwrap();
}

/// A process of the test binary run as `uid` in `cgroup`, in `role` on `path`.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    _cgroup: TestCgroup,
}

impl Proc {
    fn spawn(role: &str, path: &Path, cgroup: TestCgroup, env: &[(&str, &str)]) -> Proc {
        let owner = std::fs::metadata(path).unwrap();
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", owner.uid()))
            .arg(format!("--regid={}", owner.gid()))
            .args(["--clear-groups", "--"])
            .arg(std::env::current_exe().unwrap())
            .args(ENTRY)
            .env(ROLE, role)
            .env(PATH, path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        // The child puts itself into its cgroup before it runs anything of its own: a shell
        // that moves itself, then execs.
        let mut argv = vec![cmd.get_program().to_string_lossy().into_owned()];
        argv.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
        let mut sh = Command::new("sh");
        sh.args(daemon_util::lessee::in_cgroup(&cgroup, &argv));
        for (k, v) in cmd.get_envs() {
            if let Some(v) = v {
                sh.env(k, v);
            }
        }
        let mut child = sh
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Proc {
            child,
            stdin,
            stdout,
            _cgroup: cgroup,
        }
    }

    /// The next `hostile: ...` line; `None` when the process exited first.
    fn line(&mut self) -> Option<String> {
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line).unwrap_or(0) == 0 {
                return None;
            }
            if let Some(r) = line.trim().strip_prefix("hostile: ") {
                return Some(r.to_string());
            }
        }
    }

    fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn exit(mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn lease(d: &Daemon, name: &str) -> Result<LeaseInfo, String> {
    d.lease_req(&LeaseRequest {
        name: name.into(),
        size: SIZE,
        owner: Some("nobody".into()),
        ..Default::default()
    })
    .map_err(|e| format!("lease {name}: {e}"))
}

fn ino(lease: &LeaseInfo) -> u64 {
    std::fs::metadata(&lease.path).unwrap().ino()
}

/// The daemon of one method on `env`, with one warm lease's worth of memory (`extra`:
/// more flags).
fn world(env: &Env, by: By, extra: &[&str]) -> Daemon {
    let wrapper: &[&str] = match by {
        By::Counts => &[],
        By::Walk => &["env", "HUGEPREP_REACH=walk"],
    };
    let warm = format!("{}M", SIZE / MIB);
    let d = env.spawn_wrapped(wrapper, &[&["--warm", &warm], extra].concat());
    d.settle(SIZE);
    let method = match by {
        By::Counts => "method=\"kernel-counts\"",
        By::Walk => "method=\"proc-walk\"",
    };
    assert!(env.log().contains(method), "{}", env.log());
    d
}

/// Runs `seq` against the daemon; `Err` is the failure (the caller prints the replay).
fn run(env: &Env, d: &Daemon, seq: &Sequence, tag: &str) -> Result<Outcome, String> {
    run_timed(env, d, seq, tag, &mut Phases::default())
}

/// Where a sequence's time goes (summed over sequences, printed at the end).
#[derive(Debug, Default, Clone, Copy)]
struct Phases {
    lease: std::time::Duration,
    ops: std::time::Duration,
    release: std::time::Duration,
    check: std::time::Duration,
    back: std::time::Duration,
    /// Lingering sequences whose next lease waited for the aside's bound.
    bound_waits: u32,
}

/// As [`run`], adding each phase's time to `ph`. A panic inside (a settle that times out,
/// a daemon that stopped answering) is a failure like any other: its caller prints the
/// replay.
fn run_timed(
    env: &Env,
    d: &Daemon,
    seq: &Sequence,
    tag: &str,
    ph: &mut Phases,
) -> Result<Outcome, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_phases(env, d, seq, tag, ph)
    }))
    .unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("panicked: {text}"))
    })
}

fn run_phases(
    env: &Env,
    d: &Daemon,
    seq: &Sequence,
    tag: &str,
    ph: &mut Phases,
) -> Result<Outcome, String> {
    let mut t = std::time::Instant::now();
    let mut lap = |slot: &mut std::time::Duration| {
        *slot += t.elapsed();
        t = std::time::Instant::now();
    };
    let victim = lease(d, &format!("{tag}-victim"))?;
    lap(&mut ph.lease);
    let first = ino(&victim);
    let before = d.counters();
    let mut lessee = Proc::spawn(
        "ops",
        &victim.path,
        TestCgroup::new(&format!("{tag}-l")),
        &[(
            OPS,
            &format!(
                "{}{}",
                seq.ops_text(),
                if seq.linger { " linger" } else { "" }
            ),
        )],
    );
    let said = lessee.line();
    let expected = if seq.linger { "ready" } else { "done" };
    if said.as_deref() != Some(expected) {
        return Err(format!("the lessee said {said:?}, not {expected}"));
    }
    let lessee = if seq.linger {
        Some(lessee)
    } else {
        lessee.exit();
        None
    };
    lap(&mut ph.ops);
    d.release(victim.id).map_err(|e| format!("release: {e}"))?;
    // A lingering lessee still holds its file: the release waits aside (proven again
    // later), and the next lease, with no other room on the mount, gives it back (the
    // kernel's path) at once rather than at the aside's bound (10 s). Any other release
    // settles first: recycled in place, or deleted and refilled.
    if !seq.linger {
        d.settle(SIZE);
    }
    lap(&mut ph.release);
    let name = format!("{tag}-next");
    let next = match lease(d, &name) {
        // A lingering lessee that allocated pages past its file's end holds more than the
        // file's size, which is all the daemon counts (docs/security.md, "Growing a leased
        // file"): the lease sees too little room in giving the held file back, and is
        // refused. The held file takes the kernel's path at the aside's bound: wait for it.
        Err(e) if seq.linger && e.contains(": 422: ") => {
            ph.bound_waits += 1;
            d.settle(SIZE);
            lap(&mut ph.release);
            lease(d, &name)?
        }
        other => other?,
    };
    let after = d.counters();
    let proven = after.proven_releases - before.proven_releases;
    // A file that took the kernel's path never comes back. A proven one is the next lease's
    // unless the lessee left it at another size (it is kept warm at that size).
    let same = ino(&next) == first;
    if same && proven != 1 {
        return Err(format!(
            "the next lease is the released file ({first}), which took the kernel's path: {after:?}"
        ));
    }
    let fill: &[(&str, &str)] = if seq.linger { &[(FILL, "1")] } else { &[] };
    let mut check = Proc::spawn(
        "check",
        &next.path,
        TestCgroup::new(&format!("{tag}-c")),
        fill,
    );
    let report = check.line().ok_or("the checker said nothing")?;
    check.exit();
    let mut words = report.split_whitespace();
    let nonzero: u64 = words
        .nth(1)
        .and_then(|n| n.parse().ok())
        .ok_or(report.clone())?;
    if nonzero != 0 {
        return Err(format!(
            "the next lease has {nonzero} bytes that are not zero"
        ));
    }
    let nodes: Vec<i64> = words.skip(1).filter_map(|n| n.parse().ok()).collect();
    if nodes.len() as u64 != PAGES || nodes.iter().any(|&n| n != i64::from(next.node)) {
        return Err(format!(
            "the next lease's pages are on nodes {nodes:?}, its node is {}",
            next.node
        ));
    }
    if let Some(mut lessee) = lessee {
        lessee.say("read");
        let seen = lessee.line();
        lessee.exit();
        if seen.as_deref() != Some("seen 0") {
            return Err(format!(
                "the lingering lessee saw the next lessee's bytes: {seen:?}"
            ));
        }
    }
    lap(&mut ph.check);
    d.release(next.id)
        .map_err(|e| format!("release of the next: {e}"))?;
    d.settle(SIZE);
    // Every page is the pool's or the kernel's again (a lingering lessee let go).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while env.mount_used() != SIZE {
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "the mount holds {} bytes, the warm file is {SIZE}",
                env.mount_used()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    lap(&mut ph.back);
    Ok(match (proven, same) {
        (1, true) => Outcome::Recycled,
        (1, false) => Outcome::RecycledAtAnotherSize,
        _ => Outcome::Kernel,
    })
}

/// How a sequence's release came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Proven, scrubbed, and leased next.
    Recycled,
    /// Proven and scrubbed, kept warm at the size the lessee left it, another file leased.
    RecycledAtAnotherSize,
    /// The kernel's path.
    Kernel,
}

/// `HUGEPREP_HOSTILE_SEQUENCES` sequences from seed `first` against a daemon of method `by`
/// on `env` (`extra`: its flags), then an honest one.
fn sequences(env: &Env, by: By, first: u64, extra: &[&str]) {
    let n: u64 = std::env::var("HUGEPREP_HOSTILE_SEQUENCES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEQUENCES);
    eprintln!(
        "hostile lessees ({}): {n} sequences from seed {first}",
        by.label()
    );
    let d = world(env, by, extra);
    let mut outcomes = std::collections::BTreeMap::new();
    let mut phases = Phases::default();
    let started = std::time::Instant::now();
    for i in 0..n {
        let seq = Sequence::generate(first.wrapping_add(i));
        let t = std::time::Instant::now();
        match run_timed(env, &d, &seq, &format!("h{}{i}", by.label()), &mut phases) {
            Ok(o) => {
                if std::env::var_os("HUGEPREP_HOSTILE_VERBOSE").is_some() {
                    eprintln!("{:?} in {:?}: {}", o, t.elapsed(), seq.replay(by));
                }
                *outcomes.entry(format!("{o:?}")).or_insert(0) += 1
            }
            Err(e) => panic!("{e}\n{}\n{}", seq.replay(by), env.log()),
        }
    }
    eprintln!(
        "hostile lessees ({}): {n} sequences in {:.1} s: {outcomes:?}; {phases:?}",
        by.label(),
        started.elapsed().as_secs_f64()
    );
    // A lessee that cut its file to nothing and keeps it open (this stopped the daemon's
    // worker once: its held file was set aside at no pages): the kernel's path.
    let emptied = Sequence {
        seed: 0,
        ops: vec![Op::Map(0, 0, PAGES), Op::Truncate(0)],
        linger: true,
    };
    assert_eq!(
        run(env, &d, &emptied, &format!("h{}emptied", by.label())),
        Ok(Outcome::Kernel),
        "{}\n{}",
        emptied.replay(by),
        env.log()
    );
    // A lessee that only wrote and exited is recycled in place: the property is not met
    // by sending everything down the kernel's path.
    let honest = Sequence {
        seed: 0,
        ops: vec![Op::Map(0, 0, PAGES), Op::Write(0, 1)],
        linger: false,
    };
    assert_eq!(
        run(env, &d, &honest, &format!("h{}honest", by.label())),
        Ok(Outcome::Recycled),
        "{}\n{}",
        honest.replay(by),
        env.log()
    );
}

/// Both methods, one after the other, each with a daemon on a mount and a reservation of its
/// own. (Side by side under one reservation of both mounts, the two daemons starved each
/// other: a fresh-clone run and the next one both ended with each pool cold, 13 of 14 pages
/// free and none available, while every replay of the sequences under way passed alone.)
#[test]
fn hostile_lessees_never_reach_the_next_lease() {
    let first: u64 = std::env::var("HUGEPREP_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    {
        let counts = Env::new("hostile-counts", ROOM);
        sequences(&counts, By::Counts, first, &[]);
    }
    let walk = Env::new("hostile-walk", ROOM);
    sequences(&walk, By::Walk, first, &["--no-reserve"]);
}

/// Replays one sequence printed by a failure (`HUGEPREP_HOSTILE_REPLAY`); nothing without.
#[test]
fn replay() {
    let Ok(text) = std::env::var("HUGEPREP_HOSTILE_REPLAY") else {
        return;
    };
    let (by, seq) = Sequence::parse(&text).expect("METHOD SEED OPS [linger]");
    let env = Env::new(&format!("hostile-{}", by.label()), ROOM);
    let d = world(&env, by, &[]);
    match run(&env, &d, &seq, "replay") {
        Ok(outcome) => eprintln!("{outcome:?}\n{}", env.log()),
        Err(e) => panic!("{e}\n{}\n{}", seq.replay(by), env.log()),
    }
}

#[test]
fn a_sequence_reads_back_as_it_prints() {
    for seed in 0..200 {
        let seq = Sequence::generate(seed);
        let text = format!(
            "walk {} {}{}",
            seq.seed,
            seq.ops_text(),
            if seq.linger { " linger" } else { "" }
        );
        assert_eq!(Sequence::parse(&text), Some((By::Walk, seq)));
    }
}
