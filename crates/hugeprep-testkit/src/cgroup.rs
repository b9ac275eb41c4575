//! A cgroup of its own for each VMM a benchmark starts, as libvirt gives each QEMU its
//! machine cgroup: a released lease is scrubbed in place only when the VMM that opened it
//! has exited and one of its non-root cgroups is empty (`pool::reach`). A VMM left in the
//! benchmark's own cgroups, which never empty, would send every release down the kernel's
//! path, and the benchmark would time that path instead of a host's.
//!
//! Each cgroup is a fresh directory under the cgroup v2 mount; the VMM joins it between fork
//! and exec (before it opens anything), and the directory is removed once the VMM has been
//! reaped.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hugeprep::pool::reach::cgroup::Hierarchies;

/// How long removing an emptied cgroup may keep failing with `EBUSY` (the kernel updates a
/// cgroup's population just after its last process is reaped).
const REMOVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Tells one VMM's cgroup from another's within a run.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Errors making a VMM's cgroup.
#[derive(Debug, thiserror::Error)]
pub enum VmmCgroupError {
    /// No cgroup v2 hierarchy is mounted.
    #[error("no cgroup v2 hierarchy is mounted (/proc/self/mountinfo has no cgroup2)")]
    NoV2,
    /// The mount table could not be read.
    #[error("reading /proc/self/mountinfo for the cgroup v2 mount: {0}")]
    Mountinfo(io::Error),
    /// The cgroup directory could not be created.
    #[error("creating the VMM's cgroup {dir}: {source}")]
    Create {
        /// The directory.
        dir: PathBuf,
        /// The OS's answer.
        source: io::Error,
    },
    /// Its `cgroup.procs` could not be opened for writing.
    #[error("opening {path} for writing: {source}")]
    Procs {
        /// `cgroup.procs`.
        path: PathBuf,
        /// The OS's answer.
        source: io::Error,
    },
}

/// Where a run's VMM cgroups are made: the cgroup v2 mount.
#[derive(Debug, Clone)]
pub struct VmmCgroups {
    root: PathBuf,
}

impl VmmCgroups {
    /// The cgroup v2 mount of this mount namespace, checked by making (and removing) one
    /// cgroup there. Without it the VMMs stay in the benchmark's cgroups and no release can
    /// be proven.
    pub fn usable() -> Result<VmmCgroups, VmmCgroupError> {
        let hierarchies = Hierarchies::detect().map_err(VmmCgroupError::Mountinfo)?;
        let root = hierarchies.v2_mount().ok_or(VmmCgroupError::NoV2)?;
        let cgroups = VmmCgroups {
            root: root.to_path_buf(),
        };
        drop(cgroups.fresh("probe")?);
        Ok(cgroups)
    }

    /// A fresh, empty cgroup for one VMM, named after this process and `tag`.
    pub fn fresh(&self, tag: &str) -> Result<VmmCgroup, VmmCgroupError> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = self.root.join(format!(
            "hugeprep-bench-{}-{n}-{}",
            std::process::id(),
            sanitize(tag)
        ));
        fs::create_dir(&dir).map_err(|source| VmmCgroupError::Create {
            dir: dir.clone(),
            source,
        })?;
        let path = dir.join("cgroup.procs");
        match OpenOptions::new().write(true).open(&path) {
            Ok(procs) => Ok(VmmCgroup {
                dir,
                procs: Arc::new(procs),
            }),
            Err(source) => {
                let _ = fs::remove_dir(&dir);
                Err(VmmCgroupError::Procs { path, source })
            }
        }
    }
}

/// One VMM's cgroup; removed on drop, which must come after the VMM was reaped.
#[derive(Debug)]
pub struct VmmCgroup {
    dir: PathBuf,
    procs: Arc<File>,
}

impl VmmCgroup {
    /// Makes the process `cmd` spawns join this cgroup before it execs.
    pub fn enter_on_spawn(&self, cmd: &mut Command) {
        hugeprep::sys::cgroup::join_before_exec(cmd, Arc::clone(&self.procs));
    }

    /// The cgroup's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for VmmCgroup {
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + REMOVE_TIMEOUT;
        loop {
            match fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "could not remove a VMM's cgroup");
                    return;
                }
            }
        }
    }
}

/// A tag as a path component: letters, digits and `-` only.
fn sanitize(tag: &str) -> String {
    tag.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawned_process_runs_in_its_cgroup_which_goes_with_it() {
        let Ok(cgroups) = VmmCgroups::usable() else {
            return;
        };
        let cg = cgroups.fresh("unit test/1").unwrap();
        let dir = cg.dir().to_path_buf();
        assert!(dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .ends_with("unit-test-1"));
        let mut cmd = Command::new("cat");
        cmd.arg("/proc/self/cgroup");
        cg.enter_on_spawn(&mut cmd);
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            text.lines()
                .any(|l| l.starts_with("0::") && l.ends_with(&name)),
            "{text}"
        );
        drop(cg);
        assert!(!dir.exists());
    }
}
