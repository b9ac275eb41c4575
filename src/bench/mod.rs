//! Benchmarks behind `hugeprep bench ...`: side-by-side comparisons in one run, warmed up,
//! reported as median and range, in a table and as JSON.

pub mod clear;
pub mod clear_report;
pub mod prefault;
pub mod qemu;
pub mod recycle;
pub mod svg;
pub mod trace;

pub use crate::stats::Summary;
