//! Who opens a file (fanotify open permission events on single inodes, with a pidfd for
//! each opener, Linux 5.15 or later).
//!
//! The daemon marks each pool file before its lease path exists and reads, for every open
//! of it by any process through any name, the opener's pidfd: unlike a pid it never names
//! another process later, so the opener's cgroups can be read without a pid-reuse race.
//! Permission events ([`OpenWatch::watch`]) make the opener wait in `open(2)` until the
//! daemon has answered, so it is still running (and its cgroups readable) however briefly it
//! holds the file; an event is answered "allow" when its [`Permission`] is dropped, and if
//! the daemon dies the kernel allows what is pending. Notification events
//! ([`OpenWatch::notify`]) only report an open: the opener never waits.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// `FANOTIFY_METADATA_VERSION` of the event layout this parser reads.
const METADATA_VERSION: u8 = 3;
/// Events per `read`: each holds two descriptors (the file, the opener's pidfd) until it is
/// answered, so a batch is answered before the next is read. Where the kernel cannot make
/// a descriptor it refuses that open itself.
const BATCH: usize = 64;
/// Bytes of one event: the metadata and one pidfd record.
const EVENT_BYTES: usize = std::mem::size_of::<libc::fanotify_event_metadata>() + 8;

/// One event read from an [`OpenWatch`].
#[derive(Debug)]
pub enum Event {
    /// A marked inode `(dev, ino)` was opened by `pid`.
    Open {
        /// Device of the inode.
        dev: u64,
        /// Inode number.
        ino: u64,
        /// The opener's thread-group id when the event was made.
        pid: u32,
        /// A pidfd of the opener; `None` when it had exited before the event was read or
        /// the kernel could not make one.
        pidfd: Option<OwnedFd>,
        /// A permission event: the opener waits until this is dropped (then its open goes
        /// on). A notification event: dropping it only closes the event's descriptor.
        permission: Permission,
    },
    /// The kernel dropped events: what was opened meanwhile is not known.
    Overflow,
}

/// An open waiting for the group's answer; dropping it answers "allow". For a notification
/// event nothing waits: it holds the event's descriptor only.
#[derive(Debug)]
pub struct Permission {
    group: Arc<OwnedFd>,
    /// The event's descriptor of the file (it names the event in the answer).
    file: OwnedFd,
    answered: bool,
}

impl Permission {
    /// Whether the opener waits for this answer (a permission event).
    pub fn waits(&self) -> bool {
        !self.answered
    }

    /// The event's descriptor of the opened file (to change the inode's mark).
    pub fn file(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Refuses the open: it fails with `EPERM`.
    pub fn deny(mut self) {
        self.answer(libc::FAN_DENY);
    }

    fn answer(&mut self, response: u32) {
        if std::mem::replace(&mut self.answered, true) {
            return;
        }
        let answer = libc::fanotify_response {
            fd: self.file.as_raw_fd(),
            response,
        };
        let size = std::mem::size_of::<libc::fanotify_response>();
        // SAFETY: writes one fanotify_response that lives for the call to the group's
        // descriptor; the event's descriptor is closed only after (when `file` drops).
        let n = unsafe {
            libc::write(
                self.group.as_raw_fd(),
                (&answer as *const libc::fanotify_response).cast(),
                size,
            )
        };
        if n < 0 {
            // ENOENT: the opener was killed while it waited; nothing waits any more.
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ENOENT) {
                tracing::error!(%err, "cannot answer an open permission event");
            }
        }
    }
}

impl Drop for Permission {
    fn drop(&mut self) {
        self.answer(libc::FAN_ALLOW);
    }
}

/// A fanotify group that reports opens of the inodes it marks, and holds each open until
/// the event is read and answered.
#[derive(Debug)]
pub struct OpenWatch {
    fd: Arc<OwnedFd>,
}

