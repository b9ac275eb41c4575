//! hugetlbfs mounts: finding them by page size in `/proc/self/mountinfo` (each checked with
//! `statfs`, whose block size is the page size), mounting one when asked, unmounting.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use serde::Serialize;

use crate::hugetlb::file::hugetlbfs_page_size;
use crate::page_size::PageSize;

/// Where the kernel lists this process's mounts.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// Errors finding, mounting or unmounting hugetlbfs.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// `/proc/self/mountinfo` could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The kernel's answer.
        source: io::Error,
    },
    /// `mount(2)` failed.
    #[error("mount -t hugetlbfs -o {options} at {path}: {source}")]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// The options passed.
        options: String,
        /// The kernel's answer (`EPERM` without CAP_SYS_ADMIN, `EINVAL` for a page size the
        /// kernel lacks).
        source: io::Error,
    },
    /// After mounting, `statfs` did not show hugetlbfs of the page size asked for.
    #[error(
        "{path}: mounted, but statfs shows {found:?} instead of hugetlbfs with {expected} pages"
    )]
    Verify {
        /// The mount point.
        path: PathBuf,
        /// The page size asked for.
        expected: PageSize,
        /// What statfs reported.
        found: Option<PageSize>,
    },
    /// `umount(2)` failed.
    #[error("umount {path}: {source}")]
    Unmount {
        /// The mount point.
        path: PathBuf,
        /// The kernel's answer (`EBUSY` while a file on it is open or mapped).
        source: io::Error,
    },
}

/// Result of mount operations.
pub type Result<T> = std::result::Result<T, MountError>;

/// A mounted hugetlbfs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HugetlbfsMount {
    /// Mount point.
    pub path: PathBuf,
    /// Page size of its files (from `statfs`).
    pub page_size: PageSize,
    /// Its super-block options as mountinfo shows them (`rw,pagesize=2M,...`).
    pub options: String,
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134`
/// backslash) in a path field.
///
/// ```
/// use hugeprep::hugetlb::mount::unescape_mountinfo;
/// assert_eq!(unescape_mountinfo(r"/mnt/huge\040pages"), std::path::PathBuf::from("/mnt/huge pages"));
/// ```
pub fn unescape_mountinfo(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(OsString::from_vec(out))
}

/// One hugetlbfs line of mountinfo: (mount point, super options). Fields: `id parent
/// major:minor root mountpoint mount-options [optional...] - fstype source super-options`.
fn parse_line(line: &str) -> Option<(PathBuf, String)> {
    let (left, right) = line.split_once(" - ")?;
    let mut right = right.split(' ');
    if right.next()? != "hugetlbfs" {
        return None;
    }
    let _source = right.next()?;
    let options = right.next().unwrap_or("").to_string();
    let mountpoint = left.split(' ').nth(4)?;
    Some((unescape_mountinfo(mountpoint), options))
}

/// The page size a mountinfo option string names (`pagesize=2M`, `pagesize=1024M`).
fn option_page_size(options: &str) -> Option<PageSize> {
    options
        .split(',')
        .find_map(|o| o.strip_prefix("pagesize="))
        .and_then(|v| v.parse().ok())
}

/// Every hugetlbfs mount this process sees, in mount order. The page size comes from
/// `statfs` (the authority); a mount `statfs` cannot reach falls back to its `pagesize=`
/// option, and one with neither is skipped.
pub fn mounts() -> Result<Vec<HugetlbfsMount>> {
    let text = fs::read_to_string(MOUNTINFO).map_err(|source| MountError::Read {
        path: PathBuf::from(MOUNTINFO),
        source,
    })?;
    Ok(text
        .lines()
        .filter_map(parse_line)
        .filter_map(|(path, options)| {
            let page_size = match hugetlbfs_page_size(&path) {
                Ok(found) => found?,
                Err(_) => option_page_size(&options)?,
            };
            Some(HugetlbfsMount {
                path,
                page_size,
                options,
            })
        })
        .collect())
}

/// The first hugetlbfs mount of `page_size`, if any (`/dev/hugepages` on most systemd hosts
/// for the default size).
pub fn find(page_size: PageSize) -> Result<Option<HugetlbfsMount>> {
    Ok(mounts()?.into_iter().find(|m| m.page_size == page_size))
}

