//! The adaptive targets' forecasts: one [`Forecast`] per adaptive target (its node, or every
//! node, and its page size), fed with the VM starts of that kind and looked at by the driver.
//! Pure: times and rates come in as arguments.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::page_size::PageSize;
use crate::policy::pool::{AdaptiveGoal, Target};
use crate::pool::core::forecast::{self, Forecast, Goal, Inputs, Why};

/// How often the plan is made again from the starts kept, s (at the first look after).
pub const REPLAN_S: f64 = 3600.0;

/// An adaptive target's place: its node (`None`: every node) and page size.
pub type Key = (Option<u32>, PageSize);

/// One adaptive target's forecast and its last look.
#[derive(Debug, Clone)]
struct Entry {
    goal: AdaptiveGoal,
    forecast: Forecast,
    starts: u64,
    planned_at: Option<f64>,
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
    /// VM starts seen since the daemon started.
    pub starts: u64,
    /// Why the target has its value (`null` before the first look).
    pub why: Option<Why>,
}

/// The forecasts of the adaptive targets in force.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    entries: BTreeMap<Key, Entry>,
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
                planned_at: None,
                looked: None,
            });
            if e.goal != goal {
                e.goal = goal;
                e.forecast.set_goal(goal_of(goal));
                e.planned_at = None;
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

    /// A VM started at local time `at_s` with `bytes` on `node`; `refill_rate` in bytes/s.
    /// Returns whether an adaptive target counted it.
    pub fn started(
        &mut self,
        node: u32,
        ps: PageSize,
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
        e.forecast.started(at_s, bytes, refill_rate);
        e.starts += 1;
        true
    }

    /// The adaptive targets' places.
    pub fn keys(&self) -> Vec<Key> {
        self.entries.keys().copied().collect()
    }

    /// Looks at `key`'s target with `inputs` (planning again first when the plan is
    /// [`REPLAN_S`] old, or none was made, or the clock stepped back) and keeps it. Returns
    /// the warm bytes to install: the target in whole pages, at most the ceiling.
    pub fn look(&mut self, key: Key, inputs: &Inputs) -> Option<u64> {
        let e = self.entries.get_mut(&key)?;
        let now = inputs.now_s;
        let due = e
            .planned_at
            .map_or(true, |t| now < t || now - t >= REPLAN_S);
        if due {
            e.forecast.replan();
            e.planned_at = Some(now);
        }
        let target = e.forecast.target(inputs);
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
                why: e.looked.as_ref().map(|(t, _)| t.why.clone()),
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
