//! The clearing policy: ordered rules that map a CPU to a clearing method, minimum
//! non-temporal extent, fence interval and thread count. The default policy is
//! `policies/clearing.toml`, compiled in; the format is in `docs/clearing.md`.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroUsize;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize, Serializer};
use toml::Spanned;

use super::error::{Document, PolicyError};
use super::resolution::{DecidedBy, Resolution};
use super::schema::{RawDefaults, RawPolicy, RawRule, Scalar};
use crate::clear::{ClearPlan, Method};
use crate::cpu::{CpuInfo, Feature, Features, Vendor};
use crate::units::{format_bytes, parse_bytes};

/// The text of `policies/clearing.toml`, compiled into the binary.
pub const EMBEDDED_CLEARING_POLICY: &str = include_str!("../../policies/clearing.toml");

/// The name errors and reports give the embedded policy.
pub const EMBEDDED_CLEARING_POLICY_PATH: &str = "policies/clearing.toml";

/// The LLC size assumed for `nt_min_extent = "llc"` when the CPU's is unknown.
pub const FALLBACK_LLC_BYTES: usize = 32 << 20;

/// The rule name a [`Resolution`] carries when no rule matched.
pub const BUILTIN_FALLBACK_RULE: &str = "builtin-fallback";

const DEFAULT_FENCE_INTERVAL: usize = 2 << 20;
const CACHE_LINE: usize = 64;
const MAX_FAMILY: u32 = 0xf + 0xff;
const MAX_MODEL: u32 = 0xff;
const MAX_STEPPING: u32 = 0xf;

/// The top-level `calibration` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CalibrationMode {
    /// Do not calibrate.
    Off,
    /// Calibrate and report whether the rule's method is within 10% of the fastest.
    #[default]
    Report,
    /// As `Report`, and use the fastest method when the rule's is more than 10% slower.
    Override,
}

impl CalibrationMode {
    /// `off`, `report` or `override`.
    pub const fn name(self) -> &'static str {
        match self {
            CalibrationMode::Off => "off",
            CalibrationMode::Report => "report",
            CalibrationMode::Override => "override",
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
        ]
        .into_iter()
        .find(|m| m.name() == s)
        .ok_or_else(|| format!("unknown calibration mode {s:?}: expected off, report or override"))
    }
}

/// The smallest extent cleared with the rule's non-temporal method; smaller extents use
/// `rep stosb`, whose cached stores leave the zeroed data in the cache for a soon reader.
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

    /// The plan for `cpu` (which resolves `nt_min_extent = "llc"`).
    pub fn plan(&self, cpu: &CpuInfo) -> ClearPlan {
        ClearPlan {
            method: self.method,
            fence_interval: self.fence_interval,
            nt_min_extent: self.nt_min_extent.bytes_for(cpu),
        }
    }
}

/// Values rules fall back to (`[defaults]`, else built-in: `llc`, 2 MiB, `all`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Defaults {
    nt_min_extent: NtMinExtent,
    fence_interval: usize,
    threads: Threads,
}

/// A parsed, validated clearing policy.
///
/// ```
/// use hugeprep::cpu::CpuInfo;
/// use hugeprep::policy::ClearingPolicy;
///
/// let policy = ClearingPolicy::embedded();
/// let chosen = policy.resolve(CpuInfo::host());
/// println!("{} by rule {}: {}", chosen.plan.method, chosen.rule, chosen.source);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClearingPolicy {
    origin: PathBuf,
    embedded: bool,
    calibration: CalibrationMode,
    defaults: Defaults,
    rules: Vec<Rule>,
}

