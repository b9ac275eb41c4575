//! A hugetlbfs mount per page size: an existing one, or hugeprep's own under the runtime
//! directory (`/run/hugeprep/hugetlbfs-2M`).

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::DaemonError;
use crate::hugetlb::{mount, MountOptions};
use crate::page_size::PageSize;

/// Whether the kernel supports `page_size` at all.
pub fn kernel_supports(page_size: PageSize) -> bool {
    Path::new("/sys/kernel/mm/hugepages")
        .join(page_size.sysfs_dir())
        .exists()
}

/// A mount per page size the kernel supports: an existing one, else a new one at
/// `<run_dir>/hugetlbfs-<size>` (mode 0755, so that VMM users reach their lease files).
/// Mounts under a directory every user may write (an orphan under /tmp) are passed over
/// with a warning saying why (`hugetlb::mount::passed_over`); the operator names one with
/// `--mount` or `mounts` to use it anyway. Sizes that cannot be mounted are skipped with a
/// warning.
pub fn find_or_mount(run_dir: &Path) -> Result<Vec<PathBuf>, DaemonError> {
    let mut out = Vec::new();
    for ps in PageSize::ALL {
        if !kernel_supports(ps) {
            continue;
        }
        if let Ok((found, skipped)) = mount::find_trusted(ps, run_dir) {
            for (m, why) in skipped {
                tracing::warn!(mount = %m.path.display(), page_size = %ps, "passing over a hugetlbfs mount {why}: name it with --mount (or `mounts` in the config) to use it");
            }
            if let Some(m) = found {
                out.push(m.path);
                continue;
            }
        }
        let dir = run_dir.join(format!("hugetlbfs-{}", ps.name()));
        let mut options = MountOptions::new(ps);
        options.mode = 0o755;
        let made = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .map_err(|e| e.to_string())
            .and_then(|()| mount::mount(&dir, &options).map_err(|e| e.to_string()));
        match made {
            Ok(_) => {
                tracing::info!(mount = %dir.display(), page_size = %ps, "mounted hugetlbfs");
                out.push(dir);
            }
            Err(err) => {
                tracing::warn!(mount = %dir.display(), page_size = %ps, %err, "cannot mount hugetlbfs: not serving this page size");
            }
        }
    }
    if out.is_empty() {
        return Err(DaemonError::NoMount {
            run_dir: run_dir.to_path_buf(),
        });
    }
    Ok(out)
}
