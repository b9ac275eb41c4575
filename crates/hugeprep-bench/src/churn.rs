//! `hugeprep bench recycle --churn`: warm-lease latency on a quiet pool and on one whose
//! worker journals, scrubs, cuts and deletes files meanwhile, side by side (issue 35 item 4:
//! the lease p99 must not move while the worker works, as no file I/O runs under the
//! state lock).
//!
//! Rounds alternate the two cases (and their order). Each round settles the pool; for the
//! churned case another client then leases and releases files of twice the lease size in a
//! loop (cold leases, as the target holds none of that size, each asking for the kernel's
//! path: every release is journaled dirty, then truncated, deleted and unjournaled by the
//! worker, and none comes back warm to take the place of the timed leases' files), waits for
//! its first few releases so the worker is busy, and [`BATCH`] warm-exact leases are timed
//! one after the other (each released at once, and scrubbed back by the worker between the
//! churn's deletions), as in the quiet case. The first round of each case is a warm-up,
//! untimed.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hugeprep::client::Client;
use hugeprep::pool::{LeaseRequest, LockSnapshot};
use serde::Serialize;

use super::hog::{cases_table, lease_batch, CaseLatency, Samples, BATCH};
use super::recycle_config::{RecycleBenchConfig, RecycleBenchError};

/// Warm files of the lease size kept for the batch, beside what the churning client takes.
pub const WARM_FILES: u64 = BATCH as u64;
/// Pages the churning client's files may take at once, in lease sizes (one leased, one
/// being scrubbed or deleted, of twice the lease size each).
pub const CHURN_FILES: u64 = 4;
/// Releases of the churning client to wait for before a churned batch is timed.
const CHURN_AHEAD: u64 = 2;

/// Quiet against churned.
#[derive(Debug, Clone, Serialize)]
pub struct ChurnLatency {
    /// Bytes per timed lease.
    pub lease_size: u64,
    /// Bytes per lease of the churning client.
    pub churn_lease_size: u64,
    /// Leases and releases the churning client made during the churned rounds (warm-up
    /// included).
    pub churn_cycles: u64,
    /// Bytes the worker scrubbed over the whole run (both cases: the timed leases' files).
    pub scrubbed_bytes: u64,
    /// Released files the worker truncated and deleted over the whole run (the churn's).
    pub kernel_path_releases: u64,
    /// The quiet case.
    pub quiet: CaseLatency,
    /// The churned case.
    pub churned: CaseLatency,
    /// Churned p50 / quiet p50, at the client.
    pub p50_ratio: f64,
    /// Churned p99 / quiet p99, at the client.
    pub p99_ratio: f64,
    /// The leases served warm-exact only (the churn also competes for the warm files, and
    /// a lease it leaves none of the size for waits or faults): quiet and churned client
    /// p50 and p99, ms, what a lock held across the worker's I/O would move.
    pub warm_exact_p50_p99: [(f64, f64); 2],
    /// Churned / quiet p50 and p99 of the warm-exact leases, at the client.
    pub warm_exact_ratios: (f64, f64),
    /// The pool lock during each case's timed batches (quiet, churned): waits and holds by
    /// every thread (the timed leases', the churn's, the worker's), in powers of two of µs.
    pub lock: [LockSnapshot; 2],
}

