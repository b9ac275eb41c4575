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

/// A Python program (run as root) one of whose threads makes itself uid `UID` by a raw
/// `setresuid` system call, which changes that thread's credentials only (the C library's
/// `setresuid` changes every thread's), then runs `ACT` in it. `sys.argv`: the number of
/// `setresuid`, `UID`, then the caller's arguments.
const THREAD_AS: &str = "import ctypes,os,sys,threading\n\
    libc=ctypes.CDLL(None,use_errno=True)\n\
    u=ctypes.c_long(int(sys.argv[2]))\n\
    out={}\n\
    def run():\n\
    \x20   assert libc.syscall(ctypes.c_long(int(sys.argv[1])),u,u,u)==0\n\
    \x20   out['ok']=ACT()\n\
    t=threading.Thread(target=run)\n\
    t.start()\n\
    t.join()\n";

/// Runs, as root, a process one of whose threads makes itself uid `uid` (its leader stays
/// root) and opens `path` from that thread; whether it could open it.
pub(super) fn opens_from_a_thread_as(uid: u32, path: &std::path::Path) -> bool {
    let act = "def ACT():\n\
        \x20   try:\n\
        \x20       os.close(os.open(sys.argv[3],os.O_RDONLY))\n\
        \x20       return True\n\
        \x20   except OSError:\n\
        \x20       return False\n";
    std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "{act}{THREAD_AS}sys.exit(0 if out.get('ok') else 1)\n"
        ))
        .arg(libc::SYS_setresuid.to_string())
        .arg(uid.to_string())
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}

/// A root process with one thread that made itself another user is no root process: the
/// exemption of root openers reads every thread's credentials (before, only the leader's,
/// while the open came from the thread).
#[test]
fn a_root_process_with_a_thread_of_another_user_is_not_root() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let hold = "def ACT():\n\
        \x20   print('ready',flush=True)\n\
        \x20   sys.stdin.read()\n";
    let spawn = |uid: u32| {
        let mut child = std::process::Command::new("python3")
            .arg("-c")
            .arg(format!("{hold}{THREAD_AS}"))
            .arg(libc::SYS_setresuid.to_string())
            .arg(uid.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready");
        let root = scan::runs_as_root(std::path::Path::new(&format!("/proc/{}", child.id())));
        drop(child.stdin.take());
        child.wait().unwrap();
        root
    };
    assert!(spawn(0), "a root process whose threads are all root");
    assert!(!spawn(65534), "a root process with a thread of uid 65534");
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
    assert!(
        !opens_from_a_thread_as(65534, &path),
        "a thread of uid 65534 in a root process opened a recycled file"
    );
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
    assert!(
        !opens_from_a_thread_as(65534, &path),
        "a thread of uid 65534 in a root process opened a released file"
    );
    assert!(opens_as(0, &path), "root is refused");
    assert!(File::open(&path).is_ok(), "the daemon is refused");
    reach.watch(9, &file);
    assert!(opens_as(65534, &path));
    drop(file);
    std::fs::remove_file(&path).unwrap();
}
