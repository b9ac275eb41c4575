//! `hugeprep bench vm-start`: how long a VM takes to start with its memory prepared four
//! ways, side by side in one run, for several memory sizes.
//!
//! The cases, for QEMU alone (exec to QMP ready, VM paused), through libvirt (`virsh
//! start` to running) and for cloud-hypervisor (exec to the tiny guest's first report; it
//! runs the first three, `prefault=on` as its immediate):
//! - **immediate**: the VMM preallocates (QEMU `prealloc=on,prealloc-threads=N` on a fresh
//!   hugetlbfs file; libvirt `<hugepages/>` with `<allocation mode='immediate' threads='N'/>`):
//!   the kernel faults and zeroes every page on the start path;
//! - **floor**: file-backed memory with no preallocation: the VMM's own start cost, nothing
//!   of the memory (the guest would fault it later, while it runs);
//! - **hugeprep**: a lease from hugeprep's warm pool (over the API, inside the timed span),
//!   handed over with `qemu-args` or the libvirt hook;
//! - **immediate on a lease**: immediate preallocation over a pre-faulted lease: the VMM
//!   touches pages that are already present.
//!
//! Every case runs once untimed first (the first touch of guest-physical memory is ~25x
//! slower), then the cases alternate within each repetition (the first one rotates), and the
//! report gives median and range per case and, per repetition, the share of the memory
//! preparation hugeprep takes off the start: `(T_immediate - T_hugeprep) / (T_immediate -
//! T_floor)`.
//!
//! Per size the run tops the kernel's pool up by what it needs (the warm pool plus one fresh
//! file) and gives it back after; the daemon runs in-process on its own hugetlbfs, limited
//! to the warm target so the pool does not refill behind a lease while a start is timed.
//!
//! Each QEMU or cloud-hypervisor the run starts itself runs in a fresh cgroup of its own
//! ([`hugeprep_testkit::cgroup`]), as libvirt runs each QEMU in its machine cgroup: its release
//! is then proven unreachable and scrubbed in place, the path "release to warm" times.

mod cloud_hypervisor;
mod holdback;
pub mod hotplug;
mod libvirt;
pub mod migrate;
mod qemu;
mod report;
pub mod storm;
mod table;
mod world;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::daemon::BenchDaemonError;
use super::turns::turns;
use holdback::Holdback;
use hugeprep::clear::ClearPlan;
use hugeprep::client::ClientError;
use hugeprep::hugetlb::{FileError, MountError, PoolError};
use hugeprep::page_size::PageSize;
use hugeprep_testkit::cgroup::{VmmCgroup, VmmCgroupError, VmmCgroups};
use hugeprep_testkit::qemu::QemuError;

pub use report::{CaseResult, Saving, SizeResult, VmStartReport, WarmBreakdown};
pub(crate) use world::World;
use world::{page_world, top_up, PageWorld, TempDir};

/// How long the warm pool may take to settle between starts (a liveness bound).
const SETTLE: Duration = Duration::from_secs(120);

/// What to measure.
#[derive(Debug, Clone)]
pub struct VmStartBenchConfig {
    /// Guest memory sizes.
    pub sizes: Vec<u64>,
    /// Page sizes: every case runs on each, side by side in the same repetitions.
    pub page_sizes: Vec<PageSize>,
    /// QEMU `prealloc-threads`, libvirt `<allocation threads=>` and hugeprep's workers.
    pub threads: usize,
    /// Measured repetitions per case (after one warm-up start of each).
    pub reps: usize,
    /// The QEMU binary.
    pub qemu: PathBuf,
    /// The cloud-hypervisor binary (v53; `None`: its cases are not measured).
    pub cloud_hypervisor: Option<PathBuf>,
    /// The VMMs to measure.
    pub vmms: Vec<Vmm>,
    /// The `hugeprep` binary libvirt runs as its hook (`libvirt-hook`).
    pub hook_binary: PathBuf,
    /// How hugeprep's pool clears.
    pub plan: ClearPlan,
    /// Bytes of memory to leave to the rest of the machine: a size needing more is skipped.
    pub headroom: u64,
    /// Checked between starts; when set the benchmark stops, cleans up and fails.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// The VMM a case starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Vmm {
    /// QEMU alone: exec to QMP ready.
    Qemu,
    /// libvirt: `virsh start` to running, QEMU run as the distribution's package
    /// configures it (unprivileged: `libvirt-qemu` on Debian).
    Libvirt,
    /// The same with QEMU run as root (qemu.conf `user = "root"`), beside it.
    LibvirtRoot,
    /// cloud-hypervisor: exec to the guest's first serial report.
    CloudHypervisor,
}

