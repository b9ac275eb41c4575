//! The report of `hugeprep bench recycle`: both paths, every clearing method, the release
//! proof, the floods and the lease latency, as JSON and as a table.

use serde::Serialize;

use crate::Summary;
use hugeprep::clear::Method;
use hugeprep::page_size::PageSize;
use hugeprep::units::format_bytes;

/// The scrub of a released file should reach this fraction of the best clearing throughput
/// measured at the same thread count (goal b; reported, not asserted).
pub const SCRUB_GOAL: f64 = 0.90;

/// Throughput of one path.
#[derive(Debug, Clone, Serialize)]
pub struct PathResult {
    /// `scrub` or `kernel-path`.
    pub path: &'static str,
    /// GB/s per repetition.
    pub samples_gbps: Vec<f64>,
    /// Median and range.
    pub gbps: Summary,
}

/// One method clearing the whole mapped file in one parallel call.
#[derive(Debug, Clone, Serialize)]
pub struct MethodClear {
    /// The method.
    pub method: Method,
    /// Median and range, GB/s.
    pub gbps: Summary,
    /// GB/s per repetition, each taken in the same round as the scrub's of that index.
    pub samples_gbps: Vec<f64>,
}

/// Lease latency over the API.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyResult {
    /// Leases timed.
    pub leases: usize,
    /// Bytes per lease.
    pub lease_size: u64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Largest, ms.
    pub max_ms: f64,
    /// Leases served warm-exact.
    pub warm_exact: usize,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct RecycleBenchReport {
    /// Bytes per file.
    pub size: u64,
    /// Page size.
    pub page_size: PageSize,
    /// Threads for both paths.
    pub threads: usize,
    /// The scrubber's method.
    pub method: String,
    /// Scrub (release-to-warm) throughput.
    pub scrub: PathResult,
    /// The kernel's path: truncate, delete and fault a new file (what an unproven release
    /// costs, and what the kernel does without hugeprep).
    pub kernel_path: PathResult,
    /// (c) Median scrub / median kernel's path (the kernel's fault-in of fresh pages).
    pub ratio: f64,
    /// The release proof's own cost (a lessee that opened the file and exited), ms: the
    /// daemon's method on the quiet host.
    pub proof: Option<crate::proof::ProofTiming>,
    /// The whole proven release: the scrub's throughput with the median proof added to
    /// each repetition's time, GB/s.
    pub proven_scrub: Option<Summary>,
    /// Every proof timed: each method on the quiet host and beside the busy one.
    pub proofs: Vec<crate::proof::ProofTiming>,
    /// The proven scrub by each of `proofs`, in the same order, GB/s.
    pub proven_scrubs: Vec<Summary>,
    /// Opens under one lessee's flood, quiet first, by each method.
    pub floods: Vec<crate::flood::FloodTiming>,
    /// Every method clearing the same file, interleaved with the two paths.
    pub clear_methods: Vec<MethodClear>,
    /// The fastest of `clear_methods` by median.
    pub best_clear: Option<MethodClear>,
    /// (b) Median scrub / best clearing median.
    pub scrub_to_best: Option<f64>,
    /// (b) The scrub against the method it compares worst with, repetition by repetition
    /// (the median of the per-round ratios; steadier on a shared host), and that method.
    pub scrub_to_best_paired: Option<(f64, Method)>,
    /// (b) met: the scrub reaches at least 90% of the best clearing throughput (by the
    /// paired ratio).
    pub scrub_goal_met: Option<bool>,
    /// Lease latency, when run.
    pub latency: Option<LatencyResult>,
    /// Quiet against hogged lease latency, with `--hog`.
    pub hog: Option<crate::hog::HogLatency>,
    /// Quiet against churned lease latency, with `--churn`.
    pub churn: Option<crate::churn::ChurnLatency>,
}

