//! `hugeprep bench recycle`: what recycling a stopped VM's memory costs.
//!
//! 1. Release-to-warm throughput: scrubbing a dirty, faulted file in place (the daemon's
//!    release path: map, clear in parallel, sample-verify) against deleting the file and
//!    faulting a fresh one (the kernel zeroes every page at fault), at equal threads, side by
//!    side, alternating order, after a warm-up round of each.
//! 2. Lease latency from the warm pool over the API: an in-process daemon (pool, worker,
//!    axum on a unix socket) and a client taking and releasing leases; each lease is timed
//!    from request to answer, with the pool settled (warm) before each one.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::Summary;
use hugeprep::clear::{ClearPlan, Clearer};
use hugeprep::client::Client;
use hugeprep::hugetlb::{BackingFile, FileError, MountOptions, OwnedMount, PoolTopUp};
use hugeprep::policy::pool::Verification;
use hugeprep::pool::{fault, LeaseRequest, LeaseSource};
use hugeprep::scrub::{ScrubControl, ScrubOptions, Scrubber};
use hugeprep::sys::mmap::MmapRegion;
use hugeprep::units::gbps;

use super::recycle_config::lease_daemon;
pub use super::recycle_config::{RecycleBenchConfig, RecycleBenchError};
pub use super::recycle_report::{
    LatencyResult, MethodClear, PathResult, RecycleBenchReport, SCRUB_GOAL,
};

fn cpus(threads: usize) -> Vec<usize> {
    let mut c = hugeprep::sys::affinity::allowed_cpus();
    c.truncate(threads.max(1));
    c
}

fn dirty(file: &BackingFile, seed: u8) -> Result<(), RecycleBenchError> {
    let mut m = file.map()?;
    // One byte per 4 KiB is enough to make every page dirty without spending the run on it.
    for (i, b) in m.as_mut_slice().iter_mut().step_by(4096).enumerate() {
        *b = seed ^ (i as u8) | 1;
    }
    Ok(())
}

fn scrub_once(s: &Scrubber, file: &BackingFile, cpus: &[usize]) -> Result<f64, RecycleBenchError> {
    dirty(file, 0xa5)?;
    let opts = ScrubOptions {
        cpus: cpus.to_vec(),
        bandwidth: None,
        background: false,
        verify: Verification::Sample,
        yield_to: None,
    };
    let t = Instant::now();
    s.scrub_file(file, &opts, &ScrubControl::default())?;
    Ok(t.elapsed().as_secs_f64())
}

fn kernel_path_once(
    dir: &Path,
    old: BackingFile,
    cfg: &RecycleBenchConfig,
) -> Result<(f64, BackingFile), RecycleBenchError> {
    dirty(&old, 0x5a)?;
    let path = old.path().to_path_buf();
    let t = Instant::now();
    // As `Pool::remove_file`: truncate (the pages go back to the kernel), then unlink.
    old.file().set_len(0).map_err(|source| {
        RecycleBenchError::File(FileError::Io {
            op: "truncate",
            path: path.clone(),
            source,
        })
    })?;
    old.remove()?;
    let fresh = BackingFile::create(&path, cfg.size, cfg.page_size, None)?;
    fault::fault_range(&fresh, 0..cfg.size, 0, &cpus(cfg.threads))?;
    let s = t.elapsed().as_secs_f64();
    let _ = dir;
    Ok((s, fresh))
}

/// Clears the whole mapped file with `clearer` on `cpus`, as GB/s.
fn clear_once(
    clearer: &Clearer,
    region: &mut MmapRegion,
    cpus: &[usize],
) -> Result<f64, RecycleBenchError> {
    let t = Instant::now();
    clearer.clear_parallel(region.as_mut_slice(), cpus)?;
    Ok(gbps(region.len() as u64, t.elapsed().as_secs_f64()))
}

/// Scrub, the kernel's path and every method's raw clear, as measured by [`throughput`].
struct Throughput {
    scrub: PathResult,
    refault: PathResult,
    methods: Vec<MethodClear>,
    method: String,
}

