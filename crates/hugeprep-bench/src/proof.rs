//! The proof's own cost per release (docs/security.md): a lessee opens a watched pool file
//! from a cgroup of its own and exits, then [`Reach::prove`] runs every step a release in
//! the daemon runs. Both methods are timed, side by side in each host: the kernel's counts
//! (a BPF iterator over the daemon's thread and the file's pages) and the walk of `/proc`
//! (openers' pidfds and cgroups, every thread's descriptors and mounts). With
//! `--host-processes N` the same rounds run again beside a busy host ([`BusyHost`]), so the
//! ratio busy/quiet shows what the host's size costs each. The file has the scrub part's
//! size: the counts read one folio per page.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde::Serialize;

use super::host::BusyHost;
use super::recycle_config::RecycleBenchError;
use crate::Summary;
use hugeprep::hugetlb::BackingFile;
use hugeprep::page_size::PageSize;
use hugeprep::pool::reach::{cgroup::Hierarchies, Method, Reach};

/// How long a proof took, per release, by one method on one host.
#[derive(Debug, Clone, Serialize)]
pub struct ProofTiming {
    /// `kernel-counts` or `proc-walk`.
    pub method: &'static str,
    /// Extra processes running beside (0: the quiet host).
    pub host_processes: usize,
    /// Threads of those processes.
    pub host_threads: usize,
    /// Milliseconds per proof.
    pub samples_ms: Vec<f64>,
    /// Median and range, ms.
    pub ms: Summary,
}

/// Times `reps` proofs by each method on a file of `size` in `dir`, on the quiet host and,
/// when `host_processes` > 0, beside that many extra processes. Methods this host cannot
/// run (no fanotify, no BPF, no cgroup v2 for the lessee) are left out with a log line.
pub fn time_proofs(
    dir: &Path,
    size: u64,
    page_size: PageSize,
    reps: usize,
    host_processes: usize,
    log: &dyn Fn(&str),
) -> Result<Vec<ProofTiming>, RecycleBenchError> {
    let hierarchies = Hierarchies::detect().map_err(proof_error)?;
    let Some(root) = hierarchies.v2_mount() else {
        log("proof: no cgroup v2 mount to give the lessee a cgroup of its own: not timed");
        return Ok(Vec::new());
    };
    let path = dir.join("proof");
    {
        // A page in it, as in every lease; closed again, as the pool's files are between
        // their uses (a proof wants the daemon's one descriptor).
        let file = BackingFile::create(&path, size, page_size, None)?;
        hugeprep::pool::fault::fault_range(&file, 0..size, 0, &[0])?;
    }
    let cgroup = root.join(format!("hugeprep-bench-proof-{}", std::process::id()));
    let _ = std::fs::remove_dir(&cgroup);
    std::fs::create_dir(&cgroup).map_err(proof_error)?;
    let mut methods = Vec::new();
    for method in [None, Some(Method::ProcWalk)] {
        let reach = Reach::proving(method);
        match reach.method() {
            Method::None => log("proof: no fanotify watch on this host: not timed"),
            m if methods.iter().any(|(have, _)| *have == m) => {
                log("proof: the kernel's counts cannot be loaded here: the walk alone is timed")
            }
            m => methods.push((m, reach)),
        }
    }
    let result = (|| {
        let mut out = Vec::new();
        let mut hosts = vec![0];
        if host_processes > 0 {
            hosts.push(host_processes);
        }
        for n in hosts {
            let busy = if n > 0 {
                let exe = super::host::bench_exe().map_err(proof_error)?;
                let host = BusyHost::start(n, &exe).map_err(proof_error)?;
                log(&format!(
                    "proof: busy host of {} processes, {} threads",
                    host.processes(),
                    host.threads
                ));
                Some(host)
            } else {
                None
            };
            let threads = busy.as_ref().map_or(0, |h| h.threads);
            let mut samples = vec![Vec::with_capacity(reps); methods.len()];
            // Interleaved: every method once per round, after one round of warm-up.
            for rep in 0..=reps {
                for (i, (method, reach)) in methods.iter().enumerate() {
                    match prove_once(reach, page_size, &path, &cgroup)? {
                        Ok(ms) if rep > 0 => samples[i].push(ms),
                        Ok(_) => {}
                        Err(why) => {
                            log(&format!(
                                "proof ({}): not proven on this host ({why}): not timed",
                                method.label()
                            ));
                            return Ok(Vec::new());
                        }
                    }
                }
            }
            for ((method, _), samples) in methods.iter().zip(samples) {
                let ms = Summary::of(&samples).ok_or(RecycleBenchError::Invalid {
                    field: "reps",
                    reason: "must be at least 1",
                })?;
                log(&format!(
                    "proof ({}) beside {n} processes: {ms} ms per release",
                    method.label()
                ));
                out.push(ProofTiming {
                    method: method.label(),
                    host_processes: n,
                    host_threads: threads,
                    samples_ms: samples,
                    ms,
                });
            }
            drop(busy);
        }
        Ok(out)
    })();
    drop(methods);
    let _ = std::fs::remove_dir(&cgroup);
    let _ = std::fs::remove_file(&path);
    result
}

/// One lease and release of the file at `path` by a lessee in `cgroup`; the proof's time,
/// ms.
fn prove_once(
    reach: &Reach,
    page_size: PageSize,
    path: &Path,
    cgroup: &Path,
) -> Result<Result<f64, hugeprep::pool::reach::Unproven>, RecycleBenchError> {
    reach.watch(1, BackingFile::open(path, page_size)?.file());
    let mut lessee = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1/cgroup.procs" && exec 3<"$2" && read x"#)
        .arg("sh")
        .arg(cgroup)
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .map_err(proof_error)?;
    if let Some(mut stdin) = lessee.stdin.take() {
        let _ = writeln!(stdin);
    }
    lessee.wait().map_err(proof_error)?;
    // The open's report reached the reader (a VMM's first open comes long before its
    // release; this lessee's, just before).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while reach.first_open(1).is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // As the pool's worker does: a descriptor opened after the release, the only one, and
    // a proof tried again while what the lessee's exit lets go of is still going.
    let fresh = BackingFile::open(path, page_size)?;
    loop {
        match reach.prove(1, fresh.file()) {
            Err(
                hugeprep::pool::reach::Unproven::OpenElsewhere
                | hugeprep::pool::reach::Unproven::Referenced { .. },
            ) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            other => return Ok(other.map(|p| p.took.as_secs_f64() * 1e3)),
        }
    }
}

fn proof_error(e: std::io::Error) -> RecycleBenchError {
    RecycleBenchError::Proof(e)
}
