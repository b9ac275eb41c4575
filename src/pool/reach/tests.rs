use super::*;

/// Runs `cat PATH` as uid `uid`; whether it could open the file.
fn opens_as(uid: u32, path: &std::path::Path) -> bool {
    std::process::Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .args(["--clear-groups", "--", "cat"])
        .arg(path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_running_reader_is_not_stalled() {
    let reach = Reach::new();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(reach.reader_stalled(), None);
    let s = Duration::from_secs;
    assert_eq!(reader::stalled(s(20), s(15)), None);
    assert_eq!(reader::stalled(s(30), s(15)), Some(s(15)));
}

/// A file proven out of reach refuses opens but the daemon's and root's until its next
/// lease: an open that passed its permission check before the lease path went never
/// reaches the next lessee's memory.
#[test]
fn a_recycled_file_refuses_opens_until_leased_again() {
    use std::os::unix::fs::PermissionsExt;
    let reach = Reach::proving(Some(Method::ProcWalk));
    if reach.watch.is_none() {
        return; // not root, or no fanotify
    }
    // On a tmpfs of its own: the walk rightly fails a file whose file system another
    // mount namespace mounts below its root, as libvirt sandboxes do with /tmp's.
    let fs = PrivateTmpfs::mount("recycled");
    let path = fs.dir.join("file");
    std::fs::write(&path, b"memory").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let file = File::open(&path).unwrap();
    reach.watch(7, &file);
    // Leased: anyone with access opens it (and is recorded).
    assert!(opens_as(65534, &path));
    std::thread::sleep(Duration::from_millis(50));
    // The opener exited; not in a cgroup of its own, so not proven gone.
    assert!(matches!(
        reach.prove(7, &file),
        Err(Unproven::OpenerCgroup { .. })
    ));
    // A lease no other process opened is proven and recycled.
    reach.watch(8, &file);
    reach.prove(8, &file).unwrap();
    assert!(!opens_as(65534, &path), "a recycled file was opened");
    assert!(opens_as(0, &path), "root is refused");
    assert!(File::open(&path).is_ok(), "the daemon is refused");
    // Leased again: opens go on.
    reach.watch(9, &file);
    assert!(opens_as(65534, &path));
    drop(file);
    reach.forget(9);
}

/// A tmpfs mounted on a directory of its own for one test, unmounted and removed on drop.
struct PrivateTmpfs {
    dir: std::path::PathBuf,
}

impl PrivateTmpfs {
    fn mount(name: &str) -> PrivateTmpfs {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("hugeprep-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some("size=1m,mode=0755"),
        )
        .unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        PrivateTmpfs { dir }
    }
}

impl Drop for PrivateTmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// With the kernel's counts, opens are refused (but the daemon's and root's) from the
/// start of a proof, whatever it finds, until the next lease: an open that took its
/// reference before the counts were read is in them, a later one never reaches the file.
#[test]
fn with_kernel_counts_opens_are_refused_from_the_proof_to_the_next_lease() {
    use std::os::unix::fs::PermissionsExt;
    let reach = Reach::new();
    if reach.method() != Method::KernelCounts {
        return; // not root, or no BPF: the walk's test above covers it
    }
    let path = std::env::temp_dir().join(format!("hugeprep-refused-{}", std::process::id()));
    std::fs::write(&path, b"memory").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let file = File::open(&path).unwrap();
    reach.watch(8, &file);
    // Leased: opens never wait, and go on.
    assert!(opens_as(65534, &path));
    let _ = reach.prove(8, &file);
    assert!(
        !opens_as(65534, &path),
        "an open during or after a proof went on"
    );
    assert!(opens_as(0, &path), "root is refused");
    assert!(File::open(&path).is_ok(), "the daemon is refused");
    reach.watch(9, &file);
    assert!(opens_as(65534, &path));
    drop(file);
    std::fs::remove_file(&path).unwrap();
}