/// Why a mount that was found, not named, is not one to adopt: a directory above its mount
/// point that every user may write (`/tmp`, `/var/tmp`), unless the mount is below `own`
/// (the daemon's runtime directory, where it makes its own). Such a mount is most often an
/// orphan (a test or a tool that did not unmount), and anyone could have made the directory
/// it sits on; a mount the operator names is used as named.
pub fn passed_over(path: &Path, own: &Path) -> Option<String> {
    if path.starts_with(own) {
        return None;
    }
    path.ancestors().skip(1).find_map(|dir| {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(dir).ok()?.permissions().mode();
        (mode & 0o002 != 0).then(|| {
            format!(
                "under {} (mode {:o}), which every user may write, and not made by hugeprep",
                dir.display(),
                mode & 0o7777
            )
        })
    })
}

/// Mounts [`passed_over`], each with why.
pub type PassedOver = Vec<(HugetlbfsMount, String)>;

/// The first hugetlbfs mount of `page_size` that [`passed_over`] does not rule out, and the
/// ones it passed over with why.
pub fn find_trusted(
    page_size: PageSize,
    own: &Path,
) -> Result<(Option<HugetlbfsMount>, PassedOver)> {
    let mut skipped = Vec::new();
    for m in mounts()?.into_iter().filter(|m| m.page_size == page_size) {
        match passed_over(&m.path, own) {
            None => return Ok((Some(m), skipped)),
            Some(why) => skipped.push((m, why)),
        }
    }
    Ok((None, skipped))
}

/// How to mount a hugetlbfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountOptions {
    /// Page size of the files on it.
    pub page_size: PageSize,
    /// Mode of the mount's root directory (e.g. `0o1770` for a shared directory).
    pub mode: u32,
    /// Owner uid of the root directory.
    pub uid: Option<u32>,
    /// Owner gid of the root directory.
    pub gid: Option<u32>,
}

impl MountOptions {
    /// A mount of `page_size` pages, root directory mode 0700 owned by root.
    pub fn new(page_size: PageSize) -> MountOptions {
        MountOptions {
            page_size,
            mode: 0o700,
            uid: None,
            gid: None,
        }
    }

    /// The `-o` option string.
    pub fn to_option_string(&self) -> String {
        let mut s = format!("pagesize={},mode={:04o}", self.page_size.name(), self.mode);
        if let Some(uid) = self.uid {
            s.push_str(&format!(",uid={uid}"));
        }
        if let Some(gid) = self.gid {
            s.push_str(&format!(",gid={gid}"));
        }
        s
    }
}

