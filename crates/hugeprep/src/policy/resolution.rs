//! What the policy chose for one CPU, and how a calibration run confirms or overrides it.

use serde::Serialize;

use super::confidence::{Confidence, Evidence, Margins, GUESS_MARGINS};
use super::rule::{CalibrationMode, Threads};
use crate::clear::{ClearPlan, Method};

/// How much slower than the fastest measured method the rule's method may be and still be
/// kept: 10%.
pub const CALIBRATION_TOLERANCE: f64 = 0.10;

/// Who chose the clearing method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecidedBy {
    /// The first matching policy rule.
    Rule,
    /// Calibration, because the rule's method was clearly slower than the fastest method
    /// measured (`override`: by more than [`CALIBRATION_TOLERANCE`]; `auto`: by the
    /// rule's [`Confidence::margins`]).
    Calibration,
}

/// Measured clearing bandwidth per method. [`crate::clear::Calibration`] implements it;
/// so does a plain slice of `(method, GB/s)` pairs.
pub trait Timings {
    /// GB/s measured for `method`; `None` when it was not timed (e.g. the CPU lacks it).
    fn gbps_of(&self, method: Method) -> Option<f64>;

    /// GB/s of `method` in each calibration round (one round unless the timings say more).
    fn rounds_of(&self, method: Method) -> Vec<f64> {
        self.gbps_of(method).into_iter().collect()
    }

    /// The fastest timed method and its GB/s, ignoring non-finite and non-positive figures.
    fn fastest(&self) -> Option<(Method, f64)> {
        Method::ALL
            .into_iter()
            .filter_map(|m| self.gbps_of(m).map(|g| (m, g)))
            .filter(|(_, g)| g.is_finite() && *g > 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

impl Timings for [(Method, f64)] {
    fn gbps_of(&self, method: Method) -> Option<f64> {
        self.iter().find(|(m, _)| *m == method).map(|(_, g)| *g)
    }
}

impl Timings for crate::clear::Calibration {
    fn gbps_of(&self, method: Method) -> Option<f64> {
        crate::clear::Calibration::gbps_of(self, method)
    }

    fn rounds_of(&self, method: Method) -> Vec<f64> {
        self.methods
            .iter()
            .find(|t| t.method == method)
            .map(|t| t.rounds.clone())
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| self.gbps_of(method).into_iter().collect())
    }

    fn fastest(&self) -> Option<(Method, f64)> {
        self.gbps_of(self.fastest).map(|g| (self.fastest, g))
    }
}

impl<const N: usize> Timings for [(Method, f64); N] {
    fn gbps_of(&self, method: Method) -> Option<f64> {
        self.as_slice().gbps_of(method)
    }
}

impl Timings for Vec<(Method, f64)> {
    fn gbps_of(&self, method: Method) -> Option<f64> {
        self.as_slice().gbps_of(method)
    }
}

/// What a calibration run said about the rule's method.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct CalibrationOutcome {
    /// The mode it ran in (`report`, `override` or `auto`).
    pub mode: CalibrationMode,
    /// The rule's confidence, which sets the margins in `auto` mode.
    pub confidence: Confidence,
    /// The margins applied (`report` and `override`: replace below 90%, no hysteresis).
    pub margins: Margins,
    /// The method the rule chose.
    pub rule_method: Method,
    /// Its measured GB/s; `None` if it was not timed.
    pub rule_gbps: Option<f64>,
    /// The fastest method measured.
    pub fastest: Method,
    /// Its GB/s.
    pub fastest_gbps: f64,
    /// Whether the rule's method is at most [`CALIBRATION_TOLERANCE`] slower than the fastest.
    pub within_tolerance: bool,
    /// Whether another method replaced the rule's (`override` and `auto` modes).
    pub overridden: bool,
    /// The method in use after this calibration.
    pub chosen: Method,
    /// What happened and why, in one sentence.
    pub reason: String,
}

/// What a calibration said about the policy rule, in one word (metrics, health, alerts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// No calibration ran (`calibration = "off"`, or it failed): the rule decided alone.
    NotCalibrated,
    /// The rule's method is within [`CALIBRATION_TOLERANCE`] of the fastest measured.
    Agrees,
    /// The rule's method was clearly slower and calibration replaced it: the daemon clears
    /// with the fastest, and the policy file is wrong for this CPU.
    Overridden,
    /// The rule's method was clearly slower and stays in use (`report` mode, or within the
    /// rule's margins in `auto` mode): scrubs run slower than the host allows.
    Disagrees,
}

impl Verdict {
    /// Every verdict, in label order.
    pub const ALL: [Verdict; 4] = [
        Verdict::NotCalibrated,
        Verdict::Agrees,
        Verdict::Overridden,
        Verdict::Disagrees,
    ];

    /// The verdict of `outcome` (`None`: no calibration).
    pub fn of(outcome: Option<&CalibrationOutcome>) -> Verdict {
        match outcome {
            None => Verdict::NotCalibrated,
            Some(o) if o.within_tolerance => Verdict::Agrees,
            Some(o) if o.overridden => Verdict::Overridden,
            Some(_) => Verdict::Disagrees,
        }
    }

