//! The simulated worker: the core's own decisions ([`Schedule::decide`]) on a policy, a
//! demand history, a start gate and a kernel drawn from the seed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{Op, Sim, PAGE, PS};
use crate::page_size::PageSize;
use crate::policy::pool::{PoolPolicy, Shape};
use crate::pool::core::aside::AsideQueue;
use crate::pool::core::decide::{Figures, Inputs, Job, Kind, View};
use crate::pool::shape::{Demand, History};

/// A kernel with `free` bytes for any kind, no mount limit and no free pool pages.
struct SimKernel {
    free: u64,
}

impl Figures for SimKernel {
    fn free_bytes(&mut self, _: Kind) -> u64 {
        self.free
    }
    fn mount_free_pages(&mut self, _: PageSize) -> Option<u64> {
        None
    }
    fn pool_free_pages(&mut self, _: Kind) -> u64 {
        0
    }
}

impl Sim {
    /// The worker's choice: the core's own decision (`Schedule::decide`), at the
    /// simulation's time, on a policy, a demand history, a start gate and a kernel drawn
    /// from the seed.
    pub(super) fn worker_job(&mut self) -> Option<Op> {
        self.clock += Duration::from_millis(self.rng.below(400));
        let policy = self.draw_policy();
        let demand = self.draw_demand();
        let (urgent, starting) = (self.rng.chance(100), self.rng.chance(200));
        let mut kernel = SimKernel {
            free: if self.rng.chance(150) { 0 } else { 1 << 40 },
        };
        let (aside, drained) = (AsideQueue::default(), BTreeSet::new());
        let view = View {
            core: &self.core,
            aside: &aside,
            drained: &drained,
            demand: &demand,
        };
        let inputs = Inputs {
            now: self.clock,
            policy: &policy,
            kinds: &[(0, PS)],
            urgent,
            starting,
        };
        match self.schedule.decide(&view, &inputs, &mut kernel).job? {
            Job::Scrub { id, size } => Some(Op::Scrub {
                id,
                journal: Some(self.core.begin_scrub(id, size).ok()?),
                at: 0,
            }),
            Job::Delete(id) => Some(Op::Delete {
                id,
                remove: self.core.begin_delete(id).ok()?,
            }),
            Job::Cut { id, size } => Some(Op::Cut {
                id,
                size,
                journal: self.core.begin_cut(id, size).ok()?,
                cut: false,
            }),
            Job::Fill { kind, size } => {
                let (id, journal) = self.core.new_fill(kind.0, kind.1, size);
                Some(Op::Fill {
                    id,
                    journal: Some(journal),
                    faulted: false,
                })
            }
            Job::Reserve { .. } => None,
        }
    }

    /// A policy drawn from the seed: a target of 0 to 6 pages in files of one to three
    /// pages, the fixed or the demand shape.
    fn draw_policy(&mut self) -> PoolPolicy {
        let mut policy = self.policy.clone();
        let sizes: Vec<u64> = (1..=3)
            .filter(|_| self.rng.chance(500))
            .map(|n| n * PAGE)
            .collect();
        policy.set_warm(PS, self.rng.below(7) * PAGE, sizes);
        policy.shape = if self.rng.chance(500) {
            Shape::Demand
        } else {
            Shape::Fixed
        };
        policy
    }

    /// A demand history drawn from the seed: none, or up to three leases of one to three
    /// pages.
    fn draw_demand(&mut self) -> BTreeMap<Kind, History> {
        let n = self.rng.below(4);
        let history: History = (0..n)
            .map(|_| Demand {
                size: (1 + self.rng.below(3)) * PAGE,
                held: 1 + self.rng.below(2),
            })
            .collect();
        BTreeMap::from([((0, PS), history)])
    }
}
