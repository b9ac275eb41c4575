//! `hugeprep bench recycle --held N[,N...]`: does recycling wait on a tenant that keeps its
//! released files open? An honest lessee's release is timed back to warm on a quiet pool
//! and behind N releases whose files a process of another uid (65534) keeps open, side by
//! side in one run, interleaved round by round, after a warm-up round of each.
//!
//! The in-process daemon keeps exactly one honest file and N small ones warm (flavors, so
//! every released file is a size the pool misses: kept and proven, none given back for being
//! above target). A round: the honest lessee takes its file; for the held case N small
//! leases are taken too, handed to uid 65534, opened by one `sleep` each running as that
//! uid, and released just before the honest release. The time runs from the honest
//! release's answer until the honest file is warm again. Refills wait for the lessee grace
//! meanwhile (no lease misses). Then the holders exit, and the held files are proven on
//! their next turn and come back warm before the next round.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::daemon::BenchDaemon;
use super::recycle::{RecycleBenchConfig, RecycleBenchError};
use crate::Summary;
use hugeprep::client::Client;
use hugeprep::page_size::PageSize;
use hugeprep::policy::pool::Flavor;
use hugeprep::pool::{LeaseRequest, PoolPolicy};

/// The uid (and gid) that holds the released files open: `nobody` on Debian.
pub const HOLDER_UID: u32 = 65534;

/// The quiet pool against one count of held releases.
#[derive(Debug, Clone, Serialize)]
pub struct HeldTiming {
    /// Releases held open in front of the honest one.
    pub held: usize,
    /// Bytes per held release.
    pub held_size: u64,
    /// Bytes of the honest release.
    pub honest_size: u64,
    /// Honest release back to warm on the quiet pool, ms per round.
    pub quiet_samples_ms: Vec<f64>,
    /// The same behind `held` held releases, ms per round.
    pub held_samples_ms: Vec<f64>,
    /// Median and range, quiet.
    pub quiet_ms: Summary,
    /// Median and range, behind the held releases.
    pub held_ms: Summary,
    /// Held median / quiet median.
    pub ratio: f64,
    /// The median of the per-round ratios (steadier on a shared host).
    pub paired_ratio: Option<f64>,
    /// Proofs that found a held file and set it aside, over the run.
    pub set_aside: u64,
    /// Held releases that took the kernel's path over the run.
    pub kernel_path: u64,
}

/// The target: within 2x of the quiet pool (issue 34).
pub const HELD_GOAL: f64 = 2.0;

fn proof_error(e: std::io::Error) -> RecycleBenchError {
    RecycleBenchError::Proof(e)
}

/// One holder: `sleep` as [`HOLDER_UID`] (no supplementary group, by `setpriv`) with the
/// lease file as its standard input, opened by the holder itself (a shell that runs as that
/// uid), so the daemon sees another uid's open file.
fn hold(path: &Path) -> Result<Child, RecycleBenchError> {
    Command::new("setpriv")
        .arg(format!("--reuid={HOLDER_UID}"))
        .arg(format!("--regid={HOLDER_UID}"))
        .args([
            "--clear-groups",
            "--",
            "sh",
            "-c",
            "exec sleep 100000 < \"$0\"",
        ])
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(proof_error)
}

