//! Validation of a parsed policy file: every value checked against what it may be, with
//! errors that name the line and the field.

use std::collections::HashMap;
use std::num::NonZeroUsize;

use toml::Spanned;

use super::confidence::Confidence;
use super::error::{Document, PolicyError};
use super::rule::{CalibrationMode, Defaults, IdMatch, NtMinExtent, Rule, Threads};
use super::schema::{RawDefaults, RawPolicy, RawRule, Scalar};
use crate::clear::Method;
use crate::cpu::{Feature, Features, Vendor};
use crate::units::parse_bytes;

const DEFAULT_FENCE_INTERVAL: usize = 2 << 20;
const CACHE_LINE: usize = 64;
const MAX_FAMILY: u32 = 0xf + 0xff;
const MAX_MODEL: u32 = 0xff;
const MAX_STEPPING: u32 = 0xf;

/// A policy file's settings once every value is checked.
pub(super) struct Validated {
    pub calibration: CalibrationMode,
    pub defaults: Defaults,
    pub rules: Vec<Rule>,
}

/// Turns the raw file into rules, with errors that name the line and field.
pub(super) struct Validator<'a> {
    pub doc: &'a Document<'a>,
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

    pub fn policy(&self, raw: RawPolicy) -> Result<Validated, PolicyError> {
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
        Ok(Validated {
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
        let confidence = match &raw.confidence {
            None => Confidence::Guess,
            Some(c) => match c.get_ref().parse() {
                Ok(c) => c,
                Err(message) => return self.err(c.span(), &field("confidence"), message),
            },
        };
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
            confidence,
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
