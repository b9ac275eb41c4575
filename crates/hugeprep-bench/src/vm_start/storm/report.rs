//! A storm run's results and their table.

use serde::Serialize;

use super::super::Vmm;
use super::{Refill, StormCase};
use crate::Summary;
use hugeprep::page_size::PageSize;
use hugeprep::units::format_bytes;

/// One case of one storm size.
#[derive(Debug, Clone, Serialize)]
pub struct StormCaseResult {
    /// The case.
    pub case: StormCase,
    /// Whether the pool was free to refill during the storm (`--storm-refill`), with its
    /// start gate or without; otherwise the free pages were held back.
    pub refill: Refill,
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
    /// A refill-free row's all-ready time over the same case's with the free pages held
    /// back (paired per repetition): what a refill behind the leases costs the storm.
    pub over_held_back: Option<f64>,
}

/// One storm size.
#[derive(Debug, Clone, Serialize)]
pub struct StormResult {
    /// The VMs' page size.
    pub page_size: PageSize,
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
    /// Page sizes, one storm of each per VM count.
    pub page_sizes: Vec<PageSize>,
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
    /// The machine's 1-minute load average before and after the run.
    pub load_average: (Option<f64>, Option<f64>),
}

impl StormReport {
    /// The table: per storm size and case, all-ready median and range, per-VM p50/p99, and
    /// the ratios to the floor and to immediate preallocation.
    pub fn table(&self) -> String {
        let mut out = format!(
            "boot storm: N VMs at once (QEMU alone: exec to QMP ready; libvirt: virsh create --paused returned), {} pages, {} threads, {} reps; free pages held back unless a row says \"refill free\" (\"no gate\": the start gate off; /held: over the same case held back)\n",
            self.page_sizes
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(" and "),
            self.threads,
            self.reps,
        );
        let load = |l: Option<f64>| l.map_or("-".into(), |l| format!("{l:.1}"));
        out.push_str(&format!(
            "load average {} before, {} after\n",
            load(self.load_average.0),
            load(self.load_average.1)
        ));
        for s in &self.storms {
            out.push_str(&format!(
                "\n{} VMs x {} ({} in all) of {} pages, {}\n{:<44} {:>22} {:>9} {:>9} {:>8} {:>8} {:>8}\n",
                s.count,
                format_bytes(s.vm_bytes),
                format_bytes(s.total_bytes),
                s.page_size,
                format!("{:?}", s.vmm).to_lowercase(),
                "case",
                "all ready s (range)",
                "vm p50",
                "vm p99",
                "/floor",
                "/immed.",
                "/held"
            ));
            for c in &s.cases {
                let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}x"));
                out.push_str(&format!(
                    "{:<44} {:>7.3} ({:.3}-{:.3}) {:>9.3} {:>9.3} {:>8} {:>8} {:>8}\n",
                    c.label,
                    c.all_ready.median,
                    c.all_ready.min,
                    c.all_ready.max,
                    c.per_vm_p50,
                    c.per_vm_p99,
                    ratio(c.over_floor),
                    ratio(c.over_immediate),
                    ratio(c.over_held_back)
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
