//! `hugeprep bench vm-start --hotplug`: memory hot-plug into a running QEMU (paused, KVM,
//! q35 with `slots`/`maxmem` and a free PCIe root port), timed from the first QMP command
//! (hugeprep: the lease request) until `device_add` returned, the memory prepared four ways
//! side by side in one run:
//! - **hugeprep**: a warm lease, plugged as a `pc-dimm` with what `hugeprep hotplug-args`
//!   prints;
//! - **prealloc**: a fresh file, `prealloc=on,prealloc-threads=N`, as a `pc-dimm`;
//! - **floor**: a fresh file, no preallocation, as a `pc-dimm`;
//! - **hugeprep virtio-mem**: a warm lease as a `virtio-mem-pci` (QEMU discards the backend
//!   as it realizes the device, so the lease's pages go back to the kernel: shown, not a win).
//!
//! QEMU starts untimed before each plug and quits after it; the lease is then released and
//! the pool settles before the next case.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::holdback::Holdback;
use super::table;
use super::world::page_world;
use super::{check, Result, VmStartBenchConfig, World};
use crate::turns::turns;
use crate::Summary;
use hugeprep::client::Client;
use hugeprep::page_size::PageSize;
use hugeprep::units::format_bytes;
use hugeprep::vmm::qemu_hotplug::{self, Hotplug, HotplugDevice};
use hugeprep::vmm::GuestMemoryFile;
use hugeprep_testkit::qemu::{vm_args, QemuVm};

/// The target: a warm plug takes at most this share of `prealloc=on`'s time.
pub const TARGET: f64 = 0.10;

const LIMIT: Duration = Duration::from_secs(300);

/// How the plugged memory is prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HotplugCase {
    /// A warm lease as a pc-dimm.
    Hugeprep,
    /// A fresh file with `prealloc=on` as a pc-dimm.
    Prealloc,
    /// A fresh file without preallocation as a pc-dimm.
    Floor,
    /// A warm lease as a virtio-mem-pci.
    HugeprepVirtioMem,
}

impl HotplugCase {
    /// Every case, in table order.
    pub const ALL: [HotplugCase; 4] = [
        HotplugCase::Hugeprep,
        HotplugCase::Prealloc,
        HotplugCase::Floor,
        HotplugCase::HugeprepVirtioMem,
    ];

    /// The row label.
    pub fn label(self, threads: usize) -> String {
        match self {
            HotplugCase::Hugeprep => "hugeprep warm lease, pc-dimm".into(),
            HotplugCase::Prealloc => format!("pc-dimm, prealloc=on, prealloc-threads={threads}"),
            HotplugCase::Floor => "pc-dimm, prealloc=off (floor)".into(),
            HotplugCase::HugeprepVirtioMem => "hugeprep lease, virtio-mem-pci (discards)".into(),
        }
    }
}

/// One case at one size.
#[derive(Debug, Clone, Serialize)]
pub struct HotplugCaseResult {
    /// The case.
    pub case: HotplugCase,
    /// Row label.
    pub label: String,
    /// Seconds to plug, median and range.
    pub seconds: Summary,
    /// Every repetition's seconds.
    pub samples: Vec<f64>,
}

