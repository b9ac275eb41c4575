//! The vm-start report: median and range per case, the share of the memory preparation
//! hugeprep takes off the start (paired per repetition), the table and the chart.

use serde::Serialize;

use super::{Case, VmStartBenchConfig, Vmm};
use crate::svg::{LineChart, Series};
use crate::Summary;
use hugeprep::page_size::PageSize;
use hugeprep::units::format_bytes;

/// The share of `(T_immediate - T_floor)` a start must take off to meet the goal.
pub const GOAL: f64 = 0.9;

/// What one run of a size measured: a case of a VMM on a page size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Run {
    /// The page size.
    pub page_size: PageSize,
    /// The VMM.
    pub vmm: Vmm,
    /// The case.
    pub case: Case,
}

/// One case at one size.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// The page size of the VM's memory.
    pub page_size: PageSize,
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
    /// For a lease handed to QEMU alone: seconds of the lease call over the API, part of
    /// `seconds`.
    pub lease_call: Option<Summary>,
}

/// How much of the memory preparation a case takes off the start, for one VMM.
#[derive(Debug, Clone, Serialize)]
pub struct Saving {
    /// The page size.
    pub page_size: PageSize,
    /// The VMM.
    pub vmm: Vmm,
    /// The case compared with immediate preallocation.
    pub case: Case,
    /// `(T_immediate - T_case) / (T_immediate - T_floor)` per repetition.
    pub share: Summary,
    /// Whether the median share reaches [`GOAL`].
    pub meets_goal: bool,
}

/// Where a warm start's time above the floor goes, QEMU alone, on one page size: each part
/// paired per repetition (seconds, median and range).
#[derive(Debug, Clone, Serialize)]
pub struct WarmBreakdown {
    /// The page size.
    pub page_size: PageSize,
    /// The floor: QEMU on an empty file, mapping nothing.
    pub floor: Summary,
    /// The warm lease's start above the floor, all of it.
    pub lease_above_floor: Summary,
    /// QEMU on a file whose pages are all present, not leased, above the floor: QEMU's (and
    /// the kernel's) cost of mapping present pages.
    pub mapping_present_pages: Summary,
    /// The lease call over the API.
    pub lease_call: Summary,
    /// QEMU on the lease above QEMU on the present file: the open of a watched lease (its
    /// permission event) and anything else the lease adds to QEMU's own start.
    pub watched_open_and_rest: Summary,
}

/// One memory size.
#[derive(Debug, Clone, Serialize)]
pub struct SizeResult {
    /// Guest memory in bytes.
    pub size: u64,
    /// Per page size, VMM and case.
    pub results: Vec<CaseResult>,
    /// hugeprep (and immediate over a lease) against immediate preallocation, per page size
    /// and VMM.
    pub savings: Vec<Saving>,
    /// The warm start's breakdown per page size (QEMU alone).
    pub breakdown: Vec<WarmBreakdown>,
    /// libvirt with QEMU as the package runs it (unprivileged) against QEMU as root, per
    /// page size and case both ran: `T_libvirt / T_libvirt-root` per repetition.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unprivileged_vs_root: Vec<(PageSize, Case, Summary)>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct VmStartReport {
    /// Page sizes, side by side.
    pub page_sizes: Vec<PageSize>,
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
    /// The machine's 1-minute load average before and after the run.
    pub load_average: (Option<f64>, Option<f64>),
}

