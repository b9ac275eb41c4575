//! What no open file and no opener shows: one walk of every process's descriptors and mount
//! namespaces, failing closed.
//!
//! - A descriptor of the file itself, even an `O_PATH` one: it counts as no open file for
//!   the write lease and makes no open event, but `/proc/self/fd/N` reopens it with a
//!   permission check against the inode's owner at that moment, the next lessee's user.
//! - A mount of the file (or of a directory of the mount below its root) in a mount
//!   namespace an unprivileged user made (`unshare -Urm`, `mount --bind`): it holds the
//!   inode by path, reopened the same way. A descriptor of a mount namespace that no process
//!   is in (it may hold such a mount) counts too.
//! - An io_uring with registered buffers: they pin pages after the mapping and the file are
//!   gone, and its descriptor can be handed to a process outside the openers' cgroups that
//!   never opened the file. Its `fdinfo` lists buffers by address only, so any such ring
//!   outside the daemon counts.
//!
//! A process the daemon may not inspect (it has capabilities the daemon's unit leaves out, as
//! the init of a container host does) is skipped when it runs as root: root processes are the
//! host's trusted base, as they are for the kernel's own path (they can read any memory).
//! Any other process that cannot be read fails the scan.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;

/// Something that can still reach a released file's pages or inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A descriptor of the file (any kind, `O_PATH` too).
    Descriptor {
        /// Holder.
        pid: u32,
    },
    /// A mount below the root of the file's hugetlbfs, or a mount namespace no process is
    /// in.
    Mount {
        /// The process whose namespace (or descriptor) it is.
        pid: u32,
    },
    /// An io_uring with registered buffers.
    IoUring {
        /// Holder.
        pid: u32,
    },
}

/// What a `/proc/PID/...` read error means for the scan.
fn vanished(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH))
}

fn denied(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EACCES)
}

/// Whether the process under `/proc/PID` is root in every thread: every uid (real,
/// effective, saved, filesystem) of every one of its threads, the leader's included, is 0
/// (`false` when any cannot be read, or there is none). Credentials belong to a thread, not
/// to a process: a root process may run one thread as another user (`setresuid` by raw
/// system call changes only the calling thread's, as file servers acting for a user do),
/// and which thread opened a file is not reported. A process whose threads differ is no
/// root process.
pub(super) fn runs_as_root(proc_dir: &Path) -> bool {
    let Ok(tasks) = fs::read_dir(proc_dir.join("task")) else {
        return false;
    };
    let mut threads = 0usize;
    for task in tasks {
        let Ok(task) = task else { return false };
        let root = fs::read_to_string(task.path().join("status")).is_ok_and(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .is_some_and(|ids| {
                    let ids: Vec<&str> = ids.split_whitespace().collect();
                    ids.len() == 4 && ids.iter().all(|id| *id == "0")
                })
        });
        if !root {
            return false;
        }
        threads += 1;
    }
    threads > 0
}

/// An error reading `/proc`, with the path it came from.
struct ProcError(std::path::PathBuf, io::Error);

impl ProcError {
    fn into_io(self) -> io::Error {
        io::Error::new(self.1.kind(), format!("{}: {}", self.0.display(), self.1))
    }
}

/// `e`, naming the path it came from.
fn at(path: &Path, e: io::Error) -> ProcError {
    ProcError(path.to_path_buf(), e)
}

/// `major:minor` as `/proc/PID/mountinfo` prints a device number.
fn mountinfo_dev(dev: u64) -> String {
    format!("{}:{}", libc::major(dev), libc::minor(dev))
}

/// Walks every process but this one for the file `(dev, ino)`; the first finding, or an
/// error when some process could not be read (the caller fails closed).
pub fn find(dev: u64, ino: u64) -> io::Result<Option<Finding>> {
    walk(dev, Some(ino))
}

/// Walks every process but this one for mounts only: a mount below the root of the
/// hugetlbfs `dev` in any process's mount namespace, or a mount namespace that only a
/// descriptor keeps ([`Finding::Mount`]). The kernel counts' check when the file system has
/// more mounts than their walk reads.
pub fn find_mount(dev: u64) -> io::Result<Option<Finding>> {
    walk(dev, None)
}

/// [`find`] for the file `ino`, or [`find_mount`] when `None`.
fn walk(dev: u64, ino: Option<u64>) -> io::Result<Option<Finding>> {
    let me = std::process::id();
    let mut w = Walk {
        dev,
        ino,
        dev_text: mountinfo_dev(dev),
        in_use: BTreeSet::new(),
        held: Vec::new(),
    };
    for entry in fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Some(f) = w.threads(pid, &entry.path())? {
            return Ok(Some(f));
        }
    }
    // A namespace kept alive by a descriptor alone was not read through any process.
    for (pid, ns) in &w.held {
        if !w.in_use.contains(ns) {
            return Ok(Some(Finding::Mount { pid: *pid }));
        }
    }
    Ok(None)
}

