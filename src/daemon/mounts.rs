//! Finding a hugetlbfs mount per page size, or mounting hugeprep's own under the runtime
//! directory (`/run/hugeprep/hugetlbfs-2M`).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};

use super::DaemonError;
use crate::page_size::PageSize;

/// Mount points of hugetlbfs file systems, by page size (the first per size).
pub fn find_mounts() -> BTreeMap<PageSize, PathBuf> {
    let mut out = BTreeMap::new();
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return out;
    };
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split_whitespace().next() != Some("hugetlbfs") {
            continue;
        }
        let Some(point) = left.split_whitespace().nth(4) else {
            continue;
        };
        let point = PathBuf::from(point.replace("\\040", " "));
        let ps = page_size_of(&point);
        if let Some(ps) = ps {
            out.entry(ps).or_insert(point);
        }
    }
    out
}

fn page_size_of(path: &Path) -> Option<PageSize> {
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    let st = nix::sys::statfs::statfs(path).ok()?;
    if st.filesystem_type().0 as i64 != HUGETLBFS_MAGIC {
        return None;
    }
    PageSize::from_bytes(st.block_size() as u64)
}

/// Whether the kernel supports `page_size` at all.
pub fn kernel_supports(page_size: PageSize) -> bool {
    Path::new("/sys/kernel/mm/hugepages")
        .join(page_size.sysfs_dir())
        .exists()
}

/// A mount per page size the kernel supports: an existing one, else a new one at
/// `<run_dir>/hugetlbfs-<size>`. Sizes that cannot be mounted are skipped with a warning.
pub fn find_or_mount(run_dir: &Path) -> Result<Vec<PathBuf>, DaemonError> {
    let found = find_mounts();
    let mut out = Vec::new();
    for ps in PageSize::ALL {
        if !kernel_supports(ps) {
            continue;
        }
        if let Some(p) = found.get(&ps) {
            out.push(p.clone());
            continue;
        }
        let dir = run_dir.join(format!("hugetlbfs-{}", ps.name()));
        let made = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .map_err(|e| nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
            .and_then(|()| {
                mount(
                    Some("hugetlbfs"),
                    &dir,
                    Some("hugetlbfs"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                    Some(format!("pagesize={},mode=0755", ps.name()).as_str()),
                )
            });
        match made {
            Ok(()) => {
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
