//! What a [`Forecast`] has seen, as it is kept across restarts (`pool::adaptive::store`
//! writes and reads the file): each bucket's samples per week (class and need), the per-class
//! deficits after the last start, the recent needs, the mean start and the reservoir's
//! random state. The plan is not kept: it is
//! made again from the samples at the first look.
//!
//! Pure. [`restore`] treats what it is given as untrusted: every count is bounded as the
//! forecast bounds its own ([`BUCKETS`], [`WEEKS_KEPT`], [`SAMPLES_PER_WEEK`], classes made
//! again with `class_of` and needs counted again in whole files up to the goal's ceiling),
//! every float must be finite, and the first field that is not is named in the error.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::{
    Forecast, Goal, Week, BUCKETS, LEARNING_S, MAX_HORIZON_S, MIN_HORIZON_S, SAMPLES_PER_WEEK,
    WEEKS_KEPT, WEEK_S,
};
use crate::pool::core::forecast_files::{class_of, whole_files, Deficits};

/// The most recent needs restored (a day of starts keeps only each class's falling needs:
/// at most one per file up to the ceiling, per class).
pub const MAX_RECENT: usize = 65_536;

/// The most starts one bucket of one week may have seen (a million an hour).
pub const MAX_SEEN: u64 = 1 << 20;

/// The most classes with a deficit restored (a few thousand classes exist below any
/// ceiling a host can have; see `class_of`).
pub const MAX_DEFICITS: usize = 4096;

/// One bucket's samples of one week.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedWeek {
    /// The week's number since the epoch.
    pub week: u64,
    /// Starts seen that week in the bucket (at least the samples kept).
    pub seen: u64,
    /// Needs kept: (class, bytes of that class's files needed).
    pub samples: Vec<(u64, u64)>,
}

/// What one forecast has seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedForecast {
    /// Per bucket ([`BUCKETS`] of them), its weeks.
    pub weeks: Vec<Vec<SavedWeek>>,
    /// The last start's local time (the recursion's state, with `deficits`).
    pub last_start: Option<f64>,
    /// Bytes missing per class after it: (class, bytes).
    pub deficits: Vec<(u64, f64)>,
    /// The recent needs: (local time, class, bytes), oldest first.
    pub recent: Vec<(f64, u64, u64)>,
    /// The mean bytes of a start.
    pub mean_bytes: f64,
    /// The look-ahead, s.
    pub horizon_s: f64,
    /// The reservoir's random state.
    pub rng: u64,
}

/// A saved forecast refused: the field at fault and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Refused {
    /// The field, as `weeks[3][1].samples`.
    pub field: String,
    /// Why.
    pub message: String,
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> Refused {
    Refused {
        field: field.into(),
        message: message.into(),
    }
}

/// What `f` has seen, to be saved.
pub fn save(f: &Forecast) -> SavedForecast {
    SavedForecast {
        weeks: f
            .weeks
            .iter()
            .map(|weeks| {
                weeks
                    .iter()
                    .map(|(&week, w)| SavedWeek {
                        week,
                        seen: w.seen,
                        samples: w.samples.clone(),
                    })
                    .collect()
            })
            .collect(),
        last_start: f.deficits.parts().0,
        deficits: f.deficits.parts().1,
        recent: f.recent.iter().copied().collect(),
        mean_bytes: f.mean_bytes,
        horizon_s: f.horizon_s,
        rng: f.rng,
    }
}

fn finite(field: &str, x: f64) -> Result<f64, Refused> {
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(refuse(field, format!("{x} is not a finite number >= 0")))
    }
}

