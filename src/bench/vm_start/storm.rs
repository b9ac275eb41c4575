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

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::libvirt::LibvirtStarter;
use super::{Case, Result, VmStartBenchConfig, VmStartBenchError, Vmm, SETTLE};
use crate::bench::daemon::BenchDaemon;
use crate::bench::qemu::{self as launcher, QemuConfig, QemuVm};
use crate::bench::Summary;
use crate::client::Client;
use crate::hugetlb::{BackingFile, MountOptions, OwnedMount, PoolTopUp};
use crate::page_size::PageSize;
use crate::pool::{PoolConfig, PoolPolicy, Verification};
use crate::sys::mmap::MmapRegion;
use crate::units::format_bytes;
use crate::vmm::{qemu as handoff, GuestMemoryFile};

/// How long one QEMU of a storm may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// How the memory of a storm's VMs is prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StormCase {
    /// QEMU `prealloc=on` on fresh files.
    Immediate,
    /// Fresh files, no preallocation.
    Floor,
    /// Leases from a pool warm for every VM.
    Warm,
    /// Leases from a pool warm for half of them; the rest cold.
    HalfWarm,
}

impl StormCase {
    /// Every case, in table order.
    pub const ALL: [StormCase; 4] = [
        StormCase::Immediate,
        StormCase::Floor,
        StormCase::Warm,
        StormCase::HalfWarm,
    ];

    /// The row label for `vmm`.
    pub fn label(self, vmm: Vmm, threads: usize) -> String {
        match (vmm, self) {
            (Vmm::Qemu, StormCase::Immediate) => format!("prealloc=on, prealloc-threads={threads}"),
            (Vmm::Qemu, StormCase::Floor) => "file, prealloc=off (floor)".into(),
            (Vmm::Qemu, StormCase::Warm) => "hugeprep, pool warm for all".into(),
            (Vmm::Qemu, StormCase::HalfWarm) => "hugeprep, pool warm for half".into(),
            (Vmm::Libvirt, StormCase::Immediate) => {
                format!("<hugepages/> + immediate, threads={threads}")
            }
            (Vmm::Libvirt, StormCase::Floor) => "file-backed, hook cold (floor)".into(),
            (Vmm::Libvirt, StormCase::Warm) => "hugeprep hook, pool warm for all".into(),
            (Vmm::Libvirt, StormCase::HalfWarm) => "hugeprep hook, pool warm for half".into(),
            // Storms start QEMU alone or through libvirt; `run` leaves cloud-hypervisor out.
            (Vmm::CloudHypervisor, case) => format!("cloud-hypervisor ({case:?}, not stormed)"),
        }
    }

    /// The one-at-a-time run's case with the same domain (libvirt storms reuse its XML).
    fn domain_case(self) -> Case {
        match self {
            StormCase::Immediate => Case::Immediate,
            StormCase::Floor => Case::Floor,
            StormCase::Warm | StormCase::HalfWarm => Case::Hugeprep,
        }
    }

    fn warm_vms(self, count: usize) -> usize {
        match self {
            StormCase::Warm => count,
            StormCase::HalfWarm => count / 2,
            _ => 0,
        }
    }
}

/// One case of one storm size.
#[derive(Debug, Clone, Serialize)]
pub struct StormCaseResult {
    /// The case.
    pub case: StormCase,
    /// Whether the pool was free to refill during the storm (`--storm-refill`); otherwise
    /// the free pages were held back.
    pub refill_free: bool,
    /// Row label.
    pub label: String,
    /// Seconds until every VM was ready, per repetition summarised.
    pub all_ready: Summary,
    /// Every repetition's seconds until all were ready.
    pub all_ready_samples: Vec<f64>,
    /// Median of each VM's seconds to ready, over every VM of every repetition.
    pub per_vm_p50: f64,
    /// 99th percentile of the same.
    pub per_vm_p99: f64,
    /// All-ready time over the floor's (paired per repetition).
    pub over_floor: Option<f64>,
    /// All-ready time over immediate preallocation's (paired per repetition).
    pub over_immediate: Option<f64>,
}

