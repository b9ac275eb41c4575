//! Process handles (`pidfd_open`, Linux 5.3): a descriptor that becomes readable when the
//! process exits and, unlike a pid, never names a different process later.

use std::io;
use std::os::fd::OwnedFd;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags};

/// Opens a pidfd for `pid`. Fails with `ESRCH` when no such process exists.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    Ok(rustix::process::pidfd_open(pid, PidfdFlags::empty())?)
}

/// Whether the process behind `pidfd` has exited (its pidfd is readable then).
pub fn exited(pidfd: std::os::fd::BorrowedFd<'_>) -> io::Result<bool> {
    let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
    // A zero timeout never blocks.
    let ready = poll(&mut fds, Some(&Timespec::default()))?;
    Ok(ready > 0)
}

/// Waits (in tokio) until the process behind `pidfd` exits.
pub async fn wait_exit(pidfd: OwnedFd) -> io::Result<()> {
    use tokio::io::unix::AsyncFd;
    use tokio::io::Interest;
    // SAFETY: the AsyncFd takes ownership of the OwnedFd, so the descriptor stays open and
    // names the same pidfd until the AsyncFd is dropped.
    let afd = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)?;
    let _guard = afd.readable().await?;
    Ok(())
}

/// The start time of `pid` in clock ticks since boot (`/proc/PID/stat` field 22), which
/// together with the pid names one process across pid reuse. `None` when it does not exist.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: skip past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_has_a_pidfd_and_a_start_time() {
        let me = std::process::id();
        assert!(pidfd_open(me).is_ok());
        assert!(process_start_time(me).is_some());
        assert!(pidfd_open(0).is_err());
        assert!(pidfd_open(u32::MAX).is_err());
    }
}