impl RecycleBenchReport {
    /// The release proof's rows: each method on each host, its ratio to the same method on
    /// the quiet host, and the proven scrub.
    fn proof_table(&self) -> String {
        let mut s = format!(
            "release proof (a lessee that opened the file and exited)\n{:<14} {:>22} {:>24} {:>8} {:>22}\n",
            "method", "host", "ms median (min-max)", "x quiet", "proof + scrub GB/s"
        );
        for (i, p) in self.proofs.iter().enumerate() {
            let quiet = self
                .proofs
                .iter()
                .find(|q| q.method == p.method && q.host_processes == 0);
            let host = if p.host_processes == 0 {
                "quiet".to_string()
            } else {
                format!("+{} procs/{} thr", p.host_processes, p.host_threads)
            };
            s += &format!(
                "{:<14} {:>22} {:>24} {:>8} {:>22}\n",
                p.method,
                host,
                format!("{:.3} ({:.3}-{:.3})", p.ms.median, p.ms.min, p.ms.max),
                quiet.map_or("-".into(), |q| format!("{:.1}", p.ms.median / q.ms.median)),
                self.proven_scrubs
                    .get(i)
                    .map_or("-".into(), |g| g.to_string())
            );
        }
        s
    }

    /// The report as a table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "recycle {} of {} pages, {} threads, method {}\n{:<16} {:>24}\n",
            format_bytes(self.size),
            self.page_size,
            self.threads,
            self.method,
            "path",
            "GB/s median (min-max)"
        );
        for p in [&self.scrub, &self.kernel_path] {
            s += &format!("{:<16} {:>24}\n", p.path, p.gbps.to_string());
        }
        if let Some(g) = &self.proven_scrub {
            s += &format!("{:<16} {:>24}\n", "proof + scrub", g.to_string());
        }
        for m in &self.clear_methods {
            s += &format!(
                "{:<16} {:>24}\n",
                format!("clear {}", m.method),
                m.gbps.to_string()
            );
        }
        if let (Some(best), Some(ratio), Some((paired, vs)), Some(met)) = (
            &self.best_clear,
            self.scrub_to_best,
            self.scrub_to_best_paired,
            self.scrub_goal_met,
        ) {
            s += &format!(
                "(b) scrub / best clear: {:.0}% of {} {:.1} by medians, {:.0}% paired per round against {vs} (goal >= {:.0}%: {})\n",
                ratio * 100.0,
                best.method,
                best.gbps.median,
                paired * 100.0,
                SCRUB_GOAL * 100.0,
                if met { "met" } else { "NOT met" }
            );
        }
        s += &format!(
            "(c) scrub / kernel's path (truncate, delete, fault fresh pages): {:.2}x\n",
            self.ratio
        );
        if !self.floods.is_empty() {
            s += &format!(
                "opens of a leased file under one lessee's open flood, ms\n{:<14} {:>8} {:>26} {:>26}\n",
                "method", "threads", "another tenant p50/p99/max", "the daemon p50/p99/max"
            );
            for f in &self.floods {
                let l = |o: &crate::flood::OpenLatency| {
                    format!("{:.3}/{:.3}/{:.3}", o.p50_ms, o.p99_ms, o.max_ms)
                };
                s += &format!(
                    "{:<14} {:>8} {:>26} {:>26}\n",
                    f.method,
                    f.flood_threads,
                    l(&f.other_tenant),
                    l(&f.daemon)
                );
            }
        }
        if self.proofs.is_empty() {
            s += "release proof: not timed on this host (no fanotify or no cgroup v2)\n";
        } else {
            s += &self.proof_table();
        }
        if let Some(l) = &self.latency {
            s += &format!(
                "warm lease over the API ({} x {}): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms, {} warm-exact\n",
                l.leases,
                format_bytes(l.lease_size),
                l.p50_ms,
                l.p99_ms,
                l.max_ms,
                l.warm_exact
            );
        }
        if let Some(h) = &self.hog {
            s += &h.table();
        }
        if let Some(c) = &self.churn {
            s += &c.table();
        }
        s
    }
}
