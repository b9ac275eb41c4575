//! `hugeprep bench recycle --hog`: warm-lease latency on a quiet host and on one whose every
//! CPU is busy with an ordinary (nice 0) process, side by side.
//!
//! Rounds alternate the two cases (and their order). Each round settles the pool with the
//! host quiet, then, for the hogged case, starts one busy-looping process per CPU, takes
//! [`BATCH`] warm-exact leases one after the other (each released at once) and stops the
//! hogs. With every CPU busy the `SCHED_IDLE` worker gets almost nothing, so the batch is
//! served from files warmed before it; the quiet case does exactly the same.

use std::path::Path;
use std::time::{Duration, Instant};

use hugeprep::client::Client;
use hugeprep::pool::{LeaseRequest, LeaseSource};
use hugeprep::stats::Summary;
use hugeprep_testkit::hog::CpuHog;
use serde::Serialize;

use super::recycle_config::{RecycleBenchConfig, RecycleBenchError};

/// Leases per batch, and warm files kept for it.
pub const BATCH: usize = 8;

/// Latency of one case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseLatency {
    /// `quiet` or `hogged`.
    pub case: &'static str,
    /// Leases timed.
    pub leases: usize,
    /// Request to answer at the client (a nice 0 process, like a VMM's start path), ms.
    pub client_ms: Summary,
    /// Client p50 and p99, ms.
    pub client_p50_p99: (f64, f64),
    /// The daemon's own `ready_ms` (lock, file and journal work; no client scheduling) p50
    /// and p99.
    pub daemon_p50_p99: (f64, f64),
    /// Leases served warm-exact.
    pub warm_exact: usize,
}

/// Quiet against hogged.
#[derive(Debug, Clone, Serialize)]
pub struct HogLatency {
    /// Busy-looping processes in the hogged case (one per CPU).
    pub hogs: usize,
    /// Bytes per lease.
    pub lease_size: u64,
    /// The quiet case.
    pub quiet: CaseLatency,
    /// The hogged case.
    pub hogged: CaseLatency,
    /// Hogged p99 / quiet p99, at the client.
    pub p99_ratio: f64,
    /// The client's nice value (0: an ordinary caller).
    pub client_nice: i32,
}

pub(crate) fn case(
    name: &'static str,
    client: &[f64],
    daemon: &[f64],
    warm_exact: usize,
) -> CaseLatency {
    let q = |v: &[f64], p| Summary::quantile(v, p).unwrap_or(f64::NAN);
    CaseLatency {
        case: name,
        leases: client.len(),
        client_ms: Summary::of(client).unwrap_or(Summary {
            median: f64::NAN,
            min: f64::NAN,
            max: f64::NAN,
        }),
        client_p50_p99: (q(client, 0.5), q(client, 0.99)),
        daemon_p50_p99: (q(daemon, 0.5), q(daemon, 0.99)),
        warm_exact,
    }
}

/// The cases' rows under one header: client and daemon p50/p99, the client's median and
/// range, and how many leases were served warm-exact.
pub(crate) fn cases_table(cases: &[&CaseLatency]) -> String {
    let mut s = format!(
        "{:<8} {:>11} {:>11} {:>24} {:>13} {:>13} {:>11}\n",
        "case",
        "client p50",
        "client p99",
        "client ms median (min-max)",
        "daemon p50",
        "daemon p99",
        "warm-exact"
    );
    for c in cases {
        s += &format!(
            "{:<8} {:>8.3} ms {:>8.3} ms {:>24} {:>10.3} ms {:>10.3} ms {:>11}\n",
            c.case,
            c.client_p50_p99.0,
            c.client_p50_p99.1,
            c.client_ms.to_string(),
            c.daemon_p50_p99.0,
            c.daemon_p50_p99.1,
            c.warm_exact
        );
    }
    s
}

/// One case's timed leases: client and daemon ms, how many were warm-exact, and the client
/// ms of the warm-exact ones alone.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    pub(crate) client: Vec<f64>,
    pub(crate) daemon: Vec<f64>,
    pub(crate) warm_exact: usize,
    pub(crate) exact_client: Vec<f64>,
}

impl Samples {
    /// The case's latency summary.
    pub(crate) fn case(&self, name: &'static str) -> CaseLatency {
        case(name, &self.client, &self.daemon, self.warm_exact)
    }
}

