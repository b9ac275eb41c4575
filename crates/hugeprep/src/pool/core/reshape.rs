//! The pool's shape as the worker's decisions see it: what each kind (node, page size) has
//! warm, wants warm and should reshape, read from the files and the policy handed in (see
//! `pool::shape` for how the wanted shape is computed, and `docs/pool.md`, "Shape").

use std::collections::{BTreeMap, BTreeSet};

use super::aside::AsideQueue;
use super::{Core, Work};
use crate::page_size::PageSize;
use crate::policy::pool::{PoolPolicy, Shape};
use crate::pool::record::{FileRecord, FileState};
use crate::pool::shape::{compare, wanted, Demand, History, Reshape};

/// A kind of pool memory: (node, page size).
pub(crate) type Kind = (u32, PageSize);

/// What the worker's decisions read of the pool's state (the driver lends it, under its
/// lock): the files, those waiting aside, the drained kinds and the demand history.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    /// Every pool file, in its phase.
    pub(crate) core: &'a Core,
    /// Released files still held, waiting aside for another proof.
    pub(crate) aside: &'a AsideQueue,
    /// Kinds emptied by a drain (a target of zero until resumed).
    pub(crate) drained: &'a BTreeSet<Kind>,
    /// Recent lease sizes per kind.
    pub(crate) demand: &'a BTreeMap<Kind, History>,
}

/// Whether a file counts toward its kind's warm bytes: warm and idle, or being scrubbed or
/// refilled.
fn counted(e: &super::Entry) -> bool {
    match e.busy() {
        Some(Work::Scrub) | Some(Work::Refill) => true,
        None => e.rec().state == FileState::Warm,
        _ => false,
    }
}

impl View<'_> {
    /// Bytes of the kind that are or will be warm (warm files not on their way out, plus
    /// scrubs and refills in progress).
    pub(crate) fn pool_bytes(&self, (node, ps): Kind) -> u64 {
        self.core
            .of_kind(node, ps)
            .filter(|e| counted(e))
            .map(|e| e.rec().size)
            .sum()
    }

    /// Sizes of the files that are or will be warm (as [`View::pool_bytes`] counts them).
    fn warm_sizes(&self, (node, ps): Kind) -> BTreeMap<u64, usize> {
        let mut have = BTreeMap::new();
        for e in self.core.of_kind(node, ps).filter(|e| counted(e)) {
            *have.entry(e.rec().size).or_insert(0) += 1;
        }
        have
    }

    /// The bytes to keep warm: the policy's target, or none while the kind is drained.
    pub(crate) fn target(&self, policy: &PoolPolicy, (node, ps): Kind) -> u64 {
        if self.drained.contains(&(node, ps)) {
            return 0;
        }
        policy.target_bytes(node, ps)
    }

    /// The kind's wanted warm files under the policy's target, the history and the drain.
    pub(crate) fn wanted_sizes(&self, policy: &PoolPolicy, kind: Kind) -> Vec<u64> {
        let (node, ps) = kind;
        if self.drained.contains(&kind) {
            return Vec::new();
        }
        let Some(target) = policy.target(node, ps) else {
            return Vec::new();
        };
        let history: Vec<Demand> = self
            .demand
            .get(&kind)
            .map(|h| h.iter().copied().collect())
            .unwrap_or_default();
        wanted(target, policy.shape, &history, ps.bytes())
    }

    /// The largest missing size that fits the kind's byte deficit (the refill's next file
    /// under the demand shape).
    pub(crate) fn next_missing(&self, policy: &PoolPolicy, kind: Kind, deficit: u64) -> u64 {
        let want = self.wanted_sizes(policy, kind);
        let (missing, _) = compare(&want, &self.warm_sizes(kind));
        missing.into_iter().find(|&s| s <= deficit).unwrap_or(0)
    }

    /// What to do with a released (dirty) file under the demand shape.
    pub(crate) fn reshape_dirty(&self, policy: &PoolPolicy, rec: &FileRecord) -> Reshape {
        let (kind, s) = ((rec.node, rec.page_size), rec.size);
        let want = self.wanted_sizes(policy, kind);
        let (missing, _) = compare(&want, &self.warm_sizes(kind));
        if missing.contains(&s) {
            return Reshape::Keep(rec.id, s);
        }
        if let Some(&w) = missing.iter().find(|&&w| w < s) {
            return Reshape::Keep(rec.id, w);
        }
        let target: u64 = want.iter().sum();
        if self.pool_bytes(kind) + s <= target {
            return Reshape::Keep(rec.id, s);
        }
        Reshape::Delete(rec.id)
    }

    /// Reshapes one kind's idle warm files toward the wanted shape: cut a file of a size in
    /// excess to a missing size below it, else give back files in excess while the pool is
    /// above its target or a missing file has no room.
    pub(crate) fn reshape_warm(&self, policy: &PoolPolicy, kind: Kind) -> Option<Reshape> {
        let want = self.wanted_sizes(policy, kind);
        let target: u64 = want.iter().sum();
        let (missing, excess) = compare(&want, &self.warm_sizes(kind));
        let idle: Vec<(u64, u64)> = self
            .core
            .of_kind(kind.0, kind.1)
            .filter(|e| e.busy().is_none() && e.rec().state == FileState::Warm)
            .map(|e| (e.rec().id, e.rec().size))
            .collect();
        let surplus: Vec<(u64, u64)> = idle
            .iter()
            .copied()
            .filter(|(_, s)| excess.contains_key(s))
            .collect();
        for &w in &missing {
            if let Some(&(id, _)) = surplus
                .iter()
                .filter(|(_, s)| *s > w)
                .min_by_key(|(_, s)| *s)
            {
                return Some(Reshape::Shrink(id, w));
            }
        }
        let pool = self.pool_bytes(kind);
        let no_room = missing
            .last()
            .is_some_and(|&w| pool + w > target && !surplus.is_empty());
        if pool > target || no_room {
            let victim = surplus
                .iter()
                .max_by_key(|(_, s)| *s)
                .or_else(|| (pool > target).then(|| idle.iter().max_by_key(|(_, s)| *s))?);
            return victim.map(|&(id, _)| Reshape::Delete(id));
        }
        None
    }

    /// Whether some kind lacks a wanted file (none warm, being scrubbed or refilled for it):
    /// the lessee grace yields then to work that faults nothing.
    pub(crate) fn incomplete(&self, policy: &PoolPolicy, kinds: &[Kind]) -> bool {
        kinds.iter().any(|&kind| {
            let want = self.wanted_sizes(policy, kind);
            !compare(&want, &self.warm_sizes(kind)).0.is_empty()
        })
    }

    /// The next reshaping step of any kind under the demand shape.
    pub(crate) fn reshape_any(&self, policy: &PoolPolicy, kinds: &[Kind]) -> Option<Reshape> {
        if policy.shape != Shape::Demand {
            return None;
        }
        kinds
            .iter()
            .find_map(|&kind| self.reshape_warm(policy, kind))
    }
}