impl Vmm {
    /// Whether it is started through libvirt.
    pub fn is_libvirt(self) -> bool {
        matches!(self, Vmm::Libvirt | Vmm::LibvirtRoot)
    }

    /// Its short name in tables and logs.
    pub fn name(self) -> &'static str {
        match self {
            Vmm::Qemu => "qemu",
            Vmm::Libvirt => "libvirt",
            Vmm::LibvirtRoot => "libvirt-root",
            Vmm::CloudHypervisor => "ch",
        }
    }
}

/// How the memory is prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Case {
    /// The VMM preallocates fresh hugepages.
    Immediate,
    /// File-backed, no preallocation.
    Floor,
    /// A warm lease from hugeprep.
    Hugeprep,
    /// The VMM preallocates over a pre-faulted lease.
    ImmediateOnLease,
    /// A warm lease, mapped with `discard-data=on` (libvirt `<discard/>`, as OpenStack Nova
    /// sets it): QEMU punches the pages out when it stops, and the pool refills them.
    HugeprepDiscard,
    /// QEMU alone, with `qemu-args`' options, on a file whose pages are all present but that
    /// hugeprep never leased (faulted by the bench, untimed): the start's cost of mapping
    /// present pages, without the lease call and the watched open (the warm-start breakdown).
    Present,
}

impl Case {
    /// Every case, in table order.
    pub const ALL: [Case; 5] = [
        Case::Immediate,
        Case::Floor,
        Case::Hugeprep,
        Case::ImmediateOnLease,
        Case::HugeprepDiscard,
    ];

    /// QEMU alone's cases: every case, and the present file of the warm-start breakdown.
    pub const QEMU: [Case; 6] = [
        Case::Immediate,
        Case::Floor,
        Case::Present,
        Case::Hugeprep,
        Case::ImmediateOnLease,
        Case::HugeprepDiscard,
    ];

    /// The cases QEMU-as-root is compared on beside the unprivileged QEMU.
    pub const ROOT: [Case; 3] = [Case::Immediate, Case::Floor, Case::Hugeprep];

    /// Whether the VM's memory is a hugeprep lease.
    pub fn leased(self) -> bool {
        matches!(
            self,
            Case::Hugeprep | Case::ImmediateOnLease | Case::HugeprepDiscard
        )
    }

    /// The row label for `vmm`.
    pub fn label(self, vmm: Vmm, threads: usize) -> String {
        match (vmm, self) {
            (Vmm::Qemu, Case::Immediate) => format!("prealloc=on, prealloc-threads={threads}"),
            (Vmm::Qemu, Case::Floor) => "file, prealloc=off (floor)".into(),
            (Vmm::Qemu, Case::Hugeprep) => "hugeprep warm lease, qemu-args".into(),
            (Vmm::Qemu, Case::ImmediateOnLease) => "prealloc=on over a warm lease".into(),
            (Vmm::Qemu, Case::HugeprepDiscard) => "hugeprep warm lease, discard-data=on".into(),
            (Vmm::Qemu, Case::Present) => "present file, not leased, qemu-args".into(),
            (_, Case::Present) => "(not run)".into(),
            (Vmm::Libvirt | Vmm::LibvirtRoot, Case::Immediate) => {
                format!("<hugepages/> + immediate, threads={threads}")
            }
            (Vmm::Libvirt | Vmm::LibvirtRoot, Case::Floor) => {
                "file-backed, hook cold (floor)".into()
            }
            (Vmm::Libvirt | Vmm::LibvirtRoot, Case::Hugeprep) => "hugeprep hook, warm pool".into(),
            (Vmm::Libvirt | Vmm::LibvirtRoot, Case::ImmediateOnLease) => {
                "file-backed immediate over a lease".into()
            }
            (Vmm::Libvirt | Vmm::LibvirtRoot, Case::HugeprepDiscard) => {
                "hugeprep hook, <discard/>".into()
            }
            (Vmm::CloudHypervisor, Case::Immediate) => "hugepages=on, prefault=on".into(),
            (Vmm::CloudHypervisor, Case::Floor) => "hugepages=on, prefault=off (floor)".into(),
            (Vmm::CloudHypervisor, Case::Hugeprep) => "hugeprep warm lease, ch-args".into(),
            (Vmm::CloudHypervisor, Case::ImmediateOnLease | Case::HugeprepDiscard) => {
                "(not run)".into()
            }
        }
    }
}