/// One storm size.
#[derive(Debug, Clone, Serialize)]
pub struct StormResult {
    /// How the VMs start: QEMU alone (exec to QMP ready) or libvirt (`virsh create --paused`
    /// until it returns).
    pub vmm: Vmm,
    /// VMs started at once.
    pub count: usize,
    /// Memory of each VM, bytes.
    pub vm_bytes: u64,
    /// Memory of all of them, bytes.
    pub total_bytes: u64,
    /// Per case.
    pub cases: Vec<StormCaseResult>,
}

/// The whole storm run.
#[derive(Debug, Clone, Serialize)]
pub struct StormReport {
    /// Page size.
    pub page_size: PageSize,
    /// QEMU `prealloc-threads` and hugeprep's workers.
    pub threads: usize,
    /// Measured repetitions per case.
    pub reps: usize,
    /// Whether hugeprep's cases ran a second time with the pool free to refill during the
    /// storm (`--storm-refill`); every other storm holds the free pages back.
    pub with_refill: bool,
    /// Per storm size.
    pub storms: Vec<StormResult>,
    /// Storm sizes left out, and why.
    pub skipped: Vec<String>,
    /// What this run does not measure.
    pub not_measured: Vec<String>,
}

/// Maps (without faulting) a file of `pages` pages, so that the kernel's free pages it
/// reserves cannot be taken by a refill while a storm is timed.
struct Holdback {
    _region: Option<MmapRegion>,
    file: Option<BackingFile>,
}

impl Holdback {
    fn reserve(dir: &std::path::Path, pages: u64, ps: PageSize) -> Result<Holdback> {
        if pages == 0 {
            return Ok(Holdback {
                _region: None,
                file: None,
            });
        }
        let path = dir.join("holdback");
        let _ = std::fs::remove_file(&path);
        let file = BackingFile::create(&path, pages * ps.bytes(), ps, None)?;
        match file.map() {
            Ok(region) => Ok(Holdback {
                _region: Some(region),
                file: Some(file),
            }),
            Err(e) => {
                let _ = file.remove();
                Err(e.into())
            }
        }
    }
}

impl Drop for Holdback {
    fn drop(&mut self) {
        self._region = None;
        if let Some(file) = self.file.take() {
            let _ = file.remove();
        }
    }
}

/// One storm's world: scratch mount, pool mount, the daemon (and libvirtd, dropped first).
struct StormWorld {
    libvirt: Option<LibvirtStarter>,
    count: usize,
    size: u64,
    ps: PageSize,
    threads: usize,
    qemu: PathBuf,
    scratch: PathBuf,
    tmp: PathBuf,
    daemon: BenchDaemon,
    policy: PoolPolicy,
}

