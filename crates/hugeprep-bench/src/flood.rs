//! One lessee's open flood against everyone else's opens (`bench recycle --flood
//! 400,800`): a process of N threads opens and closes its own leased file in a loop, while
//! another tenant's process opens its own leased file one open after another, and the
//! daemon (this process) opens a watched file of its own. Each open's latency, quiet and
//! under the flood, by each method of proof: with the walk every open of a leased file
//! waits in one queue for the daemon's reader; with the kernel's counts no open waits.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::recycle_config::RecycleBenchError;
use hugeprep::hugetlb::BackingFile;
use hugeprep::page_size::PageSize;
use hugeprep::pool::reach::{Method, Reach};

/// Opens timed per tenant and case.
const OPENS: usize = 200;

/// Latency of opens of a leased file, ms.
#[derive(Debug, Clone, Serialize)]
pub struct OpenLatency {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl OpenLatency {
    fn of(mut us: Vec<f64>) -> Option<OpenLatency> {
        if us.is_empty() {
            return None;
        }
        us.sort_by(f64::total_cmp);
        let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize] / 1e3;
        Some(OpenLatency {
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: at(1.0),
        })
    }
}

/// One method under one flood (0 threads: quiet).
#[derive(Debug, Clone, Serialize)]
pub struct FloodTiming {
    /// `kernel-counts` or `proc-walk`.
    pub method: &'static str,
    /// Threads of the flooding lessee.
    pub flood_threads: usize,
    /// Another tenant's opens of its own leased file.
    pub other_tenant: OpenLatency,
    /// The daemon's own opens of a watched file.
    pub daemon: OpenLatency,
}

fn flood_error(e: std::io::Error) -> RecycleBenchError {
    RecycleBenchError::Proof(e)
}

/// Times opens quiet and under each flood of `threads`, by each method, with one-page files
/// in `dir`. `exe` runs the hidden `bench busy-process`.
pub fn time_floods(
    dir: &Path,
    page_size: PageSize,
    threads: &[usize],
    exe: &Path,
    log: &dyn Fn(&str),
) -> Result<Vec<FloodTiming>, RecycleBenchError> {
    let files = ["flooded", "other", "daemons"].map(|n| dir.join(n));
    for f in &files {
        BackingFile::create(f, page_size.bytes(), page_size, None)?;
    }
    let mut out = Vec::new();
    let result = (|| {
        for method in [None, Some(Method::ProcWalk)] {
            let reach = Reach::proving(method);
            if reach.method() == Method::None
                || out
                    .iter()
                    .any(|t: &FloodTiming| t.method == reach.method().label())
            {
                continue;
            }
            for (id, f) in files.iter().enumerate() {
                reach.watch(id as u64 + 1, BackingFile::open(f, page_size)?.file());
            }
            for &n in std::iter::once(&0).chain(threads) {
                let timing = flood_once(&reach, &files, n, exe)?;
                log(&format!(
                    "flood ({}) of {n} threads: another tenant's open p50 {:.3} p99 {:.3} ms, the daemon's p50 {:.3} p99 {:.3} ms",
                    timing.method,
                    timing.other_tenant.p50_ms,
                    timing.other_tenant.p99_ms,
                    timing.daemon.p50_ms,
                    timing.daemon.p99_ms
                ));
                out.push(timing);
            }
        }
        Ok(())
    })();
    for f in &files {
        let _ = std::fs::remove_file(f);
    }
    result.map(|()| out)
}

fn flood_once(
    reach: &Reach,
    files: &[std::path::PathBuf; 3],
    threads: usize,
    exe: &Path,
) -> Result<FloodTiming, RecycleBenchError> {
    let mut flood = None;
    if threads > 0 {
        let mut child = Command::new(exe)
            .args(["bench", "busy-process", "--threads"])
            .arg(threads.to_string())
            .arg("--open")
            .arg(&files[0])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(flood_error)?;
        let mut line = String::new();
        if let Some(out) = child.stdout.as_mut() {
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
        }
        // Every thread in its loop.
        std::thread::sleep(Duration::from_millis(300));
        flood = Some(child);
    }
    let result = (|| {
        let other = Command::new(exe)
            .args(["bench", "busy-process", "--count"])
            .arg(OPENS.to_string())
            .arg("--time-opens")
            .arg(&files[1])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(flood_error)?;
        let mut daemon = Vec::with_capacity(OPENS);
        for _ in 0..OPENS {
            let t = Instant::now();
            drop(std::fs::File::open(&files[2]).map_err(flood_error)?);
            daemon.push(t.elapsed().as_secs_f64() * 1e6);
            std::thread::sleep(Duration::from_millis(2));
        }
        let other = other.wait_with_output().map_err(flood_error)?;
        let other: Vec<f64> = String::from_utf8_lossy(&other.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let none = || RecycleBenchError::Invalid {
            field: "flood",
            reason: "no open was timed",
        };
        Ok(FloodTiming {
            method: reach.method().label(),
            flood_threads: threads,
            other_tenant: OpenLatency::of(other).ok_or_else(none)?,
            daemon: OpenLatency::of(daemon).ok_or_else(none)?,
        })
    })();
    if let Some(mut child) = flood {
        drop(child.stdin.take());
        let _ = child.wait();
    }
    result
}
