//! Benchmarks behind `hugeprep bench ...`: side-by-side comparisons in one run, warmed up,
//! reported as median and range, in a table and as JSON.
//!
//! A crate of its own, so that the library (`hugeprep`) ships no benchmark code: the binary's
//! `bench` subcommand calls into it, and tests that measure a benchmark run
//! `hugeprep bench ... --json` rather than importing it. The QEMU launcher and the cgroups it
//! shares with the tests are in `hugeprep-testkit`, re-exported here as [`qemu`] and
//! [`cgroup`].

pub mod churn;
pub mod clear;
pub mod clear_config;
pub mod clear_goals;
pub mod clear_report;
pub mod clear_results;
pub mod daemon;
pub mod flood;
pub mod held;
pub mod hog;
pub mod host;
pub mod pin;
pub mod prefault;
pub mod proof;
pub mod recycle;
pub mod recycle_config;
pub mod recycle_report;
pub mod svg;
pub mod trace;
pub mod turns;
pub mod vm_start;

pub use hugeprep::stats::Summary;
pub use hugeprep_testkit::{cgroup, qemu};

/// The machine's 1-minute load average (`/proc/loadavg`), for a report to say how busy the
/// host was while it measured (the machines benchmarks run on are shared).
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