/// The other client: leases and releases in a loop until `stop`, counting in `cycles`.
struct Churn {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Churn {
    fn start(socket: &Path, req: LeaseRequest, cycles: Arc<AtomicU64>) -> Churn {
        let stop = Arc::new(AtomicBool::new(false));
        let client = Client::new(socket);
        let halt = Arc::clone(&stop);
        let thread = std::thread::spawn(move || -> Result<(), String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let mut n = 0u64;
            while !halt.load(Ordering::Relaxed) {
                n += 1;
                let req = LeaseRequest {
                    name: format!("{}{n}", req.name),
                    ..req.clone()
                };
                match rt.block_on(client.lease(&req)) {
                    Ok(lease) => {
                        rt.block_on(client.release(lease.id))
                            .map_err(|e| e.to_string())?;
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                    // No pages for it now (the worker has not deleted the last one yet):
                    // try again shortly, as a VMM's manager would.
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            Ok(())
        });
        Churn {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> Result<(), RecycleBenchError> {
        self.halt()
    }

    fn halt(&mut self) -> Result<(), RecycleBenchError> {
        self.stop.store(true, Ordering::Relaxed);
        let Some(t) = self.thread.take() else {
            return Ok(());
        };
        let failed = |msg: String| {
            RecycleBenchError::Proof(std::io::Error::other(format!("churning client: {msg}")))
        };
        t.join()
            .map_err(|_| failed("panicked".into()))?
            .map_err(failed)
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        // Only reached on an error path, whose own error is returned.
        if let Err(err) = self.halt() {
            eprintln!("the churning client failed while stopping: {err}");
        }
    }
}

/// Runs the quiet/churned comparison with `cfg.leases` leases per case.
pub fn churned_latency(
    cfg: &RecycleBenchConfig,
    mount: &Path,
    log: &dyn Fn(&str),
) -> Result<ChurnLatency, RecycleBenchError> {
    let base = match &cfg.state_dir {
        Some(d) => d.join("churn"),
        None => std::env::temp_dir().join(format!("hugeprep-bench-churn-{}", std::process::id())),
    };
    let daemon = super::recycle_config::lease_daemon(cfg, mount, &base, WARM_FILES)?;
    let client = Client::new(daemon.socket());
    let churn_req = LeaseRequest {
        name: "churn".into(),
        size: cfg.churn_size.unwrap_or(2 * cfg.lease_size),
        page_size: Some(cfg.page_size),
        node: Some(0),
        recycle: Some(hugeprep::policy::pool::Recycle::Kernel),
        ..LeaseRequest::default()
    };
    let cycles = Arc::new(AtomicU64::new(0));
    let rounds = cfg.leases.div_ceil(BATCH).max(1);
    let before = daemon.pool().counters();
    // Per case: 0 quiet, 1 churned.
    let mut samples: [Samples; 2] = Default::default();
    let mut lock: [LockSnapshot; 2] = Default::default();
    let mut serial = 0usize;
    let result = (|| -> Result<(), RecycleBenchError> {
        for r in 0..=rounds {
            let order: [usize; 2] = if r % 2 == 0 { [0, 1] } else { [1, 0] };
            for c in order {
                daemon.settle(Duration::from_secs(120))?;
                let churn = (c == 1).then(|| {
                    let at = cycles.load(Ordering::Relaxed);
                    let churn = Churn::start(daemon.socket(), churn_req.clone(), cycles.clone());
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while cycles.load(Ordering::Relaxed) < at + CHURN_AHEAD
                        && Instant::now() < deadline
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    churn
                });
                let into = (r > 0).then_some(&mut samples[c]);
                let held = daemon.pool().status().lock;
                lease_batch(&daemon, &client, cfg, "churned", &mut serial, into)?;
                if r > 0 {
                    add_lock(&mut lock[c], &daemon.pool().status().lock.since(&held));
                }
                if let Some(churn) = churn {
                    churn.stop()?;
                }
            }
        }
        Ok(())
    })();
    let after = daemon.pool().counters();
    drop(daemon);
    if let Err(err) = std::fs::remove_dir_all(&base) {
        eprintln!(
            "cannot remove the churn case's state {}: {err}",
            base.display()
        );
    }
    result?;
    let quiet = samples[0].case("quiet");
    let churned = samples[1].case("churned");
    let q = |v: &[f64], p| hugeprep::stats::Summary::quantile(v, p).unwrap_or(f64::NAN);
    let exact = |c: usize| &samples[c].exact_client;
    let warm_exact_p50_p99 = [0, 1].map(|c| (q(exact(c), 0.5), q(exact(c), 0.99)));
    let [wq, wc] = warm_exact_p50_p99;
    let out = ChurnLatency {
        warm_exact_p50_p99,
        warm_exact_ratios: (wc.0 / wq.0, wc.1 / wq.1),
        lease_size: cfg.lease_size,
        churn_lease_size: churn_req.size,
        churn_cycles: cycles.load(Ordering::Relaxed),
        scrubbed_bytes: after.scrubbed_bytes - before.scrubbed_bytes,
        kernel_path_releases: after.kernel_path_releases - before.kernel_path_releases,
        p50_ratio: churned.client_p50_p99.0 / quiet.client_p50_p99.0,
        p99_ratio: churned.client_p50_p99.1 / quiet.client_p50_p99.1,
        quiet,
        churned,
        lock,
    };
    log(&out.table());
    Ok(out)
}

/// Adds the counts of `delta` to `sum` and keeps the longest hold seen.
fn add_lock(sum: &mut LockSnapshot, delta: &LockSnapshot) {
    for (a, b) in sum.wait_us_log2.iter_mut().zip(delta.wait_us_log2) {
        *a += b;
    }
    for (a, b) in sum.hold_us_log2.iter_mut().zip(delta.hold_us_log2) {
        *a += b;
    }
    if delta.longest_hold_us >= sum.longest_hold_us {
        sum.longest_hold_us = delta.longest_hold_us;
        sum.longest_hold_at.clone_from(&delta.longest_hold_at);
    }
}

impl ChurnLatency {
    /// The two cases side by side.
    pub fn table(&self) -> String {
        let mut s = format!(
            "warm lease, quiet vs the worker busy with another client's {} leases ({} cycles; {} MB scrubbed, {} truncated and deleted), {} leases each:\n",
            hugeprep::units::format_bytes(self.churn_lease_size),
            self.churn_cycles,
            self.scrubbed_bytes >> 20,
            self.kernel_path_releases,
            self.quiet.leases,
        );
        s += &cases_table(&[&self.quiet, &self.churned]);
        s += &format!(
            "churned / quiet at the client: p50 {:.2}x, p99 {:.2}x\n",
            self.p50_ratio, self.p99_ratio
        );
        let [wq, wc] = self.warm_exact_p50_p99;
        s += &format!(
            "warm-exact leases only, client p50/p99: quiet {:.3}/{:.3} ms, churned {:.3}/{:.3} ms: p50 {:.2}x, p99 {:.2}x\n",
            wq.0, wq.1, wc.0, wc.1, self.warm_exact_ratios.0, self.warm_exact_ratios.1
        );
        for (name, l) in ["quiet", "churned"].iter().zip(&self.lock) {
            s += &format!(
                "pool lock, {name}: {} waits, p50/p99/max under {}/{}/{} µs; {} holds, p99/max under {}/{} µs\n",
                l.wait_us_log2.iter().sum::<u64>(),
                l.wait_quantile_us(0.5),
                l.wait_quantile_us(0.99),
                l.wait_quantile_us(1.0),
                l.hold_us_log2.iter().sum::<u64>(),
                l.hold_quantile_us(0.99),
                l.hold_quantile_us(1.0),
            );
        }
        if let Some(at) = &self.lock[1].longest_hold_at {
            s += &format!(
                "longest hold since the daemon started: {} µs, taken at {at}\n",
                self.lock[1].longest_hold_us
            );
        }
        s
    }
}
