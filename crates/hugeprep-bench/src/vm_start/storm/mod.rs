//! `hugeprep bench vm-start --concurrent N`: a boot storm. N VMs start at once, QEMU alone
//! (exec to QMP ready, VM paused) and through libvirt (`virsh create --paused` until it
//! returns, in a private libvirtd with hugeprep's hook; libvirt's cases are those of the
//! one-at-a-time run: `<hugepages/>` + immediate allocation, file-backed with the hook cold,
//! and the hook on the warm pool), their memory prepared four ways, side by side in one run:
//! - **immediate**: each QEMU preallocates a fresh file (`prealloc=on`);
//! - **floor**: fresh files, no preallocation (the VMMs' own start cost);
//! - **warm**: each takes a lease from hugeprep's pool, warm for all N (the lease is inside
//!   the timed span);
//! - **half warm**: the pool is warm for N/2; the other leases are cold, faulted by the
//!   daemon while the warm VMs start.
//!
//! Per case: the time until all N are ready, and each VM's own time to ready (p50, p99 over
//! every VM of every repetition). The pool cannot refill behind the leases while a storm is
//! timed: a mapped, unfaulted file holds every free page the cold leases do not need.
//! Each QEMU started alone runs in a fresh cgroup of its own, made before the storm, so its
//! release between storms is proven and scrubbed as a libvirt host's would be.

mod case;
mod libvirt;
mod qemu;
mod report;
mod world;

use super::{Result, VmStartBenchConfig, VmStartBenchError, Vmm};
use crate::daemon::BenchDaemon;
use crate::turns::turns;
use crate::Summary;
use hugeprep::hugetlb::{MountOptions, OwnedMount, PoolTopUp};
use hugeprep::pool::{PoolPolicy, Verification};
use hugeprep::units::format_bytes;
use hugeprep_testkit::cgroup::VmmCgroups;

pub use case::{Refill, StormCase};
pub use report::{StormCaseResult, StormReport, StormResult};

use super::holdback::Holdback;
use super::libvirt::LibvirtStarter;
use case::label_of;
use world::StormWorld;

/// A storm thread's outcome; a panic is an error of the run, not of the bench process.
fn joined<T>(handle: std::thread::ScopedJoinHandle<'_, Result<T>>) -> Result<T> {
    handle.join().unwrap_or_else(|_| {
        Err(VmStartBenchError::Invalid {
            field: "concurrent",
            reason: "a storm thread panicked".into(),
        })
    })
}

