//! Scheduling class of the calling thread: background work (refill, scrubbing) runs as
//! `SCHED_IDLE` so that it only uses CPU time nothing else wants, and returns to
//! `SCHED_OTHER` when a VM is waiting for it.

use std::io;

fn set_policy(policy: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param for the duration of the call; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Puts the calling thread in `SCHED_IDLE`.
pub fn set_current_thread_idle() -> io::Result<()> {
    set_policy(libc::SCHED_IDLE)
}

/// Puts the calling thread back in `SCHED_OTHER` (allowed for root, or within
/// `RLIMIT_NICE`).
pub fn set_current_thread_normal() -> io::Result<()> {
    set_policy(libc::SCHED_OTHER)
}

/// Whether the calling thread is `SCHED_IDLE`.
pub fn current_thread_is_idle() -> bool {
    // SAFETY: sched_getscheduler takes a pid only.
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_IDLE }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_goes_idle_and_back() {
        std::thread::spawn(|| {
            set_current_thread_idle().unwrap();
            assert!(current_thread_is_idle());
            if set_current_thread_normal().is_ok() {
                assert!(!current_thread_is_idle());
            }
        })
        .join()
        .unwrap();
    }
}
