//! Scheduling class of the calling thread: background work (refill, scrubbing) runs as
//! `SCHED_IDLE` so that it only uses CPU time nothing else wants, and returns to
//! `SCHED_OTHER` when a VM is waiting for it. The threads that serve the API and the lease
//! path run above ordinary processes (`SCHED_FIFO` 1, else nice [`API_NICE`]), so that a
//! lease keeps its latency on a host whose CPUs are all busy (a VM start is what is waiting).

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

/// Nice value of the API and lease threads where real-time is refused, and of their work
/// that grows with a request ([`OutOfRealtime`]): their CFS weight is about ten times that
/// of an ordinary (nice 0) process, so a runnable hog on every CPU takes a tenth of their
/// time rather than half, though a wakeup may wait for the running hog's tick.
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

/// Real-time priority of the API and lease threads: `SCHED_FIFO` at 1, the lowest. Measured
/// on a 6.18 guest with every CPU running a busy loop: a woken nice -10 thread waited up to a
/// scheduler tick (4 ms at HZ=250) before the loop was preempted, on each of the several
/// wakeups a request crosses (lease p99 8-13 ms); a `SCHED_FIFO` thread preempts at once. It
/// stays safe for the host's VMs because the work on these threads is short: what grows with
/// a request (faulting more than [`RT_WORK_BYTES`], pinning a guest) leaves the class
/// ([`OutOfRealtime`]), threads they spawn start outside it (`SCHED_RESET_ON_FORK`), and the
/// kernel's real-time throttling bounds the rest. vCPU threads at a real-time priority above
/// 1 still come first.
pub const API_RT_PRIORITY: u32 = 1;

/// Bytes an API thread may fault (or pin) inside the real-time class: a few milliseconds of
/// the kernel's zeroing. Larger requests take seconds at worst and run at [`API_NICE`].
pub const RT_WORK_BYTES: u64 = 64 << 20;

/// `sched_setattr` flag: threads this one creates start in `SCHED_OTHER` at nice 0.
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

fn set_attr(policy: libc::c_int, flags: u64, nice: i32, priority: u32, slice_ns: u64) -> bool {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: policy as u32,
        sched_flags: flags,
        sched_nice: nice,
        sched_priority: priority,
        sched_runtime: slice_ns,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: `attr` is a valid, fully initialised sched_attr whose `size` field says how
    // much the kernel may read; pid 0 is the calling thread; flags 0.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
    rc == 0
}

/// Puts the calling thread in the API's class: `SCHED_FIFO` at [`API_RT_PRIORITY`] with
/// `SCHED_RESET_ON_FORK`, or where real-time is refused (no `CAP_SYS_NICE`, systemd's
/// `RestrictRealtime=`, a cgroup without real-time budget) [`set_current_thread_api_nice`].
/// For `on_thread_start` of the API runtime. Leaves `SCHED_IDLE` if the thread was there.
pub fn set_current_thread_api() -> io::Result<()> {
    if set_attr(
        libc::SCHED_FIFO,
        SCHED_FLAG_RESET_ON_FORK,
        0,
        API_RT_PRIORITY,
        0,
    ) {
        return Ok(());
    }
    set_current_thread_api_nice()
}

/// Puts the calling thread in `SCHED_OTHER` at [`API_NICE`] with a slice of
/// [`API_SLICE_NS`]; falls back to the nice value alone where `sched_setattr` refuses the
/// slice.
pub fn set_current_thread_api_nice() -> io::Result<()> {
    if set_attr(libc::SCHED_OTHER, 0, API_NICE, 0, API_SLICE_NS) {
        return Ok(());
    }
    set_policy(libc::SCHED_OTHER)?;
    set_current_thread_nice(API_NICE)
}

/// Puts the calling thread in `SCHED_OTHER` at nice 0 with a slice of [`API_SLICE_NS`]:
/// woken, it preempts what runs, but it weighs no more than an ordinary process. For a
/// thread whose work another process can cause at will (the open watch's reader).
pub fn set_current_thread_short_slice() -> io::Result<()> {
    if set_attr(libc::SCHED_OTHER, 0, 0, 0, API_SLICE_NS) {
        return Ok(());
    }
    Err(io::Error::last_os_error())
}

/// Whether the calling thread runs in a real-time class.
pub fn current_thread_is_realtime() -> bool {
    // SAFETY: sched_getscheduler takes a pid only.
    let policy = unsafe { libc::sched_getscheduler(0) } & !libc::SCHED_RESET_ON_FORK;
    policy == libc::SCHED_FIFO || policy == libc::SCHED_RR
}

/// A scheduling class left until dropped: `back` puts the thread where it was (`None`: it was
/// not in the class, nothing changed). What the guards below share.
#[derive(Debug)]
struct Leave {
    back: Option<fn() -> io::Result<()>>,
}

