//! The vocabulary of a clearing rule: what a `[[rule]]` matches (vendor, family, [`IdMatch`]
//! of models and steppings, features) and what it chooses (method, [`NtMinExtent`],
//! fence interval, [`Threads`]), plus the top-level [`CalibrationMode`]. The policy
//! ([`super::ClearingPolicy`]), its validation and the resolution all build on these.

use std::fmt;
use std::num::NonZeroUsize;
use std::ops::RangeInclusive;
use std::str::FromStr;

use serde::{Deserialize, Serialize, Serializer};

use super::confidence::Confidence;
use crate::clear::{ClearPlan, ClearPurpose, Method};
use crate::cpu::{CpuInfo, Feature, Features, Vendor};
use crate::units::format_bytes;

/// The LLC size assumed for `nt_min_extent = "llc"` when the CPU's is unknown.
pub const FALLBACK_LLC_BYTES: usize = 32 << 20;

/// The top-level `calibration` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CalibrationMode {
    /// Do not calibrate.
    Off,
    /// Calibrate and report whether the rule's method is within 10% of the fastest.
    Report,
    /// As `Report`, and use the fastest method when the rule's is more than 10% slower,
    /// whatever the rule's confidence.
    Override,
    /// Calibrate and weigh the result by the rule's [`Confidence`]: a `guess` is replaced
    /// when another method is more than 10% faster; a `measured` or `published` rule only
    /// when it is more than 25% slower in every round (see [`super::Margins`]).
    #[default]
    Auto,
}

impl CalibrationMode {
    /// `off`, `report` or `override`.
    pub const fn name(self) -> &'static str {
        match self {
            CalibrationMode::Off => "off",
            CalibrationMode::Report => "report",
            CalibrationMode::Override => "override",
            CalibrationMode::Auto => "auto",
        }
    }
}

impl fmt::Display for CalibrationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CalibrationMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            CalibrationMode::Off,
            CalibrationMode::Report,
            CalibrationMode::Override,
            CalibrationMode::Auto,
        ]
        .into_iter()
        .find(|m| m.name() == s)
        .ok_or_else(|| {
            format!("unknown calibration mode {s:?}: expected off, report, override or auto")
        })
    }
}

/// The smallest extent cleared with the rule's non-temporal method when the memory is used
/// right after ([`ClearPurpose::UseSoon`]); smaller extents use `rep stosb`, whose cached
/// stores leave the zeroed data in the cache for that use. Scrubs ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NtMinExtent {
    /// The CPU's last-level cache size ([`FALLBACK_LLC_BYTES`] when unknown).
    Llc,
    /// A fixed size in bytes.
    Bytes(usize),
}

impl NtMinExtent {
    /// The size in bytes for `cpu`.
    pub fn bytes_for(self, cpu: &CpuInfo) -> usize {
        match self {
            NtMinExtent::Llc => cpu
                .llc_bytes
                .and_then(|b| usize::try_from(b).ok())
                .unwrap_or(FALLBACK_LLC_BYTES),
            NtMinExtent::Bytes(b) => b,
        }
    }
}

impl fmt::Display for NtMinExtent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NtMinExtent::Llc => f.write_str("llc"),
            NtMinExtent::Bytes(b) => f.write_str(&format_bytes(*b as u64)),
        }
    }
}

/// The default number of clearing threads per NUMA node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// One per CPU of the node.
    All,
    /// At most this many.
    Count(NonZeroUsize),
}

impl Threads {
    /// The thread count given `available` CPUs: all of them, or the rule's number capped at
    /// `available` (more threads than CPUs only adds switching); at least 1.
    pub fn count(self, available: usize) -> usize {
        let available = available.max(1);
        match self {
            Threads::All => available,
            Threads::Count(n) => n.get().min(available),
        }
    }
}

impl fmt::Display for Threads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Threads::All => f.write_str("all"),
            Threads::Count(n) => write!(f, "{n}"),
        }
    }
}

impl Serialize for Threads {
    /// `"all"` or the number.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Threads::All => serializer.serialize_str("all"),
            Threads::Count(n) => serializer.serialize_u64(n.get() as u64),
        }
    }
}

/// A set of model or stepping numbers: listed values plus inclusive ranges. Empty matches
/// anything (the rule did not restrict it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdMatch {
    /// Exact values (`models = [0x55]`).
    pub values: Vec<u32>,
    /// Inclusive ranges (`model_ranges = [[0x10, 0x1f]]`).
    pub ranges: Vec<RangeInclusive<u32>>,
}

impl IdMatch {
    /// Whether the rule left this unrestricted.
    pub fn is_any(&self) -> bool {
        self.values.is_empty() && self.ranges.is_empty()
    }

