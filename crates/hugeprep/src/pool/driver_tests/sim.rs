//! A seeded simulation of the real driver on the simulated host: one seed drives leases,
//! releases (with each lessee's bytes written into its lease), lease paths deleted by the
//! VMM's manager, the worker's jobs one at a time, drains (giving the kernel's pools back
//! or not) and resumes, target changes, raises of the kernel's pools in half the seeds
//! (the kernel adds what short or fragmented memory allows), and the host's faults: a full
//! journal, a kernel that counts pages it does not have, other users that take pages,
//! failed creates and scrubs, proofs that fail, find the file held or answer late (the
//! clock moves on and another VM leases and releases meanwhile), pool-file unlinks that
//! fail (`EIO`, `EBUSY`; recovery's too), time that jumps, and released files their
//! lessees hold (a read lease, pinned pages: kept until they let go, at the keeper's
//! turns). After every step the rig's checks run (every page in exactly one file, every
//! file the pool's, a lease's or the keeper's, no lessee's bytes
//! handed to another, no ledger record of pages the kernel's pool did not get, the core's
//! invariants, the journal of idle files); at the end, with the faults gone, every lease
//! released and the pool drained, every page is back with the kernel.
//!
//! Crashes: the daemon is killed before any effect on the host (a journal write, a create,
//! a fault, a link, a scrub, a truncate, a step of recovery itself); a new one recovers with
//! the daemon's own recovery from what the host keeps, and its open watch has forgotten
//! every file (so files released before it take the kernel's path). Clean restarts too.
//! In half the seeds the journal also loses, at each crash, what it had not synced: the
//! last of its writes and removals since the last clean-shutdown marker, the last one kept
//! possibly cut short (a record that does not decode). Each of these faults must be hit
//! by the suite ([`INJECTIONS`]), as each crash point must.
//!
//! A failing seed prints the one command that replays it:
//! `HUGEPREP_DRIVER_SIM_SEED=<seed> cargo test --lib pool::driver_tests::sim -- --nocapture`.

use std::collections::BTreeMap;

use super::host::sim::Hold;
use super::sim_faults::fault_step;
use super::*;

/// Seeds the suite runs; `HUGEPREP_DRIVER_SIM_SEEDS` runs more.
const SEEDS: u64 = 300;
/// Steps per seed.
const STEPS: usize = 150;
/// The effects the suite must have crashed before: each is found safe, or the suite fails.
const CRASH_POINTS: &[&str] = &[
    "journal filling",
    "journal warm",
    "journal leased",
    "journal dirty",
    "journal scrubbing",
    "unjournal",
    "journal the clean shutdown",
    "clear the clean shutdown",
    "create and fault a refill",
    "create a lease's file",
    "resize a file",
    "fault a lease",
    "link a lease path",
    "unlink a lease path",
    "take a released file back",
    "refill holes",
    "prove out of reach",
    "scrub",
    "truncate",
    "unlink a pool file",
    "recovery: unjournal",
    "recovery: journal dirty",
    "recovery: remove a file",
    "resize the kernel's pool",
    "ledger write",
    "compact",
    "pin a lease",
    "keep a released file",
    "truncate a kept file",
    "remove a kept file",
];

/// The faults other than crashes the suite must have injected: each is found safe, or the
/// suite fails.
const INJECTIONS: &[&str] = &[
    "lost journal writes",
    "torn journal write",
    "slow proof",
    "unlink a pool file fails",
    "recovery: unlink a pool file fails",
    "the kernel adds fewer pages than asked",
];

/// Free 2M pages the kernel starts with.
pub(super) const PAGES: u64 = 24;

/// splitmix64: one seed, one stream, the same on every machine.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(super) fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// How a seed's pool is set up: sizes follow the leases (`demand`: warm files are cut to a
/// size in demand, else the fixed mix); it raises the kernel's pools (`reserve`, no margin).
#[derive(Debug, Clone, Copy)]
struct How {
    demand: bool,
    reserve: bool,
}

/// A target of `warm_mib` in files of 4 and 8 MiB, set up as `how` says.
fn policy(warm_mib: u64, how: How) -> PoolPolicy {
    let reserve =
        ["reserve = false", "reserve = true\nreserve_margin = \"0\""][how.reserve as usize];
    let mut text = format!(
        "{reserve}\nlessee_grace_ms = 0\nverify = \"full\"\n{}",
        target(warm_mib, &[4, 8])
    );
    if how.demand {
        text = text.replace("shape = \"fixed\"", "shape = \"demand\"");
    }
    PoolPolicy::from_toml(&text).expect("simulated policy")
}

/// What one seed did, so the suite can tell it exercised each path.
#[derive(Debug, Default)]
struct Stats {
    crashed_at: BTreeMap<&'static str, u64>,
    injected: BTreeMap<&'static str, u64>,
    crashes: u64,
    restarts: u64,
    leases: u64,
    refused: u64,
    releases: u64,
    jobs: u64,
    kernel_path: u64,
    scrubbed_bytes: u64,
}