impl OpenWatch {
    /// Makes the group (needs CAP_SYS_ADMIN and `CONFIG_FANOTIFY_ACCESS_PERMISSIONS`). Its
    /// queue is unlimited: a permission event is never dropped (the open fails with
    /// `ENOMEM` where the kernel cannot allocate one).
    pub fn new() -> io::Result<OpenWatch> {
        let flags = libc::FAN_CLASS_CONTENT
            | libc::FAN_CLOEXEC
            | libc::FAN_NONBLOCK
            | libc::FAN_UNLIMITED_QUEUE
            | libc::FAN_REPORT_PIDFD;
        let event_flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_LARGEFILE) as libc::c_uint;
        // SAFETY: fanotify_init takes two flag words and returns a new descriptor or -1.
        let fd = unsafe { libc::fanotify_init(flags, event_flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(OpenWatch { fd: Arc::new(fd) })
    }

    /// Holds and reports every later open of the inode behind `file` (through any of its
    /// names, or through `/proc/PID/fd`), until [`OpenWatch::unwatch`] or the inode goes.
    /// The daemon's own opens wait for an answer too: some thread must read the events.
    pub fn watch(&self, file: BorrowedFd<'_>) -> io::Result<()> {
        self.mark(libc::FAN_MARK_ADD, file)
    }

    /// Stops holding opens of the inode behind `file`.
    pub fn unwatch(&self, file: BorrowedFd<'_>) -> io::Result<()> {
        self.mark(libc::FAN_MARK_REMOVE, file)
    }

    /// Reports later opens of the inode behind `file` without holding them (notification
    /// events): the opener never waits for the daemon.
    pub fn notify(&self, file: BorrowedFd<'_>) -> io::Result<()> {
        self.mark_mask(libc::FAN_MARK_ADD, libc::FAN_OPEN, file)
    }

    /// Stops reporting opens of the inode behind `file` (a mark that watches nothing else
    /// goes). An inode that is no longer marked for them is not an error.
    pub fn unnotify(&self, file: BorrowedFd<'_>) -> io::Result<()> {
        match self.mark_mask(libc::FAN_MARK_REMOVE, libc::FAN_OPEN, file) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }

    fn mark(&self, how: libc::c_uint, file: BorrowedFd<'_>) -> io::Result<()> {
        self.mark_mask(how, libc::FAN_OPEN_PERM, file)
    }

    fn mark_mask(&self, how: libc::c_uint, mask: u64, file: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: with a null path fanotify_mark marks the object `file` refers to; no
        // memory is passed.
        let rc = unsafe {
            libc::fanotify_mark(
                self.fd.as_raw_fd(),
                how,
                mask,
                file.as_raw_fd(),
                std::ptr::null(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `timeout` for events; whether some are ready.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one pollfd that lives for the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        match rc {
            rc if rc < 0 => {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(err)
                }
            }
            0 => Ok(false),
            _ => Ok(true),
        }
    }

    /// Reads up to a batch of the events queued now, without blocking (none: the queue is
    /// empty). Every open in it waits until its [`Permission`] is answered or dropped. An
    /// error loses no open: the kernel refuses an open whose event it could not deliver.
    pub fn read(&self) -> io::Result<Vec<Event>> {
        let mut events = Vec::new();
        let mut buf = vec![0u8; BATCH * EVENT_BYTES];
        loop {
            // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let err = io::Error::last_os_error();
                match err.kind() {
                    io::ErrorKind::WouldBlock => return Ok(events),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(err),
                }
            }
            parse(&self.fd, &buf[..n as usize], &mut events);
            return Ok(events);
        }
    }
}

impl AsFd for OpenWatch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(w)
}

/// Takes ownership of a descriptor the kernel put in an event (`< 0`: none).
fn owned(fd: i32) -> Option<OwnedFd> {
    // SAFETY: a non-negative descriptor in an event is a new one the kernel opened for this
    // reader, owned by nothing else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Parses the events in `buf` (struct fanotify_event_metadata, then info records) read from
/// `group`. Each event's descriptor is owned (and its open answered) before anything else
/// is read of it; an event that cannot be understood is refused. A malformed buffer ends
/// with [`Event::Overflow`]: what follows cannot be found.
fn parse(group: &Arc<OwnedFd>, buf: &[u8], out: &mut Vec<Event>) {
    const META: usize = std::mem::size_of::<libc::fanotify_event_metadata>();
    let mut at = 0;
    while at + META <= buf.len() {
        let event_len = read_u32(buf, at) as usize;
        let vers = buf[at + 4];
        let metadata_len = u16::from_ne_bytes([buf[at + 6], buf[at + 7]]) as usize;
        if vers != METADATA_VERSION || event_len < META || at + event_len > buf.len() {
            tracing::error!(vers, event_len, "malformed fanotify event");
            out.push(Event::Overflow);
            return;
        }
        let mut mask = [0u8; 8];
        mask.copy_from_slice(&buf[at + 8..at + 16]);
        let mask = u64::from_ne_bytes(mask);
        let permission = owned(read_u32(buf, at + 16) as i32).map(|file| Permission {
            group: Arc::clone(group),
            file,
            // A notification event has no answer.
            answered: mask & libc::FAN_OPEN_PERM == 0,
        });
        let pid = read_u32(buf, at + 20);
        // Info records: a pidfd record (header: type, pad, len; then the pidfd).
        let mut pidfd = None;
        let mut info = at + metadata_len;
        let mut understood = true;
        while info + 4 <= at + event_len {
            let kind = buf[info];
            let len = u16::from_ne_bytes([buf[info + 2], buf[info + 3]]) as usize;
            if len < 4 || info + len > at + event_len {
                understood = false;
                break;
            }
            if kind == libc::FAN_EVENT_INFO_TYPE_PIDFD && len >= 8 {
                pidfd = owned(read_u32(buf, info + 4) as i32);
            }
            info += len;
        }
        at += event_len;
        if mask & libc::FAN_Q_OVERFLOW != 0 {
            out.push(Event::Overflow);
            continue;
        }
        let Some(permission) = permission else {
            continue;
        };
        let st = nix::sys::stat::fstat(permission.file.as_raw_fd());
        match st {
            Ok(st) if understood => out.push(Event::Open {
                dev: st.st_dev,
                ino: st.st_ino,
                pid,
                pidfd,
                permission,
            }),
            _ => {
                tracing::error!(pid, "an open permission event that cannot be read: refused");
                permission.deny();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pidfd of `child`'s open of the file at `path` among `events` (taken out of it).
    fn opener(events: &mut [Event], path: &std::path::Path, child: u32) -> Option<OwnedFd> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).unwrap();
        events.iter_mut().find_map(|e| match e {
            Event::Open {
                dev,
                ino,
                pid,
                pidfd,
                ..
            } if *dev == meta.dev() && *ino == meta.ino() && *pid == child => pidfd.take(),
            _ => None,
        })
    }

    #[test]
    fn an_open_of_a_marked_file_names_the_opener_and_waits_for_the_answer() {
        let Ok(watch) = OpenWatch::new() else {
            // Not root, or no fanotify: nothing to check here (the daemon tests run as root).
            return;
        };
        let path = std::env::temp_dir().join(format!("hugeprep-fanotify-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let f = std::fs::File::open(&path).unwrap();
        watch.watch(f.as_fd()).unwrap();
        assert!(watch.read().unwrap().is_empty());
        // A process that opens the file and exits at once: it cannot exit before its open
        // was read, so it is still running when the event is.
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec 3<{}", path.display()))
            .spawn()
            .unwrap();
        assert!(watch.wait(Duration::from_secs(10)).unwrap());
        let mut events = watch.read().unwrap();
        let pidfd = opener(&mut events, &path, child.id())
            .expect("the child's open is reported with a pidfd");
        std::thread::sleep(Duration::from_millis(50));
        assert!(!crate::sys::pidfd::exited(pidfd.as_fd()).unwrap());
        // Answered: the open goes on and the child exits.
        drop(events);
        assert!(child.wait().unwrap().success());
        assert!(crate::sys::pidfd::exited(pidfd.as_fd()).unwrap());
        // Unwatched: an open is neither held nor reported.
        watch.unwatch(f.as_fd()).unwrap();
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec 3<{}", path.display()))
            .spawn()
            .unwrap();
        assert!(child.wait().unwrap().success());
        assert!(watch.read().unwrap().is_empty());
        std::fs::remove_file(&path).unwrap();
    }
}
