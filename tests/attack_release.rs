//! Attacks on the release path found in review (the attacker's side of docs/security.md),
//! each with the behaviour hugeprep has since the fix (CHANGELOG, "Fixed (release path)").
//!
//! - `pages_fallocated_past_the_end_by_a_lessee_do_not_outlive_its_release`: the lease's
//!   owner can `fallocate(FALLOC_FL_KEEP_SIZE)` pages past the end of its file. The release
//!   proof passes (nobody holds them), and no size, hole or count shows them: before the fix
//!   they stayed in the warm file after the lease was gone, out of every count. The scrub
//!   now cuts every file to its size, which frees every page past the end.
//! - `a_partial_mount_by_an_unrelated_user_sends_releases_to_the_kernels_path_while_it_lasts`:
//!   any local user can bind a directory of the pool's hugetlbfs in a user and mount
//!   namespace of its own (no privilege, no lease needed). The counts' proof refuses every
//!   release while such a mount exists (defence in depth, docs/security.md): the release
//!   takes the kernel's path, which is safe, and releases are proven again once it is gone.
//! - `a_partial_mount_at_the_first_lease_does_not_disable_the_proof_for_good`: the same
//!   mount, held while the daemon takes its first lease, failed the check of the counts'
//!   model for the daemon's life; it now only puts the check off to a later lease.

mod daemon_util;

use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};

use daemon_util::lessee::Lessee;
use daemon_util::{Daemon, Env, MIB};
use hugeprep::pool::{LeaseInfo, LeaseRequest, LeaseSource};

const SIZE: u64 = 64 * MIB;
const SPARE: u64 = 8 * MIB;

#[test]
fn lessee_entry() {
    daemon_util::lessee::entry();
}

fn world(name: &str) -> (Env, Daemon) {
    let env = Env::new(name, SIZE + SPARE);
    let d = env.spawn(&["--warm", "64M"]);
    d.settle(SIZE);
    assert!(
        env.log().contains("method=\"kernel-counts\""),
        "{}",
        env.log()
    );
    (env, d)
}

fn lease_for_nobody(d: &Daemon, name: &str, size: u64) -> Result<LeaseInfo, String> {
    d.lease_req(&LeaseRequest {
        name: name.into(),
        size,
        owner: Some("nobody".into()),
        ..Default::default()
    })
    .map_err(|e| e.to_string())
}

/// Runs `argv` as uid/gid 65534 (the lease's owner), no supplementary groups.
fn as_nobody(argv: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(argv);
    c
}

#[test]
fn pages_fallocated_past_the_end_by_a_lessee_do_not_outlive_its_release() {
    let (env, d) = world("attack-keep-size");
    let victim = lease_for_nobody(&d, "vm", SIZE).unwrap();
    assert_eq!(victim.source, LeaseSource::WarmExact);
    let ino = std::fs::metadata(&victim.path).unwrap().ino();
    // The lessee, as the file's owner: 8 MiB past the end, the file's size unchanged.
    let path = victim.path.to_str().unwrap().to_owned();
    let out = as_nobody(&["fallocate", "-n", "-o", "64MiB", "-l", "8MiB", &path])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let m = std::fs::metadata(&victim.path).unwrap();
    assert_eq!(m.size(), SIZE);
    assert_eq!(
        m.blocks() * 512,
        SIZE + SPARE,
        "the pages past the end exist"
    );
    d.release(victim.id).unwrap();
    let p = d.settle(SIZE);
    let c = &p.counters;
    assert_eq!(c.proven_releases, 1, "{c:?}\n{}", env.log());
    // What the pool and the kernel say now, against what the mount holds.
    let used = env.mount_used();
    let next = lease_for_nobody(&d, "next", SIZE).unwrap();
    let next_meta = std::fs::metadata(&next.path).unwrap();
    let other = lease_for_nobody(&d, "other", 2 * MIB);
    eprintln!(
        "after the release: pool warm {} MiB, unreturned pages {}, mount used {} MiB; \
         next lease same inode: {}, its blocks {} MiB for a size of {} MiB; \
         a 2 MiB cold lease beside it: {:?}",
        p.kinds[0].warm_bytes / MIB,
        c.unreturned_pages,
        used / MIB,
        next_meta.ino() == ino,
        next_meta.blocks() * 512 / MIB,
        next_meta.size() / MIB,
        other.as_ref().map(|l| l.source)
    );
    assert_eq!(
        used, SIZE,
        "pages a lessee fallocated past the end of its file stayed in the warm file after \
         its release, counted nowhere (pool warm {} bytes, unreturned {})",
        p.kinds[0].warm_bytes, c.unreturned_pages
    );
    assert!(other.is_ok(), "{other:?}");
}