/// Runs the storms of `counts` VMs of `size` each; `log` gets a line per storm.
pub fn run(
    cfg: &VmStartBenchConfig,
    counts: &[usize],
    size: u64,
    with_refill: bool,
    log: &dyn Fn(&str),
) -> Result<StormReport> {
    super::check(cfg)?;
    let load_before = crate::load_average();
    if counts.is_empty() || counts.contains(&0) {
        return Err(VmStartBenchError::Invalid {
            field: "concurrent",
            reason: "give VM counts of at least 1".into(),
        });
    }
    let mut not_measured = Vec::new();
    let mut vmms = cfg.vmms.clone();
    if vmms.contains(&Vmm::CloudHypervisor) {
        log("not measured: cloud-hypervisor: storms start QEMU alone and through libvirt");
        not_measured.push("cloud-hypervisor: storms start QEMU alone and through libvirt".into());
        vmms.retain(|&v| v != Vmm::CloudHypervisor);
    }
    if vmms.contains(&Vmm::LibvirtRoot) {
        let why = "libvirt-root: storms start libvirt's QEMU as the package configures it";
        log(&format!("not measured: {why}"));
        not_measured.push(why.into());
        vmms.retain(|&v| v != Vmm::LibvirtRoot);
    }
    if vmms.contains(&Vmm::Libvirt) {
        if let Err(why) = super::libvirt::tools_present() {
            log(&format!("not measured: libvirt: {why}"));
            not_measured.push(format!("libvirt: {why}"));
            vmms.retain(|&v| v != Vmm::Libvirt);
        }
    }
    let cgroups = super::vmm_cgroups(&vmms, &mut not_measured, log);
    let mut storms = Vec::new();
    let mut skipped = Vec::new();
    for &count in counts {
        for &ps in &cfg.page_sizes {
            if size % ps.bytes() != 0 {
                let why = format!(
                    "{count} x {} on {ps} pages: not a whole number of pages",
                    format_bytes(size)
                );
                log(&format!("skipped {why}"));
                skipped.push(why);
                continue;
            }
            // The warm pool for all, and fresh files for all; the pool's free pages are set
            // aside already, a raise takes the rest from the machine.
            let needed = 2 * count as u64 * size;
            let free = hugeprep::hugetlb::pool::available(None, ps).unwrap_or(0) * ps.bytes();
            let taken = needed.saturating_sub(free);
            if taken > 0 && super::mem_available().is_some_and(|m| m < taken + cfg.headroom) {
                let why = format!(
                    "{count} x {} on {ps} pages: needs {} of hugepages, more than the pool's free pages and the memory available less the headroom",
                    format_bytes(size),
                    format_bytes(needed)
                );
                log(&format!("skipped {why}"));
                skipped.push(why);
                continue;
            }
            match run_count(
                cfg,
                &vmms,
                Shape { count, size, ps },
                with_refill,
                cgroups.as_ref(),
                log,
            ) {
                Ok(results) => storms.extend(results),
                // The kernel could not supply the pages (1G pages, fragmented memory): the
                // other storms' results still stand.
                Err(VmStartBenchError::KernelPool(e)) => {
                    let why = format!("{count} x {} on {ps} pages: {e}", format_bytes(size));
                    log(&format!("skipped {why}"));
                    skipped.push(why);
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(StormReport {
        page_sizes: cfg.page_sizes.clone(),
        threads: cfg.threads,
        reps: cfg.reps,
        with_refill,
        storms,
        skipped,
        not_measured,
        load_average: (load_before, crate::load_average()),
    })
}

/// One storm's shape: how many VMs, each of how many bytes, on which pages.
#[derive(Debug, Clone, Copy)]
struct Shape {
    count: usize,
    size: u64,
    ps: hugeprep::page_size::PageSize,
}

fn run_count(
    cfg: &VmStartBenchConfig,
    vmms: &[Vmm],
    shape: Shape,
    with_refill: bool,
    cgroups: Option<&VmmCgroups>,
    log: &dyn Fn(&str),
) -> Result<Vec<StormResult>> {
    let Shape { count, size, ps } = shape;
    let vm_pages = size / ps.bytes();
    let all_pages = count as u64 * vm_pages;
    let _top_up = PoolTopUp::ensure_free(None, ps, 2 * all_pages)?;
    let scratch = OwnedMount::new_temp(&std::env::temp_dir(), &MountOptions::new(ps))?;
    let pool_mount = OwnedMount::new_temp(&std::env::temp_dir(), &MountOptions::new(ps))?;
    let tmp = super::TempDir::named(&format!("{}-{}", count as u64 * size, ps.name()))?;
    let mut policy = PoolPolicy::embedded();
    policy.set_warm(ps, all_pages * ps.bytes(), vec![size]);
    policy.scrub_bandwidth = None;
    policy.threads = cfg.threads;
    policy.verify = Verification::Sample;
    // The run's top-up holds every page; a raise by the daemon (when the hold-back leaves it
    // no free page) would outlive the run's state directory. BenchDaemon::start turns it off
    // for its own copy; the targets set between cases start from this one.
    policy.reserve.enabled = false;
    let daemon = BenchDaemon::start(&tmp.0, pool_mount.path(), policy.clone(), cfg.plan)?;
    let libvirt = if vmms.contains(&Vmm::Libvirt) {
        log("starting a private libvirtd (about 10 s: it probes QEMU)");
        Some(LibvirtStarter::up_on(
            cfg,
            pool_mount.path(),
            &tmp.0,
            daemon.socket(),
            Vmm::Libvirt,
        )?)
    } else {
        None
    };
    let world = StormWorld {
        libvirt,
        count,
        size,
        ps,
        threads: cfg.threads,
        qemu: cfg.qemu.clone(),
        scratch: scratch.path().to_path_buf(),
        tmp: tmp.0.clone(),
        daemon,
        policy,
        cgroups: cgroups.cloned(),
    };
    // (VMM, case, refill): every case with the free pages held back, and with
    // `--storm-refill` hugeprep's cases again with the pool free to refill behind the leases,
    // with its start gate and without.
    let mut cases: Vec<(StormCase, Refill)> = StormCase::ALL
        .iter()
        .map(|&c| (c, Refill::HeldBack))
        .collect();
    if with_refill {
        for refill in [Refill::Free, Refill::FreeUngated] {
            cases.extend([(StormCase::Warm, refill), (StormCase::HalfWarm, refill)]);
        }
    }
    let runs: Vec<(Vmm, StormCase, Refill)> = vmms
        .iter()
        .flat_map(|&v| cases.iter().map(move |&(c, r)| (v, c, r)))
        .collect();
    let n = runs.len();
    let mut all_ready: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut per_vm: Vec<Vec<f64>> = vec![Vec::new(); n];
    for turn in turns(cfg.reps, n) {
        cfg.check_cancelled()?;
        let (rep, k) = (turn.rep, turn.case);
        let (vmm, case, refill) = runs[k];
        world
            .daemon
            .pool()
            .set_start_gate(refill != Refill::FreeUngated);
        let warm = case.warm_vms(count);
        // Fresh-file cases keep the pool warm for all: it holds the pages the fresh files
        // must not take, and the next warm storm finds it ready.
        world.set_warm(if case == StormCase::HalfWarm {
            warm
        } else {
            count
        })?;
        // Every free page but the cold leases' is held back: no refill during the storm.
        let cold_pages = (count - warm) as u64 * vm_pages;
        let needed = if case == StormCase::Warm || case == StormCase::HalfWarm {
            cold_pages
        } else {
            all_pages
        };
        let free = hugeprep::hugetlb::pool::available(None, ps)?;
        let held = match refill {
            Refill::HeldBack => free.saturating_sub(needed),
            Refill::Free | Refill::FreeUngated => 0,
        };
        let holdback = Holdback::reserve(&world.scratch, held, ps)?;
        let seconds = world.storm(vmm, case, rep * n + k)?;
        drop(holdback);
        let slowest = seconds.iter().copied().fold(0.0, f64::max);
        let label = label_of(case, vmm, cfg.threads, refill);
        let vmm_name = format!("{vmm:?}").to_lowercase();
        log(&format!(
            "{count} x {} {ps} {}  {vmm_name:<8} {label:<36} all ready {slowest:.3} s",
            format_bytes(size),
            turn.when(cfg.reps),
        ));
        if turn.timed {
            all_ready[k].push(slowest);
            per_vm[k].extend(&seconds);
        }
    }
    world.set_warm(0)?;
    drop(world);
    let per_vmm = cases.len();
    let results = vmms
        .iter()
        .enumerate()
        .map(|(v, &vmm)| {
            let base = v * per_vmm;
            let immediate = all_ready[base].clone();
            let floor = all_ready[base + 1].clone();
            let cases = cases
                .iter()
                .enumerate()
                .filter_map(|(c, &(case, refill))| {
                    let k = base + c;
                    let held_back = cases
                        .iter()
                        .position(|&r| r == (case, Refill::HeldBack))
                        .filter(|_| refill != Refill::HeldBack)
                        .map(|h| all_ready[base + h].as_slice());
                    Some(StormCaseResult {
                        case,
                        refill,
                        label: label_of(case, vmm, cfg.threads, refill),
                        all_ready: Summary::of(&all_ready[k])?,
                        all_ready_samples: all_ready[k].clone(),
                        per_vm_p50: Summary::quantile(&per_vm[k], 0.5)?,
                        per_vm_p99: Summary::quantile(&per_vm[k], 0.99)?,
                        over_floor: Summary::paired_ratio(&all_ready[k], &floor),
                        over_immediate: Summary::paired_ratio(&all_ready[k], &immediate),
                        over_held_back: held_back
                            .and_then(|h| Summary::paired_ratio(&all_ready[k], h)),
                    })
                })
                .collect();
            StormResult {
                page_size: ps,
                vmm,
                count,
                vm_bytes: size,
                total_bytes: count as u64 * size,
                cases,
            }
        })
        .collect();
    Ok(results)
}
