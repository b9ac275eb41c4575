//! A deterministic simulator of the pool's core (TigerBeetle's VOPR, FoundationDB's
//! simulation): one seed drives leases, releases, the worker's jobs, drains and clean
//! restarts, interleaved as concurrent requests and the worker interleave, through the
//! core's transitions; a fake driver performs each action on a fake journal and fake mounts
//! and injects, from the same seed, an error or a crash at any action. A crash drops the
//! core (as SIGKILL drops the daemon) and recovers from the fake journal and mounts with
//! the daemon's own plan ([`recovery::plan`]), crashing inside recovery too.
//!
//! What it checks, after every step:
//! - the core's invariants ([`Core::check`]);
//! - never dirty handed out: a lease path is only ever linked to a file holding no other
//!   lessee's bytes, and a file the core says is warm holds none;
//! - the kernel's path after a restart: a file is only scrubbed in place while the open
//!   watch of the daemon that leased it still runs (a restart loses it);
//! - the core agrees with the journal for every idle file (what a crash would recover);
//! - after recovery: the pool directory, the journal and the kept records name the same
//!   files at the same sizes, lease paths belong to kept leases, and no warm file holds a
//!   lessee's bytes.
//!
//! The worker's jobs are the core's own decisions (`decide`), at a simulated time, on
//! policies, demand histories, start gates and kernel supplies drawn from the seed.
//!
//! What it does not check: the proof itself (`reach`, tested against the kernel by
//! `tests/lessee_isolation.rs`), and sizes the kernel cannot supply: those decide *which*
//! transition comes next, never whether it is allowed.
//!
//! A failing seed prints the one command that replays it:
//! `HUGEPREP_SIM_SEED=<seed> cargo test --lib pool::core::sim -- --nocapture`.
//! `HUGEPREP_SIM_SEEDS=<n>` runs more seeds than the suite's fixed count.

mod ops;
mod restart;
mod worker;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::decide::Schedule;
use super::recovery::Step;
use super::{Action, Core, Phase};
use crate::page_size::PageSize;
use crate::policy::pool::{PoolPolicy, Recycle};
use crate::pool::record::{file_key, FileRecord, FileState, LeaseRecord, LeaseSource};

/// Seeds the suite runs (a failing one prints how to replay it alone).
pub const SEEDS: u64 = 3000;
/// Steps per seed.
const STEPS: usize = 250;
const PS: PageSize = PageSize::Size2M;
const PAGE: u64 = 2 << 20;

/// The lessee grace the simulated leases start.
const GRACE: Duration = Duration::from_millis(500);

/// splitmix64: one seed, one stream, the same on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// A file on the fake mount.
#[derive(Debug, Clone)]
struct FakeFile {
    size: u64,
    /// The lease whose lessee may have written to it (`None`: zeroed).
    bytes_of: Option<u64>,
    /// The daemon run whose open watch has seen every open since its lease path was linked.
    watched_by: Option<u64>,
}

impl FakeFile {
    /// A file just faulted: pages the kernel zeroed, never linked.
    fn fresh(size: u64) -> FakeFile {
        FakeFile {
            size,
            bytes_of: None,
            watched_by: None,
        }
    }
}

/// The fake journal and mounts: what survives a crash.
#[derive(Debug, Default)]
struct World {
    journal: BTreeMap<String, FileRecord>,
    clean: bool,
    pool: BTreeMap<u64, FakeFile>,
    /// Lease paths: name to the file (inode) they link.
    links: BTreeMap<String, u64>,
    /// Which daemon run this is (a restart starts a new one).
    run: u64,
}

/// What the fake driver does with an action: perform it, fail it, or crash before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Error,
    Crash,
}

/// One request or job in flight, at the step it will take next.
#[derive(Debug, Clone)]
enum Op {
    Lease {
        name: String,
        size: u64,
        at: LeaseAt,
    },
    Release {
        lease: u64,
        at: ReleaseAt,
    },
    Scrub {
        id: u64,
        journal: Option<Action>,
        at: u8,
    },
    Delete {
        id: u64,
        remove: Action,
    },
    Fill {
        id: u64,
        journal: Option<Action>,
        faulted: bool,
    },
    Cut {
        id: u64,
        size: u64,
        journal: Action,
        cut: bool,
    },
}

#[derive(Debug, Clone)]
enum LeaseAt {
    Choose,
    ColdJournal {
        id: u64,
        journal: Action,
    },
    Prepare {
        id: u64,
        source: LeaseSource,
    },
    Commit {
        id: u64,
        source: LeaseSource,
        rec: Option<FileRecord>,
    },
}

#[derive(Debug, Clone)]
enum ReleaseAt {
    Begin,
    Journal { id: u64, dirty: FileRecord },
    Unlink { id: u64, name: String },
}