impl Leave {
    /// Calls `to` if the thread is `inside` the class, and `back` when dropped.
    fn when(inside: bool, to: fn() -> io::Result<()>, back: fn() -> io::Result<()>) -> Leave {
        if inside {
            // A thread that cannot change class keeps its own: the ceiling is a latency aid,
            // and whether the classes can be had is logged when the daemon starts.
            let _ = to();
        }
        Leave {
            back: inside.then_some(back),
        }
    }
}

impl Drop for Leave {
    fn drop(&mut self) {
        if let Some(back) = self.back {
            // As in `when`: a thread that cannot go back keeps the higher class.
            let _ = back();
        }
    }
}

/// Takes the calling thread out of the real-time class (to [`set_current_thread_api_nice`])
/// until dropped, around work on an API thread that grows with the request: faulting more
/// than [`RT_WORK_BYTES`], pinning a guest. The threads it spawns meanwhile inherit the nice
/// value, not the real-time class.
#[derive(Debug)]
pub struct OutOfRealtime {
    _leave: Leave,
}

impl OutOfRealtime {
    /// Leaves the real-time class if the calling thread is in it.
    pub fn enter() -> OutOfRealtime {
        OutOfRealtime {
            _leave: Leave::when(
                current_thread_is_realtime(),
                set_current_thread_api_nice,
                set_current_thread_api,
            ),
        }
    }
}

/// Whether the calling thread is `SCHED_IDLE`.
pub fn current_thread_is_idle() -> bool {
    // SAFETY: sched_getscheduler takes a pid only.
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_IDLE }
}

/// Takes the calling thread out of `SCHED_IDLE` (into `SCHED_OTHER`, nice unchanged) until
/// dropped, around a call that holds kernel locks other threads wait for: `mmap`/`munmap`
/// (the process's `mmap_lock`), faulting or freeing hugepages (the hugetlb fault mutexes,
/// hashed over a few per CPU). A `SCHED_IDLE` thread preempted inside such a call keeps the
/// lock for as long as every CPU stays busy, and a lease waits behind it (measured: a paced
/// lease p99 of 16-71 ms with a busy loop per CPU). The work itself stays background: only
/// the call runs at normal priority.
#[derive(Debug)]
pub struct OutOfIdle {
    _leave: Leave,
}

impl OutOfIdle {
    /// Leaves `SCHED_IDLE` if the calling thread is in it.
    pub fn enter() -> OutOfIdle {
        OutOfIdle {
            _leave: Leave::when(
                current_thread_is_idle(),
                set_current_thread_normal,
                set_current_thread_idle,
            ),
        }
    }

    /// Leaves `SCHED_IDLE` for the API's class ([`set_current_thread_api`]) if the calling
    /// thread is in it: a priority ceiling while it holds a lock the API's threads wait on.
    pub fn enter_api() -> OutOfIdle {
        OutOfIdle {
            _leave: Leave::when(
                current_thread_is_idle(),
                set_current_thread_api,
                set_current_thread_idle,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_idle_restores_idle() {
        std::thread::spawn(|| {
            set_current_thread_idle().unwrap();
            {
                let _g = OutOfIdle::enter();
                assert!(!current_thread_is_idle());
            }
            assert!(current_thread_is_idle());
            {
                let _g = OutOfIdle::enter_api();
                assert!(!current_thread_is_idle());
            }
            assert!(current_thread_is_idle());
            set_current_thread_normal().unwrap();
            {
                let _g = OutOfIdle::enter();
            }
            assert!(!current_thread_is_idle());
        })
        .join()
        .unwrap();
    }

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
        // The niceness the test was started with (`nice cargo test` starts it above 0).
        let nice = current_thread_nice();
        std::thread::spawn(|| {
            set_current_thread_idle().unwrap();
            if set_current_thread_api().is_ok() {
                assert!(!current_thread_is_idle());
                if current_thread_is_realtime() {
                    // Its threads start as ordinary ones (SCHED_RESET_ON_FORK).
                    let child = std::thread::spawn(current_thread_is_realtime);
                    assert!(!child.join().unwrap());
                    {
                        let _long = OutOfRealtime::enter();
                        assert!(!current_thread_is_realtime());
                        assert_eq!(current_thread_nice(), API_NICE);
                    }
                    assert!(current_thread_is_realtime());
                } else {
                    assert_eq!(current_thread_nice(), API_NICE);
                }
            }
            // Only this thread changed.
        })
        .join()
        .unwrap();
        assert!(!current_thread_is_realtime());
        assert_eq!(
            current_thread_nice(),
            nice,
            "only the spawned thread changed"
        );
    }
}
