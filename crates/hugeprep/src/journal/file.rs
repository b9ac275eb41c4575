//! How a record reaches the file system: created private, written in place in one block
//! (a [`super::Lifetime::Boot`] record), or written and `fsync`ed (the rename path).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::error::{JournalError, Result};

/// A [`super::Lifetime::Boot`] record up to this size is replaced in place (one page).
pub(super) const RECORD_BLOCK: usize = 4096;

/// Maps an I/O error of `op` on `path` to a [`JournalError::Io`].
pub(super) fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> JournalError + 'a {
    move |source| JournalError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// `fsync`s a directory, so that a rename in it survives power loss.
pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}

/// Creates (or truncates) a record file, mode 0600.
pub(super) fn create(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))
}

/// Replaces a [`super::Lifetime::Boot`] record in place: the record padded with spaces (which JSON
/// ignores) to one whole block, written at offset 0 by one `pwrite`. A process dies before
/// or after a one-page write, never inside it, so a crash of the daemon leaves the old or
/// the new record; and no inode is made or renamed per state change (on ext4, allocating
/// inodes among recently deleted ones cost a tenth of the daemon's CPU under load).
/// Gives `bytes` back when the old record is longer than a block (written by the rename
/// path), which the caller then replaces by a rename.
pub(super) fn write_in_place(path: &Path, bytes: Vec<u8>) -> Result<Option<Vec<u8>>> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(io_err("open", path))?;
    let old = f.metadata().map_err(io_err("stat", path))?.len();
    if old > RECORD_BLOCK as u64 {
        return Ok(Some(bytes));
    }
    let mut block = bytes;
    block.resize(RECORD_BLOCK, b' ');
    f.write_all_at(&block, 0).map_err(io_err("write", path))?;
    Ok(None)
}

/// Writes `bytes` to a new file at `path` and `fsync`s it.
pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = create(path)?;
    f.write_all(bytes).map_err(io_err("write", path))?;
    f.sync_all().map_err(io_err("fsync", path))
}
