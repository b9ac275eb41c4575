//! An adaptive warm target: the operator gives a warm-start goal and a ceiling in place of a
//! size (`goal = 99.0`, `ceiling = "64G"`), and the daemon sizes the target itself from the
//! VM starts it sees (`pool::adaptive`, `pool::core::forecast`).

use serde::{Deserialize, Serialize};

use super::pool_error::PoolPolicyError;
use super::target::{field_bytes, Target, TargetSpec};

/// The lowest goal, percent: below it a static target is the better tool.
pub const MIN_GOAL_PERCENT: f64 = 50.0;
/// The highest goal, percent.
pub const MAX_GOAL_PERCENT: f64 = 100.0;

/// A warm-start goal as written (percent of VM starts served warm, e.g. `99.0`). Compared by
/// its bits so that the specs that hold it stay `Eq`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Percent(pub f64);

impl PartialEq for Percent {
    fn eq(&self, other: &Percent) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Percent {}

/// A validated adaptive goal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AdaptiveGoal {
    /// The warm-start goal in basis points (5000 to 10000: 99% is 9900).
    pub goal_bp: u32,
    /// Never more warm bytes than this (a positive whole number of pages).
    pub ceiling: u64,
}

impl AdaptiveGoal {
    /// The goal as a share of starts (0.5 to 1).
    pub fn rate(&self) -> f64 {
        f64::from(self.goal_bp) / 10_000.0
    }

    /// The goal in percent.
    pub fn percent(&self) -> f64 {
        f64::from(self.goal_bp) / 100.0
    }
}

fn field(field: String, message: impl Into<String>) -> PoolPolicyError {
    PoolPolicyError::Field {
        field,
        message: message.into(),
    }
}

