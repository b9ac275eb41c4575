//! The journal: hugeprep's persistent record of every pool file, written before each state
//! change takes effect, so that after a crash nothing that was not proven clean is handed
//! out.
//!
//! Each record is one small JSON file `<dir>/records/<key>.json`, replaced atomically: a
//! crash leaves either the old or the new record, never half of one. A marker file says the
//! daemon shut down cleanly; it is removed (durably) when the daemon starts.
//!
//! What a write must survive depends on what the records describe ([`Lifetime`]):
//! - [`Lifetime::Disk`] (warm targets, calibration): state that outlives the kernel. Every
//!   write goes to a temporary file, `fsync`ed, renamed over the old record, and the
//!   directory is `fsync`ed: it survives power loss.
//! - [`Lifetime::Boot`] (pool files on hugetlbfs, pages added to the kernel's pools): state
//!   that dies with the running kernel. A record only has to survive a crash of the daemon,
//!   which the page cache gives without `fsync`: after a kernel crash or power loss the
//!   memory it describes is gone too. Such a record is rewritten in place, one page at
//!   offset 0 (see `write_in_place`). The journal remembers the boot it was written in
//!   (`boot-id`, from `/proc/sys/kernel/random/boot_id`) and drops the records of an earlier
//!   boot when it opens. This keeps three `fsync`s (several ms on a busy disk) off every
//!   lease, release and scrub.
//!
//! ```
//! # let dir = std::env::temp_dir().join(format!("hugeprep-journal-doc-{}", std::process::id()));
//! use hugeprep::journal::Journal;
//! let journal = Journal::open(&dir).unwrap();
//! journal.write("p1", &serde_json::json!({"state": "warm"})).unwrap();
//! let records: Vec<(String, serde_json::Value)> = journal.load().unwrap();
//! assert_eq!(records[0].0, "p1");
//! journal.remove("p1").unwrap();
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A journal operation failed; the state change it guarded must not happen.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A file system call failed.
    #[error("journal: {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The kernel's answer.
        source: io::Error,
    },
    /// A record key that would escape the journal directory.
    #[error("journal: invalid record key {key:?}")]
    Key {
        /// The key.
        key: String,
    },
    /// A record could not be encoded.
    #[error("journal: encoding record {key}: {source}")]
    Encode {
        /// The record's key.
        key: String,
        /// The encoder's message.
        source: serde_json::Error,
    },
}

/// Result of journal operations.
pub type Result<T> = std::result::Result<T, JournalError>;

const RECORDS: &str = "records";
const CLEAN_MARKER: &str = "clean-shutdown";
const BOOT_ID: &str = "boot-id";
/// A [`Lifetime::Boot`] record up to this size is replaced in place (one page).
const RECORD_BLOCK: usize = 4096;
const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// How long the state a journal's records describe lives, which decides what a write must
/// survive (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Outlives the kernel: writes are `fsync`ed and survive power loss.
    Disk,
    /// Dies with the running kernel: writes survive a crash of the daemon, and records of an
    /// earlier boot are dropped on open.
    Boot,
}

/// The journal directory (the daemon's state directory).
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    records: PathBuf,
    lifetime: Lifetime,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> JournalError + 'a {
    move |source| JournalError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}

fn create(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))
}

/// Replaces a [`Lifetime::Boot`] record in place: the record padded with spaces (which JSON
/// ignores) to one whole block, written at offset 0 by one `pwrite`. A process dies before
/// or after a one-page write, never inside it, so a crash of the daemon leaves the old or
/// the new record; and no inode is made or renamed per state change (on ext4, allocating
/// inodes among recently deleted ones cost a tenth of the daemon's CPU under load).
/// Gives `bytes` back when the old record is longer than a block (written by the rename
/// path), which the caller then replaces by a rename.
fn write_in_place(path: &Path, bytes: Vec<u8>) -> Result<Option<Vec<u8>>> {
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
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = create(path)?;
    f.write_all(bytes).map_err(io_err("write", path))?;
    f.sync_all().map_err(io_err("fsync", path))
}

fn check_key(key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && key.len() <= 128
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(JournalError::Key {
            key: key.to_string(),
        })
    }
}

/// The running kernel's boot id, `None` where procfs does not say.
fn kernel_boot_id() -> Option<String> {
    let id = fs::read_to_string(KERNEL_BOOT_ID).ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_string())
}

impl Journal {
    /// Opens (creating, mode 0700) a journal of [`Lifetime::Disk`] records in `dir`.
    pub fn open(dir: &Path) -> Result<Journal> {
        Journal::open_with(dir, Lifetime::Disk, None)
    }

    /// Opens (creating, mode 0700) a journal of [`Lifetime::Boot`] records in `dir`, dropping
    /// the records of an earlier boot.
    pub fn open_boot(dir: &Path) -> Result<Journal> {
        Journal::open_with(dir, Lifetime::Boot, kernel_boot_id())
    }