/// A child killed (by its pid) and reaped when the test ends, passed or not.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// As any local user (uid 65534), holding no lease: binds a directory every user may search
/// (the daemon's lease directory, 0755) in a user and mount namespace of its own, and keeps
/// it until the returned child is dropped.
fn partial_mount_by_nobody(env: &Env) -> Killed {
    let target = env.mount.parent().unwrap().join("attacker-mnt");
    std::fs::create_dir_all(&target).unwrap();
    nix::unistd::chown(&target, Some(65534.into()), Some(65534.into())).unwrap();
    let leases = env.lease_dir();
    let attacker = as_nobody(&[
        "unshare",
        "--user",
        "--map-root-user",
        "--mount",
        "--",
        "sh",
        "-c",
        r#"mount --bind "$0" "$1" && echo mounted && exec sleep 600"#,
        leases.to_str().unwrap(),
        target.to_str().unwrap(),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut attacker = Killed(attacker);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(attacker.0.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "mounted");
    attacker
}

/// A lessee that simply writes and exits, as every VMM does, then its release; the
/// counters after it.
fn lease_write_exit_release(d: &Daemon) -> hugeprep::pool::CounterSnapshot {
    let lease = lease_for_nobody(d, "vm", SIZE).unwrap();
    let mut lessee = Lessee::spawn("write", &lease.path, SIZE, true, &[]);
    assert_eq!(lessee.nonzero(), 0);
    lessee.ready();
    lessee.exit();
    d.release(lease.id).unwrap();
    d.settle(SIZE);
    d.counters()
}

fn kernel_path_lines(env: &Env) -> String {
    env.log()
        .lines()
        .filter(|l| l.contains("kernel's path") || l.contains("model"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_partial_mount_by_an_unrelated_user_sends_releases_to_the_kernels_path_while_it_lasts() {
    let (env, d) = world("attack-partial-mount");
    // The model is checked on the first lease, with no mount about.
    assert_eq!(lease_write_exit_release(&d).proven_releases, 1);
    let attacker = partial_mount_by_nobody(&env);
    let c = lease_write_exit_release(&d);
    drop(attacker);
    assert_eq!(
        (c.proven_releases, c.kernel_path_releases),
        (1, 1),
        "with a partial mount about, the release takes the kernel's path: {c:?}\n{}",
        kernel_path_lines(&env)
    );
    assert!(env
        .log()
        .contains("mounts of its file system show a part of it"));
    // The mount gone, releases are proven again; nothing leaked meanwhile.
    let c = lease_write_exit_release(&d);
    assert_eq!(c.proven_releases, 2, "{c:?}\n{}", kernel_path_lines(&env));
    assert_eq!(c.failed_releases, 0, "{c:?}");
}

#[test]
fn a_partial_mount_at_the_first_lease_does_not_disable_the_proof_for_good() {
    let (env, d) = world("attack-model-poison");
    // Mounted before the daemon's first lease, gone before the release.
    let attacker = partial_mount_by_nobody(&env);
    let lease = lease_for_nobody(&d, "first", SIZE).unwrap();
    drop(attacker);
    d.release(lease.id).unwrap();
    d.settle(SIZE);
    // Nobody holds any mount now: every later release should be proven.
    let c = lease_write_exit_release(&d);
    assert!(
        c.proven_releases >= 1,
        "a bind mount that a user with no lease held during the daemon's first lease sent \
         every later release to the kernel's path: {c:?}\n{}",
        kernel_path_lines(&env)
    );
}
