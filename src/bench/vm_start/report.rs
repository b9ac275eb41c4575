//! The vm-start report: median and range per case, the share of the memory preparation
//! hugeprep takes off the start (paired per repetition), the table and the chart.

use serde::Serialize;

use super::{Case, VmStartBenchConfig, Vmm};
use crate::bench::svg::{LineChart, Series};
use crate::bench::Summary;
use crate::page_size::PageSize;
use crate::units::format_bytes;

/// The share of `(T_immediate - T_floor)` a start must take off to meet the goal.
pub const GOAL: f64 = 0.9;

/// One case at one size.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// The VMM.
    pub vmm: Vmm,
    /// The case.
    pub case: Case,
    /// Row label.
    pub label: String,
    /// Seconds to ready.
    pub seconds: Summary,
    /// Seconds above the floor (same repetition), when the floor ran.
    pub above_floor: Option<Summary>,
    /// Every measured start, in seconds, by repetition.
    pub samples: Vec<f64>,
    /// For a lease handed to QEMU alone or cloud-hypervisor: seconds from the release (QEMU has exited) until
    /// the pool was warm again (a scrub, or a refill of the pages `discard-data` punched
    /// out), with the pool worker at its idle priority.
    pub release_to_warm: Option<Summary>,
}

/// How much of the memory preparation a case takes off the start, for one VMM.
#[derive(Debug, Clone, Serialize)]
pub struct Saving {
    /// The VMM.
    pub vmm: Vmm,
    /// The case compared with immediate preallocation.
    pub case: Case,
    /// `(T_immediate - T_case) / (T_immediate - T_floor)` per repetition.
    pub share: Summary,
    /// Whether the median share reaches [`GOAL`].
    pub meets_goal: bool,
}

/// One memory size.
#[derive(Debug, Clone, Serialize)]
pub struct SizeResult {
    /// Guest memory in bytes.
    pub size: u64,
    /// Per VMM and case.
    pub results: Vec<CaseResult>,
    /// hugeprep (and immediate over a lease) against immediate preallocation, per VMM.
    pub savings: Vec<Saving>,
    /// libvirt with QEMU as the package runs it (unprivileged) against QEMU as root, per
    /// case both ran: `T_libvirt / T_libvirt-root` per repetition.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unprivileged_vs_root: Vec<(Case, Summary)>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct VmStartReport {
    /// Page size.
    pub page_size: PageSize,
    /// Preallocation threads (QEMU, libvirt) and hugeprep's workers.
    pub threads: usize,
    /// Measured repetitions per case.
    pub reps: usize,
    /// QEMU's version line.
    pub qemu_version: Option<String>,
    /// cloud-hypervisor's version line, when it was measured.
    pub cloud_hypervisor_version: Option<String>,
    /// The VMMs measured.
    pub vmms: Vec<Vmm>,
    /// VMMs not measured, and why.
    pub not_measured: Vec<String>,
    /// Per size.
    pub sizes: Vec<SizeResult>,
    /// Sizes left out, and why.
    pub skipped: Vec<String>,
}

fn paired(a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

/// Summarises one size; `runs[i]` was measured as `samples[i]`.
pub(super) fn size_result(
    size: u64,
    threads: usize,
    runs: &[(Vmm, Case)],
    samples: Vec<Vec<f64>>,
    recycles: Vec<Vec<f64>>,
) -> SizeResult {
    let find = |vmm: Vmm, case: Case| {
        runs.iter()
            .position(|&r| r == (vmm, case))
            .map(|i| samples[i].as_slice())
    };
    let mut results = Vec::new();
    let mut savings = Vec::new();
    for ((&(vmm, case), s), recycle) in runs.iter().zip(&samples).zip(&recycles) {
        let Some(seconds) = Summary::of(s) else {
            continue;
        };
        let above_floor = find(vmm, Case::Floor)
            .filter(|_| case != Case::Floor)
            .and_then(|f| Summary::of(&paired(s, f, |x, f| x - f)));
        results.push(CaseResult {
            vmm,
            case,
            label: case.label(vmm, threads),
            seconds,
            above_floor,
            samples: s.clone(),
            // libvirt releases inside `virsh destroy` (the hook's `release end`), before
            // the benchmark can start a clock.
            release_to_warm: Summary::of(recycle).filter(|_| case.leased() && !vmm.is_libvirt()),
        });
        if case.leased() {
            let (Some(imm), Some(floor)) = (find(vmm, Case::Immediate), find(vmm, Case::Floor))
            else {
                continue;
            };
            let share: Vec<f64> = (0..s.len().min(imm.len()).min(floor.len()))
                .map(|i| (imm[i] - s[i]) / (imm[i] - floor[i]))
                .collect();
            if let Some(share) = Summary::of(&share) {
                savings.push(Saving {
                    vmm,
                    case,
                    share,
                    meets_goal: share.median >= GOAL,
                });
            }
        }
    }
    let unprivileged_vs_root = Case::ROOT
        .iter()
        .filter_map(|&case| {
            let (a, b) = (find(Vmm::Libvirt, case)?, find(Vmm::LibvirtRoot, case)?);
            Some((case, Summary::of(&paired(a, b, |x, y| x / y))?))
        })
        .collect();
    SizeResult {
        size,
        results,
        savings,
        unprivileged_vs_root,
    }
}

/// The whole report.
pub(super) fn report(
    cfg: &VmStartBenchConfig,
    vmms: &[Vmm],
    not_measured: Vec<String>,
    sizes: Vec<SizeResult>,
    skipped: Vec<String>,
) -> VmStartReport {
    VmStartReport {
        page_size: cfg.page_size,
        threads: cfg.threads,
        reps: cfg.reps,
        qemu_version: crate::bench::qemu::version(&cfg.qemu),
        cloud_hypervisor_version: cfg
            .cloud_hypervisor
            .as_deref()
            .filter(|_| vmms.contains(&Vmm::CloudHypervisor))
            .and_then(crate::bench::qemu::version),
        vmms: vmms.to_vec(),
        not_measured,
        sizes,
        skipped,
    }
}

fn vmm_name(vmm: Vmm) -> &'static str {
    vmm.name()
}

