//! What one `bench clear` run measured: the results its report, its goals and its JSON are
//! made of (data only, so that the run, the goals and the rendering all depend on it and not
//! on each other).

use serde::Serialize;

use super::clear_config::PolicyChoice;
use super::Summary;
use hugeprep::clear::{ClearPurpose, Method};
use hugeprep::page_size::PageSize;

/// One method at one chunk size and thread count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MethodResult {
    /// The method.
    pub method: Method,
    /// Bytes per kernel call.
    pub chunk_bytes: usize,
    /// Worker threads.
    pub threads: usize,
    /// Throughput over the repetitions, GB/s.
    pub gbps: Summary,
    /// Each repetition's GB/s, in order: repetition `i` of every method in a cell ran in
    /// the same interleaved round, so they can be compared in pairs.
    #[serde(default)]
    pub samples_gbps: Vec<f64>,
}

/// The plan in use, for one [`ClearPurpose`], at one chunk size and thread count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PurposeResult {
    /// Scrub (always streams) or use-soon (cached below `nt_min_extent`).
    pub purpose: ClearPurpose,
    /// The method the plan used for chunks of this size.
    pub method_used: Method,
    /// Bytes per kernel call.
    pub chunk_bytes: usize,
    /// Worker threads.
    pub threads: usize,
    /// Throughput over the repetitions, GB/s.
    pub gbps: Summary,
}

/// The kernel's fault-path zeroing of fresh hugetlbfs pages at one thread count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelResult {
    /// The page size faulted.
    pub page_size: PageSize,
    /// Worker threads, each faulting a disjoint range of one memfd.
    pub threads: usize,
    /// Throughput over the repetitions, GB/s.
    pub gbps: Summary,
}

/// Everything one run measured; serialises to the `--json` object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClearBenchReport {
    /// The policy's choice, when given.
    pub policy: Option<PolicyChoice>,
    /// Bytes cleared per repetition.
    pub buffer_bytes: usize,
    /// Whether the cleared buffer was backed by 2 MiB hugepages.
    pub hugepage_backed: bool,
    /// Timed repetitions per measurement (after one warm-up).
    pub reps: usize,
    /// The CPUs workers were pinned to, in order (n threads use the first n).
    pub cpus: Vec<usize>,
    /// Every method x chunk size x thread count measured.
    pub results: Vec<MethodResult>,
    /// The plan in use for each purpose x chunk size x thread count (when a policy was given).
    pub purposes: Vec<PurposeResult>,
    /// The kernel fault-in baselines.
    pub kernel: Vec<KernelResult>,
    /// The restated goals per thread count (see [`super::clear_goals`]).
    pub goals: Vec<ThreadGoals>,
    /// What was skipped and why.
    pub notes: Vec<String>,
}

/// The goals at one thread count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadGoals {
    /// Worker threads.
    pub threads: usize,
    /// Cells (chunk sizes >= 2 MiB) where the method in use was measured.
    pub cells: usize,
    /// Cells where it is within 10% of the best method.
    pub cells_within_10pct: usize,
    /// Its lowest fraction of the best method over those cells (paired repetitions where
    /// kept, see [`super::clear_report::PolicyVerdict::fraction`]).
    pub worst_fraction_of_best: f64,
    /// The chunk size of that cell.
    pub worst_chunk_bytes: usize,
    /// (a) met: every cell within 10%.
    pub within_10pct_everywhere: bool,
    /// The kernel's fault-in of fresh 2M pages, GB/s median.
    pub kernel_2m_gbps: Option<f64>,
    /// The method in use, median over the chunk sizes >= 2 MiB of its medians, GB/s.
    pub in_use_gbps: f64,
    /// The best method's highest median at chunks >= 2 MiB, GB/s.
    pub best_gbps: f64,
    /// (c) `in_use_gbps / kernel_2m_gbps`.
    pub in_use_to_kernel: Option<f64>,
    /// `best_gbps / kernel_2m_gbps`.
    pub best_to_kernel: Option<f64>,
    /// How far apart two timings of the same code were in this run: the method in use timed
    /// raw and as the scrub plan (which streams with the same method at every chunk size),
    /// the median over the cells of |a - b| / max(a, b). A shortfall smaller than this is noise.
    pub noise: Option<f64>,
}
