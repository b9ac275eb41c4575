//! io_uring instances with registered buffers, anywhere on the host.
//!
//! A registered buffer pins its pages for as long as the ring lives, after the mapping it
//! was registered from and the file behind it are gone: the one page reference a lessee can
//! hand to another process (the ring's descriptor, over a unix socket) that the write-lease
//! check and the openers' cgroups do not see. The ring's `fdinfo` lists its buffers by
//! address only, so any ring with buffers outside the daemon makes the proof fail.
//!
//! A process the daemon may not inspect (it has capabilities the daemon's unit leaves out,
//! as the init of a container host does) is skipped when it runs as root: root processes
//! are the host's trusted base, as they are for the kernel's own path (they can read any
//! memory). Any other process that cannot be read fails the scan.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;

/// What a `/proc/PID/...` read error means for the scan.
fn vanished(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH))
}

fn denied(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EACCES)
}

/// Whether every uid of the process under `/proc/PID` is 0 (`false` when unknown).
fn runs_as_root(proc_dir: &std::path::Path) -> bool {
    fs::read_to_string(proc_dir.join("status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .is_some_and(|ids| ids.split_whitespace().all(|id| id == "0"))
    })
}

/// `e`, naming the path it came from.
fn at(path: &std::path::Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// The first process other than this one that holds an io_uring with registered buffers;
/// an error when some process could not be read (the caller fails closed).
pub fn foreign_buffers() -> io::Result<Option<u32>> {
    let me = std::process::id();
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
        let fds = match fs::read_dir(entry.path().join("fd")) {
            Ok(fds) => fds,
            Err(e) if vanished(&e) => continue,
            Err(e) if denied(&e) && runs_as_root(&entry.path()) => continue,
            Err(e) => return Err(at(&entry.path().join("fd"), e)),
        };
        for fd in fds {
            let fd = match fd {
                Ok(fd) => fd,
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(e),
            };
            let target = match fs::read_link(fd.path()) {
                Ok(t) => t,
                Err(e) if vanished(&e) => continue,
                Err(e) if denied(&e) && runs_as_root(&entry.path()) => break,
                Err(e) => return Err(at(&fd.path(), e)),
            };
            if target.as_os_str().as_bytes() != b"anon_inode:[io_uring]" {
                continue;
            }
            let info = entry.path().join("fdinfo").join(fd.file_name());
            let text = match fs::read_to_string(&info) {
                Ok(t) => t,
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(at(&info, e)),
            };
            if registered_buffers(&text) != Some(0) {
                return Ok(Some(pid));
            }
        }
    }
    Ok(None)
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
}