/// What a walk looks for, and the mount namespaces it met so far.
struct Walk {
    dev: u64,
    /// The file; `None`: mounts only.
    ino: Option<u64>,
    /// `dev` as mountinfo writes it.
    dev_text: String,
    /// Mount namespaces read through a process.
    in_use: BTreeSet<String>,
    /// Mount namespaces descriptors hold, with a process holding each.
    held: Vec<(u32, String)>,
}

impl Walk {
    /// Every thread of process `pid` (`base` is `/proc/PID`): one may have a descriptor
    /// table or a mount namespace of its own (`unshare`), and the leader may have exited
    /// while others run.
    fn threads(&mut self, pid: u32, base: &Path) -> io::Result<Option<Finding>> {
        let tasks_dir = base.join("task");
        let tasks = match fs::read_dir(&tasks_dir) {
            Ok(t) => t,
            Err(e) if vanished(&e) => return Ok(None),
            Err(e) if denied(&e) && runs_as_root(base) => return Ok(None),
            Err(e) => return Err(at(&tasks_dir, e).into_io()),
        };
        for task in tasks {
            let task = match task {
                Ok(t) => t,
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(at(&tasks_dir, e).into_io()),
            };
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let scan = Scan {
                pid,
                fds: tid == pid || !shares_files(pid, tid),
            };
            match self.process(&task.path(), &scan) {
                Ok(Some(f)) => return Ok(Some(f)),
                Ok(None) => {}
                // A thread that exited (a leader that called `exit` while others run has
                // no namespace or descriptors left to read): the others are read.
                Err(ProcError(_, e)) if vanished(&e) => {}
                Err(ProcError(_, e)) if denied(&e) && runs_as_root(base) => {}
                Err(e) => return Err(e.into_io()),
            }
        }
        Ok(None)
    }
}

/// What to read of one thread.
struct Scan {
    /// Its process.
    pid: u32,
    /// Its descriptor table may differ from its leader's.
    fds: bool,
}

/// Whether thread `tid` shares process `pid`'s leader's descriptor table (`kcmp`); `false`
/// when that cannot be told, so that its table is read.
fn shares_files(pid: u32, tid: u32) -> bool {
    // SAFETY: kcmp takes plain integers and compares kernel objects; no memory is passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid as libc::pid_t,
            tid as libc::pid_t,
            KCMP_FILES,
            0usize,
            0usize,
        )
    };
    rc == 0
}

/// `KCMP_FILES` of `linux/kcmp.h`: the descriptor tables.
const KCMP_FILES: libc::c_int = 2;

impl Walk {
    /// One thread (`base` is `/proc/PID/task/TID`): its mount namespace (read once per
    /// namespace) and, unless it shares its leader's, its descriptor table.
    fn process(&mut self, base: &Path, scan: &Scan) -> Result<Option<Finding>, ProcError> {
        let pid = scan.pid;
        let ns = fs::read_link(base.join("ns/mnt")).map_err(|e| at(&base.join("ns/mnt"), e))?;
        let ns = ns.to_string_lossy().into_owned();
        if self.in_use.insert(ns) {
            let info = fs::read_to_string(base.join("mountinfo"))
                .map_err(|e| at(&base.join("mountinfo"), e))?;
            for line in info.lines() {
                let mut f = line.split(' ').skip(2);
                if let (Some(d), Some(root)) = (f.next(), f.next()) {
                    if d == self.dev_text && root != "/" {
                        return Ok(Some(Finding::Mount { pid }));
                    }
                }
            }
        }
        if !scan.fds {
            return Ok(None);
        }
        let fd_dir = base.join("fd");
        let dir = fs::File::open(&fd_dir).map_err(|e| at(&fd_dir, e))?;
        for fd in fs::read_dir(&fd_dir).map_err(|e| at(&fd_dir, e))? {
            let fd = match fd {
                Ok(fd) => fd,
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(at(&fd_dir, e)),
            };
            if let Some(f) = self.descriptor(base, &dir, &fd, pid)? {
                return Ok(Some(f));
            }
        }
        Ok(None)
    }