impl ClearingPolicy {
    /// The policy compiled into the binary (`policies/clearing.toml`).
    pub fn embedded() -> &'static ClearingPolicy {
        static EMBEDDED: OnceLock<ClearingPolicy> = OnceLock::new();
        EMBEDDED.get_or_init(|| {
            let mut policy = ClearingPolicy::parse(
                EMBEDDED_CLEARING_POLICY,
                Path::new(EMBEDDED_CLEARING_POLICY_PATH),
            )
            .expect("the embedded clearing policy is valid (tests parse it)");
            policy.embedded = true;
            policy
        })
    }

    /// Reads and validates a policy file.
    pub fn from_file(path: &Path) -> Result<ClearingPolicy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        ClearingPolicy::parse(&text, path)
    }

    /// The file at `path`, or the embedded policy when `None`.
    pub fn load(path: Option<&Path>) -> Result<ClearingPolicy, PolicyError> {
        match path {
            Some(p) => ClearingPolicy::from_file(p),
            None => Ok(ClearingPolicy::embedded().clone()),
        }
    }

    /// Parses and validates policy text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<ClearingPolicy, PolicyError> {
        let doc = Document { text, path: origin };
        let raw: RawPolicy = toml::from_str(text).map_err(|e| doc.toml_error(&e))?;
        Validator { doc: &doc }.policy(raw)
    }

    /// The file this policy came from (`policies/clearing.toml` for the embedded one).
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Whether this is the policy compiled into the binary.
    pub fn is_embedded(&self) -> bool {
        self.embedded
    }

    /// The `calibration` setting.
    pub fn calibration(&self) -> CalibrationMode {
        self.calibration
    }

    /// The rules, in the order they are tried.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The first rule that matches `cpu`.
    pub fn matching_rule(&self, cpu: &CpuInfo) -> Option<&Rule> {
        self.rules.iter().find(|r| r.matches(cpu))
    }

    /// The clearing decision for `cpu`: the first matching rule's plan. If no rule matches
    /// (a custom policy without a catch-all), `rep stosb`, which every x86-64 runs, under
    /// the rule name [`BUILTIN_FALLBACK_RULE`].
    pub fn resolve(&self, cpu: &CpuInfo) -> Resolution {
        match self.matching_rule(cpu) {
            Some(rule) => Resolution {
                rule: rule.name.clone(),
                plan: rule.plan(cpu),
                threads: rule.threads,
                source: rule.source.clone(),
                decided_by: DecidedBy::Rule,
                calibration: None,
            },
            None => {
                tracing::warn!(cpu = %cpu, policy = %self.origin.display(), "no clearing rule matches; using rep stosb");
                Resolution {
                    rule: BUILTIN_FALLBACK_RULE.to_string(),
                    plan: ClearPlan {
                        method: Method::RepStosb,
                        fence_interval: self.defaults.fence_interval,
                        nt_min_extent: self.defaults.nt_min_extent.bytes_for(cpu),
                    },
                    threads: self.defaults.threads,
                    source: format!(
                        "no rule in {} matches this CPU; rep stosb runs on every x86-64",
                        self.origin.display()
                    ),
                    decided_by: DecidedBy::Rule,
                    calibration: None,
                }
            }
        }
    }
}

/// Turns the raw file into rules, with errors that name the line and field.
struct Validator<'a> {
    doc: &'a Document<'a>,
}

