//! The clearing decision the daemon makes with default settings, for the benchmarks to report
//! beside what they measure.

use anyhow::Context;
use hugeprep::clear::CALIBRATION_BUFFER;
use hugeprep::cpu::CpuInfo;
use hugeprep::hugetlb::lock::HugepageLock;
use hugeprep::hugetlb::pool::PoolTopUp;
use hugeprep::policy::{ClearingPolicy, Resolution};
use hugeprep::PageSize;

/// The embedded policy's rule for this CPU, calibrated with the policy's own setting (`auto`)
/// as `hugeprep serve` does at start. The calibration buffer is hugepage-backed: the pool is
/// raised by any shortfall for the calibration and given back at once, under `_lock` (the
/// machine-wide hugepage lock the benchmark holds).
pub fn decide_in_use(_lock: &HugepageLock) -> anyhow::Result<Resolution> {
    let policy = ClearingPolicy::embedded();
    let pages = (CALIBRATION_BUFFER as u64).div_ceil(PageSize::Size2M.bytes());
    let top_up = PoolTopUp::ensure_free(None, PageSize::Size2M, pages);
    if let Err(err) = &top_up {
        eprintln!("calibration on ordinary memory: {err}");
    }
    let (resolution, _) = policy
        .decide(CpuInfo::host(), policy.calibration())
        .context("calibrating the clearing methods")?;
    drop(top_up);
    Ok(resolution)
}
