//! Benchmarks behind `hugeprep bench ...`: side-by-side comparisons in one run, warmed up,
//! reported as median and range, in a table and as JSON.

pub mod cgroup;
pub mod clear;
pub mod clear_config;
pub mod clear_goals;
pub mod clear_report;
pub mod daemon;
pub mod flood;
pub mod hog;
pub mod host;
pub mod pin;
pub mod prefault;
pub mod proof;
pub mod qemu;
pub mod recycle;
pub mod svg;
pub mod trace;
pub mod vm_start;

pub use crate::stats::Summary;
