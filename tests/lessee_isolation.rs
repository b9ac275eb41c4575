//! A lessee that misbehaves never sees the next lessee's memory (docs/security.md): each
//! way a lessee (uid 65534, the lease's owner) can keep to its pages after unmapping and
//! closing its lease, against a pool that keeps one 64 MiB file warm, so that the released
//! file would be the one leased next if it were recycled in place. Each test ends with zero
//! bytes of the next lessee readable by the attacker and the pool's and the kernel's counts
//! exact. And the common path: a lessee that simply exits has its memory scrubbed in place.
//!
//! Every attack runs against both ways of proving a release: the kernel's own counts (a BPF
//! iterator, the default) and the walk of `/proc` the daemon falls back to without BPF
//! (`HUGEPREP_REACH=walk`; the tests named `..._walk`). The reason each logs differs where
//! the two see the attack through different counts.

mod daemon_util;

use std::os::unix::fs::MetadataExt;

use daemon_util::lessee::{Lessee, PINNED, SECRET};
use daemon_util::{map_lease, Daemon, Env, MIB};
use hugeprep::pool::{LeaseInfo, LeaseRequest, LeaseSource};

const SIZE: u64 = 64 * MIB;
/// The 2 MiB pages an attacker's ring pins.
const PAGES: u64 = PINNED / (2 * MIB);

#[test]
fn lessee_entry() {
    daemon_util::lessee::entry();
}

/// Waits until a line of the daemon's log has every one of `words` (a liveness bound).
fn wait_for_log(env: &Env, words: &[&str]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !env
        .log()
        .lines()
        .any(|l| words.iter().all(|w| l.contains(w)))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no {words:?} in the log:\n{}",
            env.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn ino(lease: &LeaseInfo) -> u64 {
    std::fs::metadata(&lease.path).unwrap().ino()
}

/// Room beside the warm file: less than a second file, so that the released file is the one
/// the next lease would get if it were recycled in place, and enough for what an attacker
/// pins, so that the kernel's path can fault a new file meanwhile.
const SPARE: u64 = 8 * MIB;

/// How the daemon proves releases.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum By {
    /// The kernel's counts (BPF), the default where they load.
    Counts,
    /// The walk of `/proc` (`HUGEPREP_REACH=walk`).
    Walk,
}

/// A world with room for one warm file and [`SPARE`], its releases proven `by`.
fn world_by(name: &str, by: By, extra: &[&str]) -> (Env, Daemon) {
    world_with_room(name, by, SIZE + SPARE, extra)
}

/// [`world_by`] on a mount of `room` bytes.
fn world_with_room(name: &str, by: By, room: u64, extra: &[&str]) -> (Env, Daemon) {
    let env = Env::new(name, room);
    let wrapper: &[&str] = match by {
        By::Counts => &[],
        By::Walk => &["env", "HUGEPREP_REACH=walk"],
    };
    let d = env.spawn_wrapped(wrapper, &[&["--warm", "64M"], extra].concat());
    d.settle(SIZE);
    let method = match by {
        By::Counts => "method=\"kernel-counts\"",
        By::Walk => "method=\"proc-walk\"",
    };
    assert!(
        env.log().contains(method),
        "the daemon does not prove releases {by:?}:\n{}",
        env.log()
    );
    (env, d)
}

/// A world whose releases are proven by the kernel's counts.
fn world(name: &str, extra: &[&str]) -> (Env, Daemon) {
    world_by(name, By::Counts, extra)
}

