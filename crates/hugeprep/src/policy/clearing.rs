//! The clearing policy: ordered rules that map a CPU to a clearing method, minimum
//! non-temporal extent, fence interval and thread count. The default policy is
//! `policies/clearing.toml`, compiled in; the format is in `docs/clearing.md`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::confidence::Confidence;
use super::error::{Document, PolicyError};
use super::resolution::{DecidedBy, Resolution};
use super::rule::{CalibrationMode, Defaults, Rule};
use super::schema::RawPolicy;
use super::validate::{Validated, Validator};
use crate::clear::{calibrate, CalibrateError, Calibration, ClearPlan, ClearPurpose, Method};
use crate::cpu::CpuInfo;

/// The text of `policies/clearing.toml`, compiled into the binary.
pub const EMBEDDED_CLEARING_POLICY: &str = include_str!("../../../../policies/clearing.toml");

/// The name errors and reports give the embedded policy.
pub const EMBEDDED_CLEARING_POLICY_PATH: &str = "policies/clearing.toml";

/// The rule name a [`Resolution`] carries when no rule matched.
pub const BUILTIN_FALLBACK_RULE: &str = "builtin-fallback";

/// How long a calibration may spend timing the clearing methods, after its warm-up: with the
/// warm-up, a calibration takes about 300 ms.
pub const CALIBRATION_BUDGET: std::time::Duration = std::time::Duration::from_millis(200);

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
        let Validated {
            calibration,
            defaults,
            rules,
        } = Validator { doc: &doc }.policy(raw)?;
        Ok(ClearingPolicy {
            origin: origin.to_path_buf(),
            embedded: false,
            calibration,
            defaults,
            rules,
        })
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

    /// Resolves the rule for `cpu` and, unless `mode` is `Off`, times every available method
    /// (about [`CALIBRATION_BUDGET`]) and applies the result the way `mode` says: "trust but
    /// verify". Returns the decision and the measurements it rests on.
    pub fn decide(
        &self,
        cpu: &CpuInfo,
        mode: CalibrationMode,
    ) -> Result<(Resolution, Option<Calibration>), CalibrateError> {
        let mut resolution = self.resolve(cpu);
        if mode == CalibrationMode::Off {
            return Ok((resolution, None));
        }
        let measured = calibrate(CALIBRATION_BUDGET)?;
        resolution.apply_calibration(mode, &measured, None);
        Ok((resolution, Some(measured)))
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
                confidence: rule.confidence,
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
                        purpose: ClearPurpose::Scrub,
                    },
                    threads: self.defaults.threads,
                    source: format!(
                        "no rule in {} matches this CPU; rep stosb runs on every x86-64",
                        self.origin.display()
                    ),
                    confidence: Confidence::Guess,
                    decided_by: DecidedBy::Rule,
                    calibration: None,
                }
            }
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
        assert_eq!(p.calibration(), CalibrationMode::Auto);
        assert!(p.rules().len() >= 10);
        assert_eq!(p.rules().last().unwrap().name, "generic-movnti");
    }
}