    fn open_with(dir: &Path, lifetime: Lifetime, boot: Option<String>) -> Result<Journal> {
        let records = dir.join(RECORDS);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&records)
            .map_err(io_err("mkdir", &records))?;
        let journal = Journal {
            dir: dir.to_path_buf(),
            records,
            lifetime,
        };
        if let (Lifetime::Boot, Some(boot)) = (lifetime, boot) {
            journal.enter_boot(&boot)?;
        }
        Ok(journal)
    }

    /// Drops the records of an earlier boot (the state they describe is gone) and records
    /// `boot` as the journal's boot, durably. A journal that never recorded a boot keeps its
    /// records: an older hugeprep wrote them, most likely in this boot.
    fn enter_boot(&self, boot: &str) -> Result<()> {
        let path = self.dir.join(BOOT_ID);
        let stored = fs::read_to_string(&path).ok();
        let stored = stored.as_deref().map(str::trim);
        if stored == Some(boot) {
            return Ok(());
        }
        if let Some(earlier) = stored {
            let mut dropped = 0;
            let entries = fs::read_dir(&self.records).map_err(io_err("readdir", &self.records))?;
            for entry in entries {
                let entry = entry.map_err(io_err("readdir", &self.records))?;
                fs::remove_file(entry.path()).map_err(io_err("unlink", &entry.path()))?;
                dropped += 1;
            }
            sync_dir(&self.records)?;
            tracing::info!(
                dir = %self.dir.display(), earlier, dropped,
                "journal records of an earlier boot dropped: what they described died with that kernel"
            );
        }
        let tmp = self.dir.join(".boot-id.tmp");
        write_synced(&tmp, boot.as_bytes())?;
        fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
        sync_dir(&self.dir)
    }

    /// What the records describe, and so what a write survives.
    pub fn lifetime(&self) -> Lifetime {
        self.lifetime
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record_path(&self, key: &str) -> PathBuf {
        self.records.join(format!("{key}.json"))
    }

    /// Replaces the record `key` with `value`. When this returns `Ok`, the new record
    /// survives a crash of the daemon, and for [`Lifetime::Disk`] power loss too.
    pub fn write<T: Serialize>(&self, key: &str, value: &T) -> Result<()> {
        check_key(key)?;
        let bytes = serde_json::to_vec(value).map_err(|source| JournalError::Encode {
            key: key.to_string(),
            source,
        })?;
        let path = self.record_path(key);
        let bytes = if self.lifetime == Lifetime::Boot && bytes.len() <= RECORD_BLOCK {
            match write_in_place(&path, bytes)? {
                None => return Ok(()),
                Some(bytes) => bytes,
            }
        } else {
            bytes
        };
        let tmp = self.records.join(format!(".{key}.json.tmp"));
        match self.lifetime {
            Lifetime::Disk => write_synced(&tmp, &bytes)?,
            Lifetime::Boot => create(&tmp)?
                .write_all(&bytes)
                .map_err(io_err("write", &tmp))?,
        }
        fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
        self.sync_records()
    }

    /// Removes the record `key` (no error when it does not exist), as lasting as
    /// [`Journal::write`].
    pub fn remove(&self, key: &str) -> Result<()> {
        check_key(key)?;
        let path = self.record_path(key);
        match fs::remove_file(&path) {
            Ok(()) => self.sync_records(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("unlink", &path)(e)),
        }
    }

    fn sync_records(&self) -> Result<()> {
        match self.lifetime {
            Lifetime::Disk => sync_dir(&self.records),
            Lifetime::Boot => Ok(()),
        }
    }

    /// Every record, sorted by key. Leftover temporary files (a crash between write and
    /// rename) are removed. A record that does not decode is reported with `Err` in its slot
    /// so the caller can treat its file as unknown.
    pub fn load_raw<T: DeserializeOwned>(
        &self,
    ) -> Result<Vec<(String, std::result::Result<T, String>)>> {
        let mut out = Vec::new();
        let entries = fs::read_dir(&self.records).map_err(io_err("readdir", &self.records))?;
        for entry in entries {
            let entry = entry.map_err(io_err("readdir", &self.records))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with('.') {
                // A write interrupted before its rename; the next load tries again.
                if let Err(err) = fs::remove_file(&path) {
                    tracing::warn!(path = %path.display(), %err, "cannot remove a leftover journal temporary file");
                }
                continue;
            }
            let Some(key) = name.strip_suffix(".json") else {
                continue;
            };
            let text = fs::read(&path).map_err(io_err("read", &path))?;
            let value = serde_json::from_slice::<T>(&text).map_err(|e| format!("{name}: {e}"));
            out.push((key.to_string(), value));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Every record that decodes, sorted by key (see [`Journal::load_raw`]).
    pub fn load<T: DeserializeOwned>(&self) -> Result<Vec<(String, T)>> {
        Ok(self
            .load_raw()?
            .into_iter()
            .filter_map(|(k, v)| v.ok().map(|v| (k, v)))
            .collect())
    }

    /// Whether the last run ended with [`Journal::mark_clean_shutdown`].
    pub fn was_clean_shutdown(&self) -> bool {
        self.dir.join(CLEAN_MARKER).exists()
    }

    /// Records a clean shutdown: every `warm` record is true.
    pub fn mark_clean_shutdown(&self) -> Result<()> {
        let path = self.dir.join(CLEAN_MARKER);
        let f = File::create(&path).map_err(io_err("create", &path))?;
        f.sync_all().map_err(io_err("fsync", &path))?;
        sync_dir(&self.dir)
    }

    /// Removes the clean-shutdown marker durably: from now on a crash means warm records
    /// must be re-proven.
    pub fn clear_clean_shutdown(&self) -> Result<()> {
        let path = self.dir.join(CLEAN_MARKER);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("unlink", &path)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("hugeprep-journal-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn records_replace_atomically_and_survive_reopen() {
        let dir = temp("replace");
        let j = Journal::open(&dir).unwrap();
        j.write("p1", &1u32).unwrap();
        j.write("p1", &2u32).unwrap();
        j.write("p2", &3u32).unwrap();
        fs::write(dir.join("records/.p3.json.tmp"), b"{half").unwrap();
        fs::write(dir.join("records/p4.json"), b"{broken").unwrap();
        let j = Journal::open(&dir).unwrap();
        let raw = j.load_raw::<u32>().unwrap();
        assert_eq!(raw.len(), 3);
        assert!(raw[2].1.is_err());
        assert_eq!(
            j.load::<u32>().unwrap(),
            vec![("p1".into(), 2), ("p2".into(), 3)]
        );
        assert!(!dir.join("records/.p3.json.tmp").exists());
        j.remove("p1").unwrap();
        j.remove("p1").unwrap();
        assert_eq!(j.load::<u32>().unwrap().len(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keys_cannot_escape() {
        let dir = temp("keys");
        let j = Journal::open(&dir).unwrap();
        for key in ["", "../x", "a/b", "a.b"] {
            assert!(
                matches!(j.write(key, &1), Err(JournalError::Key { .. })),
                "{key}"
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn boot_records_of_an_earlier_boot_are_dropped() {
        let dir = temp("boot");
        let j = Journal::open_with(&dir, Lifetime::Boot, Some("boot-a".into())).unwrap();
        j.write("p1", &1u32).unwrap();
        // Reopened in the same boot: kept.
        let j = Journal::open_with(&dir, Lifetime::Boot, Some("boot-a".into())).unwrap();
        assert_eq!(j.load::<u32>().unwrap(), vec![("p1".into(), 1)]);
        // In another boot: what the record described died with the kernel.
        let j = Journal::open_with(&dir, Lifetime::Boot, Some("boot-b".into())).unwrap();
        assert!(j.load::<u32>().unwrap().is_empty());
        assert_eq!(fs::read_to_string(dir.join(BOOT_ID)).unwrap(), "boot-b");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn boot_records_are_replaced_in_place_by_shorter_and_longer_ones() {
        let dir = temp("inplace");
        let j = Journal::open_with(&dir, Lifetime::Boot, Some("boot-a".into())).unwrap();
        let long = "x".repeat(3000);
        let huge = "y".repeat(RECORD_BLOCK + 10);
        for value in [&long, "short", &huge, "short again", &long] {
            j.write("p1", &value).unwrap();
            let loaded = j.load::<String>().unwrap();
            assert_eq!(loaded, vec![("p1".to_string(), value.to_string())]);
        }
        let len = fs::metadata(dir.join("records/p1.json")).unwrap().len();
        assert!(len >= RECORD_BLOCK as u64, "{len}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn boot_records_without_a_recorded_boot_are_kept() {
        // A state directory from before boot ids were recorded.
        let dir = temp("noboot");
        Journal::open(&dir).unwrap().write("p1", &1u32).unwrap();
        let j = Journal::open_with(&dir, Lifetime::Boot, Some("boot-a".into())).unwrap();
        assert_eq!(j.load::<u32>().unwrap().len(), 1);
        assert_eq!(j.lifetime(), Lifetime::Boot);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn clean_shutdown_marker() {
        let dir = temp("marker");
        let j = Journal::open(&dir).unwrap();
        assert!(!j.was_clean_shutdown());
        j.mark_clean_shutdown().unwrap();
        assert!(j.was_clean_shutdown());
        j.clear_clean_shutdown().unwrap();
        assert!(!j.was_clean_shutdown());
        fs::remove_dir_all(&dir).unwrap();
    }
}