fn throughput(
    cfg: &RecycleBenchConfig,
    dir: &Path,
    log: &dyn Fn(&str),
) -> Result<Throughput, RecycleBenchError> {
    let scrubber = Scrubber::new(cfg.plan)?;
    let cpus = cpus(cfg.threads);
    let a = BackingFile::create(&dir.join("scrub"), cfg.size, cfg.page_size, None)?;
    fault::fault_range(&a, 0..cfg.size, 0, &cpus)?;
    // The same file, mapped once, for the raw clears: what the methods can do on this memory
    // without the scrub's mapping, thread starts and verification.
    let clearers = cfg
        .methods
        .iter()
        .map(|&m| Clearer::new(ClearPlan::always(m)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut mapped = a.map()?;
    for c in &clearers {
        clear_once(c, &mut mapped, &cpus)?;
    }
    let mut raw: Vec<Vec<f64>> = vec![Vec::with_capacity(cfg.reps); clearers.len()];
    let mut b = BackingFile::create(&dir.join("refault"), cfg.size, cfg.page_size, None)?;
    fault::fault_range(&b, 0..cfg.size, 0, &cpus)?;
    let w1 = scrub_once(&scrubber, &a, &cpus)?;
    let (w2, nb) = kernel_path_once(dir, b, cfg)?;
    b = nb;
    log(&format!(
        "warm-up  scrub {:.1} GB/s  kernel path {:.1} GB/s",
        gbps(cfg.size, w1),
        gbps(cfg.size, w2)
    ));
    let (mut s1, mut s2) = (Vec::new(), Vec::new());
    for rep in 0..cfg.reps {
        let scrub_first = rep % 2 == 0;
        if scrub_first {
            s1.push(gbps(cfg.size, scrub_once(&scrubber, &a, &cpus)?));
        }
        let (t, nb) = kernel_path_once(dir, b, cfg)?;
        b = nb;
        s2.push(gbps(cfg.size, t));
        if !scrub_first {
            s1.push(gbps(cfg.size, scrub_once(&scrubber, &a, &cpus)?));
        }
        for k in 0..clearers.len() {
            let i = (k + rep) % clearers.len();
            raw[i].push(clear_once(&clearers[i], &mut mapped, &cpus)?);
        }
        log(&format!(
            "rep {}/{}  scrub {:.1} GB/s  kernel path {:.1} GB/s",
            rep + 1,
            cfg.reps,
            s1[rep],
            s2[rep]
        ));
    }
    let summary = |v: &Vec<f64>| {
        Summary::of(v).ok_or(RecycleBenchError::Invalid {
            field: "reps",
            reason: "must be at least 1",
        })
    };
    let methods = clearers
        .iter()
        .zip(&raw)
        .map(|(c, samples)| {
            Ok(MethodClear {
                method: c.plan().method,
                gbps: summary(samples)?,
                samples_gbps: samples.clone(),
            })
        })
        .collect::<Result<Vec<_>, RecycleBenchError>>()?;
    Ok(Throughput {
        scrub: PathResult {
            path: "scrub",
            gbps: summary(&s1)?,
            samples_gbps: s1,
        },
        refault: PathResult {
            path: "kernel-path",
            gbps: summary(&s2)?,
            samples_gbps: s2,
        },
        methods,
        method: scrubber.method().name().to_string(),
    })
}

fn latency(
    cfg: &RecycleBenchConfig,
    mount: &Path,
    log: &dyn Fn(&str),
) -> Result<LatencyResult, RecycleBenchError> {
    let base = match &cfg.state_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("hugeprep-bench-recycle-{}", std::process::id())),
    };
    let daemon = lease_daemon(cfg, mount, &base, 4)?;
    let client = Client::new(daemon.socket());
    let settle = || daemon.settle(Duration::from_secs(60));
    let mut samples = Vec::with_capacity(cfg.leases);
    let mut warm_exact = 0;
    let result = daemon.runtime().block_on(async {
        // Warm-up: 20 leases untimed.
        for i in 0..cfg.leases + 20 {
            settle()?;
            let req = LeaseRequest {
                name: format!("bench{i}"),
                size: cfg.lease_size,
                page_size: Some(cfg.page_size),
                node: Some(0),
                ..LeaseRequest::default()
            };
            let t = Instant::now();
            let lease = client.lease(&req).await?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if i >= 20 {
                samples.push(ms);
                warm_exact += usize::from(lease.source == LeaseSource::WarmExact);
            }
            client.release(lease.id).await?;
        }
        Ok::<(), RecycleBenchError>(())
    });
    drop(daemon);
    let _ = std::fs::remove_dir_all(&base);
    result?;
    let out = LatencyResult {
        leases: samples.len(),
        lease_size: cfg.lease_size,
        p50_ms: Summary::quantile(&samples, 0.5).unwrap_or(f64::NAN),
        p99_ms: Summary::quantile(&samples, 0.99).unwrap_or(f64::NAN),
        max_ms: samples.iter().copied().fold(0.0, f64::max),
        warm_exact,
    };
    log(&format!(
        "lease latency over the API: p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms ({} of {} warm-exact)",
        out.p50_ms, out.p99_ms, out.max_ms, out.warm_exact, out.leases
    ));
    Ok(out)
}

