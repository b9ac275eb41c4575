//! The adaptive targets' forecasts: one [`Forecast`] per adaptive target (its node, or every
//! node, and its page size), fed with the VM starts of that kind and looked at by the driver.
//! Pure: times and rates come in as arguments.
//!
//! A plan is made on a copy, outside the lock the driver keeps the registry under (each
//! lease's commit takes it): [`Registry::take_due`] hands out a copy of each forecast whose
//! plan is due and notes the starts counted from then on; [`Replan::make`] plans the copy;
//! [`Registry::install`] feeds the copy those starts, in order, and puts it in place. A
//! start changes what a forecast has seen and never reads its plan, so the result is the
//! forecast that planned at the copy and then saw the starts.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::page_size::PageSize;
use crate::policy::pool::{AdaptiveGoal, Target};
use crate::pool::core::forecast::file::{self as saved_file, Refused, SavedForecast};
use crate::pool::core::forecast::{self, Forecast, Goal, Inputs, Why};

use super::weigh::{Starter, Weigh};

/// How often the plan is made again from the starts kept, s (at the first look after).
pub const REPLAN_S: f64 = 3600.0;

/// An adaptive target's place: its node (`None`: every node) and page size.
pub type Key = (Option<u32>, PageSize);

/// Starts counted while a plan is being made, at most: past it (a plan that never came
/// back) the plan is dropped and made again at the next look.
pub const STARTS_WHILE_PLANNING: usize = 65_536;

/// A start as the forecast is fed it: local time, bytes, refill rate.
type Start = (f64, u64, f64);

/// A plan being made outside the registry: a copy of one target's forecast.
#[derive(Debug)]
pub struct Replan {
    key: Key,
    ticket: u64,
    forecast: Forecast,
}

impl Replan {
    /// Plans the copy (the costly part: a sort of every bucket's samples).
    pub fn make(&mut self) {
        self.forecast.replan();
    }
}

/// One adaptive target's forecast and its last look.
#[derive(Debug, Clone)]
struct Entry {
    goal: AdaptiveGoal,
    forecast: Forecast,
    starts: u64,
    /// The starts counted per principal (see `weigh`).
    weigh: Weigh,
    planned_at: Option<f64>,
    /// A plan handed out (its ticket) and the starts counted since.
    planning: Option<(u64, Vec<Start>)>,
    /// The last look's target and why, and the bytes installed from it.
    looked: Option<(forecast::Target, u64)>,
}

/// An adaptive target as `GET /v1/pool/adaptive` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdaptiveStatus {
    /// Page size.
    pub page_size: PageSize,
    /// Node; `null`: every node (each node keeps this target).
    pub node: Option<u32>,
    /// The warm-start goal, percent.
    pub goal_percent: f64,
    /// The ceiling, bytes.
    pub ceiling: u64,
    /// Warm bytes in force (the last look's target in whole pages; 0 before the first look).
    pub target_bytes: u64,
    /// VM starts counted since the daemon started.
    pub starts: u64,
    /// Starts not counted: past their principal's share of the hour (see `weigh`).
    pub starts_not_counted: u64,
    /// Why the target has its value (`null` before the first look).
    pub why: Option<Why>,
}

/// The forecasts of the adaptive targets in force.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    entries: BTreeMap<Key, Entry>,
    /// The ticket of the next plan handed out.
    tickets: u64,
}

fn goal_of(g: AdaptiveGoal) -> Goal {
    Goal {
        warm_start_rate: g.rate(),
        ceiling: g.ceiling,
    }
}

impl Registry {
    /// Follows the targets in force: a new adaptive target gets a forecast that has seen
    /// nothing, a changed goal is planned again at the next look (what was seen is kept), and
    /// a target no longer adaptive (or gone) is forgotten.
    pub fn sync(&mut self, targets: &[Target]) {
        let wanted: BTreeMap<Key, AdaptiveGoal> = targets
            .iter()
            .filter_map(|t| t.adaptive.map(|a| ((t.node, t.page_size), a)))
            .collect();
        self.entries.retain(|k, _| wanted.contains_key(k));
        for (key, goal) in wanted {
            let e = self.entries.entry(key).or_insert_with(|| Entry {
                goal,
                forecast: Forecast::new(goal_of(goal)),
                starts: 0,
                weigh: Weigh::default(),
                planned_at: None,
                planning: None,
                looked: None,
            });
            if e.goal != goal {
                e.goal = goal;
                e.forecast.set_goal(goal_of(goal));
                e.planned_at = None;
                // A plan under way is for the old goal.
                e.planning = None;
            }
        }
    }