/// Validates an adaptive target: `None` when `spec` gives neither `goal` nor `ceiling` (a
/// static target). Both are needed together, and neither with `warm` or `flavors`. The
/// validated target keeps no warm bytes until the daemon has sized it.
pub(super) fn validate(spec: &TargetSpec, prefix: &str) -> Result<Option<Target>, PoolPolicyError> {
    if spec.goal.is_none() && spec.ceiling.is_none() {
        return Ok(None);
    }
    if !spec.warm.is_empty() {
        return Err(field(
            format!("{prefix}.warm"),
            "give either warm (a fixed size) or goal and ceiling (a target the daemon sizes), not both",
        ));
    }
    if !spec.flavors.is_empty() {
        return Err(field(
            format!("{prefix}.flavors"),
            "an adaptive target (goal and ceiling) keeps no flavors: give sizes, or warm with flavors",
        ));
    }
    let Some(Percent(goal)) = spec.goal else {
        return Err(field(
            format!("{prefix}.goal"),
            format!(
                "missing: a ceiling needs a goal, the warm-start rate in percent \
                 ({MIN_GOAL_PERCENT} to {MAX_GOAL_PERCENT})"
            ),
        ));
    };
    let Some(ceiling) = &spec.ceiling else {
        return Err(field(
            format!("{prefix}.ceiling"),
            "missing: a goal needs a ceiling, the most warm memory the target may keep (e.g. \"64G\")",
        ));
    };
    if !goal.is_finite() || !(MIN_GOAL_PERCENT..=MAX_GOAL_PERCENT).contains(&goal) {
        return Err(field(
            format!("{prefix}.goal"),
            format!(
                "{goal}: must be {MIN_GOAL_PERCENT} to {MAX_GOAL_PERCENT} \
                 (percent of VM starts served warm)"
            ),
        ));
    }
    let page = spec.page_size.bytes();
    let whole_pages = |name: String, text: &str| -> Result<u64, PoolPolicyError> {
        let bytes = field_bytes(name.clone(), text)?;
        if bytes == 0 || bytes % page != 0 {
            return Err(field(
                name,
                format!(
                    "{text} is not a positive multiple of the target's page_size {}",
                    spec.page_size
                ),
            ));
        }
        Ok(bytes)
    };
    let ceiling = whole_pages(format!("{prefix}.ceiling"), ceiling)?;
    let mut sizes = Vec::new();
    for (j, s) in spec.sizes.iter().enumerate() {
        sizes.push(whole_pages(format!("{prefix}.sizes[{j}]"), s)?);
    }
    Ok(Some(Target {
        page_size: spec.page_size,
        node: spec.node,
        warm: 0,
        sizes,
        flavors: Vec::new(),
        adaptive: Some(AdaptiveGoal {
            goal_bp: (goal * 100.0).round() as u32,
            ceiling,
        }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page_size::PageSize;

    fn spec(goal: Option<f64>, ceiling: Option<&str>, warm: &str) -> TargetSpec {
        TargetSpec {
            page_size: PageSize::Size2M,
            node: Some(0),
            warm: warm.into(),
            sizes: Vec::new(),
            flavors: Vec::new(),
            goal: goal.map(Percent),
            ceiling: ceiling.map(str::to_string),
        }
    }

    fn err_field(s: &TargetSpec) -> (String, String) {
        match s.validate("target[0]") {
            Err(PoolPolicyError::Field { field, message }) => (field, message),
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn goal_and_ceiling_make_an_adaptive_target() {
        let t = spec(Some(99.0), Some("64G"), "")
            .validate("target[0]")
            .unwrap();
        assert_eq!(t.warm, 0);
        assert!(t.flavors.is_empty());
        let a = t.adaptive.unwrap();
        assert_eq!(a.goal_bp, 9900);
        assert_eq!(a.ceiling, 64 << 30);
        assert!((a.rate() - 0.99).abs() < 1e-12);
        // Eq holds through the goal's bits.
        assert_eq!(
            spec(Some(99.5), Some("1G"), ""),
            spec(Some(99.5), Some("1G"), "")
        );
    }

    #[test]
    fn static_targets_are_untouched() {
        let t = spec(None, None, "4G").validate("target[0]").unwrap();
        assert_eq!(t.adaptive, None);
        assert_eq!(t.warm, 4 << 30);
    }

    #[test]
    fn errors_name_the_field_and_the_limit() {
        let (f, m) = err_field(&spec(Some(99.0), Some("64G"), "4G"));
        assert_eq!(f, "target[0].warm");
        assert!(m.contains("not both"), "{m}");
        let (f, m) = err_field(&spec(Some(99.0), None, ""));
        assert_eq!(f, "target[0].ceiling");
        assert!(m.contains("missing"), "{m}");
        let (f, m) = err_field(&spec(None, Some("64G"), ""));
        assert_eq!(f, "target[0].goal");
        assert!(m.contains("50 to 100"), "{m}");
        for bad in [49.9, 100.5, f64::NAN, -1.0] {
            let (f, m) = err_field(&spec(Some(bad), Some("64G"), ""));
            assert_eq!(f, "target[0].goal");
            assert!(m.contains("must be 50 to 100"), "{m}");
        }
        let (f, m) = err_field(&spec(Some(99.0), Some("3M"), ""));
        assert_eq!(f, "target[0].ceiling");
        assert!(
            m.contains("positive multiple of the target's page_size 2M"),
            "{m}"
        );
        let (f, _) = err_field(&spec(Some(99.0), Some("0"), ""));
        assert_eq!(f, "target[0].ceiling");
        let (f, _) = err_field(&spec(Some(99.0), Some("lots"), ""));
        assert_eq!(f, "target[0].ceiling");
        let mut with_flavors = spec(Some(99.0), Some("64G"), "");
        with_flavors.flavors.push(super::super::target::FlavorSpec {
            size: "2G".into(),
            count: 1,
        });
        assert_eq!(err_field(&with_flavors).0, "target[0].flavors");
    }

    #[test]
    fn the_toml_keys() {
        let t: TargetSpec =
            toml::from_str("page_size = \"2M\"\ngoal = 99\nceiling = \"8G\"\n").unwrap();
        assert_eq!(t.goal, Some(Percent(99.0)));
        let v = t.validate("target[0]").unwrap();
        assert_eq!(v.adaptive.unwrap().ceiling, 8 << 30);
    }
}