    /// `not_calibrated`, `agrees`, `overridden` or `disagrees`.
    pub const fn label(self) -> &'static str {
        match self {
            Verdict::NotCalibrated => "not_calibrated",
            Verdict::Agrees => "agrees",
            Verdict::Overridden => "overridden",
            Verdict::Disagrees => "disagrees",
        }
    }
}

/// The clearing decision for one CPU: the plan, the default thread count, and who decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Resolution {
    /// The name of the rule that matched (`builtin-fallback` if none did).
    pub rule: String,
    /// How to clear. `plan.method` is the rule's method unless calibration overrode it.
    pub plan: ClearPlan,
    /// Default number of clearing threads per NUMA node.
    pub threads: Threads,
    /// Where the rule's choice comes from.
    pub source: String,
    /// The rule's confidence (`guess` for the built-in fallback).
    pub confidence: Confidence,
    /// Whether the rule or calibration chose `plan.method`.
    pub decided_by: DecidedBy,
    /// The last calibration applied, if any.
    pub calibration: Option<CalibrationOutcome>,
}

impl Resolution {
    /// The method to clear with.
    pub fn method(&self) -> Method {
        self.plan.method
    }

    /// The method the rule chose, even if calibration has replaced it.
    pub fn rule_method(&self) -> Method {
        self.calibration
            .as_ref()
            .map_or(self.plan.method, |c| c.rule_method)
    }