fn paired(a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

/// Summarises one size; `runs[i]` was measured as `samples[i]` (and, for QEMU's leases,
/// `lease_calls[i]`).
pub(super) fn size_result(
    size: u64,
    threads: usize,
    runs: &[Run],
    samples: Vec<Vec<f64>>,
    recycles: Vec<Vec<f64>>,
    lease_calls: Vec<Vec<f64>>,
) -> SizeResult {
    let find = |ps: PageSize, vmm: Vmm, case: Case| {
        runs.iter()
            .position(|r| {
                *r == Run {
                    page_size: ps,
                    vmm,
                    case,
                }
            })
            .map(|i| samples[i].as_slice())
    };
    let mut results = Vec::new();
    let mut savings = Vec::new();
    for (
        i,
        &Run {
            page_size: ps,
            vmm,
            case,
        },
    ) in runs.iter().enumerate()
    {
        let s = &samples[i];
        let Some(seconds) = Summary::of(s) else {
            continue;
        };
        let above_floor = find(ps, vmm, Case::Floor)
            .filter(|_| case != Case::Floor)
            .and_then(|f| Summary::of(&paired(s, f, |x, f| x - f)));
        results.push(CaseResult {
            page_size: ps,
            vmm,
            case,
            label: case.label(vmm, threads),
            seconds,
            above_floor,
            samples: s.clone(),
            // libvirt releases inside `virsh destroy` (the hook's `release end`), before
            // the benchmark can start a clock.
            release_to_warm: Summary::of(&recycles[i])
                .filter(|_| case.leased() && !vmm.is_libvirt()),
            lease_call: Summary::of(&lease_calls[i]),
        });
        if case.leased() {
            let (Some(imm), Some(floor)) =
                (find(ps, vmm, Case::Immediate), find(ps, vmm, Case::Floor))
            else {
                continue;
            };
            let share: Vec<f64> = (0..s.len().min(imm.len()).min(floor.len()))
                .map(|i| (imm[i] - s[i]) / (imm[i] - floor[i]))
                .collect();
            if let Some(share) = Summary::of(&share) {
                savings.push(Saving {
                    page_size: ps,
                    vmm,
                    case,
                    share,
                    meets_goal: share.median >= GOAL,
                });
            }
        }
    }
    let mut breakdown = Vec::new();
    let mut page_sizes: Vec<PageSize> = runs.iter().map(|r| r.page_size).collect();
    page_sizes.dedup();
    for &ps in &page_sizes {
        let q = |case| find(ps, Vmm::Qemu, case);
        let calls = runs
            .iter()
            .position(|r| {
                *r == Run {
                    page_size: ps,
                    vmm: Vmm::Qemu,
                    case: Case::Hugeprep,
                }
            })
            .map(|i| lease_calls[i].as_slice());
        let (Some(floor), Some(present), Some(lease), Some(calls)) =
            (q(Case::Floor), q(Case::Present), q(Case::Hugeprep), calls)
        else {
            continue;
        };
        if calls.len() != lease.len() {
            continue;
        }
        let lease_qemu = paired(lease, calls, |l, c| l - c);
        let parts = (
            Summary::of(floor),
            Summary::of(&paired(lease, floor, |l, f| l - f)),
            Summary::of(&paired(present, floor, |p, f| p - f)),
            Summary::of(calls),
            Summary::of(&paired(&lease_qemu, present, |l, p| l - p)),
        );
        if let (Some(floor), Some(lease_above_floor), Some(mapping), Some(call), Some(rest)) = parts
        {
            breakdown.push(WarmBreakdown {
                page_size: ps,
                floor,
                lease_above_floor,
                mapping_present_pages: mapping,
                lease_call: call,
                watched_open_and_rest: rest,
            });
        }
    }
    let mut unprivileged_vs_root = Vec::new();
    for &ps in &page_sizes {
        for case in Case::ROOT {
            let (Some(a), Some(b)) = (
                find(ps, Vmm::Libvirt, case),
                find(ps, Vmm::LibvirtRoot, case),
            ) else {
                continue;
            };
            if let Some(r) = Summary::of(&paired(a, b, |x, y| x / y)) {
                unprivileged_vs_root.push((ps, case, r));
            }
        }
    }
    SizeResult {
        size,
        results,
        savings,
        breakdown,
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
    load_before: Option<f64>,
) -> VmStartReport {
    VmStartReport {
        page_sizes: cfg.page_sizes.clone(),
        threads: cfg.threads,
        reps: cfg.reps,
        qemu_version: hugeprep_testkit::qemu::version(&cfg.qemu),
        cloud_hypervisor_version: cfg
            .cloud_hypervisor
            .as_deref()
            .filter(|_| vmms.contains(&Vmm::CloudHypervisor))
            .and_then(hugeprep_testkit::qemu::version),
        vmms: vmms.to_vec(),
        not_measured,
        sizes,
        skipped,
        load_average: (load_before, crate::load_average()),
    }
}

fn vmm_name(vmm: Vmm) -> &'static str {
    vmm.name()
}

impl VmStartReport {
    /// The human-readable table: per size, median (min-max) seconds per case and above the
    /// floor, then hugeprep's share of the preparation taken off the start.
    pub fn table(&self) -> String {
        let pages: Vec<String> = self.page_sizes.iter().map(|p| p.to_string()).collect();
        let mut out = format!(
            "VM start, {} pages side by side, {} threads, {} reps: median (min-max) seconds\n",
            pages.join(" and "),
            self.threads,
            self.reps
        );
        if let Some(v) = &self.qemu_version {
            out.push_str(&format!("{v}\n"));
        }
        let load = |l: Option<f64>| l.map_or("-".into(), |l| format!("{l:.1}"));
        out.push_str(&format!(
            "load average {} before, {} after\n",
            load(self.load_average.0),
            load(self.load_average.1)
        ));
        if let Some(v) = &self.cloud_hypervisor_version {
            out.push_str(&format!("{v}\n"));
        }
        for size in &self.sizes {
            out.push_str(&format!(
                "\n{}\n{:<5} {:<12} {:<42} {:>22} {:>22} {:>22}\n",
                format_bytes(size.size),
                "pages",
                "vmm",
                "case",
                "seconds to ready",
                "above floor",
                "release to warm"
            ));
            let range = |s: &Summary| format!("{:.3} ({:.3}-{:.3})", s.median, s.min, s.max);
            for r in &size.results {
                out.push_str(&format!(
                    "{:<5} {:<12} {:<42} {:>22} {:>22} {:>22}\n",
                    r.page_size.to_string(),
                    vmm_name(r.vmm),
                    r.label,
                    range(&r.seconds),
                    r.above_floor.as_ref().map(range).unwrap_or_default(),
                    r.release_to_warm.as_ref().map(range).unwrap_or_default()
                ));
            }
            for b in &size.breakdown {
                let ms = |s: &Summary| {
                    format!(
                        "{:.1} ({:.1}..{:.1})",
                        s.median * 1e3,
                        s.min * 1e3,
                        s.max * 1e3
                    )
                };
                out.push_str(&format!(
                    "{:<5} {:<12} warm start above the floor ({} ms), ms: {} = mapping present pages {} + lease call {} + watched open and the rest {} (each paired per rep)\n",
                    b.page_size.to_string(),
                    "qemu",
                    ms(&b.floor),
                    ms(&b.lease_above_floor),
                    ms(&b.mapping_present_pages),
                    ms(&b.lease_call),
                    ms(&b.watched_open_and_rest),
                ));
            }
            for s in &size.savings {
                out.push_str(&format!(
                    "{:<5} {:<12} {:<42} {:.3} ({:.3}-{:.3}) of immediate - floor taken off{}\n",
                    s.page_size.to_string(),
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
            for (ps, case, r) in &size.unprivileged_vs_root {
                out.push_str(&format!(
                    "{} on {ps} pages: libvirt / libvirt-root (QEMU unprivileged / as root), {}: {:.3} ({:.3}-{:.3})\n",
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
                let name = format!("{} {} {}", r.page_size, vmm_name(r.vmm), r.label);
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
                self.reps,
                self.page_sizes
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(" and ")
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
        let run = |case| Run {
            page_size: PageSize::Size1G,
            vmm: Vmm::Qemu,
            case,
        };
        let runs = [
            run(Case::Immediate),
            run(Case::Floor),
            run(Case::Hugeprep),
            run(Case::Present),
        ];
        let samples = vec![
            vec![1.1, 2.1],
            vec![0.1, 0.1],
            vec![0.15, 0.2],
            vec![0.11, 0.12],
        ];
        let recycles = vec![vec![0.0; 2]; 4];
        let mut calls = vec![Vec::new(); 4];
        calls[2] = vec![0.01, 0.02];
        let r = size_result(1 << 30, 2, &runs, samples, recycles, calls);
        let s = &r.savings[0];
        // (1.1-0.15)/1.0 = 0.95, (2.1-0.2)/2.0 = 0.95.
        assert!((s.share.median - 0.95).abs() < 1e-9, "{s:?}");
        assert!(s.meets_goal);
        let hp = &r.results[2];
        assert!((hp.above_floor.unwrap().max - 0.1).abs() < 1e-9);
        assert!(r.results[1].above_floor.is_none());
        assert!(r.results[0].release_to_warm.is_none() && hp.release_to_warm.is_some());
        // 0.05 and 0.1 above the floor: 0.01 and 0.02 mapping, 0.01 and 0.02 lease call,
        // 0.15-0.01-0.11 = 0.03 and 0.2-0.02-0.12 = 0.06 the rest.
        let b = &r.breakdown[0];
        assert_eq!(b.page_size, PageSize::Size1G);
        assert!((b.lease_above_floor.max - 0.1).abs() < 1e-9, "{b:?}");
        assert!((b.mapping_present_pages.min - 0.01).abs() < 1e-9, "{b:?}");
        assert!((b.lease_call.max - 0.02).abs() < 1e-9, "{b:?}");
        assert!((b.watched_open_and_rest.max - 0.06).abs() < 1e-9, "{b:?}");
    }
}