/// One size on one page size.
#[derive(Debug, Clone, Serialize)]
pub struct HotplugResult {
    /// Plugged bytes.
    pub size: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Per case.
    pub cases: Vec<HotplugCaseResult>,
    /// hugeprep's time over prealloc's, paired per repetition.
    pub hugeprep_over_prealloc: Option<Summary>,
    /// hugeprep's time minus the floor's, seconds, paired per repetition.
    pub hugeprep_above_floor: Option<Summary>,
    /// The median of `hugeprep_over_prealloc` is at most [`TARGET`].
    pub target_met: bool,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct HotplugReport {
    /// QEMU `prealloc-threads` and hugeprep's workers.
    pub threads: usize,
    /// Measured repetitions per case.
    pub reps: usize,
    /// QEMU's version line.
    pub qemu_version: Option<String>,
    /// Per size and page size.
    pub results: Vec<HotplugResult>,
    /// Sizes left out, and why.
    pub skipped: Vec<String>,
    /// The machine's 1-minute load average before and after the run.
    pub load_average: (Option<f64>, Option<f64>),
}

/// Runs the plugs; `log` gets a line per plug and per skipped size.
pub fn run(
    cfg: &VmStartBenchConfig,
    pairs: &[(u64, PageSize)],
    log: &dyn Fn(&str),
) -> Result<HotplugReport> {
    check(cfg)?;
    let load_before = crate::load_average();
    let mut not_measured = Vec::new();
    let cgroups = super::vmm_cgroups(&[super::Vmm::Qemu], &mut not_measured, log);
    let mut results = Vec::new();
    let mut skipped = not_measured;
    for &(size, ps) in pairs {
        let name = format!("{} on {ps} pages", format_bytes(size));
        if size % ps.bytes() != 0 {
            table::skip(
                &mut skipped,
                log,
                format!("{name}: not a whole number of pages"),
            );
            continue;
        }
        let (top_up, one_copy) = match super::world::top_up(cfg, size, ps) {
            Ok((t, false)) => (t, false),
            Ok((_, true)) => {
                table::skip(&mut skipped, log, format!("{name}: the machine holds one copy only (warm pool and a fresh file are needed)"));
                continue;
            }
            Err(why) => {
                table::skip(&mut skipped, log, format!("{name}: {why}"));
                continue;
            }
        };
        let pw = page_world(cfg, size, ps, top_up, one_copy, cgroups.as_ref())?;
        results.push(run_world(cfg, &pw.world, log)?);
    }
    Ok(HotplugReport {
        threads: cfg.threads,
        reps: cfg.reps,
        qemu_version: hugeprep_testkit::qemu::version(&cfg.qemu),
        results,
        skipped,
        load_average: (load_before, crate::load_average()),
    })
}

fn run_world(cfg: &VmStartBenchConfig, world: &World, log: &dyn Fn(&str)) -> Result<HotplugResult> {
    let name = format!("{} {}", format_bytes(world.size), world.page_size);
    let cases = HotplugCase::ALL;
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(cfg.reps); cases.len()];
    for turn in turns(cfg.reps, cases.len()) {
        cfg.check_cancelled()?;
        let case = cases[turn.case];
        let leased = matches!(case, HotplugCase::Hugeprep | HotplugCase::HugeprepVirtioMem);
        let held = if leased {
            world.size / world.page_size.bytes()
        } else {
            0
        };
        let holdback = Holdback::reserve(&world.scratch, held, world.page_size)?;
        let tag = format!("{}-{}", turn.rep, turn.case);
        let seconds = plug_once(cfg, world, case, &tag)?;
        world.settle()?;
        drop(holdback);
        log(&format!(
            "{name} {:<8} {:<44} {seconds:.4} s",
            turn.when(cfg.reps),
            case.label(world.threads)
        ));
        if turn.timed {
            samples[turn.case].push(seconds);
        }
    }
    let of = |c: HotplugCase| table::samples_of(&cases, &samples, c);
    let hp = of(HotplugCase::Hugeprep);
    let over = table::paired(hp, of(HotplugCase::Prealloc), |a, b| a / b);
    let above = table::paired(hp, of(HotplugCase::Floor), |a, b| a - b);
    Ok(HotplugResult {
        size: world.size,
        page_size: world.page_size,
        cases: cases
            .iter()
            .zip(&samples)
            .filter_map(|(&case, s)| {
                Some(HotplugCaseResult {
                    case,
                    label: case.label(world.threads),
                    seconds: Summary::of(s)?,
                    samples: s.clone(),
                })
            })
            .collect(),
        target_met: over.is_some_and(|s| s.median <= TARGET),
        hugeprep_over_prealloc: over,
        hugeprep_above_floor: above,
    })
}