/// The simulation of one seed.
pub struct Sim {
    rng: Rng,
    world: World,
    core: Core,
    ops: Vec<Op>,
    trace: Vec<String>,
    /// Per mille of actions that fail, and that crash.
    error_rate: u64,
    crash_rate: u64,
    names: u64,
    /// The worker's decisions' memory (grace, backoffs), and the simulation's time.
    schedule: Schedule,
    clock: Instant,
    /// The policy the drawn ones start from.
    policy: PoolPolicy,
    /// Crashes and clean restarts survived, files scrubbed in place, leases handed out.
    pub stats: Stats,
}

/// What one run did (so that a suite can tell it exercised each path).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Crashes, recovery included.
    pub crashes: u64,
    /// Clean shutdowns and starts.
    pub clean_restarts: u64,
    /// Leases committed.
    pub leases: u64,
    /// Files scrubbed in place.
    pub scrubbed: u64,
    /// Files given the kernel's path (or given back).
    pub deleted: u64,
    /// Actions failed on purpose.
    pub errors: u64,
    /// Crashes injected, by the action they came before.
    pub crashed_at: BTreeMap<&'static str, u64>,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.crashes += o.crashes;
        self.clean_restarts += o.clean_restarts;
        self.leases += o.leases;
        self.scrubbed += o.scrubbed;
        self.deleted += o.deleted;
        self.errors += o.errors;
        for (site, n) in &o.crashed_at {
            *self.crashed_at.entry(site).or_insert(0) += n;
        }
    }
}

/// The crash points the suite must have crashed at (docs/pool.md "States", docs/security.md,
/// and every action of the recovery plan): each is found safe, or the suite fails.
pub const CRASH_POINTS: &[&str] = &[
    "lease: resize, or create and fault",
    "lease: link the lease path",
    "lease: journal leased",
    "cold lease: journal filling",
    "failed warm lease: journal dirty",
    "failed cold lease: remove file, unjournal",
    "release: journal dirty",
    "release: unlink the lease path, take back",
    "scrub: journal scrubbing",
    "scrub: prove out of reach",
    "scrub: clear and verify",
    "scrub: journal warm",
    "refill: journal filling",
    "refill: create and fault",
    "refill: journal warm",
    "cut: ftruncate",
    "cut: journal",
    "delete: truncate and unlink",
    "delete: unjournal",
    "give up: truncate and unlink",
    "clean shutdown: journal dirty files",
    "clean shutdown: marker",
    "recovery: unjournal",
    "recovery: journal dirty",
    "recovery: remove a file",
    "recovery: relink a lease path",
    "recovery: remove a lease path",
];

fn recovery_site(step: &Step) -> &'static str {
    match step {
        Step::Unjournal(_) => "recovery: unjournal",
        Step::Journal(_) => "recovery: journal dirty",
        Step::RemovePoolEntry(..) | Step::RemoveFile(..) => "recovery: remove a file",
        Step::Relink(..) => "recovery: relink a lease path",
        Step::RemoveLeasePath(..) => "recovery: remove a lease path",
    }
}

/// A crash was injected: unwind to the simulation loop.
struct Crashed;

type Step_ = Result<(), Crashed>;

impl Sim {
    /// A simulation of `seed`.
    pub fn new(seed: u64) -> Sim {
        let mut rng = Rng(seed);
        let error_rate = rng.below(60);
        let crash_rate = rng.below(25);
        Sim {
            rng,
            world: World::default(),
            core: Core::with_files(Vec::new(), 1),
            ops: Vec::new(),
            trace: Vec::new(),
            error_rate,
            crash_rate,
            names: 0,
            schedule: Schedule::default(),
            // Only differences from it matter: the simulation never reads the clock again.
            clock: Instant::now(),
            policy: PoolPolicy::embedded(),
            stats: Stats::default(),
        }
    }