/// A forecast for `goal` that has seen what `saved` says (and has no plan yet), or the
/// first field that is out of bounds. Needs above the goal's ceiling are counted at it;
/// weeks that are no longer kept at local time `now_s` (the daemon was stopped for weeks)
/// are dropped.
pub fn restore(saved: &SavedForecast, goal: Goal, now_s: f64) -> Result<Forecast, Refused> {
    let mut f = Forecast::new(goal);
    if saved.weeks.len() != BUCKETS {
        return Err(refuse(
            "weeks",
            format!("{} buckets where there are {BUCKETS}", saved.weeks.len()),
        ));
    }
    for (b, weeks) in saved.weeks.iter().enumerate() {
        f.weeks[b] = restore_bucket(b, weeks, goal.ceiling)?;
        let week_now = (now_s / WEEK_S).floor().max(0.0) as u64;
        f.weeks[b].retain(|&w, _| w.saturating_add(WEEKS_KEPT) > week_now);
        if let Some((&w, _)) = f.weeks[b].range(week_now.saturating_add(2)..).next() {
            return Err(refuse(
                format!("weeks[{b}]"),
                format!("week {w} is after this one ({week_now})"),
            ));
        }
    }
    f.deficits = restore_deficits(saved, goal.ceiling)?;
    if saved.recent.len() > MAX_RECENT {
        return Err(refuse(
            "recent",
            format!("{} needs, more than {MAX_RECENT}", saved.recent.len()),
        ));
    }
    let mut recent = VecDeque::with_capacity(saved.recent.len());
    for (i, &(t, c, d)) in saved.recent.iter().enumerate() {
        let t = finite(&format!("recent[{i}][0]"), t)?;
        if recent.back().is_some_and(|&(u, _, _)| t < u) {
            return Err(refuse(
                format!("recent[{i}][0]"),
                "earlier than the need before",
            ));
        }
        let (c, d) = counted(c, d, goal.ceiling);
        recent.push_back((t, c, d));
    }
    if let Some(&(newest, _, _)) = recent.back() {
        recent.retain(|&(t, _, _)| t >= newest - LEARNING_S);
    }
    f.recent = recent;
    f.mean_bytes = finite("mean_bytes", saved.mean_bytes)?;
    let h = finite("horizon_s", saved.horizon_s)?;
    if !(MIN_HORIZON_S..=MAX_HORIZON_S).contains(&h) {
        return Err(refuse(
            "horizon_s",
            format!("{h} is not from {MIN_HORIZON_S} to {MAX_HORIZON_S}"),
        ));
    }
    f.horizon_s = h;
    f.rng = saved.rng;
    Ok(f)
}

/// A saved (class, need) counted as the forecast counts its own: the class made again from
/// the size, the need in whole files of it up to `ceiling`.
fn counted(class: u64, need: u64, ceiling: u64) -> (u64, u64) {
    let class = class_of(class, ceiling);
    (class, whole_files(need as f64, class, ceiling))
}

fn restore_deficits(saved: &SavedForecast, ceiling: u64) -> Result<Deficits, Refused> {
    let at = match saved.last_start {
        Some(t) => Some(finite("last_start", t)?),
        None => None,
    };
    if saved.deficits.len() > MAX_DEFICITS {
        return Err(refuse(
            "deficits",
            format!("{} classes, more than {MAX_DEFICITS}", saved.deficits.len()),
        ));
    }
    let mut missing = Vec::with_capacity(saved.deficits.len());
    for (i, &(c, d)) in saved.deficits.iter().enumerate() {
        let d = finite(&format!("deficits[{i}][1]"), d)?;
        missing.push((class_of(c, ceiling), d.min(ceiling as f64)));
    }
    Ok(Deficits::from_parts(at, missing))
}