/// The seed's pool: how it is set up, on a host with its kernel's pool and memory.
fn setup(rng: &mut Rng) -> (Rig, How) {
    let how = How {
        demand: rng.chance(500),
        reserve: rng.chance(500),
    };
    // Raising pools: a small kernel pool, memory for more pages or fewer, some fragmented.
    let pages = if how.reserve { rng.below(12) } else { PAGES };
    let mut r = rig(&target(8, &[4, 8]), pages);
    if how.reserve {
        r.host.set_memory(0, rng.below(2 * PAGES) * PS.bytes());
        r.host.fragment(0, rng.below(8) * PS.bytes());
    }
    r.pool.set_policy(policy(8, how));
    r.policy = policy(8, how);
    (r, how)
}

fn run(seed: u64, trace: &mut Vec<String>) -> Stats {
    let mut rng = Rng(seed);
    let (mut r, how) = setup(&mut rng);
    let crash_rate = rng.below(80);
    // The journal of this seed loses what it had not synced at a crash (or keeps it, as a
    // journal in the page cache does when only the daemon dies).
    let lose = rng.chance(500);
    r.host.inject(|f| f.lose_unsynced = lose);
    let mut stats = Stats::default();
    let mut leases: Vec<LeaseInfo> = Vec::new();
    for step in 0..STEPS {
        if rng.chance(crash_rate) {
            let n = rng.below(8);
            r.host.inject(|f| f.crash_after = Some(n));
            trace.push(format!("{step}: crash before the effect {n} from here"));
        }
        if rng.chance(10) {
            let marked = clean_restart(&mut r);
            trace.push(format!("{step}: clean restart (marked: {marked})"));
            stats.restarts += 1;
            leases = r.pool.leases();
            r.check();
            continue;
        }
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            one_step(&r, &mut rng, &mut leases, &mut stats, how)
        }));
        let what = match stepped {
            Ok(what) => what,
            Err(panic) if panic.is::<super::host::sim::Crashed>() => {
                if rng.chance(600) {
                    // Killed again during its recovery.
                    let n = rng.below(2);
                    r.host.inject(|f| f.crash_after = Some(n));
                }
                r.restart();
                stats.crashes += 1;
                leases = r.pool.leases();
                "crashed; a new daemon recovered".to_string()
            }
            Err(panic) => std::panic::resume_unwind(panic),
        };
        r.host.inject(|f| f.tick = Duration::ZERO);
        trace.push(format!("{step}: {what}"));
        r.check();
    }
    finish(&r, how, &mut stats);
    stats
}

/// The end of a seed: faults gone, every lease back, the pool drained: every page with the
/// kernel; what the host and the pool counted goes into `stats`.
fn finish(r: &Rig, how: How, stats: &mut Stats) {
    r.host.inject(|f| *f = Default::default());
    r.host.let_go();
    let leases = r.pool.leases();
    for info in leases {
        r.pool.release(info.id).expect("a release without faults");
    }
    r.pool.set_policy(policy(0, how));
    r.settle();
    // Their holders let go: the keeper truncates and removes every kept file.
    r.pool.reclaim_kept(None);
    let drain = DrainRequest {
        release_pools: true,
        ..DrainRequest::default()
    };
    r.pool
        .drain(&drain, Duration::ZERO)
        .expect("a drain without faults");
    r.settle();
    r.check();
    // Every page the daemon recorded adding went back, as far as they were free.
    let held = r.host.ledger(0, PS);
    assert!(held == 0 || r.free() == 0, "{held} pages still recorded");
    // Held files wait aside until proven again; the drain gives them up.
    assert!(r.host.files().is_empty(), "left: {:?}", r.host.files());
    assert_eq!(r.free(), r.host.total_pages(0, PS), "every page back");
    stats.crashed_at = r.host.crashed_at();
    stats.injected = r.host.injected();
    let c = r.pool.counters();
    stats.kernel_path = c.kernel_path_releases;
    stats.scrubbed_bytes = c.scrubbed_bytes;
}

/// A clean restart, as `systemctl restart` makes it: whether the clean shutdown was marked.
fn clean_restart(r: &mut Rig) -> bool {
    r.pool.shutdown();
    let marked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        r.pool.mark_clean_shutdown()
    }));
    r.restart();
    marked.is_ok()
}

/// One request, job or fault of the simulation: what it did.
fn one_step(
    r: &Rig,
    rng: &mut Rng,
    leases: &mut Vec<LeaseInfo>,
    stats: &mut Stats,
    how: How,
) -> String {
    match rng.below(100) {
        n @ 0..=44 if n < 25 || !leases.is_empty() => request_step(r, rng, n, leases, stats),
        n @ 80..=84 => pool_step(r, rng, n, how),
        96 if !leases.is_empty() => {
            let info = &leases[rng.below(leases.len() as u64) as usize];
            r.host.delete_lease_path(&info.path);
            format!("the lessee's manager deletes {}", info.path.display())
        }
        n @ (85..=95 | 97 | 98) => fault_step(r, rng, n),
        _ => {
            let did = r.pool.work_once();
            stats.jobs += u64::from(did);
            format!("work: {did}")
        }
    }
}

