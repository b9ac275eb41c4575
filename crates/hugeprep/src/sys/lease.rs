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
///
/// An open or truncate of the inode while the lease is held breaks it, and the kernel
/// signals the holder with `SIGIO`, whose default action ends the process: a daemon under
/// load was killed that way, and a lessee opening its old file at the wrong moment could do
/// it on purpose. So the first call sets `SIGIO` to ignored when it is at its default (a
/// handler the program installed is left alone); the break itself needs no answer, as the
/// lease is given back at once.
pub fn sole_open_file(file: &File) -> io::Result<bool> {
    ignore_sigio_once()?;
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

/// Sets `SIGIO` to ignored, once per process, unless the program handles it.
fn ignore_sigio_once() -> io::Result<()> {
    static DONE: std::sync::OnceLock<Result<(), i32>> = std::sync::OnceLock::new();
    let done = DONE.get_or_init(|| {
        // SAFETY: sigaction with a null new action only reads the current one into `old`, a
        // zeroed sigaction that lives for the call.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::sigaction(libc::SIGIO, std::ptr::null(), &mut old) } < 0 {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL));
        }
        if old.sa_sigaction != libc::SIG_DFL {
            return Ok(());
        }
        // SAFETY: SIG_IGN installs no handler: no code runs on the signal.
        if unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) } == libc::SIG_ERR {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL));
        }
        Ok(())
    });
    done.map_err(io::Error::from_raw_os_error)
}

/// Takes (`libc::F_WRLCK`, `F_RDLCK`) or gives back (`F_UNLCK`) a file lease on `file`,
/// as a lessee may: for tests of what the daemon does beside one.
#[cfg(test)]
pub(crate) fn set_lease(file: &File, kind: libc::c_int) -> io::Result<()> {
    // SAFETY: F_SETLEASE takes an integer argument; no memory is passed.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, kind) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The file lease `file` holds (`F_UNLCK`: none, or broken).
#[cfg(test)]
pub(crate) fn lease_of(file: &File) -> io::Result<libc::c_int> {
    // SAFETY: F_GETLEASE takes no argument.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLEASE) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
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

    /// An open of the file while the lease is held breaks it: the kernel's SIGIO must not end
    /// the process (it did, under load, before SIGIO was ignored).
    #[test]
    fn a_lease_broken_by_an_open_does_not_end_the_process() {
        let path =
            std::env::temp_dir().join(format!("hugeprep-lease-break-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let mine = File::open(&path).unwrap();
        ignore_sigio_once().unwrap();
        // Hold the lease as `sole_open_file` does, across an open from another thread.
        // SAFETY: F_SETLEASE takes an integer argument.
        let rc = unsafe { libc::fcntl(mine.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) };
        assert_eq!(rc, 0);
        let opener = {
            let path = path.clone();
            std::thread::spawn(move || File::open(path).map(drop))
        };
        // The opener waits for the lease; the break's SIGIO comes first.
        std::thread::sleep(std::time::Duration::from_millis(200));
        // SAFETY: as above.
        let rc = unsafe { libc::fcntl(mine.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
        assert_eq!(rc, 0);
        opener.join().unwrap().unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}