    /// One descriptor `fd` of process `pid` (`dir` is the open `fd` directory of `base`):
    /// a mount namespace it holds is remembered; the file, or an io_uring with registered
    /// buffers, is found.
    fn descriptor(
        &mut self,
        base: &Path,
        dir: &fs::File,
        fd: &fs::DirEntry,
        pid: u32,
    ) -> Result<Option<Finding>, ProcError> {
        let target = match fs::read_link(fd.path()) {
            Ok(t) => t,
            Err(e) if vanished(&e) => return Ok(None),
            Err(e) => return Err(at(&fd.path(), e)),
        };
        let target = target.as_os_str().as_bytes();
        if target.starts_with(b"mnt:[") {
            self.held
                .push((pid, String::from_utf8_lossy(target).into_owned()));
            return Ok(None);
        }
        // Mounts only: the namespaces descriptors hold are all that is read of them.
        let Some(ino) = self.ino else { return Ok(None) };
        if target == b"anon_inode:[io_uring]" {
            let info = base.join("fdinfo").join(fd.file_name());
            let text = match fs::read_to_string(&info) {
                Ok(t) => t,
                Err(e) if vanished(&e) => return Ok(None),
                Err(e) => return Err(at(&info, e)),
            };
            let held = registered_buffers(&text) != Some(0);
            return Ok(held.then_some(Finding::IoUring { pid }));
        }
        if target.first() != Some(&b'/') {
            return Ok(None);
        }
        // The descriptor's own file, through the magic link (an O_PATH one too).
        match fstatat(
            Some(dir.as_raw_fd()),
            fd.file_name().as_os_str(),
            AtFlags::empty(),
        ) {
            Ok(st) if st.st_dev == self.dev && st.st_ino == ino => {
                Ok(Some(Finding::Descriptor { pid }))
            }
            Ok(_) => Ok(None),
            Err(nix::errno::Errno::ENOENT) => Ok(None),
            // A descriptor of something else the daemon may not stat (a socket of another
            // namespace, a deleted file's link target): it is not the pool file, which the
            // daemon owns and may always stat.
            Err(nix::errno::Errno::EACCES) => Ok(None),
            Err(e) => Err(at(&fd.path(), io::Error::from(e))),
        }
    }
}

/// `UserBufs:` of an io_uring's fdinfo; `None` when the line is missing (counted as held).
fn registered_buffers(fdinfo: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("UserBufs:"))
        .and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_bufs_is_read_from_fdinfo() {
        assert_eq!(
            registered_buffers("pos:\t0\nUserBufs:\t2\n    0: 0x7f/4096\n"),
            Some(2)
        );
        assert_eq!(registered_buffers("UserFiles:\t0\nUserBufs:\t0\n"), Some(0));
        assert_eq!(registered_buffers("pos:\t0\n"), None);
    }

    /// Runs the Python `script` (given `PATH`, a path that reaches a fresh memfd, and
    /// printing `ready` once it holds what it holds) and asserts that the scan finds it
    /// holding a descriptor of the memfd. A memfd: no mount namespace anywhere mounts its
    /// file system, so the only finding can be the child's descriptor (a file in /tmp shares
    /// its device with every bind mount of the root file system, e.g. a libvirt sandbox's).
    fn assert_found_holding(script: &str) {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let memfd =
            rustix::fs::memfd_create("hugeprep-scan", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let memfd = fs::File::from(memfd);
        let path = format!("/proc/{}/fd/{}", std::process::id(), memfd.as_raw_fd());
        let meta = memfd.metadata().unwrap();
        let mut child = std::process::Command::new("python3")
            .arg("-c")
            .arg(format!("PATH={path:?}\n{script}"))
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
        let found = find(meta.dev(), meta.ino()).unwrap();
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(
            matches!(found, Some(Finding::Descriptor { pid }) if pid == child.id()),
            "{found:?}"
        );
    }

    #[test]
    fn a_child_holding_an_o_path_descriptor_is_found() {
        // `exec 3<` would be a real open; an O_PATH descriptor is what the scan adds.
        assert_found_holding(
            "import os,sys\nfd=os.open(PATH, os.O_PATH)\nprint('ready', flush=True)\nsys.stdin.read()\n",
        );
    }

    /// A thread with a descriptor table of its own (`unshare(CLONE_FILES)`) holds the
    /// descriptor: its leader's table, all that `/proc/PID/fd` shows, has none.
    #[test]
    fn a_thread_with_a_descriptor_table_of_its_own_is_read() {
        assert_found_holding(
            "import ctypes,os,sys,threading\n\
             ready=threading.Event()\n\
             def hold():\n\
             \x20   assert ctypes.CDLL(None,use_errno=True).unshare(0x400)==0\n\
             \x20   fd=os.open(PATH, os.O_PATH)\n\
             \x20   ready.set()\n\
             \x20   threading.Event().wait()\n\
             threading.Thread(target=hold,daemon=True).start()\n\
             ready.wait()\n\
             print('ready', flush=True)\n\
             sys.stdin.read()\n",
        );
    }
}
