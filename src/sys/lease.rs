//! Whether any other open file of an inode exists anywhere in the system, asked of the
//! kernel itself: a write lease (`F_SETLEASE`, `F_WRLCK`) is granted only when the caller's
//! file is the inode's only open file (`check_conflicting_open` in `fs/locks.c` compares the
//! inode's counts of files open for writing and for reading with the caller's own).
//!
//! Every way to reach a file's pages anew goes through an open file: a descriptor in any
//! process, one in flight over SCM_RIGHTS, one registered with an io_uring, a mapping (it
//! holds its file), a file reopened through `/proc/PID/fd`. So one `fcntl` answers for all
//! of them, with no scan of `/proc` and no race with a descriptor passed between processes.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Whether `file` (opened by the caller, read-only or read-write) is the only open file of
/// its inode. The lease is given back at once: nobody else's open ever waits for it.
pub fn sole_open_file(file: &File) -> io::Result<bool> {
    // SAFETY: F_SETLEASE takes an integer argument; no memory is passed.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EBUSY) => Ok(false),
            _ => Err(err),
        };
    }
    // SAFETY: as above; removing the lease just taken.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_open_file_anywhere_refuses_the_lease() {
        let path = std::env::temp_dir().join(format!("hugeprep-lease-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let mine = File::open(&path).unwrap();
        // Leases need the caller to own the file or CAP_LEASE: both hold here.
        assert!(sole_open_file(&mine).unwrap());
        let other = File::open(&path).unwrap();
        assert!(!sole_open_file(&mine).unwrap());
        drop(other);
        assert!(sole_open_file(&mine).unwrap());
        std::fs::remove_file(&path).unwrap();
    }
}