/// Starts a paused QEMU with room for the plug (untimed), plugs the memory of `case` (timed),
/// quits QEMU and gives back the lease or the fresh file.
fn plug_once(cfg: &VmStartBenchConfig, world: &World, case: HotplugCase, tag: &str) -> Result<f64> {
    let qmp = world.tmp.join(format!("plug-{tag}.qmp"));
    let mut args = vm_args(&qmp);
    args.extend([
        "-m".to_string(),
        format!("128M,slots=2,maxmem={}M", 128 + (world.size >> 20)),
        "-device".to_string(),
        "pcie-root-port,id=hp-rp0,bus=pcie.0,chassis=1".to_string(),
    ]);
    let mut vm = QemuVm::spawn_args_in(&cfg.qemu, &args, &qmp, world.vmm_cgroup("plug")?)?;
    vm.wait_ready(LIMIT)?;
    let fresh = world.scratch.join(format!("plug-{tag}"));
    let _ = std::fs::remove_file(&fresh);
    let client = Client::new(world.daemon.socket());
    let start = Instant::now();
    let mut lease_id = None;
    let result = (|| {
        let (path, node, device) = match case {
            HotplugCase::Hugeprep | HotplugCase::HugeprepVirtioMem => {
                let lease =
                    client.blocking(client.lease(&world.lease_request(format!("plug-{tag}"))))?;
                lease_id = Some(lease.id);
                let device = if case == HotplugCase::Hugeprep {
                    HotplugDevice::PcDimm
                } else {
                    HotplugDevice::VirtioMemPci
                };
                (lease.path, Some(lease.node), device)
            }
            HotplugCase::Prealloc | HotplugCase::Floor => {
                (fresh.clone(), None, HotplugDevice::PcDimm)
            }
        };
        let plug = Hotplug {
            mem: GuestMemoryFile {
                id: "hp-mem0",
                path: &path,
                size: world.size,
                node,
            },
            device,
            device_id: "hp-dev0".into(),
            bus: (device == HotplugDevice::VirtioMemPci).then(|| "hp-rp0".to_string()),
            guest_node: None,
        };
        let mut object = qemu_hotplug::object_add_arguments(&plug.mem);
        if case == HotplugCase::Prealloc {
            object["prealloc"] = serde_json::json!(true);
            object["prealloc-threads"] = serde_json::json!(world.threads);
        }
        vm.execute_with("object-add", object)?;
        vm.execute_with("device_add", qemu_hotplug::device_add_arguments(&plug))?;
        Ok(start.elapsed().as_secs_f64())
    })();
    vm.quit(Duration::from_secs(10));
    if let Some(id) = lease_id {
        client.blocking(client.release(id))?;
    }
    let _ = std::fs::remove_file(&fresh);
    result
}

impl HotplugReport {
    /// The table: per size and case, seconds to plug, median (min-max), and the ratios.
    pub fn table(&self) -> String {
        let mut out = table::head(
            "memory hot-plug into a paused QEMU (object-add + device_add)",
            self.threads,
            self.reps,
            self.load_average,
        );
        for r in &self.results {
            out.push_str(&table::size_head(r.size, r.page_size));
            for c in &r.cases {
                out.push_str(&format!("{:<48} {}\n", c.label, table::cell(&c.seconds)));
            }
            if let Some(x) = &r.hugeprep_over_prealloc {
                out.push_str(&format!(
                    "hugeprep / prealloc: {} (target <= {TARGET}: {})\n",
                    table::cell(x),
                    table::met(r.target_met)
                ));
            }
            if let Some(x) = &r.hugeprep_above_floor {
                out.push_str(&format!("hugeprep - floor: {} s\n", table::cell(x)));
            }
        }
        table::lines(&mut out, "skipped", &self.skipped);
        out
    }
}