/// Waits until each holder has the file open (its standard input is the lease file).
fn wait_opened(holders: &[(Child, String)]) -> Result<(), RecycleBenchError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    for (child, name) in holders {
        let fd = format!("/proc/{}/fd/0", child.id());
        loop {
            if std::fs::read_link(&fd).is_ok_and(|l| l.to_string_lossy().ends_with(name.as_str())) {
                break;
            }
            if Instant::now() > deadline {
                return Err(proof_error(std::io::Error::other(format!(
                    "holder {} did not open {name} within 30 s",
                    child.id()
                ))));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(())
}

/// The warm bytes of the kind.
fn warm_bytes(daemon: &BenchDaemon, ps: PageSize) -> u64 {
    daemon
        .pool()
        .status()
        .kinds
        .iter()
        .filter(|k| k.page_size == ps && k.node == 0)
        .map(|k| k.warm_bytes)
        .sum()
}

/// Waits until the kind has `bytes` warm, polling every 200 µs; the time taken.
fn until_warm(
    daemon: &BenchDaemon,
    ps: PageSize,
    bytes: u64,
    timeout: Duration,
) -> Result<Duration, RecycleBenchError> {
    let t = Instant::now();
    while warm_bytes(daemon, ps) < bytes {
        if t.elapsed() > timeout {
            return Err(RecycleBenchError::Proof(std::io::Error::other(format!(
                "the pool did not get {bytes} bytes warm within {} s",
                timeout.as_secs()
            ))));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(t.elapsed())
}

/// Waits until pool file `file` is warm again, polling every 200 µs; the time taken.
fn until_file_warm(
    daemon: &BenchDaemon,
    file: Option<u64>,
    timeout: Duration,
) -> Result<Duration, RecycleBenchError> {
    let t = Instant::now();
    let file =
        file.ok_or_else(|| proof_error(std::io::Error::other("the honest lease has no file")))?;
    while !daemon.pool().file_is_warm(file) {
        if t.elapsed() > timeout {
            return Err(proof_error(std::io::Error::other(format!(
                "the honest file did not come back warm within {} s",
                timeout.as_secs()
            ))));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(t.elapsed())
}

/// One round: the honest release back to warm, behind `held` held releases; ms.
fn round(
    daemon: &BenchDaemon,
    cfg: &RecycleBenchConfig,
    held: usize,
    held_size: u64,
    target: u64,
    seq: &mut usize,
) -> Result<f64, RecycleBenchError> {
    let client = Client::new(daemon.socket());
    let ps = cfg.page_size;
    // Full before each round (the held files of the last round proven and scrubbed).
    until_warm(daemon, ps, target, Duration::from_secs(120))?;
    *seq += 1;
    let lease = |name: String, size: u64, owner: Option<String>| LeaseRequest {
        name,
        size,
        page_size: Some(ps),
        node: Some(0),
        owner,
        ..LeaseRequest::default()
    };
    let (ms, holders) = daemon.block_on(async {
        let honest = client
            .lease(&lease(format!("honest{seq}"), cfg.lease_size, None))
            .await?;
        let mut held_leases = Vec::with_capacity(held);
        for i in 0..held {
            let name = format!("held{seq}-{i}");
            let l = client
                .lease(&lease(
                    name.clone(),
                    held_size,
                    Some(HOLDER_UID.to_string()),
                ))
                .await?;
            held_leases.push((l, name));
        }
        let mut holders = Vec::with_capacity(held);
        for (l, name) in &held_leases {
            holders.push((hold(&l.path)?, name.clone()));
        }
        wait_opened(&holders)?;
        for (l, _) in &held_leases {
            client.release(l.id).await?;
        }
        let file = daemon.pool().file_of_lease(honest.id);
        client.release(honest.id).await?;
        let took = until_file_warm(daemon, file, Duration::from_secs(120))?;
        Ok::<_, RecycleBenchError>((took.as_secs_f64() * 1e3, holders))
    })?;
    for (mut child, _) in holders {
        let _ = child.kill();
        let _ = child.wait();
    }
    Ok(ms)
}

/// Times the honest release quiet and behind each count of held releases.
pub fn time_held(
    cfg: &RecycleBenchConfig,
    mount: &Path,
    counts: &[usize],
    log: &dyn Fn(&str),
) -> Result<Vec<HeldTiming>, RecycleBenchError> {
    let held_size = cfg.page_size.bytes();
    let mut out = Vec::new();
    for &held in counts {
        let base =
            std::env::temp_dir().join(format!("hugeprep-bench-held-{}-{held}", std::process::id()));
        let target = cfg.lease_size + held as u64 * held_size;
        let mut policy = PoolPolicy::embedded();
        // Exactly one honest file and `held` small ones, each kept when released (a size
        // the shape misses) and so proven.
        policy.set_warm(cfg.page_size, target, vec![cfg.lease_size]);
        if let Some(t) = policy.targets.last_mut() {
            t.flavors = vec![
                Flavor {
                    size: cfg.lease_size,
                    count: 1,
                },
                Flavor {
                    size: held_size,
                    count: held as u32,
                },
            ];
        }
        policy.scrub_bandwidth = None;
        policy.threads = cfg.threads;
        let daemon = BenchDaemon::start(&base, mount, policy, cfg.plan)?;
        // Refills wait while a lessee starts: only scrubs make warm bytes during a round.
        daemon.pool().set_lessee_grace(Duration::from_secs(5));
        let before = daemon.pool().counters();
        let reasons_before: u64 = daemon
            .pool()
            .kernel_path_by_reason()
            .iter()
            .map(|r| r.1)
            .sum();
        let result = (|| {
            let mut seq = 0;
            let (mut quiet, mut behind) = (Vec::new(), Vec::new());
            for rep in 0..=cfg.reps {
                let q = round(&daemon, cfg, 0, held_size, target, &mut seq)?;
                let h = round(&daemon, cfg, held, held_size, target, &mut seq)?;
                log(&format!(
                    "held {held}: round {rep}{}: quiet {q:.1} ms, behind {held} held {h:.1} ms",
                    if rep == 0 { " (warm-up)" } else { "" }
                ));
                if rep > 0 {
                    quiet.push(q);
                    behind.push(h);
                }
            }
            Ok::<_, RecycleBenchError>((quiet, behind))
        })();
        let after = daemon.pool().counters();
        let reasons_after: u64 = daemon
            .pool()
            .kernel_path_by_reason()
            .iter()
            .map(|r| r.1)
            .sum();
        drop(daemon);
        let _ = std::fs::remove_dir_all(&base);
        let (quiet, behind) = result?;
        let (Some(q), Some(h)) = (Summary::of(&quiet), Summary::of(&behind)) else {
            continue;
        };
        let t = HeldTiming {
            held,
            held_size,
            honest_size: cfg.lease_size,
            ratio: h.median / q.median,
            paired_ratio: Summary::paired_ratio(&behind, &quiet),
            quiet_samples_ms: quiet,
            held_samples_ms: behind,
            quiet_ms: q,
            held_ms: h,
            set_aside: after.held_aside - before.held_aside,
            kernel_path: reasons_after - reasons_before,
        };
        log(&t.table_row());
        out.push(t);
    }
    Ok(out)
}

impl HeldTiming {
    /// The header of [`HeldTiming::table_row`].
    pub fn table_head() -> String {
        format!(
            "honest release back to warm, quiet vs behind held releases (files kept open by uid {HOLDER_UID})\n{:>6} {:>24} {:>24} {:>8} {:>8} {:>10} {:>8}\n",
            "held", "quiet ms med (min-max)", "held ms med (min-max)", "x quiet", "paired", "set aside", "kernel"
        )
    }

    /// One row: the count, both timings, the ratios and whether the goal is met.
    pub fn table_row(&self) -> String {
        let f = |s: &Summary| format!("{:.1} ({:.1}-{:.1})", s.median, s.min, s.max);
        format!(
            "{:>6} {:>24} {:>24} {:>8.2} {:>8} {:>10} {:>8}  goal <= {HELD_GOAL}x: {}\n",
            self.held,
            f(&self.quiet_ms),
            f(&self.held_ms),
            self.ratio,
            self.paired_ratio.map_or("-".into(), |r| format!("{r:.2}")),
            self.set_aside,
            self.kernel_path,
            if self.ratio <= HELD_GOAL {
                "met"
            } else {
                "NOT met"
            }
        )
    }
}

/// Runs `bench recycle --held`: borrows the pages (the honest file, the held files, and as
/// many again for refills), mounts its own hugetlbfs, times each count in `counts`.
pub fn run(
    cfg: &RecycleBenchConfig,
    counts: &[usize],
    log: &dyn Fn(&str),
) -> Result<Vec<HeldTiming>, RecycleBenchError> {
    use hugeprep::hugetlb::{MountOptions, OwnedMount, PoolTopUp};
    if cfg.reps == 0 {
        return Err(RecycleBenchError::Invalid {
            field: "reps",
            reason: "must be at least 1",
        });
    }
    hugeprep::hugetlb::check_size(cfg.lease_size, cfg.page_size)?;
    let most = counts.iter().copied().max().unwrap_or(0) as u64;
    let pages = 2 * (cfg.lease_size / cfg.page_size.bytes() + most);
    // Declared before the mount so that it drops after it (see `recycle::run`).
    let top_up = PoolTopUp::ensure_free(None, cfg.page_size, pages)?;
    let mut options = MountOptions::new(cfg.page_size);
    options.mode = 0o755;
    let mount = OwnedMount::new_temp(&std::env::temp_dir(), &options)?;
    let result = time_held(cfg, mount.path(), counts, log);
    let _ = mount.unmount();
    drop(top_up);
    result
}