impl Validator<'_> {
    fn err<T>(
        &self,
        span: std::ops::Range<usize>,
        field: &str,
        message: impl Into<String>,
    ) -> Result<T, PolicyError> {
        Err(self.doc.error(span.start, Some(field.to_string()), message))
    }

    fn policy(&self, raw: RawPolicy) -> Result<ClearingPolicy, PolicyError> {
        let calibration = match &raw.calibration {
            None => CalibrationMode::default(),
            Some(c) => match c.get_ref().parse() {
                Ok(mode) => mode,
                Err(message) => return self.err(c.span(), "calibration", message),
            },
        };
        let defaults = self.defaults(&raw.defaults)?;
        if raw.rules.is_empty() {
            return self.err(
                0..0,
                "rule",
                "the policy has no [[rule]]: add at least a catch-all rule",
            );
        }
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut rules = Vec::with_capacity(raw.rules.len());
        for (i, raw_rule) in raw.rules.into_iter().enumerate() {
            let rule = self.rule(i + 1, raw_rule, &defaults)?;
            if let Some(first) = names.insert(rule.name.clone(), rule.line) {
                return Err(PolicyError::Invalid {
                    path: self.doc.path.to_path_buf(),
                    line: rule.line,
                    column: 1,
                    field: Some(format!("rule[{}].name", i + 1)),
                    message: format!(
                        "rule name {:?} is already used by the rule on line {first}",
                        rule.name
                    ),
                });
            }
            rules.push(rule);
        }
        Ok(ClearingPolicy {
            origin: self.doc.path.to_path_buf(),
            embedded: false,
            calibration,
            defaults,
            rules,
        })
    }

    fn defaults(&self, raw: &RawDefaults) -> Result<Defaults, PolicyError> {
        Ok(Defaults {
            nt_min_extent: match &raw.nt_min_extent {
                Some(v) => self.nt_min_extent(v, "defaults.nt_min_extent")?,
                None => NtMinExtent::Llc,
            },
            fence_interval: match &raw.fence_interval {
                Some(v) => self.fence_interval(v, "defaults.fence_interval")?,
                None => DEFAULT_FENCE_INTERVAL,
            },
            threads: match &raw.threads {
                Some(v) => self.threads(v, "defaults.threads")?,
                None => Threads::All,
            },
        })
    }

    fn rule(&self, index: usize, raw: RawRule, defaults: &Defaults) -> Result<Rule, PolicyError> {
        let field = |name: &str| format!("rule[{index}].{name}");
        let name = raw.name.get_ref().trim().to_string();
        if name.is_empty() {
            return self.err(
                raw.name.span(),
                &field("name"),
                "a rule needs a non-empty name",
            );
        }
        let line = self.doc.line_column(raw.name.span().start).0;

        let vendor = match &raw.vendor {
            None => None,
            Some(v) => Some(self.vendor(v, &field("vendor"))?),
        };
        let family = match &raw.family {
            None => None,
            Some(f) if *f.get_ref() > MAX_FAMILY => {
                return self.err(
                    f.span(),
                    &field("family"),
                    format!(
                        "family {:#x} is above the largest CPUID family {MAX_FAMILY:#x}",
                        f.get_ref()
                    ),
                )
            }
            Some(f) => Some(*f.get_ref()),
        };
        let models = self.id_match(
            raw.models.as_ref(),
            raw.model_ranges.as_ref(),
            MAX_MODEL,
            (&field("models"), &field("model_ranges")),
        )?;
        let steppings = self.id_match(
            raw.steppings.as_ref(),
            raw.stepping_ranges.as_ref(),
            MAX_STEPPING,
            (&field("steppings"), &field("stepping_ranges")),
        )?;
        if family.is_none() {
            let first_id_field = [
                raw.models.as_ref().map(|m| (m.span(), "models")),
                raw.model_ranges
                    .as_ref()
                    .map(|m| (m.span(), "model_ranges")),
                raw.steppings.as_ref().map(|m| (m.span(), "steppings")),
                raw.stepping_ranges
                    .as_ref()
                    .map(|m| (m.span(), "stepping_ranges")),
            ]
            .into_iter()
            .flatten()
            .next();
            if let Some((span, name)) = first_id_field {
                return self.err(
                    span,
                    &field(name),
                    "model and stepping numbers mean different CPUs in different families: set `family` too",
                );
            }
        }

        let mut requires = Features::NONE;
        for r in &raw.requires {
            match r.get_ref().parse::<Feature>() {
                Ok(f) => requires.set(f, true),
                Err(e) => return self.err(r.span(), &field("requires"), e.to_string()),
            }
        }
        let method = match raw.method.get_ref().parse::<Method>() {
            Ok(m) => m,
            Err(e) => return self.err(raw.method.span(), &field("method"), e.to_string()),
        };
        let nt_min_extent = match &raw.nt_min_extent {
            Some(v) => self.nt_min_extent(v, &field("nt_min_extent"))?,
            None => defaults.nt_min_extent,
        };
        let fence_interval = match &raw.fence_interval {
            Some(v) => self.fence_interval(v, &field("fence_interval"))?,
            None => defaults.fence_interval,
        };
        let threads = match &raw.threads {
            Some(v) => self.threads(v, &field("threads"))?,
            None => defaults.threads,
        };
        let source = raw
            .source
            .get_ref()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if source.is_empty() {
            return self.err(
                raw.source.span(),
                &field("source"),
                "say where the rule's choice comes from (a measurement, a kernel or glibc change)",
            );
        }
        Ok(Rule {
            name,
            line,
            vendor,
            family,
            models,
            steppings,
            requires,
            method,
            nt_min_extent,
            fence_interval,
            threads,
            source,
        })
    }

    fn vendor(&self, v: &Spanned<String>, field: &str) -> Result<Vendor, PolicyError> {
        let text = v.get_ref().trim();
        match text.to_ascii_lowercase().as_str() {
            "" => self.err(v.span(), field, "vendor is empty: write \"intel\", \"amd\" or a CPUID vendor string, or leave it out"),
            "intel" | "genuineintel" => Ok(Vendor::Intel),
            "amd" | "authenticamd" => Ok(Vendor::Amd),
            _ => Ok(Vendor::Other(text.to_string())),
        }
    }

    #[allow(clippy::type_complexity)]
    fn id_match(
        &self,
        values: Option<&Spanned<Vec<Spanned<u32>>>>,
        ranges: Option<&Spanned<Vec<Spanned<[u32; 2]>>>>,
        max: u32,
        (values_field, ranges_field): (&str, &str),
    ) -> Result<IdMatch, PolicyError> {
        let mut out = IdMatch::default();
        if let Some(values) = values {
            if values.get_ref().is_empty() {
                return self.err(
                    values.span(),
                    values_field,
                    "an empty list matches no CPU; leave the field out to match any",
                );
            }
            for v in values.get_ref() {
                if *v.get_ref() > max {
                    return self.err(
                        v.span(),
                        values_field,
                        format!(
                            "{} is above the largest possible value {max:#x}",
                            v.get_ref()
                        ),
                    );
                }
                out.values.push(*v.get_ref());
            }
        }
        if let Some(ranges) = ranges {
            if ranges.get_ref().is_empty() {
                return self.err(
                    ranges.span(),
                    ranges_field,
                    "an empty list matches no CPU; leave the field out to match any",
                );
            }
            for r in ranges.get_ref() {
                let [lo, hi] = *r.get_ref();
                if lo > hi {
                    return self.err(
                        r.span(),
                        ranges_field,
                        format!("range [{lo:#x}, {hi:#x}] is reversed: write the low end first, [{hi:#x}, {lo:#x}]"),
                    );
                }
                if hi > max {
                    return self.err(
                        r.span(),
                        ranges_field,
                        format!("{hi:#x} is above the largest possible value {max:#x}"),
                    );
                }
                out.ranges.push(lo..=hi);
            }
        }
        Ok(out)
    }

    fn bytes(&self, v: &Spanned<Scalar>, field: &str, allowed: &str) -> Result<usize, PolicyError> {
        let bytes = match v.get_ref() {
            Scalar::Int(i) => u64::try_from(*i).ok(),
            Scalar::Text(s) => parse_bytes(s).ok(),
        };
        match bytes.and_then(|b| usize::try_from(b).ok()) {
            Some(b) => Ok(b),
            None => self.err(v.span(), field, format!("{} is not {allowed}", v.get_ref())),
        }
    }

    fn nt_min_extent(&self, v: &Spanned<Scalar>, field: &str) -> Result<NtMinExtent, PolicyError> {
        if matches!(v.get_ref(), Scalar::Text(s) if s.eq_ignore_ascii_case("llc")) {
            return Ok(NtMinExtent::Llc);
        }
        self.bytes(v, field, "\"llc\" or a size such as \"32M\" or 33554432")
            .map(NtMinExtent::Bytes)
    }

    fn fence_interval(&self, v: &Spanned<Scalar>, field: &str) -> Result<usize, PolicyError> {
        let bytes = self.bytes(v, field, "a size such as \"2M\" or 2097152")?;
        if bytes < CACHE_LINE || bytes % CACHE_LINE != 0 {
            return self.err(
                v.span(),
                field,
                format!("{} is not a positive multiple of the {CACHE_LINE}-byte cache line (use at least \"64K\"; \"2M\" is the default)", v.get_ref()),
            );
        }
        Ok(bytes)
    }

    fn threads(&self, v: &Spanned<Scalar>, field: &str) -> Result<Threads, PolicyError> {
        let parsed = match v.get_ref() {
            Scalar::Text(s) if s == "all" => Some(Threads::All),
            Scalar::Int(i) => usize::try_from(*i)
                .ok()
                .and_then(NonZeroUsize::new)
                .map(Threads::Count),
            Scalar::Text(_) => None,
        };
        match parsed {
            Some(t) => Ok(t),
            None => self.err(
                v.span(),
                field,
                format!("{} is not \"all\" or a number of threads >= 1", v.get_ref()),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_policy_parses() {
        let p = ClearingPolicy::embedded();
        assert!(p.is_embedded());
        assert_eq!(p.calibration(), CalibrationMode::Report);
        assert!(p.rules().len() >= 10);
        assert_eq!(p.rules().last().unwrap().name, "generic-movnti");
    }

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
