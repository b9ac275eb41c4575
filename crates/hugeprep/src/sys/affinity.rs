//! CPU affinity: which CPUs this thread may run on, and pinning worker threads.

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Pinning a thread failed, usually because a CPU is offline or outside the cpuset.
#[derive(Debug, thiserror::Error)]
#[error("cannot pin thread to CPUs {cpus:?}: {source}")]
pub struct AffinityError {
    /// The CPUs asked for.
    pub cpus: Vec<usize>,
    /// The kernel's answer.
    pub source: nix::Error,
}

/// Restricts the calling thread to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), AffinityError> {
    let err = |source| AffinityError {
        cpus: cpus.to_vec(),
        source,
    };
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu).map_err(err)?;
    }
    sched_setaffinity(Pid::from_raw(0), &set).map_err(err)
}

/// The CPU the calling thread runs on now (`sched_getcpu`); it may move right after.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// The CPUs the calling thread may run on now (honours cgroup cpusets and `taskset`).
pub fn allowed_cpus() -> Vec<usize> {
    process_cpus(0).unwrap_or_else(|| {
        (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
    })
}

/// The CPUs process (or thread) `pid` may run on; `None` when it does not exist. `0` is the
/// calling thread.
pub fn process_cpus(pid: u32) -> Option<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(i32::try_from(pid).ok()?)).ok()?;
    Some(
        (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_to_an_allowed_cpu_and_back() {
        let all = allowed_cpus();
        assert!(!all.is_empty());
        std::thread::spawn(move || {
            pin_current_thread(&all[..1]).unwrap();
            assert_eq!(allowed_cpus(), vec![all[0]]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pinning_to_a_missing_cpu_names_it() {
        let err = pin_current_thread(&[100_000]).unwrap_err();
        assert!(err.to_string().contains("100000"), "{err}");
    }
}