/// Errors running the benchmark; each keeps the failing layer's own error.
#[derive(Debug, thiserror::Error)]
pub enum VmStartBenchError {
    /// A setting is out of range.
    #[error("bench vm-start: --{field}: {reason}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A benchmark hugetlbfs could not be mounted.
    #[error("bench vm-start: {0}")]
    Mount(#[from] MountError),
    /// The reservation that keeps the pool from refilling failed.
    #[error("bench vm-start: {0}")]
    File(#[from] FileError),
    /// The kernel's pool could not be read or raised.
    #[error("bench vm-start: {0}")]
    KernelPool(#[from] PoolError),
    /// The in-process daemon failed.
    #[error("bench vm-start: {0}")]
    Daemon(#[from] BenchDaemonError),
    /// The libvirt sandbox failed.
    #[error("bench vm-start: libvirt: {0}")]
    Libvirt(#[from] hugeprep::vmm::libvirt::sandbox::SandboxError),
    /// A `virsh` command failed.
    #[error("bench vm-start: {command}: {stderr}")]
    Virsh {
        /// The command.
        command: String,
        /// What virsh said.
        stderr: String,
    },
    /// A lease over the API failed.
    #[error("bench vm-start: {0}")]
    Client(#[from] ClientError),
    /// QEMU failed.
    #[error("bench vm-start: {0}")]
    Qemu(#[from] QemuError),
    /// A VMM's cgroup could not be made.
    #[error("bench vm-start: {0}")]
    Cgroup(#[from] VmmCgroupError),
    /// A directory or file of the run could not be made.
    #[error("bench vm-start: {op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// Interrupted.
    #[error("bench vm-start: interrupted; everything the benchmark took was given back")]
    Cancelled,
}

type Result<T> = std::result::Result<T, VmStartBenchError>;

/// A way to start VMs: the cases it can run and one timed start.
pub(crate) trait Starter {
    /// Which VMM.
    fn vmm(&self) -> Vmm;
    /// The cases it runs.
    fn cases(&self) -> &'static [Case] {
        &Case::ALL
    }
    /// Starts a VM of `case` and returns the seconds to ready; the VM is stopped and every
    /// lease and file of it given back before it returns.
    fn start(&mut self, world: &World, case: Case, tag: &str) -> Result<f64>;
    /// Seconds the last start spent in the lease call over the API, when it made one (the
    /// warm-start breakdown); `None` where the lease is not timed apart.
    fn last_lease_seconds(&self) -> Option<f64> {
        None
    }
}

/// A fresh cgroup in `cgroups`, if any.
fn vmm_cgroup(cgroups: Option<&VmmCgroups>, tag: &str) -> Result<Option<VmmCgroup>> {
    Ok(cgroups.map(|c| c.fresh(tag)).transpose()?)
}

/// Where the run's VMMs get cgroups of their own; without a usable cgroup v2 hierarchy,
/// says once (in `log` and `not_measured`) that recycling is not measured: every release
/// then takes the kernel's path.
fn vmm_cgroups(
    vmms: &[Vmm],
    not_measured: &mut Vec<String>,
    log: &dyn Fn(&str),
) -> Option<VmmCgroups> {
    // libvirt puts its QEMUs in machine cgroups of its own; only the VMMs the run starts
    // itself need one from it.
    if vmms.iter().all(|v| v.is_libvirt()) {
        return None;
    }
    match VmmCgroups::usable() {
        Ok(cgroups) => Some(cgroups),
        Err(e) => {
            let why = format!("recycling: {e}; each release takes the kernel's path");
            log(&format!("not measured: {why}"));
            not_measured.push(why);
            None
        }
    }
}

impl VmStartBenchConfig {
    /// `Err(Cancelled)` once [`VmStartBenchConfig::cancel`] is set: checked before each run.
    fn check_cancelled(&self) -> Result<()> {
        match &self.cancel {
            Some(c) if c.load(Ordering::Relaxed) => Err(VmStartBenchError::Cancelled),
            _ => Ok(()),
        }
    }
}

fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

fn check(cfg: &VmStartBenchConfig) -> Result<()> {
    let invalid = |field, reason: String| Err(VmStartBenchError::Invalid { field, reason });
    if cfg.reps == 0 {
        return invalid("reps", "must be at least 1".into());
    }
    if cfg.threads == 0 {
        return invalid("threads", "must be at least 1".into());
    }
    if cfg.sizes.is_empty() {
        return invalid("sizes", "give at least one size".into());
    }
    if cfg.page_sizes.is_empty() {
        return invalid("page-size", "give at least one page size".into());
    }
    // Every size fits the smallest page size asked for; a larger page size that does not
    // divide a size is left out of that size (listed as skipped).
    let smallest = cfg.page_sizes.iter().copied().min_by_key(|p| p.bytes());
    for &size in &cfg.sizes {
        if let Some(ps) = smallest {
            if hugeprep::hugetlb::check_size(size, ps).is_err() || size < (2 << 20) {
                return invalid(
                    "sizes",
                    format!(
                        "{size} is not a positive multiple of the {ps} page size of at least \
                         2 MiB (--page-size {ps})"
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Runs the benchmark; `log` gets a line per start.
pub fn run(cfg: &VmStartBenchConfig, log: &dyn Fn(&str)) -> Result<VmStartReport> {
    check(cfg)?;
    let load_before = crate::load_average();
    let mut not_measured = Vec::new();
    let mut vmms = cfg.vmms.clone();
    if vmms.iter().any(|v| v.is_libvirt()) {
        if let Err(why) = libvirt::tools_present() {
            log(&format!("not measured: libvirt: {why}"));
            not_measured.push(format!("libvirt: {why}"));
            vmms.retain(|v| !v.is_libvirt());
        }
    }
    if vmms.contains(&Vmm::CloudHypervisor) && cfg.cloud_hypervisor.is_none() {
        let why = "cloud-hypervisor: no binary (--cloud-hypervisor)";
        log(&format!("not measured: {why}"));
        not_measured.push(why.to_string());
        vmms.retain(|&v| v != Vmm::CloudHypervisor);
    }
    let cgroups = vmm_cgroups(&vmms, &mut not_measured, log);
    let mut sizes = Vec::new();
    let mut skipped = Vec::new();
    for &size in &cfg.sizes {
        if let Some(result) = run_size(cfg, &vmms, size, cgroups.as_ref(), &mut skipped, log)? {
            sizes.push(result);
        }
    }
    Ok(report::report(
        cfg,
        &vmms,
        not_measured,
        sizes,
        skipped,
        load_before,
    ))
}

/// One size on every page size the machine has pages for, their cases interleaved; `None`
/// when no page size could be had (each reason in `skipped`).
fn run_size(
    cfg: &VmStartBenchConfig,
    vmms: &[Vmm],
    size: u64,
    cgroups: Option<&VmmCgroups>,
    skipped: &mut Vec<String>,
    log: &dyn Fn(&str),
) -> Result<Option<SizeResult>> {
    let size_name = hugeprep::units::format_bytes(size);
    // Gigantic pages first: their free pages are set aside already, and a 2M top-up after
    // them sees the memory that is left.
    let mut order = cfg.page_sizes.clone();
    order.sort_by_key(|ps| std::cmp::Reverse(ps.bytes()));
    let mut worlds: Vec<PageWorld> = Vec::new();
    for ps in order {
        if size % ps.bytes() != 0 {
            let why = format!("{size_name} on {ps} pages: not a whole number of pages");
            log(&format!("skipped {why}"));
            skipped.push(why);
            continue;
        }
        let (top_up, one_copy) = match top_up(cfg, size, ps) {
            Ok(t) => t,
            Err(why) => {
                let why = format!("{size_name} on {ps} pages: {why}");
                log(&format!("skipped {why}"));
                skipped.push(why);
                continue;
            }
        };
        if one_copy {
            log(&format!(
                "{size_name} on {ps} pages: the machine holds one copy only: the pool is emptied (untimed) before each fresh-file case and refilled after it"
            ));
        }
        worlds.push(page_world(cfg, size, ps, top_up, one_copy, cgroups)?);
    }
    worlds.sort_by_key(|w| cfg.page_sizes.iter().position(|&p| p == w.world.page_size));
    if worlds.is_empty() {
        return Ok(None);
    }
    let mut starters: Vec<(usize, Box<dyn Starter>)> = Vec::new();
    for (w, pw) in worlds.iter().enumerate() {
        for vmm in vmms {
            starters.push((
                w,
                match vmm {
                    Vmm::Qemu => Box::new(qemu::QemuStarter::new(cfg)),
                    Vmm::Libvirt | Vmm::LibvirtRoot => {
                        log(&format!(
                            "starting a private libvirtd, QEMU as {} (about 10 s: it probes QEMU)",
                            if *vmm == Vmm::LibvirtRoot {
                                "root"
                            } else {
                                "the package configures it"
                            }
                        ));
                        Box::new(libvirt::LibvirtStarter::up(cfg, &pw.world, *vmm)?)
                    }
                    Vmm::CloudHypervisor => match &cfg.cloud_hypervisor {
                        Some(binary) => Box::new(cloud_hypervisor::ChStarter::new(binary)),
                        None => continue,
                    },
                },
            ));
        }
    }
    let runs: Vec<(usize, Case)> = starters
        .iter()
        .enumerate()
        .flat_map(|(s, (_, starter))| starter.cases().iter().map(move |&c| (s, c)))
        .collect();
    let mut samples = vec![Vec::with_capacity(cfg.reps); runs.len()];
    let mut recycles = vec![Vec::with_capacity(cfg.reps); runs.len()];
    let mut lease_calls = vec![Vec::with_capacity(cfg.reps); runs.len()];
    for turn in turns(cfg.reps, runs.len()) {
        cfg.check_cancelled()?;
        let (rep, k) = (turn.rep, turn.case);
        let (s, case) = runs[k];
        let (w, starter) = &mut starters[s];
        let world = &worlds[*w].world;
        let (ps, one_copy) = (world.page_size, world.one_copy);
        // The fresh pages stay reserved while hugeprep's cases run: the pool cannot
        // refill behind the lease while the start is timed (with one copy there are none
        // to refill with).
        let held = if case.leased() && !one_copy {
            size / ps.bytes()
        } else {
            0
        };
        let holdback = Holdback::reserve(&world.scratch, held, ps)?;
        if one_copy && !case.leased() {
            world.set_warm(&world.policy, 0)?;
        }
        let seconds = starter.start(world, case, &format!("{rep}-{k}"))?;
        let lease_call = starter.last_lease_seconds();
        if one_copy && !case.leased() {
            world.set_warm(&world.policy, size)?;
        }
        // The lease was released as the VM stopped: until the pool is warm again is
        // what recycling it costs (a scrub, or a refill of what QEMU punched out).
        let released = std::time::Instant::now();
        world.settle()?;
        let recycle = released.elapsed().as_secs_f64();
        drop(holdback);
        let label = case.label(starter.vmm(), cfg.threads);
        let vmm = starter.vmm().name();
        let when = turn.when(cfg.reps);
        log(&format!(
            "{size_name} {ps} {when}  {vmm:<8} {label:<44} {seconds:.3} s"
        ));
        if turn.timed {
            samples[k].push(seconds);
            recycles[k].push(recycle);
            lease_calls[k].extend(lease_call);
        }
    }
    let runs: Vec<report::Run> = runs
        .iter()
        .map(|&(s, case)| report::Run {
            page_size: worlds[starters[s].0].world.page_size,
            vmm: starters[s].1.vmm(),
            case,
        })
        .collect();
    drop(starters);
    drop(worlds);
    Ok(Some(report::size_result(
        size,
        cfg.threads,
        &runs,
        samples,
        recycles,
        lease_calls,
    )))
}
