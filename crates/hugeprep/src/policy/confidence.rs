//! How much a rule's choice is trusted, and how much measured evidence it takes to replace
//! it: the margins `calibration = "auto"` applies, with hysteresis so that a noisy run cannot
//! flip the method back and forth.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::clear::Method;

/// Where a rule's choice comes from, as its `source` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Confidence {
    /// Timed on this CPU model (this project's machines).
    Measured,
    /// Timed on this CPU model by others (a kernel patch series, glibc tuning).
    Published,
    /// A family or feature fallback: assumed from similar CPUs, not timed on this model.
    /// Rules that do not say are guesses.
    #[default]
    Guess,
}

impl Confidence {
    /// `measured`, `published` or `guess`.
    pub const fn name(self) -> &'static str {
        match self {
            Confidence::Measured => "measured",
            Confidence::Published => "published",
            Confidence::Guess => "guess",
        }
    }

    /// The margins `calibration = "auto"` applies to a rule of this confidence.
    pub const fn margins(self) -> Margins {
        match self {
            Confidence::Guess => GUESS_MARGINS,
            Confidence::Measured | Confidence::Published => KNOWN_MODEL_MARGINS,
        }
    }
}

impl fmt::Display for Confidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Confidence {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            Confidence::Measured,
            Confidence::Published,
            Confidence::Guess,
        ]
        .into_iter()
        .find(|c| c.name() == s)
        .ok_or_else(|| format!("unknown confidence {s:?}: expected measured, published or guess"))
    }
}

/// When calibration replaces a rule's method and when it gives the method back.
///
/// The rule's method is compared with the fastest method as a ratio of throughputs. It is
/// replaced when the ratio is below `replace_below` (judged on the median of every sample,
/// or, with `every_round`, in each calibration round separately); a replacement made earlier
/// is undone only when the ratio is back at or above `restore_at`. Between the two the earlier
/// decision stands: that gap is the hysteresis.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Margins {
    /// Replace the rule's method when it reaches less than this fraction of the fastest.
    pub replace_below: f64,
    /// Go back to the rule's method once it reaches at least this fraction.
    pub restore_at: f64,
    /// Whether every calibration round must show the shortfall, not only the median.
    pub every_round: bool,
}

/// A guess is replaced when another method is more than 10% faster (the clearing goal's
/// tolerance), and restored at 95%.
pub const GUESS_MARGINS: Margins = Margins {
    replace_below: 0.90,
    restore_at: 0.95,
    every_round: false,
};

/// A measured or published rule is replaced only when it is more than 25% slower in every
/// round (the streaming methods' run-to-run spread on shared hosts is up to ~15%), and
/// restored at 90%.
pub const KNOWN_MODEL_MARGINS: Margins = Margins {
    replace_below: 0.75,
    restore_at: 0.90,
    every_round: true,
};

/// The evidence about one rule's method: its median and per-round throughput against the
/// fastest method's, and which method an earlier calibration chose, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Evidence {
    /// The rule's method.
    pub rule_method: Method,
    /// Its median GB/s over every sample.
    pub rule_gbps: f64,
    /// Its GB/s per round.
    pub rule_rounds: Vec<f64>,
    /// The fastest method by median.
    pub fastest: Method,
    /// Its median GB/s.
    pub fastest_gbps: f64,
    /// Its GB/s per round.
    pub fastest_rounds: Vec<f64>,
    /// The method an earlier calibration put in place of the rule's, kept while the evidence
    /// stays inside the hysteresis band; `None` when the rule's method was in use.
    pub previous_override: Option<(Method, f64)>,
}

/// What the margins made of the evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// The method to use.
    pub method: Method,
    /// Whether it replaces the rule's.
    pub overridden: bool,
    /// One sentence: what was compared and why it came out this way.
    pub reason: String,
}

impl Evidence {
    /// The rule's median as a fraction of the fastest method's.
    pub fn ratio(&self) -> f64 {
        if self.fastest_gbps > 0.0 {
            self.rule_gbps / self.fastest_gbps
        } else {
            1.0
        }
    }

    /// The highest per-round fraction: the rule's best showing in any round.
    fn best_round_ratio(&self) -> f64 {
        self.rule_rounds
            .iter()
            .zip(&self.fastest_rounds)
            .filter(|(_, f)| **f > 0.0)
            .map(|(r, f)| r / f)
            .fold(f64::NEG_INFINITY, f64::max)
    }