fn lease_for_nobody(d: &Daemon, name: &str) -> LeaseInfo {
    let l = d
        .lease_req(&LeaseRequest {
            name: name.into(),
            size: SIZE,
            owner: Some("nobody".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(l.source, LeaseSource::WarmExact);
    l
}

/// Releases the attacker's lease, leases the next one (warm, 64 MiB), fills it with the
/// secret and returns it with how many bytes of it the attacker reads.
fn next_lessee(d: &Daemon, victim: &LeaseInfo, attacker: &mut Lessee) -> (LeaseInfo, u64) {
    d.release(victim.id).unwrap();
    d.settle(SIZE);
    // Every QEMU of a libvirt host runs as the same user: so does the next lessee.
    let next = lease_for_nobody(d, "next");
    {
        let (_f, mut r) = map_lease(&next);
        r.as_mut_slice().fill(SECRET);
    }
    let seen = attacker.seen();
    (next, seen)
}

/// The end of every attack: the file took the kernel's path (a new inode for the next
/// lessee, `pages` pages held back by the attacker counted), and once the attacker lets go
/// the kernel has every page back: the mount holds exactly the warm file.
fn check_kernel_path(
    env: &Env,
    d: &Daemon,
    first_ino: u64,
    next: &LeaseInfo,
    pages: u64,
    attacker: Lessee,
) {
    assert_ne!(
        ino(next),
        first_ino,
        "the released file was recycled in place"
    );
    let c = d.counters();
    assert_eq!(c.kernel_path_releases, 1, "{c:?}\n{}", env.log());
    assert_eq!(c.proven_releases, 0, "{c:?}");
    assert_eq!(c.unreturned_pages, pages, "{c:?}");
    release_and_wait_for_the_pages(env, d, next, attacker);
}

/// Releases `next`, ends the attacker and waits until the mount holds only the warm file:
/// the pinned pages are freed by the kernel once the attacker's ring, pipe or lease is gone
/// (an io_uring's teardown runs a little after its process exits).
fn release_and_wait_for_the_pages(env: &Env, d: &Daemon, next: &LeaseInfo, attacker: Lessee) {
    d.release(next.id).unwrap();
    attacker.exit();
    let p = d.settle(SIZE);
    assert_eq!(p.kinds[0].leased_bytes, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while env.mount_used() != SIZE {
        assert!(
            std::time::Instant::now() < deadline,
            "mount holds {} bytes, the warm file is {SIZE}",
            env.mount_used()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// One attacker that uses the victim's lease as `mode` and keeps a way to its pages: 0
/// bytes of the next lessee reach it, the release says `reason`, and `pages` are held back.
fn lone_attacker(env: &Env, d: &Daemon, mode: &str, reason: &str, pages: u64) {
    let victim = lease_for_nobody(d, "victim");
    let first = ino(&victim);
    let mut attacker = Lessee::spawn(mode, &victim.path, SIZE, true, &[]);
    attacker.ready();
    let (next, seen) = next_lessee(d, &victim, &mut attacker);
    assert_eq!(seen, 0, "the attacker read {seen} bytes of the next lessee");
    assert!(
        env.log().contains(&format!("reason=\"{reason}\"")),
        "{}",
        env.log()
    );
    check_kernel_path(env, d, first, &next, pages, attacker);
}

#[test]
fn an_io_uring_fixed_buffer_kept_after_unmap_and_close_reaches_nothing() {
    // The pinned folios count a pin each beyond the page cache.
    let (env, d) = world("reach-uring", &[]);
    lone_attacker(&env, &d, "iouring", "pages-held", PAGES);
}

#[test]
fn an_io_uring_fixed_buffer_kept_after_unmap_and_close_reaches_nothing_walk() {
    let (env, d) = world_by("reach-uring-w", By::Walk, &[]);
    lone_attacker(&env, &d, "iouring", "opener-alive", PAGES);
}

#[test]
fn pages_vmspliced_into_a_kept_pipe_reach_nothing() {
    // The pipe's buffers hold references to the folio.
    let (env, d) = world("reach-vmsplice", &[]);
    // 64 KiB of one 2 MiB page sit in the pipe.
    lone_attacker(&env, &d, "vmsplice", "pages-held", 1);
}

#[test]
fn pages_vmspliced_into_a_kept_pipe_reach_nothing_walk() {
    let (env, d) = world_by("reach-vmsplice-w", By::Walk, &[]);
    lone_attacker(&env, &d, "vmsplice", "opener-alive", 1);
}

/// A local user (uid 65534, no privilege) makes more mounts of the pool's file system than
/// the kernel counts' walk reads (4,096), in a user and mount namespace of its own, from
/// before the first lease: the model of the counts is still checked, releases are still
/// proven and recycled in place (the mounts beyond the bound are read from `/proc`), and
/// each such proof is counted and logged. Before, every release took the kernel's path for
/// as long as the mounts existed.
#[test]
fn more_mounts_than_the_kernel_walk_reads_leave_the_proof_on() {
    let env = Env::new("reach-mounts", SIZE + SPARE);
    let mut mounts = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "--",
            "python3",
            "-c",
        ])
        .arg(
            "import ctypes,os,sys\n\
             libc=ctypes.CDLL(None,use_errno=True)\n\
             m=sys.argv[1].encode()\n\
             for i in range(4200):\n\
             \x20   if libc.mount(m,m,None,4096,None)!=0:\n\
             \x20       sys.exit('mount %d: %s'%(i,os.strerror(ctypes.get_errno())))\n\
             print('ready',flush=True)\n\
             sys.stdin.read()\n",
        )
        .arg(&env.mount)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(mounts.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready", "the bind mounts were not made");
    let d = env.spawn(&["--warm", "64M"]);
    d.settle(SIZE);
    assert!(
        env.log().contains("method=\"kernel-counts\""),
        "{}",
        env.log()
    );
    let lease = lease_for_nobody(&d, "lease");
    let first = ino(&lease);
    assert!(
        env.log().contains("match the release proof's model"),
        "the model was not checked beside the mounts:\n{}",
        env.log()
    );
    daemon_util::lessee::nonzero_then_dirty(&lease.path, SIZE);
    d.release(lease.id).unwrap();
    d.settle(SIZE);
    let c = d.counters();
    assert_eq!(c.proven_releases, 1, "{c:?}\n{}", env.log());
    assert_eq!(c.kernel_path_releases, 0, "{c:?}");
    let next = lease_for_nobody(&d, "next");
    assert_eq!(
        ino(&next),
        first,
        "the released file was not recycled in place"
    );
    assert!(daemon_util::lease_is_zero(&next));
    assert!(
        env.log()
            .contains("more mounts than the release proof's kernel walk reads"),
        "{}",
        env.log()
    );
    let (status, body) = d
        .client
        .blocking(d.client.request("GET".parse().unwrap(), "/metrics", None))
        .unwrap();
    assert_eq!(status, 200);
    let metrics = String::from_utf8_lossy(&body);
    assert!(
        metrics.contains("hugeprep_proof_mounts_beyond_bound_total 1"),
        "{metrics}"
    );
    drop(mounts.stdin.take());
    mounts.wait().unwrap();
}

/// A read lease (`F_SETLEASE`, `F_RDLCK`) the lessee keeps on its lease file: the daemon's
/// opens for writing fail at once (`O_NONBLOCK`) rather than wait for the lessee, so the file
/// cannot even be truncated. It takes the kernel's path (unlinked; a new file is faulted for
/// the next lease), every one of its pages is counted as unreturned (the lessee's open file
/// holds them), none is reused, and they return to the kernel once the lessee lets go.
#[test]
fn a_read_lease_kept_on_the_lease_file_reaches_nothing() {
    read_lease(By::Counts);
}

#[test]
fn a_read_lease_kept_on_the_lease_file_reaches_nothing_walk() {
    read_lease(By::Walk);
}

fn read_lease(by: By) {
    // Room for the held file and the new one the refill faults.
    let name = match by {
        By::Counts => "rdlease",
        By::Walk => "rdlease-walk",
    };
    let (env, d) = world_with_room(name, by, 2 * SIZE + SPARE, &[]);
    let victim = lease_for_nobody(&d, "victim");
    let first = ino(&victim);
    let mut attacker = Lessee::spawn("rdlease", &victim.path, SIZE, true, &[]);
    attacker.ready();
    let (next, seen) = next_lessee(&d, &victim, &mut attacker);
    assert_eq!(seen, 0, "the attacker read {seen} bytes of the next lessee");
    assert_ne!(ino(&next), first, "the released file was reused");
    let c = d.counters();
    assert_eq!(c.proven_releases, 0, "{c:?}");
    assert_eq!(
        c.unreturned_pages,
        SIZE / (2 * MIB),
        "every page of the leased file is held: {c:?}\n{}",
        env.log()
    );
    release_and_wait_for_the_pages(&env, &d, &next, attacker);
}

#[test]
fn an_extra_hard_link_reaches_nothing() {
    hard_link(By::Counts);
}

#[test]
fn an_extra_hard_link_reaches_nothing_walk() {
    hard_link(By::Walk);
}

fn hard_link(by: By) {
    let (env, d) = world_by("reach-link", by, &[]);
    let drop_dir = env.mount.join("drop");
    std::fs::create_dir(&drop_dir).unwrap();
    std::fs::set_permissions(
        &drop_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    let victim = lease_for_nobody(&d, "victim");
    let first = ino(&victim);
    let link = drop_dir.join("kept");
    let link_env = [("HUGEPREP_LESSEE_SOCKET", link.to_str().unwrap())];
    let mut attacker = Lessee::spawn("link", &victim.path, SIZE, true, &link_env);
    attacker.ready();
    // The attacker exits (its cgroup empties): only the link is left, which a later process
    // of the same user opens.
    attacker.exit();
    let mut reader = Lessee::spawn("link-read", &victim.path, SIZE, true, &link_env);
    reader.ready();
    let (next, seen) = next_lessee(&d, &victim, &mut reader);
    assert_eq!(seen, 0, "the attacker read {seen} bytes of the next lessee");
    assert!(env.log().contains("reason=\"links\""), "{}", env.log());
    // Truncation gave the pages back although the link keeps the inode.
    check_kernel_path(&env, &d, first, &next, 0, reader);
    std::fs::remove_file(&link).unwrap();
}

#[test]
fn a_lease_fd_passed_to_a_helper_that_keeps_an_io_uring_buffer_reaches_nothing() {
    // The helper never opened the file: its pins count on the folios all the same.
    lease_fd_passed_to_a_helper(By::Counts, "pages-held");
}

#[test]
fn a_lease_fd_passed_to_a_helper_that_keeps_an_io_uring_buffer_reaches_nothing_walk() {
    lease_fd_passed_to_a_helper(By::Walk, "io-uring");
}

fn lease_fd_passed_to_a_helper(by: By, reason: &str) {
    let (env, d) = world_by("reach-scm", by, &[]);
    let victim = lease_for_nobody(&d, "victim");
    let first = ino(&victim);
    // The helper runs in a cgroup of its own, never opens the file and outlives the lessee.
    let sock_dir = env.dir.join("scm");
    std::fs::create_dir(&sock_dir).unwrap();
    std::fs::set_permissions(
        &sock_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let sock = sock_dir.join("s");
    let sock_env = [("HUGEPREP_LESSEE_SOCKET", sock.to_str().unwrap())];
    let mut helper = Lessee::spawn("recv-iouring", &victim.path, SIZE, true, &sock_env);
    helper.listening();
    let mut lessee = Lessee::spawn("send-fd", &victim.path, SIZE, true, &sock_env);
    lessee.ready();
    helper.ready();
    // The walk: the daemon has read the lessee's open (and its cgroups) before the lessee
    // exits, as it would for a VMM that runs longer than a few microseconds.
    if by == By::Walk {
        let pid = format!("pid={}", lessee.pid());
        wait_for_log(&env, &["leased file opened", &pid]);
    }
    lessee.exit();
    let (next, seen) = next_lessee(&d, &victim, &mut helper);
    assert_eq!(seen, 0, "the helper read {seen} bytes of the next lessee");
    assert!(
        env.log().contains(&format!("reason=\"{reason}\"")),
        "{}",
        env.log()
    );
    check_kernel_path(&env, &d, first, &next, PAGES, helper);
}

#[test]
fn a_child_in_another_cgroup_that_keeps_a_mapping_reaches_nothing() {
    child_keeps_a_mapping(By::Counts);
}

#[test]
fn a_child_in_another_cgroup_that_keeps_a_mapping_reaches_nothing_walk() {
    child_keeps_a_mapping(By::Walk);
}

fn child_keeps_a_mapping(by: By) {
    let (env, d) = world_by("reach-child", by, &[]);
    let victim = lease_for_nobody(&d, "victim");
    let first = ino(&victim);
    let mut lessee = Lessee::spawn("write", &victim.path, SIZE, true, &[]);
    lessee.nonzero();
    lessee.ready();
    // Its child, moved to another cgroup, keeps a mapping; the lessee itself exits.
    let mut child = Lessee::spawn("map", &victim.path, SIZE, true, &[]);
    child.ready();
    lessee.exit();
    let (next, seen) = next_lessee(&d, &victim, &mut child);
    assert_eq!(seen, 0, "the child read {seen} bytes of the next lessee");
    assert!(
        env.log().contains("reason=\"open-elsewhere\""),
        "{}",
        env.log()
    );
    check_kernel_path(&env, &d, first, &next, 0, child);
}

/// A process of the lessees' user that never opens the file but keeps a way to reopen it
/// (`mode`), while the VMM writes its memory and exits from a cgroup of its own.
fn holder_beside_a_vmm(name: &str, by: By, mode: &str, reason: &str) {
    let (env, d) = world_by(name, by, &[]);
    let victim = lease_for_nobody(&d, "victim");
    let first = ino(&victim);
    let mut holder = Lessee::spawn(mode, &victim.path, SIZE, true, &[]);
    holder.ready();
    let mut vmm = Lessee::spawn("write", &victim.path, SIZE, true, &[]);
    vmm.nonzero();
    vmm.ready();
    vmm.exit();
    let (next, seen) = next_lessee(&d, &victim, &mut holder);
    assert_eq!(seen, 0, "the holder read {seen} bytes of the next lessee");
    assert!(
        env.log().contains(&format!("reason=\"{reason}\"")),
        "{}",
        env.log()
    );
    check_kernel_path(&env, &d, first, &next, 0, holder);
}

#[test]
fn an_o_path_descriptor_kept_by_another_process_reaches_nothing() {
    // One more reference to the file's dentry.
    holder_beside_a_vmm("reach-opath", By::Counts, "opath", "descriptor");
}

#[test]
fn an_o_path_descriptor_kept_by_another_process_reaches_nothing_walk() {
    holder_beside_a_vmm("reach-opath-w", By::Walk, "opath", "descriptor");
}

#[test]
fn a_bind_mount_in_a_user_namespace_reaches_nothing() {
    // A mount of the file system that shows only the file.
    holder_beside_a_vmm("reach-bind", By::Counts, "bind", "mount");
}

#[test]
fn a_bind_mount_in_a_user_namespace_reaches_nothing_walk() {
    holder_beside_a_vmm("reach-bind-w", By::Walk, "bind", "mount");
}

/// The walk trusts an opener's emptied cgroup: not one delegated to its user, who could
/// move a child that keeps the pages into a sibling cgroup and let its own cgroup empty.
#[test]
fn a_lessee_in_a_cgroup_delegated_to_its_user_is_not_proven_gone_walk() {
    let (env, d) = world_by("reach-delegated", By::Walk, &[]);
    let victim = lease_for_nobody(&d, "victim");
    let first = ino(&victim);
    let cgroup = daemon_util::lessee::TestCgroup::new("delegated");
    cgroup.delegate(65534);
    let mut lessee = Lessee::spawn_in("write", &victim.path, SIZE, Some(cgroup), &[]);
    lessee.nonzero();
    lessee.ready();
    let pid = format!("pid={}", lessee.pid());
    wait_for_log(&env, &["leased file opened", &pid]);
    lessee.exit();
    d.release(victim.id).unwrap();
    d.settle(SIZE);
    let next = lease_for_nobody(&d, "next");
    assert_ne!(ino(&next), first, "recycled in place");
    assert!(
        env.log().contains("reason=\"opener-cgroup\""),
        "{}",
        env.log()
    );
    d.release(next.id).unwrap();
}

/// The kernel's counts play no part for cgroups: a lessee in a cgroup delegated to its user
/// moves the child that keeps its pages (in a pipe) to a sibling cgroup and exits; the
/// child's pipe still holds the folio.
#[test]
fn a_lessee_in_a_cgroup_delegated_to_its_user_that_moves_a_child_out_reaches_nothing() {
    let (env, d) = world("reach-delegated", &[]);
    let victim = lease_for_nobody(&d, "victim");
    let first = ino(&victim);
    let session = daemon_util::lessee::TestCgroup::new("delegated");
    session.delegate(65534);
    let sibling = daemon_util::lessee::TestCgroup::new("delegated-sibling");
    sibling.delegate(65534);
    let mut lessee = Lessee::spawn_in("write", &victim.path, SIZE, Some(session), &[]);
    lessee.nonzero();
    lessee.ready();
    let mut child = Lessee::spawn_in("vmsplice", &victim.path, SIZE, Some(sibling), &[]);
    child.ready();
    lessee.exit();
    let (next, seen) = next_lessee(&d, &victim, &mut child);
    assert_eq!(seen, 0, "the child read {seen} bytes of the next lessee");
    assert!(env.log().contains("reason=\"pages-held\""), "{}", env.log());
    check_kernel_path(&env, &d, first, &next, 1, child);
}

#[test]
fn a_proof_step_that_fails_takes_the_kernels_path() {
    // Without CAP_SYS_ADMIN the daemon has no fanotify watch (and without CAP_BPF and
    // CAP_PERFMON no kernel counts): nothing can be proven, so even a lessee that keeps
    // nothing gets its memory back by the kernel's path.
    let env = Env::new("reach-nocap", SIZE + SPARE);
    let d = env.spawn_wrapped(
        &[
            "setpriv",
            "--inh-caps=-sys_admin,-bpf,-perfmon",
            "--bounding-set=-sys_admin,-bpf,-perfmon",
            "--",
        ],
        &["--warm", "64M"],
    );
    d.settle(SIZE);
    assert!(env.log().contains("method=\"none\""), "{}", env.log());
    lone_attacker(&env, &d, "iouring", "not-watched", PAGES);
}

/// A daemon that cannot load the kernel counts' BPF program (its `bpf(2)` refused, as a
/// seccomp filter or a kernel without BPF would) says so, walks `/proc` instead, and still
/// finds the attack.
#[test]
fn without_bpf_the_proof_falls_back_to_the_walk_and_says_so() {
    let env = Env::new("reach-nobpf", SIZE + SPARE);
    // A seccomp filter is inherited by the children of the thread that installs it.
    let d = std::thread::scope(|s| {
        s.spawn(|| {
            refuse_bpf_syscalls();
            env.spawn(&["--warm", "64M"])
        })
        .join()
        .unwrap()
    });
    d.settle(SIZE);
    assert!(env.log().contains("method=\"proc-walk\""), "{}", env.log());
    assert!(
        env.log().contains("cannot read the kernel's counts"),
        "{}",
        env.log()
    );
    lone_attacker(&env, &d, "iouring", "opener-alive", PAGES);
}

/// Makes `bpf(2)` fail with EPERM for this thread and what it starts from now on.
fn refuse_bpf_syscalls() {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let filter = [
        // seccomp_data.arch: other architectures are left alone.
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4),
        jump(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            AUDIT_ARCH_X86_64,
            0,
            3,
        ),
        // seccomp_data.nr
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        jump(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            libc::SYS_bpf as u32,
            0,
            1,
        ),
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: the program points at `filter`, which outlives the call; the kernel copies it.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        )
    };
    assert_eq!(rc, 0, "seccomp: {}", std::io::Error::last_os_error());
}

#[test]
fn a_lessee_that_simply_exits_is_scrubbed_in_place() {
    simply_exits(By::Counts);
}

#[test]
fn a_lessee_that_simply_exits_is_scrubbed_in_place_walk() {
    simply_exits(By::Walk);
}

fn simply_exits(by: By) {
    let (env, d) = world_by("reach-common", by, &[]);
    let mut first = None;
    for round in 0..3 {
        let lease = lease_for_nobody(&d, "vm");
        let ino = ino(&lease);
        assert_eq!(
            *first.get_or_insert(ino),
            ino,
            "round {round}: not recycled in place\n{}",
            env.log()
        );
        let mut lessee = Lessee::spawn("write", &lease.path, SIZE, true, &[]);
        assert_eq!(
            lessee.nonzero(),
            0,
            "round {round}: the last lessee's bytes survived"
        );
        lessee.ready();
        lessee.exit();
        d.release(lease.id).unwrap();
        d.settle(SIZE);
    }
    let c = d.counters();
    assert_eq!(c.proven_releases, 3, "{c:?}\n{}", env.log());
    assert_eq!(c.kernel_path_releases, 0, "{c:?}");
    assert_eq!(c.unreturned_pages, 0, "{c:?}");
    assert_eq!(env.mount_used(), SIZE);
}

/// A lessee that opens its file and exits at once, while the daemon cannot read the open
/// event (stopped, as a busy host may keep it off a CPU): its open waits for the daemon's
/// answer, so its cgroup is read while it runs and the release is proven. With open events
/// that did not wait, it exited unread and the release took the kernel's path (a CI flake
/// of `libvirt_hook`'s write through a lease).
#[test]
fn a_lessee_that_opens_and_exits_while_the_daemon_is_stopped_is_recorded_walk() {
    opens_while_the_daemon_is_stopped(By::Walk);
}

/// With the kernel's counts nobody's open waits for the daemon, even a stopped one, and the
/// release of a lessee that opened and exited is proven all the same.
#[test]
fn an_open_never_waits_for_the_daemon_and_is_proven() {
    opens_while_the_daemon_is_stopped(By::Counts);
}

fn opens_while_the_daemon_is_stopped(by: By) {
    let (env, d) = world_by("reach-quick", by, &[]);
    let lease = lease_for_nobody(&d, "vm");
    let first = ino(&lease);
    let cgroup = daemon_util::lessee::TestCgroup::new("quick");
    let argv: Vec<String> = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
        "sh",
        "-c",
        r#"exec 3<"$0""#,
    ]
    .iter()
    .map(|a| a.to_string())
    .chain([lease.path.display().to_string()])
    .collect();
    let daemon = rustix::process::Pid::from_raw(d.pid() as i32).unwrap();
    rustix::process::kill_process(daemon, rustix::process::Signal::STOP).unwrap();
    let mut opener = std::process::Command::new("sh")
        .args(daemon_util::lessee::in_cgroup(&cgroup, &argv))
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let waited = opener.try_wait().unwrap().is_none();
    rustix::process::kill_process(daemon, rustix::process::Signal::CONT).unwrap();
    match by {
        By::Walk => assert!(waited, "the open did not wait for the stopped daemon"),
        By::Counts => assert!(!waited, "the open waited for the stopped daemon"),
    }
    assert!(opener.wait().unwrap().success());
    d.release(lease.id).unwrap();
    d.settle(SIZE);
    let c = d.counters();
    assert_eq!(c.proven_releases, 1, "{c:?}\n{}", env.log());
    assert_eq!(c.kernel_path_releases, 0, "{c:?}");
    let again = lease_for_nobody(&d, "vm");
    assert_eq!(ino(&again), first, "not recycled in place");
    d.release(again.id).unwrap();
}

#[test]
fn a_lease_that_asks_for_the_kernels_path_gets_it() {
    let (env, d) = world("reach-trust", &[]);
    let lease = d
        .lease_req(&LeaseRequest {
            name: "vm".into(),
            size: SIZE,
            owner: Some("nobody".into()),
            recycle: Some(hugeprep::policy::pool::Recycle::Kernel),
            ..Default::default()
        })
        .unwrap();
    let first = ino(&lease);
    d.release(lease.id).unwrap();
    d.settle(SIZE);
    let again = lease_for_nobody(&d, "vm");
    assert_ne!(ino(&again), first);
    assert!(env.log().contains("reason=\"trust\""), "{}", env.log());
    d.release(again.id).unwrap();
}

/// A misspelt owner in `[pool.recycle_owners]` would silently leave `kernel` off for the
/// tenant it was written for: the daemon refuses to start with it, and a reload with it
/// keeps the policy in force (the owner's leases still take the kernel's path).
#[test]
fn a_misspelt_recycle_owner_is_refused_at_start_and_at_reload() {
    let env = Env::new("reach-names", SIZE + SPARE);
    let config = env.dir.join("config.toml");
    let write = |owner: &str| {
        std::fs::write(
            &config,
            format!(
                "[pool]\n[[pool.target]]\npage_size = \"2M\"\nwarm = \"64M\"\n\
                 [pool.recycle_owners]\n{owner:?} = \"kernel\"\n"
            ),
        )
        .unwrap()
    };
    write("nobdy");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["serve", "--config", config.to_str().unwrap(), "--socket"])
        .arg(env.dir.join("refused.sock"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "started with a misspelt owner: {err}"
    );
    assert!(
        err.contains("recycle_owners.\"nobdy\"") && err.contains("names no user on this host"),
        "{err}"
    );

    write("nobody");
    let d = env.spawn(&["--config", config.to_str().unwrap()]);
    d.settle(SIZE);
    write("nobdy");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    wait_for_log(&env, &["reload refused", "nobdy"]);
    // The policy in force still sends nobody's leases the kernel's path.
    let lease = lease_for_nobody(&d, "vm");
    let first = ino(&lease);
    d.release(lease.id).unwrap();
    d.settle(SIZE);
    let again = lease_for_nobody(&d, "vm");
    assert_ne!(
        ino(&again),
        first,
        "recycled in place after the refused reload"
    );
    assert!(env.log().contains("reason=\"trust\""), "{}", env.log());
    d.release(again.id).unwrap();
}