    /// Whether `id` is listed or in a range (always, when unrestricted).
    pub fn matches(&self, id: u32) -> bool {
        self.is_any() || self.values.contains(&id) || self.ranges.iter().any(|r| r.contains(&id))
    }
}

impl fmt::Display for IdMatch {
    /// `any`, or `0x55, 0x10-0x1f`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_any() {
            return f.write_str("any");
        }
        let items: Vec<String> = self
            .values
            .iter()
            .map(|v| format!("{v:#x}"))
            .chain(
                self.ranges
                    .iter()
                    .map(|r| format!("{:#x}-{:#x}", r.start(), r.end())),
            )
            .collect();
        f.write_str(&items.join(", "))
    }
}

/// One validated `[[rule]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Unique name, reported as the reason for the choice.
    pub name: String,
    /// The line of `name` in the policy file.
    pub line: usize,
    /// Required vendor; `None` matches any.
    pub vendor: Option<Vendor>,
    /// Required family; `None` matches any.
    pub family: Option<u32>,
    /// Matching models.
    pub models: IdMatch,
    /// Matching steppings.
    pub steppings: IdMatch,
    /// Features the rule lists in `requires`.
    pub requires: Features,
    /// The clearing method.
    pub method: Method,
    /// Smallest extent cleared with `method` when it is non-temporal.
    pub nt_min_extent: NtMinExtent,
    /// Bytes between two `sfence`s.
    pub fence_interval: usize,
    /// Default clearing threads per NUMA node.
    pub threads: Threads,
    /// Where the choice comes from.
    pub source: String,
    /// Whether `source` is a measurement of this model or a guess from similar CPUs.
    pub confidence: Confidence,
}

/// The feature a method cannot run without.
fn method_feature(method: Method) -> Option<Feature> {
    match method {
        Method::Avx2Nt => Some(Feature::Avx2),
        Method::Avx512Nt => Some(Feature::Avx512f),
        Method::Clzero => Some(Feature::Clzero),
        Method::RepStosb | Method::Movnti | Method::WriteBytes => None,
    }
}

impl Rule {
    /// `requires` plus the feature the method needs.
    pub fn required_features(&self) -> Features {
        let mut all = self.requires;
        if let Some(f) = method_feature(self.method) {
            all.set(f, true);
        }
        all
    }

    /// Why the rule does not match `cpu`, or `None` if it does.
    pub fn mismatch(&self, cpu: &CpuInfo) -> Option<String> {
        if let Some(v) = &self.vendor {
            if *v != cpu.vendor {
                return Some(format!("vendor is {}, not {v}", cpu.vendor));
            }
        }
        if let Some(f) = self.family {
            if f != cpu.family {
                return Some(format!("family is {:#x}, not {f:#x}", cpu.family));
            }
        }
        if !self.models.matches(cpu.model) {
            return Some(format!("model {:#x} is not in {}", cpu.model, self.models));
        }
        if !self.steppings.matches(cpu.stepping) {
            return Some(format!(
                "stepping {} is not in {}",
                cpu.stepping, self.steppings
            ));
        }
        let missing = cpu.features.missing(self.required_features());
        if !missing.is_empty() {
            return Some(format!("CPU lacks {missing}"));
        }
        None
    }

    /// Whether the rule matches `cpu`.
    pub fn matches(&self, cpu: &CpuInfo) -> bool {
        self.mismatch(cpu).is_none()
    }

    /// The plan for `cpu` (which resolves `nt_min_extent = "llc"`), for scrubbing; use
    /// [`ClearPlan::for_purpose`] for memory used right after the clear.
    pub fn plan(&self, cpu: &CpuInfo) -> ClearPlan {
        ClearPlan {
            method: self.method,
            fence_interval: self.fence_interval,
            nt_min_extent: self.nt_min_extent.bytes_for(cpu),
            purpose: ClearPurpose::Scrub,
        }
    }
}

/// Values rules fall back to (`[defaults]`, else built-in: `llc`, 2 MiB, `all`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Defaults {
    pub nt_min_extent: NtMinExtent,
    pub fence_interval: usize,
    pub threads: Threads,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_capped_by_available_cpus() {
        assert_eq!(Threads::All.count(8), 8);
        assert_eq!(Threads::All.count(0), 1);
        let four = Threads::Count(NonZeroUsize::new(4).unwrap());
        assert_eq!(four.count(2), 2);
        assert_eq!(four.count(16), 4);
    }

    #[test]
    fn id_match_lists_and_ranges() {
        let m = IdMatch {
            values: vec![0x55],
            ranges: vec![0x10..=0x1f],
        };
        assert!(m.matches(0x55) && m.matches(0x1f) && !m.matches(0x20));
        assert!(IdMatch::default().matches(7));
        assert_eq!(m.to_string(), "0x55, 0x10-0x1f");
    }
}
