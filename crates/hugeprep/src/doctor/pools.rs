//! Hugepage pools per node and page size, whether 1 GiB pages can still be had, and the
//! hugetlbfs mounts.

use super::{DoctorOptions, Finding, Severity};
use crate::hugetlb::lock::HugepageLock;
use crate::hugetlb::mount;
use crate::hugetlb::pool::{self, PoolTopUp, Scope};
use crate::page_size::PageSize;
use crate::pool::{KindStatus, PoolStatus};
use crate::topology::{self, Topology};
use crate::units::format_bytes;

const CHECK: &str = "hugepages";

/// One finding per node and page size the kernel has; with the daemon's pool when it runs.
pub fn pools(opts: &DoctorOptions, daemon: Option<&PoolStatus>) -> Vec<Finding> {
    let sizes = pool::page_sizes();
    if sizes.is_empty() {
        return vec![Finding::new(
            CHECK,
            "kernel",
            Severity::Blocking,
            "this kernel has no hugepage pools (/sys/kernel/mm/hugepages is missing)",
        )
        .remedy("use a kernel built with CONFIG_HUGETLBFS and CONFIG_HUGETLB_PAGE")];
    }
    let topology = match Topology::detect() {
        Ok(t) => t,
        Err(e) => {
            return vec![Finding::new(
                CHECK,
                "topology",
                Severity::Blocking,
                e.to_string(),
            )]
        }
    };
    let mut out = Vec::new();
    for node in topology.node_ids() {
        for &ps in &sizes {
            let kind =
                daemon.and_then(|d| d.kinds.iter().find(|k| k.node == node && k.page_size == ps));
            out.push(kernel_pool(opts, node, ps, kind));
            if let Some(k) = kind {
                out.extend(daemon_kind(k));
            }
        }
    }
    out
}

fn kernel_pool(
    opts: &DoctorOptions,
    node: u32,
    ps: PageSize,
    kind: Option<&KindStatus>,
) -> Finding {
    let subject = format!("node {node} {ps}");
    let counts = match pool::read(Scope::Node(node), ps) {
        Ok(c) => c,
        Err(e) => return Finding::new(CHECK, subject, Severity::Warning, e.to_string()),
    };
    let free = pool::available(Some(node), ps).unwrap_or(0);
    let message = format!(
        "kernel pool {} pages ({}), {free} free",
        counts.total,
        format_bytes(counts.total_bytes())
    );
    let needed = opts.page_sizes.contains(&ps);
    if free > 0 {
        return Finding::ok(CHECK, subject, message);
    }
    if ps == PageSize::Size1G && opts.probe_1g {
        return one_gig(node, needed, message);
    }
    if !needed {
        return Finding::new(CHECK, subject, Severity::Info, message);
    }
    let daemon_fills = kind.is_some_and(|k| k.target_bytes > 0 && !k.drained);
    let set = format!("hugeprep pool --set N --node {node} --page-size {ps}");
    if daemon_fills && kind.is_some_and(|k| k.warm_bytes > 0) {
        return Finding::ok(
            CHECK,
            subject,
            format!("{message}: its pages are in the daemon's warm pool"),
        );
    }
    if !opts.reserve.enabled {
        return Finding::new(
            CHECK,
            subject,
            Severity::Blocking,
            format!("{message}, and reserve is disabled: a lease of {ps} pages fails"),
        )
        .remedy(format!(
            "{set}, or set reserve = true in [pool] of /etc/hugeprep/hugeprep.toml, then \
             systemctl reload hugeprep"
        ));
    }
    let available = topology::node_available_bytes(node).unwrap_or(0);
    if available < opts.reserve.margin + ps.bytes() {
        return Finding::new(
            CHECK,
            subject,
            Severity::Blocking,
            format!(
                "{message}; node {node} has {} available and keeps {} (reserve_margin): the \
                 pool cannot grow",
                format_bytes(available),
                format_bytes(opts.reserve.margin)
            ),
        )
        .remedy(
            "free memory on the node, or lower reserve_margin in [pool] of \
             /etc/hugeprep/hugeprep.toml, then systemctl reload hugeprep",
        );
    }
    if daemon_fills {
        return Finding::ok(
            CHECK,
            subject,
            format!(
                "{message}; the daemon raises it for its warm target (node {node} has {} available)",
                format_bytes(available)
            ),
        );
    }
    // No warm target: each lease raises the pool by what it needs and is served cold
    // (faulted on the lease path), as the packaged defaults intend. Nothing is wrong; warm
    // memory only makes starts faster.
    Finding::new(
        CHECK,
        subject,
        Severity::Info,
        format!(
            "{message}: leases are served cold, the daemon raising the pool for each (node \
             {node} has {} available)",
            format_bytes(available)
        ),
    )
    .remedy(format!(
        "for faster starts keep memory warm: add [[pool.target]] page_size = \"{ps}\" \
         warm = \"4G\" to /etc/hugeprep/hugeprep.toml, then systemctl reload hugeprep"
    ))
}

