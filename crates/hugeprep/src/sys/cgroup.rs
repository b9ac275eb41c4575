//! Starting a child process inside a cgroup: it joins between fork and exec, so the program
//! it runs never runs (or opens a file) anywhere else.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;

/// Makes the child `cmd` spawns join the cgroup whose `cgroup.procs` is open as `procs`
/// (opened for writing) before it execs. A failed move fails the spawn with its errno.
pub fn join_before_exec(cmd: &mut Command, procs: Arc<File>) {
    let join = move || {
        // "0" names the writing process: no pid to format after fork.
        // SAFETY: write(2) on a descriptor the Arc keeps open, from a buffer that lives for
        // the call; it is async-signal-safe, as code between fork and exec must be, and it
        // neither allocates nor takes a lock.
        let n = unsafe { libc::write(procs.as_raw_fd(), b"0".as_ptr().cast(), 1) };
        match n {
            1 => Ok(()),
            n if n < 0 => Err(std::io::Error::last_os_error()),
            _ => Err(std::io::Error::from_raw_os_error(libc::EIO)),
        }
    };
    // SAFETY: the closure only calls write(2) (see above) and builds an io::Error from an
    // errno, which does not allocate.
    unsafe {
        cmd.pre_exec(join);
    }
}