    /// The adaptive target that a lease on `node` of `ps` pages counts for: the node's own,
    /// else the one for every node (as `PoolPolicy::target` chooses).
    pub fn key_for(&self, node: u32, ps: PageSize) -> Option<Key> {
        [(Some(node), ps), (None, ps)]
            .into_iter()
            .find(|k| self.entries.contains_key(k))
    }

    /// A VM started by `who` at local time `at_s` with `bytes` on `node`; `refill_rate` in
    /// bytes/s. Returns whether an adaptive target counted it (a tenant past its share of
    /// the hour is not counted: see `weigh`).
    pub fn started(
        &mut self,
        node: u32,
        ps: PageSize,
        who: Starter<'_>,
        at_s: f64,
        bytes: u64,
        refill_rate: f64,
    ) -> bool {
        let Some(e) = self
            .key_for(node, ps)
            .and_then(|k| self.entries.get_mut(&k))
        else {
            return false;
        };
        if !e.weigh.counts(who, at_s) {
            return false;
        }
        e.forecast.started(at_s, bytes, refill_rate);
        e.starts += 1;
        if let Some((_, since)) = &mut e.planning {
            if since.len() < STARTS_WHILE_PLANNING {
                since.push((at_s, bytes, refill_rate));
            } else {
                e.planning = None;
                e.planned_at = None;
            }
        }
        true
    }

    /// Copies of the forecasts whose plan is due at local time `now_s` ([`REPLAN_S`] old,
    /// or none made, or the clock stepped back) and not under way: plan each
    /// ([`Replan::make`]) without the registry, then [`Registry::install`] it.
    pub fn take_due(&mut self, now_s: f64) -> Vec<Replan> {
        let mut out = Vec::new();
        for (&key, e) in &mut self.entries {
            let due = e
                .planned_at
                .map_or(true, |t| now_s < t || now_s - t >= REPLAN_S);
            // A plan under way for [`REPLAN_S`] was lost (its thread panicked): a new
            // ticket replaces it, and the old one's install is refused.
            if !due {
                continue;
            }
            self.tickets += 1;
            e.planning = Some((self.tickets, Vec::new()));
            e.planned_at = Some(now_s);
            out.push(Replan {
                key,
                ticket: self.tickets,
                forecast: e.forecast.clone(),
            });
        }
        out
    }

    /// Puts a plan made on a copy in place, after feeding the copy the starts counted
    /// since it was taken. Returns false (and drops it) when its target was changed or
    /// forgotten meanwhile: the next look plans again.
    pub fn install(&mut self, replan: Replan) -> bool {
        let Some(e) = self.entries.get_mut(&replan.key) else {
            return false;
        };
        match e.planning.take() {
            Some((ticket, since)) if ticket == replan.ticket => {
                let mut f = replan.forecast;
                for (at_s, bytes, rate) in since {
                    f.started(at_s, bytes, rate);
                }
                e.forecast = f;
                true
            }
            other => {
                e.planning = other;
                false
            }
        }
    }

    /// Makes the due plans in place ([`Registry::take_due`], [`Replan::make`],
    /// [`Registry::install`] in one go): for callers that hold no lock.
    pub fn replan_due(&mut self, now_s: f64) {
        for mut r in self.take_due(now_s) {
            r.make();
            self.install(r);
        }
    }