    /// Applies `margins`: see [`Margins`].
    ///
    /// ```
    /// use hugeprep::clear::Method;
    /// use hugeprep::policy::{Confidence, Evidence};
    ///
    /// // The masked Intel Xeon: rep stosb at 41% of avx512-nt in every round.
    /// let e = Evidence {
    ///     rule_method: Method::RepStosb,
    ///     rule_gbps: 9.5,
    ///     rule_rounds: vec![9.4, 9.5, 9.9],
    ///     fastest: Method::Avx512Nt,
    ///     fastest_gbps: 23.0,
    ///     fastest_rounds: vec![22.5, 23.0, 24.0],
    ///     previous_override: None,
    /// };
    /// assert_eq!(e.judge(Confidence::Guess.margins()).method, Method::Avx512Nt);
    /// assert_eq!(e.judge(Confidence::Measured.margins()).method, Method::Avx512Nt);
    /// ```
    pub fn judge(&self, margins: Margins) -> Judgement {
        let ratio = self.ratio();
        let pct = |r: f64| format!("{:.0}%", r * 100.0);
        let rule = self.rule_method;
        if self.fastest == rule {
            return Judgement {
                method: rule,
                overridden: false,
                reason: format!("{rule} measured fastest ({:.1} GB/s)", self.rule_gbps),
            };
        }
        let (shortfall, evidence) = if margins.every_round && !self.rule_rounds.is_empty() {
            let best_round = self.best_round_ratio();
            (
                best_round < margins.replace_below,
                format!(
                    "{rule} at {} of {} (best round {} of {} rounds)",
                    pct(ratio),
                    self.fastest,
                    pct(best_round),
                    self.rule_rounds.len()
                ),
            )
        } else {
            (
                ratio < margins.replace_below,
                format!("{rule} at {} of {}", pct(ratio), self.fastest),
            )
        };
        let needed = if margins.every_round {
            format!(
                "replacing needs below {} in every round",
                pct(margins.replace_below)
            )
        } else {
            format!("replacing needs below {}", pct(margins.replace_below))
        };
        if shortfall {
            // An earlier replacement that is still within 10% of the fastest stays: equal
            // streaming methods trade first place from run to run.
            let method = match self.previous_override {
                Some((prev, gbps)) if gbps >= self.fastest_gbps * 0.90 => prev,
                _ => self.fastest,
            };
            return Judgement {
                method,
                overridden: true,
                reason: format!("{evidence}: {needed}, so calibration replaces it with {method}"),
            };
        }
        if let Some((prev, _)) = self.previous_override {
            if ratio < margins.restore_at {
                return Judgement {
                    method: prev,
                    overridden: true,
                    reason: format!(
                        "{evidence}: an earlier calibration replaced it with {prev}, and going back needs {} or more",
                        pct(margins.restore_at)
                    ),
                };
            }
        }
        Judgement {
            method: rule,
            overridden: false,
            reason: format!("{evidence}: {needed}, so the rule stands"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(rule: f64, rounds: &[f64], previous: Option<Method>) -> Evidence {
        Evidence {
            rule_method: Method::RepStosb,
            rule_gbps: rule,
            rule_rounds: rounds.to_vec(),
            fastest: Method::Avx512Nt,
            fastest_gbps: 100.0,
            fastest_rounds: vec![100.0; rounds.len()],
            previous_override: previous.map(|m| (m, 100.0)),
        }
    }

    #[test]
    fn a_guess_is_replaced_when_another_method_is_clearly_faster() {
        let j = evidence(85.0, &[85.0, 86.0, 84.0], None).judge(GUESS_MARGINS);
        assert!(j.overridden && j.method == Method::Avx512Nt, "{j:?}");
        let j = evidence(92.0, &[92.0, 92.0, 92.0], None).judge(GUESS_MARGINS);
        assert!(!j.overridden && j.method == Method::RepStosb, "{j:?}");
    }

    #[test]
    fn a_known_model_needs_a_large_shortfall_in_every_round() {
        // 70% median, but one round at 80%: noise cannot be ruled out.
        let j = evidence(70.0, &[70.0, 80.0, 65.0], None).judge(KNOWN_MODEL_MARGINS);
        assert!(!j.overridden, "{j:?}");
        assert!(j.reason.contains("best round 80%"), "{}", j.reason);
        let j = evidence(41.0, &[40.0, 41.0, 44.0], None).judge(KNOWN_MODEL_MARGINS);
        assert!(j.overridden && j.method == Method::Avx512Nt, "{j:?}");
    }

    #[test]
    fn hysteresis_keeps_an_earlier_override_inside_the_band() {
        // 92%: not enough to replace a guess afresh, not enough to restore it either.
        let before = Some(Method::Avx512Nt);
        let j = evidence(92.0, &[92.0; 3], before).judge(GUESS_MARGINS);
        assert!(j.overridden && j.method == Method::Avx512Nt, "{j:?}");
        let j = evidence(96.0, &[96.0; 3], before).judge(GUESS_MARGINS);
        assert!(!j.overridden && j.method == Method::RepStosb, "{j:?}");
        let j = evidence(92.0, &[92.0; 3], None).judge(GUESS_MARGINS);
        assert!(!j.overridden, "{j:?}");
    }

    #[test]
    fn an_earlier_replacement_that_is_still_near_the_top_stays() {
        let mut e = evidence(50.0, &[50.0; 3], Some(Method::Clzero));
        e.previous_override = Some((Method::Clzero, 95.0));
        assert_eq!(e.judge(GUESS_MARGINS).method, Method::Clzero);
        e.previous_override = Some((Method::Clzero, 80.0));
        assert_eq!(e.judge(GUESS_MARGINS).method, Method::Avx512Nt);
    }

    #[test]
    fn names_round_trip() {
        for c in [
            Confidence::Measured,
            Confidence::Published,
            Confidence::Guess,
        ] {
            assert_eq!(c.name().parse::<Confidence>(), Ok(c));
        }
        assert!("sure".parse::<Confidence>().is_err());
    }
}