/// Runs the benchmark; `log` gets progress lines.
pub fn run(
    cfg: &RecycleBenchConfig,
    log: &dyn Fn(&str),
) -> Result<RecycleBenchReport, RecycleBenchError> {
    if cfg.reps == 0 {
        return Err(RecycleBenchError::Invalid {
            field: "reps",
            reason: "must be at least 1",
        });
    }
    hugeprep::hugetlb::check_size(cfg.size, cfg.page_size)?;
    hugeprep::hugetlb::check_size(cfg.lease_size, cfg.page_size)?;
    let mut lease_files = if cfg.hog {
        crate::hog::BATCH as u64 + 2
    } else {
        6
    };
    if cfg.churn {
        lease_files = lease_files.max(crate::churn::WARM_FILES + crate::churn::CHURN_FILES + 2);
    }
    let pages = (2 * cfg.size).max(lease_files * cfg.lease_size) / cfg.page_size.bytes();
    // Declared before the mount so that it drops after it, on every return: pages can only be
    // given back once the files on the mount have let go of them.
    let top_up = PoolTopUp::ensure_free(None, cfg.page_size, pages)?;
    let mut options = MountOptions::new(cfg.page_size);
    options.mode = 0o755;
    let mount = OwnedMount::new_temp(&std::env::temp_dir(), &options)?;
    let Throughput {
        scrub,
        refault,
        methods: clear_methods,
        method,
    } = throughput(cfg, mount.path(), log)?;
    for f in ["scrub", "refault"] {
        let _ = std::fs::remove_file(mount.path().join(f));
    }
    let proofs = crate::proof::time_proofs(
        mount.path(),
        cfg.size,
        cfg.page_size,
        cfg.reps,
        cfg.host_processes,
        log,
    )?;
    let with_proof = |p: &crate::proof::ProofTiming| {
        let with_proof: Vec<f64> = scrub
            .samples_gbps
            .iter()
            .map(|g| cfg.size as f64 / 1e9 / (cfg.size as f64 / 1e9 / g + p.ms.median / 1e3))
            .collect();
        Summary::of(&with_proof)
    };
    let proven_scrubs: Vec<Summary> = proofs.iter().filter_map(with_proof).collect();
    let proof = proofs.first().cloned();
    let floods = if cfg.flood.is_empty() {
        Vec::new()
    } else {
        let exe = crate::host::bench_exe().map_err(RecycleBenchError::Proof)?;
        crate::flood::time_floods(mount.path(), cfg.page_size, &cfg.flood, &exe, log)?
    };
    let proven_scrub = proven_scrubs.first().cloned();
    let latency = if cfg.leases > 0 {
        Some(latency(cfg, mount.path(), log)?)
    } else {
        None
    };
    let hog = if cfg.leases > 0 && cfg.hog {
        Some(crate::hog::hogged_latency(cfg, mount.path(), log)?)
    } else {
        None
    };
    let churn = if cfg.leases > 0 && cfg.churn {
        Some(crate::churn::churned_latency(cfg, mount.path(), log)?)
    } else {
        None
    };
    let _ = mount.unmount();
    drop(top_up);
    let best_clear = clear_methods
        .iter()
        .max_by(|a, b| a.gbps.median.total_cmp(&b.gbps.median))
        .cloned();
    let paired = clear_methods
        .iter()
        .filter_map(|m| {
            Summary::paired_ratio(&scrub.samples_gbps, &m.samples_gbps).map(|f| (f, m.method))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0));
    Ok(RecycleBenchReport {
        size: cfg.size,
        page_size: cfg.page_size,
        threads: cfg.threads,
        method,
        ratio: scrub.gbps.median / refault.gbps.median,
        scrub_to_best: best_clear
            .as_ref()
            .map(|b| scrub.gbps.median / b.gbps.median),
        scrub_goal_met: paired.map(|(f, _)| f >= SCRUB_GOAL),
        scrub_to_best_paired: paired,
        best_clear,
        clear_methods,
        scrub,
        kernel_path: refault,
        proof,
        proven_scrub,
        proofs,
        proven_scrubs,
        floods,
        latency,
        hog,
        churn,
    })
}