    /// Runs `steps` steps; panics (with the trace) on the first broken invariant.
    pub fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            if self.step().is_err() {
                self.crash();
            }
            self.check();
        }
    }

    fn note(&mut self, what: String) {
        if self.trace.len() == 400 {
            self.trace.remove(0);
        }
        self.trace.push(what);
    }

    /// Whether the next action fails, crashes, or is performed.
    fn fault(&mut self, site: &'static str) -> Fault {
        let f = if self.rng.chance(self.crash_rate) {
            *self.stats.crashed_at.entry(site).or_insert(0) += 1;
            Fault::Crash
        } else if self.rng.chance(self.error_rate) {
            self.stats.errors += 1;
            Fault::Error
        } else {
            Fault::None
        };
        self.note(format!("  {site}: {f:?}"));
        f
    }

    /// Performs a core action on the fake world; `Ok(false)`: it failed.
    fn perform(&mut self, site: &'static str, action: &Action) -> Result<bool, Crashed> {
        self.note(format!("  {action:?}"));
        match self.fault(site) {
            Fault::Crash => return Err(Crashed),
            Fault::Error => return Ok(false),
            Fault::None => {}
        }
        match action {
            Action::Journal(rec) => {
                self.world.journal.insert(rec.key(), rec.clone());
            }
            Action::Unjournal(id) => {
                self.world.journal.remove(&file_key(*id));
            }
            Action::RemoveFile { rec, .. } => {
                self.world.pool.remove(&rec.id);
            }
        }
        Ok(true)
    }

    /// An I/O of the driver's own (fault, link, scrub): `Ok(false)` when it fails.
    fn io(&mut self, site: &'static str) -> Result<bool, Crashed> {
        match self.fault(site) {
            Fault::Crash => Err(Crashed),
            Fault::Error => Ok(false),
            Fault::None => Ok(true),
        }
    }

    /// One step: a new request or job, or the next step of one in flight.
    fn step(&mut self) -> Step_ {
        let roll = self.rng.below(100);
        if roll < 3 {
            return self.clean_restart();
        }
        if roll < 5 {
            return self.drain();
        }
        if roll < 7 {
            // The VMM's manager deletes a lease path (libvirt does at VM stop): the pool keeps
            // its own link, and a restart links the path again.
            let names: Vec<String> = self.world.links.keys().cloned().collect();
            if !names.is_empty() {
                let name = names[self.rng.below(names.len() as u64) as usize].clone();
                self.note(format!("lessee deletes {name}"));
                self.world.links.remove(&name);
            }
            return Ok(());
        }
        if self.ops.is_empty() || roll < 40 {
            self.start_op();
            return Ok(());
        }
        let i = self.rng.below(self.ops.len() as u64) as usize;
        let op = self.ops.remove(i);
        self.note(format!("{op:?}"));
        if let Some(next) = self.advance(op)? {
            self.ops.push(next);
        }
        Ok(())
    }

    fn start_op(&mut self) {
        let op = match self.rng.below(6) {
            0 | 1 => {
                self.names += 1;
                Op::Lease {
                    name: format!("vm{}", self.names % 5),
                    size: (1 + self.rng.below(3)) * PAGE,
                    at: LeaseAt::Choose,
                }
            }
            2 => {
                let leases: Vec<u64> = self
                    .core
                    .files()
                    .filter_map(|e| match &e.rec().state {
                        FileState::Leased(l) => Some(l.id),
                        _ => None,
                    })
                    .collect();
                if leases.is_empty() {
                    return;
                }
                let lease = leases[self.rng.below(leases.len() as u64) as usize];
                Op::Release {
                    lease,
                    at: ReleaseAt::Begin,
                }
            }
            _ => match self.worker_job() {
                Some(op) => op,
                None => return,
            },
        };
        self.note(format!("start {op:?}"));
        self.ops.push(op);
    }

    /// A drain: every idle file that is not leased is given back.
    fn drain(&mut self) -> Step_ {
        self.note("drain".into());
        let idle: Vec<u64> = self
            .core
            .files()
            .filter(|e| matches!(e.phase(), Some(Phase::Warm | Phase::Dirty)))
            .map(|e| e.rec().id)
            .collect();
        for id in idle {
            self.give_up(id)?;
        }
        Ok(())
    }

    /// The trace of the last steps, for a failure's report.
    pub fn trace(&self) -> String {
        self.trace.join("\n")
    }
}

/// The lease path the simulator hands out for `name`.
pub(super) fn lease_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new("/sim/leases").join(name)
}

/// A lease record of `name` as a lease request would journal it.
pub(super) fn lease_record(id: u64, name: &str, source: LeaseSource) -> LeaseRecord {
    LeaseRecord {
        id,
        name: name.to_string(),
        path: lease_path(name),
        uid: None,
        gid: None,
        pid: None,
        pid_start: None,
        source,
        ready_ms: 0.0,
        created_unix: 0,
        idempotency: None,
        recycle: Recycle::Proven,
        principal: None,
    }
}

/// Runs one seed, printing how to replay it when it fails.
pub fn run_seed(seed: u64, steps: usize) -> Stats {
    let mut sim = Sim::new(seed);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.run(steps)));
    if let Err(panic) = result {
        eprintln!("{}", sim.trace());
        eprintln!(
            "simulation failed: replay with\n  HUGEPREP_SIM_SEED={seed} cargo test --lib pool::core::sim -- --nocapture"
        );
        std::panic::resume_unwind(panic);
    }
    std::mem::take(&mut sim.stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The suite's fixed seed count (or `HUGEPREP_SIM_SEEDS`), or the one seed
    /// `HUGEPREP_SIM_SEED` names.
    #[test]
    fn seeds_keep_every_invariant_through_errors_and_crashes() {
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
        let seeds: Vec<u64> = match env("HUGEPREP_SIM_SEED") {
            Some(seed) => vec![seed],
            None => (0..env("HUGEPREP_SIM_SEEDS").unwrap_or(SEEDS)).collect(),
        };
        let one = seeds.len() == 1;
        let mut total = Stats::default();
        for seed in seeds {
            total.add(&run_seed(seed, STEPS));
        }
        eprintln!("simulated: {total:#?}");
        if !one {
            let missed: Vec<&&str> = CRASH_POINTS
                .iter()
                .filter(|p| !total.crashed_at.contains_key(*p))
                .collect();
            assert!(missed.is_empty(), "never crashed at {missed:?}");
        }
    }
}
