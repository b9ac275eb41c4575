//! The proof's own cost per release (docs/security.md): a lessee opens a watched pool file
//! from a cgroup of its own and exits, then [`Reach::prove`] runs every step a release in
//! the daemon runs (link count, write lease, the opener's pidfd and cgroup, the scan of
//! `/proc` for io_uring buffers). Its cost does not depend on the file's size, so one page is
//! timed.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde::Serialize;

use super::recycle::RecycleBenchError;
use crate::bench::Summary;
use crate::hugetlb::BackingFile;
use crate::page_size::PageSize;
use crate::pool::reach::{cgroup::Hierarchies, Reach};

/// How long a proof took, per release.
#[derive(Debug, Clone, Serialize)]
pub struct ProofTiming {
    /// Milliseconds per proof.
    pub samples_ms: Vec<f64>,
    /// Median and range, ms.
    pub ms: Summary,
}

/// Times `reps` proofs on a one-page file in `dir`; `None` (and a log line) where this host
/// cannot prove anything (no fanotify, no cgroup v2 to give the lessee a cgroup of its own).
pub fn time_proofs(
    dir: &Path,
    page_size: PageSize,
    reps: usize,
    log: &dyn Fn(&str),
) -> Result<Option<ProofTiming>, RecycleBenchError> {
    let hierarchies = Hierarchies::detect().map_err(proof_error)?;
    let Some(root) = hierarchies.v2_mount() else {
        log("proof: no cgroup v2 mount to give the lessee a cgroup of its own: not timed");
        return Ok(None);
    };
    let path = dir.join("proof");
    let file = BackingFile::create(&path, page_size.bytes(), page_size, None)?;
    let reach = Reach::new();
    let cgroup = root.join(format!("hugeprep-bench-proof-{}", std::process::id()));
    let _ = std::fs::remove_dir(&cgroup);
    std::fs::create_dir(&cgroup).map_err(proof_error)?;
    let result = (|| {
        let mut samples = Vec::with_capacity(reps);
        for rep in 0..=reps {
            reach.watch(1, file.file());
            let mut lessee = Command::new("sh")
                .arg("-c")
                .arg(r#"echo $$ > "$1/cgroup.procs" && exec 3<"$2" && read x"#)
                .arg("sh")
                .arg(&cgroup)
                .arg(&path)
                .stdin(Stdio::piped())
                .spawn()
                .map_err(proof_error)?;
            if let Some(mut stdin) = lessee.stdin.take() {
                let _ = writeln!(stdin);
            }
            lessee.wait().map_err(proof_error)?;
            match reach.prove(1, file.file()) {
                // The first round warms the caches of /proc: not counted.
                Ok(p) if rep > 0 => samples.push(p.took.as_secs_f64() * 1e3),
                Ok(_) => {}
                Err(why) => {
                    log(&format!(
                        "proof: not proven on this host ({why}): not timed"
                    ));
                    return Ok(None);
                }
            }
        }
        let ms = Summary::of(&samples).ok_or(RecycleBenchError::Invalid {
            field: "reps",
            reason: "must be at least 1",
        })?;
        log(&format!("proof per release: {ms} ms"));
        Ok(Some(ProofTiming {
            samples_ms: samples,
            ms,
        }))
    })();
    drop(reach);
    let _ = std::fs::remove_dir(&cgroup);
    drop(file);
    let _ = std::fs::remove_file(&path);
    result
}

fn proof_error(e: std::io::Error) -> RecycleBenchError {
    RecycleBenchError::Proof(e)
}