impl VmStartReport {
    /// The human-readable table: per size, median (min-max) seconds per case and above the
    /// floor, then hugeprep's share of the preparation taken off the start.
    pub fn table(&self) -> String {
        let mut out = format!(
            "VM start, {} pages, {} threads, {} reps: median (min-max) seconds\n",
            self.page_size, self.threads, self.reps
        );
        if let Some(v) = &self.qemu_version {
            out.push_str(&format!("{v}\n"));
        }
        if let Some(v) = &self.cloud_hypervisor_version {
            out.push_str(&format!("{v}\n"));
        }
        for size in &self.sizes {
            out.push_str(&format!(
                "\n{}\n{:<12} {:<42} {:>22} {:>22} {:>22}\n",
                format_bytes(size.size),
                "vmm",
                "case",
                "seconds to ready",
                "above floor",
                "release to warm"
            ));
            for r in &size.results {
                let range = |s: &Summary| format!("{:.3} ({:.3}-{:.3})", s.median, s.min, s.max);
                out.push_str(&format!(
                    "{:<12} {:<42} {:>22} {:>22} {:>22}\n",
                    vmm_name(r.vmm),
                    r.label,
                    range(&r.seconds),
                    r.above_floor.as_ref().map(range).unwrap_or_default(),
                    r.release_to_warm.as_ref().map(range).unwrap_or_default()
                ));
            }
            for s in &size.savings {
                out.push_str(&format!(
                    "{:<12} {:<42} {:.3} ({:.3}-{:.3}) of immediate - floor taken off{}\n",
                    vmm_name(s.vmm),
                    s.case.label(s.vmm, self.threads),
                    s.share.median,
                    s.share.min,
                    s.share.max,
                    if s.case != Case::Hugeprep {
                        ""
                    } else if s.meets_goal {
                        " (goal >= 0.9: met)"
                    } else {
                        " (goal >= 0.9: NOT met)"
                    }
                ));
            }
        }
        for size in &self.sizes {
            for (case, r) in &size.unprivileged_vs_root {
                out.push_str(&format!(
                    "{}: libvirt / libvirt-root (QEMU unprivileged / as root), {}: {:.3} ({:.3}-{:.3})\n",
                    format_bytes(size.size),
                    case.label(Vmm::Libvirt, self.threads),
                    r.median,
                    r.min,
                    r.max
                ));
            }
        }
        for s in &self.skipped {
            out.push_str(&format!("skipped {s}\n"));
        }
        for n in &self.not_measured {
            out.push_str(&format!("not measured: {n}\n"));
        }
        out
    }

    /// A line chart of median seconds to ready against memory size, one line per VMM and
    /// case.
    pub fn svg(&self) -> String {
        let mut series: Vec<Series> = Vec::new();
        for size in &self.sizes {
            let gib = size.size as f64 / (1u64 << 30) as f64;
            for r in &size.results {
                let name = format!("{} {}", vmm_name(r.vmm), r.label);
                match series.iter_mut().find(|s| s.name == name) {
                    Some(s) => s.points.push((gib, r.seconds.median)),
                    None => series.push(Series {
                        name,
                        points: vec![(gib, r.seconds.median)],
                    }),
                }
            }
        }
        LineChart {
            title: format!(
                "VM start: seconds to ready (median of {}), {} pages",
                self.reps, self.page_size
            ),
            x_label: "guest memory, GiB".into(),
            y_label: "seconds".into(),
            log_x: false,
            x_ticks: self
                .sizes
                .iter()
                .map(|s| (s.size as f64 / (1u64 << 30) as f64, format_bytes(s.size)))
                .collect(),
            series,
            reference_lines: Vec::new(),
        }
        .render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_pair_repetitions_and_judge_the_goal() {
        let runs = [
            (Vmm::Qemu, Case::Immediate),
            (Vmm::Qemu, Case::Floor),
            (Vmm::Qemu, Case::Hugeprep),
        ];
        let samples = vec![vec![1.1, 2.1], vec![0.1, 0.1], vec![0.15, 0.2]];
        let recycles = vec![vec![0.0; 2]; 3];
        let r = size_result(1 << 30, 2, &runs, samples, recycles);
        let s = &r.savings[0];
        // (1.1-0.15)/1.0 = 0.95, (2.1-0.2)/2.0 = 0.95.
        assert!((s.share.median - 0.95).abs() < 1e-9, "{s:?}");
        assert!(s.meets_goal);
        let hp = &r.results[2];
        assert!((hp.above_floor.unwrap().max - 0.1).abs() < 1e-9);
        assert!(r.results[1].above_floor.is_none());
        assert!(r.results[0].release_to_warm.is_none() && hp.release_to_warm.is_some());
    }
}