impl StormWorld {
    fn set_warm(&self, vms: usize) -> Result<()> {
        let mut policy = self.policy.clone();
        policy.set_warm(self.ps, vms as u64 * self.size, vec![self.size]);
        self.daemon.pool().set_policy(policy);
        self.daemon.settle(SETTLE)?;
        // A lowered target is met only once the worker trimmed the files above it.
        let pool = self.daemon.pool();
        let deadline = Instant::now() + SETTLE;
        while !(pool.is_idle()
            && pool
                .status()
                .kinds
                .iter()
                .all(|k| k.warm_bytes == k.target_bytes))
        {
            if Instant::now() > deadline {
                return Err(crate::bench::daemon::BenchDaemonError::Settle {
                    seconds: SETTLE.as_secs(),
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Starts the storm's N VMs at once; returns each VM's seconds to ready (from the common
    /// start) with the VMs and leases given back.
    fn storm(&self, vmm: Vmm, case: StormCase, tag: usize) -> Result<Vec<f64>> {
        match (vmm, &self.libvirt) {
            (Vmm::Libvirt, Some(lv)) => self.storm_libvirt(lv, case, tag),
            _ => self.storm_qemu(case, tag),
        }
    }

    /// N `virsh create --paused` at once; each VM's time is until its virsh returned.
    fn storm_libvirt(&self, lv: &LibvirtStarter, case: StormCase, tag: usize) -> Result<Vec<f64>> {
        lv.set_cold(case == StormCase::Floor)?;
        let uuids: Vec<String> = (0..self.count)
            .map(|i| format!("57a0b007-0000-4000-8000-{:06x}{:06x}", tag % 0x100_0000, i))
            .collect();
        let mut files = Vec::with_capacity(self.count);
        for uuid in &uuids {
            let file = lv.xml_dir().join(format!("storm-{uuid}.xml"));
            std::fs::write(
                &file,
                lv.domain_xml_of(self.size, self.threads, case.domain_case(), uuid),
            )
            .map_err(|source| VmStartBenchError::Io {
                op: "write a storm domain's XML",
                source,
            })?;
            files.push(file.to_string_lossy().into_owned());
        }
        let barrier = Arc::new(Barrier::new(self.count));
        let started = Instant::now();
        let outcomes: Vec<Result<f64>> = std::thread::scope(|s| {
            let handles: Vec<_> = files
                .iter()
                .map(|file| {
                    let barrier = Arc::clone(&barrier);
                    s.spawn(move || {
                        barrier.wait();
                        lv.virsh_ok(&["create", "--paused", file])?;
                        Ok(started.elapsed().as_secs_f64())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(VmStartBenchError::Invalid {
                            field: "concurrent",
                            reason: "a storm thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        // `release end` gives each hook lease back before destroy returns.
        for (uuid, outcome) in uuids.iter().zip(&outcomes) {
            if outcome.is_ok() {
                lv.virsh_ok(&["destroy", uuid])?;
            }
        }
        for file in &files {
            let _ = std::fs::remove_file(file);
        }
        outcomes.into_iter().collect()
    }

    /// N QEMUs at once.
    fn storm_qemu(&self, case: StormCase, tag: usize) -> Result<Vec<f64>> {
        let barrier = Arc::new(Barrier::new(self.count));
        let started = Instant::now();
        let outcomes: Vec<Result<(f64, QemuVm, Option<u64>)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.count)
                .map(|i| {
                    let barrier = Arc::clone(&barrier);
                    s.spawn(move || {
                        barrier.wait();
                        self.one(case, tag, i, started)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(VmStartBenchError::Invalid {
                            field: "concurrent",
                            reason: "a storm thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let client = Client::new(self.daemon.socket());
        let mut seconds = Vec::with_capacity(self.count);
        let mut first_error = None;
        for outcome in outcomes {
            match outcome {
                Ok((secs, vm, lease)) => {
                    seconds.push(secs);
                    vm.quit(Duration::from_secs(10));
                    if let Some(id) = lease {
                        client.blocking(client.release(id))?;
                    }
                }
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        for i in 0..self.count {
            let _ = std::fs::remove_file(self.scratch.join(format!("storm-{tag}-{i}")));
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(seconds),
        }
    }

    /// VM `i` of a storm: its memory prepared for `case`, QEMU started and ready.
    fn one(
        &self,
        case: StormCase,
        tag: usize,
        i: usize,
        started: Instant,
    ) -> Result<(f64, QemuVm, Option<u64>)> {
        let qmp = self.tmp.join(format!("qmp-{i}.sock"));
        match case {
            StormCase::Immediate | StormCase::Floor => {
                let config = QemuConfig {
                    binary: self.qemu.clone(),
                    size: self.size,
                    mem_path: self.scratch.join(format!("storm-{tag}-{i}")),
                    share: true,
                    prealloc: case == StormCase::Immediate,
                    prealloc_threads: self.threads,
                    qmp_socket: qmp,
                };
                let mut vm = QemuVm::spawn(&config)?;
                vm.wait_ready(READY_TIMEOUT)?;
                Ok((started.elapsed().as_secs_f64(), vm, None))
            }
            StormCase::Warm | StormCase::HalfWarm => {
                let client = Client::new(self.daemon.socket());
                let lease = client.blocking(client.lease(&crate::pool::LeaseRequest {
                    recycle: None,
                    name: format!("storm-{tag}-{i}"),
                    size: self.size,
                    page_size: Some(self.ps),
                    node: None,
                    owner: None,
                    pid: None,
                    pin: false,
                }))?;
                let mut args = launcher::vm_args(&qmp);
                args.extend(handoff::machine_args(&GuestMemoryFile {
                    id: "mem0",
                    path: &lease.path,
                    size: lease.size,
                    node: Some(lease.node),
                }));
                let ready = QemuVm::spawn_args(&self.qemu, &args, &qmp).and_then(|mut vm| {
                    vm.wait_ready(READY_TIMEOUT)?;
                    Ok(vm)
                });
                match ready {
                    Ok(vm) => Ok((started.elapsed().as_secs_f64(), vm, Some(lease.id))),
                    Err(e) => {
                        let _ = client.blocking(client.release(lease.id));
                        Err(e.into())
                    }
                }
            }
        }
    }
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
    if vmms.contains(&Vmm::Libvirt) {
        if let Err(why) = super::libvirt::tools_present() {
            log(&format!("not measured: libvirt: {why}"));
            not_measured.push(format!("libvirt: {why}"));
            vmms.retain(|&v| v != Vmm::Libvirt);
        }
    }
    let mut storms = Vec::new();
    let mut skipped = Vec::new();
    for &count in counts {
        // The warm pool for all, and fresh files for all.
        let needed = 2 * count as u64 * size;
        if super::mem_available().is_some_and(|m| m < needed + cfg.headroom) {
            let why = format!(
                "{count} x {}: needs {} of hugepages, more than the memory available less the headroom",
                format_bytes(size),
                format_bytes(needed)
            );
            log(&format!("skipped {why}"));
            skipped.push(why);
            continue;
        }
        storms.extend(run_count(cfg, &vmms, count, size, with_refill, log)?);
    }
    Ok(StormReport {
        page_size: cfg.page_size,
        threads: cfg.threads,
        reps: cfg.reps,
        with_refill,
        storms,
        skipped,
        not_measured,
    })
}

fn run_count(
    cfg: &VmStartBenchConfig,
    vmms: &[Vmm],
    count: usize,
    size: u64,
    with_refill: bool,
    log: &dyn Fn(&str),
) -> Result<Vec<StormResult>> {
    let ps = cfg.page_size;
    let vm_pages = size / ps.bytes();
    let all_pages = count as u64 * vm_pages;
    let _top_up = PoolTopUp::ensure_free(None, ps, 2 * all_pages)?;
    let scratch = OwnedMount::new_temp(&std::env::temp_dir(), &MountOptions::new(ps))?;
    let pool_mount = OwnedMount::new_temp(&std::env::temp_dir(), &MountOptions::new(ps))?;
    let tmp = super::TempDir::new(count as u64 * size)?;
    let mut policy = PoolPolicy::embedded();
    policy.set_warm(ps, all_pages * ps.bytes(), vec![size]);
    policy.scrub_bandwidth = None;
    policy.threads = cfg.threads;
    policy.verify = Verification::Sample;
    // The run's top-up holds every page; a raise by the daemon (when the hold-back leaves it
    // no free page) would outlive the run's state directory. BenchDaemon::start turns it off
    // for its own copy; the targets set between cases start from this one.
    policy.reserve.enabled = false;
    let daemon = BenchDaemon::start(
        PoolConfig {
            state_dir: tmp.0.join("state"),
            mounts: vec![pool_mount.path().to_path_buf()],
            policy: policy.clone(),
            plan: cfg.plan,
        },
        &tmp.0.join("hugeprep.sock"),
    )?;
    let libvirt = if vmms.contains(&Vmm::Libvirt) {
        log("starting a private libvirtd (about 10 s: it probes QEMU)");
        Some(LibvirtStarter::up_on(
            cfg,
            pool_mount.path(),
            &tmp.0,
            daemon.socket(),
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
    };
    // (VMM, case, refill free): every case with the free pages held back, and with
    // `--storm-refill` hugeprep's cases again with the pool free to refill behind the leases.
    let mut cases: Vec<(StormCase, bool)> = StormCase::ALL.iter().map(|&c| (c, false)).collect();
    if with_refill {
        cases.extend([(StormCase::Warm, true), (StormCase::HalfWarm, true)]);
    }
    let runs: Vec<(Vmm, StormCase, bool)> = vmms
        .iter()
        .flat_map(|&v| cases.iter().map(move |&(c, r)| (v, c, r)))
        .collect();
    let n = runs.len();
    let mut all_ready: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut per_vm: Vec<Vec<f64>> = vec![Vec::new(); n];
    for (rep, timed) in std::iter::once((0, false)).chain((0..cfg.reps).map(|r| (r, true))) {
        for i in 0..n {
            if cfg
                .cancel
                .as_ref()
                .is_some_and(|c| c.load(Ordering::Relaxed))
            {
                return Err(VmStartBenchError::Cancelled);
            }
            let k = if timed { (rep + i) % n } else { i };
            let (vmm, case, refill_free) = runs[k];
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
            let free = crate::hugetlb::pool::available(None, ps)?;
            let held = if refill_free {
                0
            } else {
                free.saturating_sub(needed)
            };
            let holdback = Holdback::reserve(&world.scratch, held, ps)?;
            let seconds = world.storm(vmm, case, rep * n + k)?;
            drop(holdback);
            let slowest = seconds.iter().copied().fold(0.0, f64::max);
            let label = label_of(case, vmm, cfg.threads, refill_free);
            let vmm_name = format!("{vmm:?}").to_lowercase();
            if timed {
                all_ready[k].push(slowest);
                per_vm[k].extend(&seconds);
                log(&format!(
                    "{count} x {} rep {}/{}  {vmm_name:<8} {label:<36} all ready {slowest:.3} s",
                    format_bytes(size),
                    rep + 1,
                    cfg.reps
                ));
            } else {
                log(&format!(
                    "{count} x {} warm-up  {vmm_name:<8} {label:<36} all ready {slowest:.3} s",
                    format_bytes(size)
                ));
            }
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
                .filter_map(|(c, &(case, refill_free))| {
                    let k = base + c;
                    Some(StormCaseResult {
                        case,
                        refill_free,
                        label: label_of(case, vmm, cfg.threads, refill_free),
                        all_ready: Summary::of(&all_ready[k])?,
                        all_ready_samples: all_ready[k].clone(),
                        per_vm_p50: Summary::quantile(&per_vm[k], 0.5)?,
                        per_vm_p99: Summary::quantile(&per_vm[k], 0.99)?,
                        over_floor: Summary::paired_ratio(&all_ready[k], &floor),
                        over_immediate: Summary::paired_ratio(&all_ready[k], &immediate),
                    })
                })
                .collect();
            StormResult {
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

fn label_of(case: StormCase, vmm: Vmm, threads: usize, refill_free: bool) -> String {
    let label = case.label(vmm, threads);
    if refill_free {
        format!("{label}, refill free")
    } else {
        label
    }
}

impl StormReport {
    /// The table: per storm size and case, all-ready median and range, per-VM p50/p99, and
    /// the ratios to the floor and to immediate preallocation.
    pub fn table(&self) -> String {
        let mut out = format!(
            "boot storm: N VMs at once (QEMU alone: exec to QMP ready; libvirt: virsh create --paused returned), {} pages, {} threads, {} reps; free pages held back unless a row says \"refill free\"\n",
            self.page_size,
            self.threads,
            self.reps,
        );
        for s in &self.storms {
            out.push_str(&format!(
                "\n{} VMs x {} ({} in all), {}\n{:<44} {:>22} {:>9} {:>9} {:>8} {:>8}\n",
                s.count,
                format_bytes(s.vm_bytes),
                format_bytes(s.total_bytes),
                format!("{:?}", s.vmm).to_lowercase(),
                "case",
                "all ready s (range)",
                "vm p50",
                "vm p99",
                "/floor",
                "/immed."
            ));
            for c in &s.cases {
                let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}x"));
                out.push_str(&format!(
                    "{:<44} {:>7.3} ({:.3}-{:.3}) {:>9.3} {:>9.3} {:>8} {:>8}\n",
                    c.label,
                    c.all_ready.median,
                    c.all_ready.min,
                    c.all_ready.max,
                    c.per_vm_p50,
                    c.per_vm_p99,
                    ratio(c.over_floor),
                    ratio(c.over_immediate)
                ));
            }
        }
        for s in &self.skipped {
            out.push_str(&format!("skipped: {s}\n"));
        }
        for s in &self.not_measured {
            out.push_str(&format!("not measured: {s}\n"));
        }
        out
    }
}