fn restore_bucket(
    b: usize,
    weeks: &[SavedWeek],
    ceiling: u64,
) -> Result<BTreeMap<u64, Week>, Refused> {
    if weeks.len() > WEEKS_KEPT as usize {
        return Err(refuse(
            format!("weeks[{b}]"),
            format!("{} weeks, more than the {WEEKS_KEPT} kept", weeks.len()),
        ));
    }
    let mut out = BTreeMap::new();
    for (i, w) in weeks.iter().enumerate() {
        let at = format!("weeks[{b}][{i}]");
        if w.samples.len() > SAMPLES_PER_WEEK {
            return Err(refuse(
                format!("{at}.samples"),
                format!("{} samples, more than {SAMPLES_PER_WEEK}", w.samples.len()),
            ));
        }
        if w.seen > MAX_SEEN {
            return Err(refuse(
                format!("{at}.seen"),
                format!(
                    "{} starts in one hour of one week, more than {MAX_SEEN}",
                    w.seen
                ),
            ));
        }
        if w.seen < w.samples.len() as u64 {
            return Err(refuse(
                format!("{at}.seen"),
                format!(
                    "{} seen, fewer than its {} samples",
                    w.seen,
                    w.samples.len()
                ),
            ));
        }
        let week = Week {
            samples: w
                .samples
                .iter()
                .map(|&(c, d)| counted(c, d, ceiling))
                .collect(),
            seen: w.seen,
        };
        if out.insert(w.week, week).is_some() {
            return Err(refuse(
                format!("{at}.week"),
                format!("week {} twice", w.week),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;
    const MONDAY: f64 = 1_704_067_200.0;

    fn goal() -> Goal {
        Goal {
            warm_start_rate: 0.99,
            ceiling: 64 * G,
        }
    }

    fn fed() -> Forecast {
        let mut f = Forecast::new(goal());
        for i in 0..500u64 {
            f.started(MONDAY + i as f64 * 997.0, (1 + i % 5) * G, 2e9);
        }
        f
    }

    #[test]
    fn a_restored_forecast_plans_and_goes_on_as_the_one_saved() {
        let mut a = fed();
        let saved = save(&a);
        let text = serde_json::to_string(&saved).unwrap();
        let back: SavedForecast = serde_json::from_str(&text).unwrap();
        assert_eq!(back, saved);
        let later = MONDAY + 500.0 * 997.0;
        let mut b = restore(&back, goal(), later).unwrap();
        for f in [&mut a, &mut b] {
            f.started(later, 3 * G, 2e9);
            f.replan();
        }
        assert_eq!(a.plan(), b.plan());
        assert_eq!(save(&a), save(&b));
    }

    /// Spoils one field of a saved forecast.
    type Spoil = Box<dyn Fn(&mut SavedForecast)>;

    #[test]
    fn out_of_bounds_fields_are_named() {
        let good = save(&fed());
        for (spoil, field) in spoils() {
            let mut s = good.clone();
            spoil(&mut s);
            let err = restore(&s, goal(), MONDAY).unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
    }

    /// Each spoiled field, with its name in the error.
    fn spoils() -> Vec<(Spoil, &'static str)> {
        let first: Vec<(Spoil, &'static str)> = vec![
            (Box::new(|s| s.weeks.pop().map(drop).unwrap_or(())), "weeks"),
            (
                Box::new(|s| {
                    s.weeks[9] = (0..5)
                        .map(|w| SavedWeek {
                            week: w,
                            seen: 0,
                            samples: vec![],
                        })
                        .collect()
                }),
                "weeks[9]",
            ),
            (
                Box::new(|s| {
                    s.weeks[9] = vec![SavedWeek {
                        week: 1,
                        seen: 1 << 20,
                        samples: vec![(G, G); SAMPLES_PER_WEEK + 1],
                    }]
                }),
                "weeks[9][0].samples",
            ),
            (
                Box::new(|s| {
                    s.weeks[9] = vec![SavedWeek {
                        week: 1,
                        seen: 0,
                        samples: vec![(G, G)],
                    }]
                }),
                "weeks[9][0].seen",
            ),
            (
                Box::new(|s| {
                    s.weeks[9] = vec![SavedWeek {
                        week: 1,
                        seen: MAX_SEEN + 1,
                        samples: vec![],
                    }]
                }),
                "weeks[9][0].seen",
            ),
            (
                Box::new(|s| {
                    s.weeks[9] = vec![SavedWeek {
                        week: u64::MAX,
                        seen: 1,
                        samples: vec![(G, G)],
                    }]
                }),
                "weeks[9]",
            ),
        ];
        first.into_iter().chain(more_spoils()).collect()
    }

    /// The rest of [`spoils`].
    fn more_spoils() -> Vec<(Spoil, &'static str)> {
        vec![
            (Box::new(|s| s.mean_bytes = f64::NAN), "mean_bytes"),
            (Box::new(|s| s.horizon_s = 1e9), "horizon_s"),
            (
                Box::new(|s| s.recent = vec![(1.0, G, G); MAX_RECENT + 1]),
                "recent",
            ),
            (
                Box::new(|s| s.recent = vec![(5.0, G, G), (1.0, G, G)]),
                "recent[1][0]",
            ),
            (
                Box::new(|s| s.last_start = Some(f64::INFINITY)),
                "last_start",
            ),
            (
                Box::new(|s| s.deficits = vec![(G, f64::NAN)]),
                "deficits[0][1]",
            ),
            (
                Box::new(|s| s.deficits = vec![(G, 1.0); MAX_DEFICITS + 1]),
                "deficits",
            ),
        ]
    }

    #[test]
    fn needs_past_the_ceiling_are_cut_and_old_weeks_dropped() {
        let mut s = save(&fed());
        let week = (MONDAY / WEEK_S) as u64;
        s.weeks[9] = vec![SavedWeek {
            week,
            seen: 1,
            samples: vec![(u64::MAX, u64::MAX)],
        }];
        let f = restore(
            &s,
            Goal {
                ceiling: 8 * G,
                ..goal()
            },
            MONDAY,
        )
        .unwrap();
        assert_eq!(f.weeks[9][&week].samples, vec![(8 * G, 8 * G)]);
        // Weeks no longer kept are dropped.
        let later = MONDAY + WEEK_S * WEEKS_KEPT as f64;
        assert!(restore(&s, goal(), later).unwrap().weeks[9].is_empty());
    }
}