/// Leases and at once releases [`BATCH`] files of `cfg.lease_size`, one after the other,
/// named `<prefix><serial>`, timing each into `into` (`None`: a warm-up batch).
pub(crate) fn lease_batch(
    daemon: &super::daemon::BenchDaemon,
    client: &Client,
    cfg: &RecycleBenchConfig,
    prefix: &str,
    serial: &mut usize,
    mut into: Option<&mut Samples>,
) -> Result<(), RecycleBenchError> {
    for _ in 0..BATCH {
        *serial += 1;
        let req = LeaseRequest {
            name: format!("{prefix}{serial}"),
            size: cfg.lease_size,
            page_size: Some(cfg.page_size),
            node: Some(0),
            ..LeaseRequest::default()
        };
        let t = Instant::now();
        let lease = daemon.block_on(client.lease(&req))?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if let Some(s) = into.as_deref_mut() {
            s.client.push(ms);
            s.daemon.push(lease.ready_ms);
            if lease.source == LeaseSource::WarmExact {
                s.warm_exact += 1;
                s.exact_client.push(ms);
            }
        }
        daemon.block_on(client.release(lease.id))?;
    }
    Ok(())
}

/// Runs the quiet/hogged comparison with `cfg.leases` leases per case.
pub fn hogged_latency(
    cfg: &RecycleBenchConfig,
    mount: &Path,
    log: &dyn Fn(&str),
) -> Result<HogLatency, RecycleBenchError> {
    let base = match &cfg.state_dir {
        Some(d) => d.join("hog"),
        None => std::env::temp_dir().join(format!("hugeprep-bench-hog-{}", std::process::id())),
    };
    let daemon = super::recycle_config::lease_daemon(cfg, mount, &base, BATCH as u64)?;
    let client = Client::new(daemon.socket());
    let nice_before = hugeprep::sys::priority::current_thread_nice();
    if let Some(n) = cfg.client_nice {
        hugeprep::sys::priority::set_current_thread_nice(n).map_err(|source| {
            RecycleBenchError::Daemon(super::daemon::BenchDaemonError::Io {
                op: "set the client's nice value (--client-nice)",
                source,
            })
        })?;
    }
    let client_nice = hugeprep::sys::priority::current_thread_nice();
    let hogs = hugeprep::sys::affinity::allowed_cpus().len();
    let rounds = cfg.leases.div_ceil(BATCH).max(1);
    // Per case: 0 quiet, 1 hogged.
    let mut samples: [Samples; 2] = Default::default();
    let mut serial = 0usize;
    let result = (|| -> Result<(), RecycleBenchError> {
        // Warm-up, untimed: one quiet batch.
        for r in 0..=rounds {
            let order: [usize; 2] = if r % 2 == 0 { [0, 1] } else { [1, 0] };
            for c in order {
                daemon.settle(Duration::from_secs(120))?;
                let _hog = if c == 1 && r > 0 {
                    Some(CpuHog::start(hogs).map_err(|source| {
                        RecycleBenchError::Daemon(super::daemon::BenchDaemonError::Io {
                            op: "start the CPU hogs",
                            source,
                        })
                    })?)
                } else {
                    None
                };
                let into = (r > 0).then_some(&mut samples[c]);
                lease_batch(&daemon, &client, cfg, "hog", &mut serial, into)?;
            }
        }
        Ok(())
    })();
    let _ = hugeprep::sys::priority::set_current_thread_nice(nice_before);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&base);
    result?;
    let quiet = samples[0].case("quiet");
    let hogged = samples[1].case("hogged");
    let out = HogLatency {
        hogs,
        lease_size: cfg.lease_size,
        p99_ratio: hogged.client_p50_p99.1 / quiet.client_p50_p99.1,
        client_nice,
        quiet,
        hogged,
    };
    log(&out.table());
    Ok(out)
}

impl HogLatency {
    /// The two cases side by side.
    pub fn table(&self) -> String {
        let mut s = format!(
            "warm lease, quiet vs {} CPU hogs (nice 0), client at nice {}, {} leases each:\n",
            self.hogs, self.client_nice, self.quiet.leases,
        );
        s += &cases_table(&[&self.quiet, &self.hogged]);
        s += &format!("hogged / quiet p99 at the client: {:.2}x\n", self.p99_ratio);
        s
    }
}
