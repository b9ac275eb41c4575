//! The kernel features hugeprep uses, each probed by calling it, and the memlock limit.

use super::{Finding, Severity};
use crate::page_size::PageSize;
use crate::sys::probe;

const CHECK: &str = "kernel";

/// `MADV_POPULATE_WRITE`, pidfd, io_uring and hugetlb memfds.
pub fn features() -> Vec<Finding> {
    let mut out = Vec::new();
    out.push(match probe::madv_populate_write() {
        Ok(()) => Finding::ok(
            CHECK,
            "MADV_POPULATE_WRITE",
            "works (large-extent prefault)",
        ),
        Err(e) => Finding::new(
            CHECK,
            "MADV_POPULATE_WRITE",
            Severity::Warning,
            format!("unavailable ({e}): prefault falls back to mlock, one page at a time"),
        )
        .remedy("use Linux 5.14 or later"),
    });
    out.push(match probe::pidfd() {
        Ok(()) => Finding::ok(CHECK, "pidfd", "works (leases follow their process)"),
        Err(e) => Finding::new(
            CHECK,
            "pidfd",
            Severity::Warning,
            format!("pidfd_open fails ({e}): a lease taken with --pid is not released when its process exits"),
        )
        .remedy("use Linux 5.3 or later; release leases explicitly (hugeprep release)"),
    });
    out.push(match probe::io_uring() {
        Ok(()) => Finding::ok(CHECK, "io_uring", "works (long-term pinning of leases)"),
        Err(e) => Finding::new(
            CHECK,
            "io_uring",
            Severity::Info,
            format!("io_uring_setup fails ({e}): leases cannot be pinned the way VFIO pins them"),
        )
        .remedy("allow it: sysctl kernel.io_uring_disabled=0 (needed only for pinned leases)"),
    });
    for ps in crate::hugetlb::pool::page_sizes() {
        out.push(match probe::memfd_hugetlb(ps) {
            Ok(()) => Finding::ok(
                CHECK,
                format!("memfd {ps}"),
                "memfd_create(MFD_HUGETLB) works",
            ),
            Err(e) => Finding::new(
                CHECK,
                format!("memfd {ps}"),
                if ps == PageSize::Size2M {
                    Severity::Warning
                } else {
                    Severity::Info
                },
                format!(
                    "memfd_create(MFD_HUGETLB) fails ({e}): only files on hugetlbfs mounts work"
                ),
            ),
        });
    }
    out
}

/// A limit from `/proc/self/limits` (`Max locked memory  65536  65536  bytes`): the soft
/// limit, `None` for unlimited.
fn limit(text: &str, name: &str) -> Option<Option<u64>> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let soft = line[name.len()..].split_whitespace().next()?;
    Some(soft.parse().ok())
}

/// Whether this process has CAP_IPC_LOCK (bit 14 of `CapEff`), which lifts RLIMIT_MEMLOCK.
fn has_ipc_lock(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// RLIMIT_MEMLOCK and CAP_IPC_LOCK: locking and long-term pinning leases need either.
pub fn memlock() -> Vec<Finding> {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let soft = limit(&limits, "Max locked memory").flatten();
    let subject = "RLIMIT_MEMLOCK";
    let shown = soft.map_or("unlimited".to_string(), crate::units::format_bytes);
    let f = if has_ipc_lock(&status) {
        Finding::ok("limits", subject, format!("{shown}; CAP_IPC_LOCK lifts it"))
    } else if soft.is_none() {
        Finding::ok("limits", subject, "unlimited")
    } else {
        Finding::new(
            "limits",
            subject,
            Severity::Info,
            format!("{shown} and no CAP_IPC_LOCK: this user cannot lock or pin leases"),
        )
        .remedy("run the daemon as root (the unit does), or LimitMEMLOCK=infinity")
    };
    vec![f]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_capabilities_parse() {
        let text = "Limit                     Soft Limit           Hard Limit           Units\n\
                    Max locked memory         65536                65536                bytes\n";
        assert_eq!(limit(text, "Max locked memory"), Some(Some(65536)));
        let text = "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(limit(text, "Max locked memory"), Some(None));
        assert!(has_ipc_lock("CapEff:\t000001ffffffffff\n"));
        assert!(!has_ipc_lock("CapEff:\t0000000000000000\n"));
    }
}
