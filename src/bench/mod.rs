//! Benchmarks behind `hugeprep bench ...`: side-by-side comparisons in one run, warmed up,
//! reported as median and range, in a table and as JSON.

pub mod prefault;
pub mod qemu;
pub mod recycle;
pub mod stats;

pub use stats::Summary;