    /// Compares the rule's method with calibration's timings. `Off` changes nothing;
    /// `Report` records whether the rule's method is within [`CALIBRATION_TOLERANCE`] of the
    /// fastest; `Override` also switches to the fastest method when it is not; `Auto` switches
    /// by the margins of the rule's [`Confidence`] (a `guess` like `Override`; a `measured` or
    /// `published` rule only when it is more than 25% slower in every round). `previous` is
    /// the method an earlier calibration chose instead of the rule's, with its GB/s then: it
    /// stays inside the hysteresis band. Timings with no usable figure change nothing.
    /// Applying a second calibration judges the rule's method again, not the previous winner.
    ///
    /// ```
    /// use hugeprep::clear::Method;
    /// use hugeprep::cpu::CpuInfo;
    /// use hugeprep::policy::{CalibrationMode, ClearingPolicy, DecidedBy};
    ///
    /// let mut r = ClearingPolicy::embedded().resolve(CpuInfo::host());
    /// let rule_method = r.method();
    /// let fastest = if rule_method == Method::Clzero { Method::Avx2Nt } else { Method::Clzero };
    /// let timings = [(rule_method, 50.0), (fastest, 80.0)];
    ///
    /// r.apply_calibration(CalibrationMode::Report, &timings, None);
    /// assert_eq!((r.method(), r.decided_by), (rule_method, DecidedBy::Rule));
    /// assert!(!r.calibration.as_ref().unwrap().within_tolerance);
    ///
    /// r.apply_calibration(CalibrationMode::Override, &timings, None);
    /// assert_eq!((r.method(), r.decided_by), (fastest, DecidedBy::Calibration));
    /// ```
    pub fn apply_calibration<T: Timings + ?Sized>(
        &mut self,
        mode: CalibrationMode,
        cal: &T,
        previous: Option<(Method, f64)>,
    ) {
        if mode == CalibrationMode::Off {
            return;
        }
        let Some((fastest, fastest_gbps)) = cal.fastest() else {
            tracing::warn!("calibration measured no method; keeping rule {}", self.rule);
            return;
        };
        let rule_method = self.rule_method();
        let rule_gbps = cal.gbps_of(rule_method).filter(|g| g.is_finite());
        let within_tolerance =
            rule_gbps.is_some_and(|g| g >= fastest_gbps * (1.0 - CALIBRATION_TOLERANCE));
        let margins = match mode {
            CalibrationMode::Auto => self.confidence.margins(),
            _ => Margins {
                replace_below: 1.0 - CALIBRATION_TOLERANCE,
                restore_at: 1.0 - CALIBRATION_TOLERANCE,
                every_round: false,
            },
        };
        let judgement = match rule_gbps {
            // A rule whose method was not timed cannot be weighed: replace it like a guess.
            None => Evidence {
                rule_method,
                rule_gbps: 0.0,
                rule_rounds: Vec::new(),
                fastest,
                fastest_gbps,
                fastest_rounds: Vec::new(),
                previous_override: previous,
            }
            .judge(GUESS_MARGINS),
            Some(g) => Evidence {
                rule_method,
                rule_gbps: g,
                rule_rounds: cal.rounds_of(rule_method),
                fastest,
                fastest_gbps,
                fastest_rounds: cal.rounds_of(fastest),
                previous_override: previous,
            }
            .judge(margins),
        };
        let overridden = judgement.overridden && mode != CalibrationMode::Report;
        let reason = match mode {
            CalibrationMode::Report if judgement.overridden => format!(
                "{} (calibration = report: keeping the rule)",
                judgement.reason.replace(
                    &format!("calibration replaces it with {}", judgement.method),
                    &format!("{} would be used", judgement.method)
                )
            ),
            CalibrationMode::Auto => format!("rule is {}: {}", self.confidence, judgement.reason),
            _ => judgement.reason,
        };
        if overridden {
            self.plan.method = judgement.method;
            self.decided_by = DecidedBy::Calibration;
        } else {
            self.plan.method = rule_method;
            self.decided_by = DecidedBy::Rule;
        }
        self.calibration = Some(CalibrationOutcome {
            mode,
            confidence: self.confidence,
            margins,
            rule_method,
            rule_gbps,
            fastest,
            fastest_gbps,
            within_tolerance,
            overridden,
            chosen: self.plan.method,
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolution(method: Method) -> Resolution {
        Resolution {
            rule: "r".into(),
            plan: ClearPlan::always(method),
            threads: Threads::All,
            source: "s".into(),
            confidence: Confidence::Guess,
            decided_by: DecidedBy::Rule,
            calibration: None,
        }
    }

    #[test]
    fn within_ten_percent_is_kept_even_in_override() {
        let mut r = resolution(Method::Avx512Nt);
        r.apply_calibration(
            CalibrationMode::Override,
            &[(Method::Avx512Nt, 66.0), (Method::Clzero, 73.0)],
            None,
        );
        let c = r.calibration.clone().unwrap();
        assert!(c.within_tolerance && !c.overridden);
        assert_eq!(
            (r.method(), r.decided_by),
            (Method::Avx512Nt, DecidedBy::Rule)
        );
    }

    #[test]
    fn more_than_ten_percent_slower_is_overridden() {
        let mut r = resolution(Method::RepStosb);
        r.apply_calibration(
            CalibrationMode::Override,
            &[(Method::RepStosb, 29.0), (Method::Avx512Nt, 73.0)],
            None,
        );
        assert_eq!(r.method(), Method::Avx512Nt);
        assert_eq!(r.decided_by, DecidedBy::Calibration);
        assert_eq!(r.rule_method(), Method::RepStosb);
        // A later calibration judges the rule's method again.
        r.apply_calibration(
            CalibrationMode::Override,
            &[(Method::RepStosb, 72.0), (Method::Avx512Nt, 73.0)],
            None,
        );
        assert_eq!(
            (r.method(), r.decided_by),
            (Method::RepStosb, DecidedBy::Rule)
        );
    }

    #[test]
    fn report_only_records() {
        let mut r = resolution(Method::Clzero);
        r.apply_calibration(CalibrationMode::Report, &vec![(Method::Movnti, 37.0)], None);
        let c = r.calibration.clone().unwrap();
        assert_eq!(c.rule_gbps, None);
        assert!(!c.within_tolerance && !c.overridden);
        assert_eq!(r.method(), Method::Clzero);
    }

    #[test]
    fn off_and_empty_timings_change_nothing() {
        let mut r = resolution(Method::Clzero);
        r.apply_calibration(CalibrationMode::Off, &[(Method::Movnti, 99.0)], None);
        let empty: [(Method, f64); 0] = [];
        r.apply_calibration(CalibrationMode::Override, &empty, None);
        r.apply_calibration(
            CalibrationMode::Override,
            &[(Method::Movnti, f64::NAN)],
            None,
        );
        assert_eq!(r, resolution(Method::Clzero));
    }

    #[test]
    fn auto_replaces_a_guess_but_keeps_a_measured_rule_within_its_margin() {
        let timings = [(Method::Avx512Nt, 70.0), (Method::Clzero, 85.0)];
        let mut guess = resolution(Method::Avx512Nt);
        guess.apply_calibration(CalibrationMode::Auto, &timings, None);
        assert_eq!(
            (guess.method(), guess.decided_by),
            (Method::Clzero, DecidedBy::Calibration)
        );
        let c = guess.calibration.as_ref().unwrap();
        assert!(
            c.reason
                .starts_with("rule is guess: avx512-nt at 82% of clzero"),
            "{}",
            c.reason
        );

        let mut measured = resolution(Method::Avx512Nt);
        measured.confidence = Confidence::Measured;
        measured.apply_calibration(CalibrationMode::Auto, &timings, None);
        assert_eq!(
            (measured.method(), measured.decided_by),
            (Method::Avx512Nt, DecidedBy::Rule)
        );
        let c = measured.calibration.clone().unwrap();
        assert!(!c.overridden && !c.within_tolerance);
        assert!(c.reason.contains("the rule stands"), "{}", c.reason);
    }

    #[test]
    fn report_says_what_auto_would_do_without_doing_it() {
        let mut r = resolution(Method::RepStosb);
        r.apply_calibration(
            CalibrationMode::Report,
            &[(Method::RepStosb, 9.5), (Method::Avx512Nt, 23.0)],
            None,
        );
        let c = r.calibration.clone().unwrap();
        assert_eq!((r.method(), c.overridden), (Method::RepStosb, false));
        assert!(c.reason.contains("avx512-nt would be used"), "{}", c.reason);
    }
}
