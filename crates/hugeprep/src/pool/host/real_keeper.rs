//! The real host's [`Keeper`]: the kept files on the hugetlbfs mounts.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::keeper::{Keeper, KeptAt, Opened};
use super::{FileAt, RealHost};
use crate::hugetlb::pool;
use crate::page_size::PageSize;
use crate::pool::reach::kernel::Pins;

/// Opens `path` for writing without waiting for a lease to be given up (`O_NONBLOCK`: a read
/// lease fails it at once with `EWOULDBLOCK`).
pub(super) fn open_for_write(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
}

/// Truncates `file` to nothing, with the pages of `page_size` that came back to `node`
/// meanwhile (`None` when the node's counts cannot be read): to its free list, or, when the
/// reserve lowered the pool below what is in use, as surplus pages that leave the pool.
pub(super) fn truncate_counted(
    file: &fs::File,
    node: u32,
    page_size: PageSize,
) -> (io::Result<()>, Option<u64>) {
    let counts = || pool::read(pool::Scope::Node(node), page_size).ok();
    let before = counts();
    let truncated = file.set_len(0);
    let after = counts();
    let returned = match (before, after) {
        (Some(b), Some(a)) => Some(a.returned_since(&b)),
        _ => None,
    };
    (truncated, returned)
}

/// A file's length and the bytes of pages it holds (hugetlbfs counts them in `st_blocks`).
fn size_and_held(st: &rustix::fs::Stat) -> (u64, u64) {
    let blocks = u64::try_from(st.st_blocks).unwrap_or(0);
    (
        u64::try_from(st.st_size).unwrap_or(0),
        blocks.saturating_mul(512),
    )
}

fn no_mount(ps: PageSize) -> io::Error {
    io::Error::other(format!("no hugetlbfs mount for {ps} pages"))
}

impl RealHost {
    fn kept_path(&self, kept: &KeptAt) -> io::Result<std::path::PathBuf> {
        let mount = self.mounts.get(&kept.page_size);
        let mount = mount.ok_or_else(|| no_mount(kept.page_size))?;
        Ok(mount.pool_dir_handle().fd_path().join(&kept.name))
    }
}

impl Keeper for RealHost {
    fn open_released(&self, file: FileAt) -> io::Result<Opened> {
        let path = self.path(file).map_err(io::Error::other)?;
        Ok(Opened::new(file.id, Some(open_for_write(&path)?)))
    }

    fn open_kept(&self, kept: &KeptAt) -> io::Result<Opened> {
        let id = crate::pool::kept::parse_kept_name(&kept.name).map_or(0, |(id, ..)| id);
        Ok(Opened::new(
            id,
            Some(open_for_write(&self.kept_path(kept)?)?),
        ))
    }

    fn pinned_pages(&self, opened: &Opened) -> Result<Option<Pins>, String> {
        match (self.reach.get(), opened.real()) {
            (Some(reach), Some(file)) => reach.pinned_pages(file),
            _ => Ok(None),
        }
    }

    fn punch_unpinned(&self, opened: &Opened, pins: &Pins, page_size: PageSize) {
        let (Some(file), Some(at)) = (opened.real(), &pins.at) else {
            return;
        };
        if let Err(err) = punch_all_but(file, at, page_size.bytes()) {
            tracing::warn!(id = opened.id(), %err, "cannot give back the pages of a released file that nobody pins: it is kept whole");
        }
    }

    fn held_bytes(&self, opened: &Opened) -> u64 {
        opened
            .real()
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.blocks().saturating_mul(512))
    }

    fn held_bytes_at(&self, file: FileAt) -> u64 {
        self.path(file)
            .ok()
            .and_then(|p| fs::symlink_metadata(p).ok())
            .map_or(0, |m| m.blocks().saturating_mul(512))
    }

    fn leased_size(&self, file: FileAt) -> Option<(u64, u64)> {
        // One `fstatat` of the pool's own name in the pool directory's handle (the
        // directory is the daemon's, 0700: no lessee can put another file there).
        let mount = self.mounts.get(&file.page_size)?;
        let st = rustix::fs::statat(
            mount.pool_dir_handle().fd(),
            crate::pool::file_key(file.id).as_str(),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .ok()?;
        Some(size_and_held(&st))
    }

    fn keep_as(&self, file: FileAt, name: &str) -> io::Result<()> {
        let path = self.path(file).map_err(io::Error::other)?;
        let kept = path.with_file_name(name);
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &path,
            rustix::fs::CWD,
            &kept,
            rustix::fs::RenameFlags::NOREPLACE,
        )
        .map_err(io::Error::from)
    }

    fn truncate_kept(
        &self,
        opened: Opened,
        node: u32,
        page_size: PageSize,
    ) -> (io::Result<()>, u64) {
        let Some(file) = opened.real() else {
            return (Ok(()), 0);
        };
        let (truncated, returned) = truncate_counted(file, node, page_size);
        (truncated, returned.unwrap_or(0))
    }

    fn kept_size(&self, kept: &KeptAt) -> Option<(u64, u64)> {
        let path = self.kept_path(kept).ok()?;
        let st = rustix::fs::statat(
            rustix::fs::CWD,
            &path,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .ok()?;
        Some(size_and_held(&st))
    }

    fn remove_kept(&self, kept: &KeptAt) -> io::Result<()> {
        fs::remove_file(self.kept_path(kept)?)
    }

    fn kept_names(&self, page_size: PageSize) -> Vec<(String, u64)> {
        let Some(mount) = self.mounts.get(&page_size) else {
            return Vec::new();
        };
        let Ok(entries) = fs::read_dir(mount.pool_dir_handle().fd_path()) else {
            return Vec::new();
        };
        entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| crate::pool::kept::parse_kept_name(name).is_some())
            .map(|name| {
                let path = mount.pool_dir_handle().fd_path().join(&name);
                let bytes = fs::symlink_metadata(path).map_or(0, |m| m.blocks() * 512);
                (name, bytes)
            })
            .collect()
    }
}

/// Punches every page of `file` out but those at the byte offsets `keep` (pages of
/// `page` bytes): their pages return to the kernel, the kept ones stay in the file.
fn punch_all_but(file: &fs::File, keep: &[u64], page: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = file.metadata()?.len();
    let mut keep: Vec<u64> = keep.iter().map(|&at| at - at % page).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from = 0;
    for end in keep
        .into_iter()
        .chain(std::iter::once(len.div_ceil(page) * page))
    {
        if end > from {
            nix::fcntl::fallocate(
                file.as_raw_fd(),
                nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                    | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                i64::try_from(from).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
                i64::try_from(end - from)
                    .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
            )
            .map_err(io::Error::from)?;
        }
        from = end.saturating_add(page);
    }
    Ok(())
}