/// Mounts hugetlbfs at `dir` (which must exist): `mount -t hugetlbfs -o pagesize=..,mode=..
/// none DIR`, `nosuid,nodev`, and checks the result with `statfs`.
pub fn mount(dir: &Path, options: &MountOptions) -> Result<HugetlbfsMount> {
    let opts = options.to_option_string();
    nix::mount::mount(
        Some("hugetlbfs"),
        dir,
        Some("hugetlbfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(opts.as_str()),
    )
    .map_err(|e| MountError::Mount {
        path: dir.to_path_buf(),
        options: opts.clone(),
        source: e.into(),
    })?;
    let found = hugetlbfs_page_size(dir).ok().flatten();
    if found != Some(options.page_size) {
        // The error below says what was wrong; a mount that will not go is left to `Drop`.
        let _ = unmount(dir);
        return Err(MountError::Verify {
            path: dir.to_path_buf(),
            expected: options.page_size,
            found,
        });
    }
    Ok(HugetlbfsMount {
        path: dir.to_path_buf(),
        page_size: options.page_size,
        options: opts,
    })
}

/// Unmounts `dir`.
pub fn unmount(dir: &Path) -> Result<()> {
    nix::mount::umount2(dir, MntFlags::empty()).map_err(|e| MountError::Unmount {
        path: dir.to_path_buf(),
        source: e.into(),
    })
}

/// A hugetlbfs this process mounted on a directory it created; dropping it unmounts the file
/// system and removes the directory (files on it go with it).
#[derive(Debug)]
pub struct OwnedMount {
    mount: HugetlbfsMount,
    active: bool,
}

impl OwnedMount {
    /// Creates a fresh directory under `parent` (`hugeprep-<pid>-<n>`) and mounts hugetlbfs
    /// there.
    pub fn new_temp(parent: &Path, options: &MountOptions) -> Result<OwnedMount> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = parent.join(format!(
            "hugeprep-{}-{}-{}",
            options.page_size.name(),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir(&dir).map_err(|source| MountError::Mount {
            path: dir.clone(),
            options: "mkdir".into(),
            source,
        })?;
        match mount(&dir, options) {
            Ok(mount) => Ok(OwnedMount {
                mount,
                active: true,
            }),
            Err(e) => {
                // The error is `e`; an empty directory left behind is harmless.
                let _ = fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mount.path
    }

    /// The mount's description.
    pub fn mount(&self) -> &HugetlbfsMount {
        &self.mount
    }

    /// Unmounts now and removes the directory, reporting failure.
    pub fn unmount(mut self) -> Result<()> {
        self.active = false;
        unmount(&self.mount.path)?;
        // Unmounted: an empty directory left behind is harmless.
        let _ = fs::remove_dir(&self.mount.path);
        Ok(())
    }
}

impl Drop for OwnedMount {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        // A file still mapped elsewhere keeps the mount busy: detach it so it goes once free.
        if unmount(&self.mount.path).is_err() {
            if let Err(err) = nix::mount::umount2(&self.mount.path, MntFlags::MNT_DETACH) {
                tracing::warn!(mount = %self.mount.path.display(), %err, "cannot unmount");
            }
        }
        // A directory still mounted on (or not empty) stays: nothing to lose.
        let _ = fs::remove_dir(&self.mount.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hugetlbfs_lines_only() {
        let line = r"512 25 0:52 / /mnt/huge\040one rw,relatime shared:300 - hugetlbfs none rw,pagesize=1024M";
        let (path, opts) = parse_line(line).unwrap();
        assert_eq!(path, PathBuf::from("/mnt/huge one"));
        assert_eq!(option_page_size(&opts), Some(PageSize::Size1G));
        let tmpfs = "30 25 0:26 / /tmp rw - tmpfs tmpfs rw";
        assert!(parse_line(tmpfs).is_none());
        let plain = "40 25 0:40 / /dev/hugepages rw,relatime - hugetlbfs hugetlbfs rw,pagesize=2M";
        assert_eq!(
            parse_line(plain).unwrap().0,
            PathBuf::from("/dev/hugepages")
        );
    }

    #[test]
    fn escapes() {
        assert_eq!(unescape_mountinfo(r"a\134b"), PathBuf::from(r"a\b"));
        assert_eq!(unescape_mountinfo(r"a\011b\012"), PathBuf::from("a\tb\n"));
        assert_eq!(
            unescape_mountinfo(r"trailing\04"),
            PathBuf::from(r"trailing\04")
        );
        assert_eq!(unescape_mountinfo(r"x\999"), PathBuf::from(r"x\999"));
    }

    #[test]
    fn mounts_under_world_writable_directories_are_passed_over() {
        let own = Path::new("/run/hugeprep");
        assert_eq!(
            passed_over(Path::new("/run/hugeprep/hugetlbfs-2M"), own),
            None
        );
        assert_eq!(passed_over(Path::new("/dev/hugepages"), own), None);
        let why = passed_over(Path::new("/tmp/orphan/mnt"), own).unwrap();
        assert!(why.contains("under /tmp (mode 1777)"), "{why}");
        // The daemon's own mounts, wherever its runtime directory is.
        assert_eq!(
            passed_over(Path::new("/tmp/run/hugetlbfs-2M"), Path::new("/tmp/run")),
            None
        );
    }

    #[test]
    fn option_strings() {
        let mut o = MountOptions::new(PageSize::Size2M);
        o.uid = Some(64055);
        assert_eq!(o.to_option_string(), "pagesize=2M,mode=0700,uid=64055");
    }
}
