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

mod error;
mod file;

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use error::{JournalError, Result};
use file::{create, io_err, sync_dir, write_in_place, write_synced, RECORD_BLOCK};

/// The format of the records this build writes, recorded in `<dir>/format`. Raise it when a
/// record changes so that an older build would misread it, and read the older formats in
/// [`Journal::open`]'s check (`read_format`). 0 is a directory from before the file: its
/// records are those of format 1.
pub const FORMAT: u32 = 1;
const FORMAT_FILE: &str = "format";
const RECORDS: &str = "records";
const CLEAN_MARKER: &str = "clean-shutdown";
const BOOT_ID: &str = "boot-id";
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

/// The format `dir` was written in: `None` when it records none (new, or written before
/// formats were recorded, which format 1 reads as it is); an error for one newer than
/// [`FORMAT`] or a file that names no format.
fn read_format(dir: &Path) -> Result<Option<u32>> {
    let path = dir.join(FORMAT_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", &path)(e)),
    };
    match text.trim().parse::<u32>() {
        Ok(found) if found <= FORMAT => Ok(Some(found)),
        _ => Err(JournalError::Format {
            dir: dir.to_path_buf(),
            found: text.trim().chars().take(40).collect(),
            supported: FORMAT,
        }),
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
        // Before anything is changed (records of an earlier boot dropped, the format file
        // rewritten): a newer build's records are not this build's to read or delete.
        let format = read_format(dir)?;
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
        if format != Some(FORMAT) {
            journal.write_format()?;
        }
        Ok(journal)
    }

    /// Records [`FORMAT`] in `<dir>/format`, durably.
    fn write_format(&self) -> Result<()> {
        let path = self.dir.join(FORMAT_FILE);
        let tmp = self.dir.join(".format.tmp");
        write_synced(&tmp, format!("{FORMAT}\n").as_bytes())?;
        fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
        sync_dir(&self.dir)
    }

    /// The records a daemon opening `dir` in this boot would find, read without changing
    /// anything (no directory made, no earlier boot's records dropped, no temporary file
    /// removed): for a look from outside while the daemon may run (`hugeprep
    /// removal-check`). Records of an earlier boot and records that do not decode (one being
    /// rewritten at that moment among them) are left out.
    pub fn peek_boot_records<T: DeserializeOwned>(dir: &Path) -> Result<Vec<(String, T)>> {
        read_format(dir)?;
        let stored = fs::read_to_string(dir.join(BOOT_ID)).ok();
        if let (Some(stored), Some(now)) = (stored, kernel_boot_id()) {
            if stored.trim() != now {
                return Ok(Vec::new());
            }
        }
        let records = dir.join(RECORDS);
        let entries = match fs::read_dir(&records) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("readdir", &records)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err("readdir", &records))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(key) = name
                .strip_suffix(".json")
                .filter(|_| !name.starts_with('.'))
            else {
                continue;
            };
            let Ok(text) = fs::read(entry.path()) else {
                continue;
            };
            if let Ok(value) = serde_json::from_slice::<T>(&text) {
                out.push((key.to_string(), value));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
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
    fn a_directory_without_a_format_is_read_and_gets_this_builds() {
        // As a build from before formats were recorded left it.
        let dir = temp("format0");
        fs::create_dir_all(dir.join(RECORDS)).unwrap();
        fs::write(dir.join("records/p1.json"), b"7").unwrap();
        let j = Journal::open_with(&dir, Lifetime::Boot, Some("boot-a".into())).unwrap();
        assert_eq!(j.load::<u32>().unwrap(), vec![("p1".into(), 7)]);
        assert_eq!(fs::read_to_string(dir.join(FORMAT_FILE)).unwrap(), "1\n");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_newer_format_is_refused_and_nothing_changes() {
        let dir = temp("format2");
        let j = Journal::open_with(&dir, Lifetime::Boot, Some("boot-a".into())).unwrap();
        j.write("p1", &1u32).unwrap();
        for text in ["2\n", "hugeprep 9"] {
            fs::write(dir.join(FORMAT_FILE), text).unwrap();
            // Another boot: an accepted open would drop the record.
            let err = Journal::open_with(&dir, Lifetime::Boot, Some("boot-b".into())).unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(
                    err,
                    JournalError::Format {
                        supported: FORMAT,
                        ..
                    }
                ),
                "{msg}"
            );
            assert!(
                msg.contains("newer hugeprep") && msg.contains(text.trim()),
                "{msg}"
            );
            assert!(matches!(
                Journal::peek_boot_records::<u32>(&dir),
                Err(JournalError::Format { .. })
            ));
            assert_eq!(fs::read_to_string(dir.join(FORMAT_FILE)).unwrap(), text);
            assert_eq!(fs::read_to_string(dir.join(BOOT_ID)).unwrap(), "boot-a");
            assert!(dir.join("records/p1.json").exists());
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn peeking_changes_nothing() {
        let dir = temp("peek");
        assert!(Journal::peek_boot_records::<u32>(&dir).unwrap().is_empty());
        assert!(!dir.exists());
        let j = Journal::open_boot(&dir).unwrap();
        j.write("p1", &1u32).unwrap();
        fs::write(dir.join("records/p2.json"), b"{half").unwrap();
        fs::write(dir.join("records/.p3.json.tmp"), b"3").unwrap();
        let peeked = Journal::peek_boot_records::<u32>(&dir).unwrap();
        assert_eq!(peeked, vec![("p1".to_string(), 1)]);
        assert!(dir.join("records/.p3.json.tmp").exists());
        // Records of an earlier boot describe nothing that lives now.
        fs::write(dir.join(BOOT_ID), "an-earlier-boot").unwrap();
        if kernel_boot_id().is_some() {
            assert!(Journal::peek_boot_records::<u32>(&dir).unwrap().is_empty());
        }
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