/// No free 1 GiB page: ask the kernel for one more and give it straight back. 1 GiB pages
/// need 1 GiB of contiguous memory, which fragments soon after boot.
fn one_gig(node: u32, needed: bool, message: String) -> Finding {
    let subject = format!("node {node} 1G");
    let unmet = if needed {
        Severity::Warning
    } else {
        Severity::Info
    };
    let boot = "reserve 1G pages at boot: kernel command line hugepagesz=1G hugepages=N";
    if !nix::unistd::geteuid().is_root() {
        return Finding::new(
            CHECK,
            subject,
            Severity::Info,
            format!("{message} (not probed: run as root)"),
        );
    }
    let lock = match HugepageLock::try_acquire() {
        Ok(Some(lock)) => lock,
        Ok(None) | Err(_) => {
            return Finding::new(
                CHECK,
                subject,
                Severity::Info,
                format!("{message} (not probed: another hugepage borrower holds the lock)"),
            )
        }
    };
    let probe = PoolTopUp::raise(Some(node), PageSize::Size1G, 1);
    let got = probe.as_ref().map_or(0, |t| t.added());
    drop(probe); // gives the page back
    drop(lock);
    if got > 0 {
        return Finding::ok(
            CHECK,
            subject,
            format!("{message}; the kernel can still supply 1 GiB pages"),
        );
    }
    let census = crate::hugetlb::contig::Census::take(PageSize::Size1G);
    let finding = Finding::new(
        CHECK,
        subject,
        unmet,
        format!(
            "{message}; the kernel cannot supply a 1 GiB page now ({})",
            census
                .as_ref()
                .map_or_else(|_| "memory fragmented".to_string(), |c| c.cause())
        ),
    );
    // Ranges that look free to the census while the kernel refuses a page: on a kernel that
    // initialises memory lazily, that is memory the page allocator has not taken in yet, which
    // a pull-in brings in (docs/operations.md). Where every range holds unmovable pages a
    // pull-in gets nothing (measured: 0 of 4 pages, 16 of 2626 2M pages pulled in, an hour
    // into a busy machine's life), so it is advised only here.
    let looks_free = census
        .as_ref()
        .is_ok_and(|c| c.ranges.iter().any(|r| r.usable()));
    if looks_free && initialises_memory_lazily() {
        finding.remedy(format!(
            "the kernel initialises memory lazily (deferred_init): pull it in before asking, \
             as the daemon's raises do (reserve_pull_in = true; scripts/gigantic-pages take N \
             for tests), or {boot}"
        ))
    } else {
        finding.remedy(boot)
    }
}

/// Whether the kernel command line asks for memory to be initialised lazily
/// (`deferred_init=lazy`): memory nobody touched since boot is then outside the page
/// allocator, where the 1G allocator does not look.
fn initialises_memory_lazily() -> bool {
    std::fs::read_to_string("/proc/cmdline").is_ok_and(|c| {
        c.split_whitespace()
            .any(|w| w.starts_with("deferred_init="))
    })
}

fn daemon_kind(k: &KindStatus) -> Option<Finding> {
    let subject = format!("node {} {} pool", k.node, k.page_size);
    if k.drained {
        return Some(
            Finding::new(CHECK, subject, Severity::Info, "drained by hugeprep drain")
                .remedy("hugeprep resume"),
        );
    }
    if let Some(reason) = &k.reason {
        return Some(Finding::new(
            CHECK,
            subject,
            Severity::Warning,
            format!(
                "warm target {} not met ({} warm): {reason}",
                format_bytes(k.target_bytes),
                format_bytes(k.warm_bytes)
            ),
        ));
    }
    (k.target_bytes > 0).then(|| {
        Finding::ok(
            CHECK,
            subject,
            format!(
                "{} warm of a {} target; the daemon added {} pages to the kernel's pool",
                format_bytes(k.warm_bytes),
                format_bytes(k.target_bytes),
                k.reserved_pages
            ),
        )
    })
}

/// A hugetlbfs mount for each page size VMs need.
pub fn mounts(opts: &DoctorOptions) -> Vec<Finding> {
    let found = match mount::mounts() {
        Ok(m) => m,
        Err(e) => {
            return vec![Finding::new(
                "mounts",
                "mountinfo",
                Severity::Warning,
                e.to_string(),
            )]
        }
    };
    let mut out = Vec::new();
    for &ps in &opts.page_sizes {
        let (trusted, passed): (Vec<_>, Vec<_>) = found
            .iter()
            .filter(|m| m.page_size == ps)
            .map(|m| (m, mount::passed_over(&m.path, &opts.run_dir)))
            .partition(|(_, why)| why.is_none());
        for (m, why) in passed {
            out.push(
                Finding::new(
                    "mounts",
                    format!("hugetlbfs {ps}"),
                    Severity::Info,
                    format!(
                        "{} passed over when the daemon finds its mount: {}",
                        m.path.display(),
                        why.unwrap_or_default()
                    ),
                )
                .remedy(format!(
                    "unmount it if it is a leftover (umount {}), or name it in \
                     /etc/hugeprep/hugeprep.toml (mounts = [\"{}\"]) to use it",
                    m.path.display(),
                    m.path.display()
                )),
            );
        }
        let paths: Vec<String> = trusted
            .iter()
            .map(|(m, _)| m.path.display().to_string())
            .collect();
        out.push(if paths.is_empty() {
            Finding::new(
                "mounts",
                format!("hugetlbfs {ps}"),
                Severity::Info,
                format!(
                    "no mount to adopt: the daemon mounts its own under its run directory ({})",
                    opts.run_dir.display()
                ),
            )
            .remedy(format!(
                "for a fixed path libvirt can use: hugeprep mount --page-size {ps} /dev/hugepages"
            ))
        } else {
            Finding::ok("mounts", format!("hugetlbfs {ps}"), paths.join(", "))
        });
    }
    out
}
