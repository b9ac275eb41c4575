//! Scheduling class of the calling thread: background work (refill, scrubbing) runs as
//! `SCHED_IDLE` so that it only uses CPU time nothing else wants, and returns to
//! `SCHED_OTHER` when a VM is waiting for it. The threads that serve the API and the lease
//! path run at [`API_NICE`], above ordinary processes, so that a lease keeps its latency on a
//! host whose CPUs are all busy (a VM start is what is waiting).

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

/// Nice value of the API and lease threads: their CFS weight is about ten times that of an
/// ordinary (nice 0) process, so a runnable hog on every CPU delays them by a fraction of a
/// slice rather than a share of it. Not a real-time class: a cold lease faulting memory for
/// seconds must not starve the host's VMs.
pub const API_NICE: i32 = -10;

/// Sets the nice value of the calling thread only (Linux: `setpriority` on the thread id).
/// Lowering it below 0 needs `CAP_SYS_NICE` (or `RLIMIT_NICE`).
pub fn set_current_thread_nice(nice: i32) -> io::Result<()> {
    set_process_nice(nix::unistd::gettid().as_raw() as u32, nice)
}

/// Sets the nice value of process (or thread) `pid`.
pub fn set_process_nice(pid: u32, nice: i32) -> io::Result<()> {
    // SAFETY: setpriority takes plain integers.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, pid as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The nice value of the calling thread.
pub fn current_thread_nice() -> i32 {
    let tid = nix::unistd::gettid().as_raw() as libc::id_t;
    // SAFETY: getpriority takes plain integers; -1 is a valid answer, so errno is not checked
    // (the call cannot fail for the calling thread).
    unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) }
}

/// Time slice asked for the API and lease threads, ns (the kernel's minimum, 0.1 ms). A
/// `SCHED_OTHER` thread with a shorter slice than the running one preempts it at wakeup
/// (EEVDF, Linux 6.12+), instead of waiting for the running task's slice (0.75-3 ms) to
/// end: each request crosses several threads, each wakeup would pay it.
pub const API_SLICE_NS: u64 = 100_000;

/// `struct sched_attr` of `sched_setattr(2)`, the first version (48 bytes).
#[repr(C)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

/// Puts the calling thread in `SCHED_OTHER` at [`API_NICE`] with a slice of
/// [`API_SLICE_NS`] (leaving `SCHED_IDLE` if it was there); for `on_thread_start` of the API
/// runtime. Falls back to the nice value alone where `sched_setattr` refuses.
pub fn set_current_thread_api() -> io::Result<()> {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: 0,
        sched_nice: API_NICE,
        sched_priority: 0,
        sched_runtime: API_SLICE_NS,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: `attr` is a valid, fully initialised sched_attr whose `size` field says how
    // much the kernel may read; pid 0 is the calling thread; flags 0.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
    if rc == 0 {
        return Ok(());
    }
    set_policy(libc::SCHED_OTHER)?;
    set_current_thread_nice(API_NICE)
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

    #[test]
    fn an_api_thread_runs_above_ordinary_processes() {
        std::thread::spawn(|| {
            set_current_thread_idle().unwrap();
            if set_current_thread_api().is_ok() {
                assert_eq!(current_thread_nice(), API_NICE);
                assert!(!current_thread_is_idle());
            }
            // Only this thread changed.
        })
        .join()
        .unwrap();
        assert_eq!(current_thread_nice(), 0);
    }
}