/// A lease (`n` below 25) or a release.
fn request_step(
    r: &Rig,
    rng: &mut Rng,
    n: u64,
    leases: &mut Vec<LeaseInfo>,
    stats: &mut Stats,
) -> String {
    match n {
        0..=24 => {
            let name = format!("vm{}", rng.below(6));
            let size = (1 + rng.below(4)) * 2 * MIB;
            // A lease that would wait for work nobody runs here reaches its deadline
            // in a few turns of a clock that jumps.
            r.host.inject(|f| f.tick = Duration::from_secs(40));
            let mut req = request(&name, size / MIB);
            req.pin = rng.chance(200);
            let res = r.pool.lease(&req);
            r.host.inject(|f| f.tick = Duration::ZERO);
            match res {
                Ok(info) => {
                    r.host.write(&info.path, &format!("lessee-{}", info.id));
                    stats.leases += 1;
                    let s = format!("lease {name} {size} -> {:?} {}", info.source, info.id);
                    leases.push(info);
                    s
                }
                Err(e) => {
                    stats.refused += 1;
                    format!("lease {name} {size} refused: {e}")
                }
            }
        }
        _ => {
            let info = leases.remove(rng.below(leases.len() as u64) as usize);
            // The lessee holds its file past the release: a read lease, or pages it pins.
            let mut hold = Hold::default();
            if rng.chance(150) && r.host.lease_paths().contains_key(&info.path) {
                hold.read_lease = rng.chance(500);
                hold.pinned = rng.below(3);
                r.host.hold(&info.path, hold);
            }
            match r.pool.release(info.id) {
                Ok(_) => {
                    stats.releases += 1;
                    format!("release {} (held: {hold:?})", info.id)
                }
                Err(e) => {
                    leases.push(info.clone());
                    format!("release {} failed: {e}", info.id)
                }
            }
        }
    }
}

/// A drain, a resume or a new target.
fn pool_step(r: &Rig, rng: &mut Rng, n: u64, how: How) -> String {
    match n {
        80..=81 => {
            let drain = DrainRequest {
                release_pools: rng.chance(500),
                ..DrainRequest::default()
            };
            let rep = r.pool.drain(&drain, Duration::ZERO);
            let rep = rep.map(|d| (d.kinds, d.released));
            format!("drain (release pools: {}): {rep:?}", drain.release_pools)
        }
        82..=83 => format!("resume: {:?}", r.pool.resume(None, None)),
        _ => {
            let warm = rng.below(5) * 4;
            r.pool.set_policy(policy(warm, how));
            format!("target {warm}M")
        }
    }
}

#[test]
fn seeds_keep_every_page_in_one_file_and_every_byte_with_its_lessee() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seeds: Vec<u64> = match env("HUGEPREP_DRIVER_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env("HUGEPREP_DRIVER_SIM_SEEDS").unwrap_or(SEEDS)).collect(),
    };
    let one = seeds.len() == 1;
    let mut total = Stats::default();
    for seed in seeds {
        let mut trace = Vec::new();
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed, &mut trace)));
        match result {
            Ok(s) => {
                for (site, n) in s.crashed_at {
                    *total.crashed_at.entry(site).or_default() += n;
                }
                for (what, n) in s.injected {
                    *total.injected.entry(what).or_default() += n;
                }
                total.crashes += s.crashes;
                total.restarts += s.restarts;
                total.leases += s.leases;
                total.refused += s.refused;
                total.releases += s.releases;
                total.jobs += s.jobs;
                total.kernel_path += s.kernel_path;
                total.scrubbed_bytes += s.scrubbed_bytes;
            }
            Err(panic) => {
                eprintln!("{}", trace.join("\n"));
                eprintln!(
                    "driver simulation failed: replay with\n  HUGEPREP_DRIVER_SIM_SEED={seed} cargo test --lib pool::driver_tests::sim -- --nocapture"
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("simulated the driver: {total:?}");
    if !one {
        assert!(total.leases > 0 && total.refused > 0 && total.releases > 0);
        assert!(total.kernel_path > 0 && total.scrubbed_bytes > 0);
        assert!(total.crashes > 0 && total.restarts > 0);
        let missed: Vec<&&str> = CRASH_POINTS
            .iter()
            .filter(|p| !total.crashed_at.contains_key(*p))
            .collect();
        assert!(missed.is_empty(), "never crashed before {missed:?}");
        let missed: Vec<&&str> = INJECTIONS
            .iter()
            .filter(|i| !total.injected.contains_key(*i))
            .collect();
        assert!(missed.is_empty(), "never injected {missed:?}");
    }
}