    /// Puts back what the forecasts of the targets in force had seen (read from the file
    /// kept across restarts, at local time `now_s`), into those that have counted no start
    /// yet. Returns, per saved forecast, whether it was put back (`None`: no adaptive target
    /// there now) or why not.
    pub fn restore(
        &mut self,
        saved: BTreeMap<Key, SavedForecast>,
        now_s: f64,
    ) -> Vec<(Key, Option<Result<(), Refused>>)> {
        saved
            .into_iter()
            .map(|(key, s)| {
                let outcome = self
                    .entries
                    .get_mut(&key)
                    .filter(|e| e.starts == 0)
                    .map(|e| {
                        let f = saved_file::restore(&s, goal_of(e.goal), now_s)?;
                        e.forecast = f;
                        e.planned_at = None;
                        e.planning = None;
                        Ok(())
                    });
                (key, outcome)
            })
            .collect()
    }

    /// What each forecast has seen, to be kept across restarts.
    pub fn saved(&self) -> Vec<(Key, SavedForecast)> {
        self.entries
            .iter()
            .map(|(&k, e)| (k, saved_file::save(&e.forecast)))
            .collect()
    }

    /// The adaptive targets' places.
    pub fn keys(&self) -> Vec<Key> {
        self.entries.keys().copied().collect()
    }

    /// Looks at `key`'s target with `inputs` and the sizes of the VMs due (`pending`, the
    /// known demand) with the plan in place (see [`Registry::take_due`]) and keeps it.
    /// Returns the warm bytes to install: the target in whole pages, at most the ceiling.
    pub fn look(&mut self, key: Key, inputs: &Inputs, pending: &[u64]) -> Option<u64> {
        let e = self.entries.get_mut(&key)?;
        let target = e.forecast.target_known(inputs, pending);
        let page = key.1.bytes();
        let bytes = target
            .bytes
            .div_ceil(page)
            .saturating_mul(page)
            .min(e.goal.ceiling);
        e.looked = Some((target, bytes));
        Some(bytes)
    }

    /// The bytes installed for `key` (0 before its first look).
    pub fn installed(&self, key: Key) -> u64 {
        self.entries
            .get(&key)
            .and_then(|e| e.looked.as_ref())
            .map_or(0, |&(_, b)| b)
    }

    /// Puts each adaptive target's installed bytes in its `warm` (and, when it names no
    /// sizes, files of the size a static target of that many bytes keeps).
    pub fn apply(&self, targets: &mut [Target]) {
        for t in targets.iter_mut() {
            let Some(goal) = t.adaptive else {
                continue;
            };
            // A lowered ceiling holds at once, before the next look.
            t.warm = self.installed((t.node, t.page_size)).min(goal.ceiling);
            // The plan counts files: kept as the target's flavors, so the pool keeps a
            // file of each size a start needs (the demand shape alone may not).
            t.flavors = self.installed_files((t.node, t.page_size), t.warm);
            if t.sizes.is_empty() && t.warm > 0 {
                t.sizes
                    .push(crate::policy::pool::default_file_size(t.warm, t.page_size));
            }
        }
    }

    /// The files installed for `key` as flavors, when they are whole pages and make up
    /// `warm` exactly (else none: the demand shape fills `warm`).
    fn installed_files(&self, key: Key, warm: u64) -> Vec<crate::policy::pool::Flavor> {
        let page = key.1.bytes();
        let Some((t, _)) = self.entries.get(&key).and_then(|e| e.looked.as_ref()) else {
            return Vec::new();
        };
        let whole = t
            .files
            .iter()
            .all(|&(size, n)| size % page == 0 && n <= 4096);
        if !whole || t.bytes != warm {
            return Vec::new();
        }
        let flavor = |&(size, count): &(u64, u64)| crate::policy::pool::Flavor {
            size,
            count: count as u32,
        };
        t.files.iter().map(flavor).collect()
    }

    /// Every adaptive target, for the API and the metrics.
    pub fn report(&self) -> Vec<AdaptiveStatus> {
        self.entries
            .iter()
            .map(|(&(node, page_size), e)| AdaptiveStatus {
                page_size,
                node,
                goal_percent: e.goal.percent(),
                ceiling: e.goal.ceiling,
                target_bytes: e.looked.as_ref().map_or(0, |&(_, b)| b),
                starts: e.starts,
                starts_not_counted: e.weigh.dropped,
                why: e.looked.as_ref().map(|(t, _)| t.why.clone()),
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
