//! The journal: hugeprep's persistent record of every pool file, written before each state
//! change takes effect, so that after a crash nothing that was not proven clean is handed
//! out.
//!
//! Each record is one small JSON file `<dir>/records/<key>.json`, replaced atomically: write
//! a temporary file, `fsync` it, `rename` it over the old one, `fsync` the directory. A
//! crash leaves either the old or the new record, never half of one. Removing a record
//! `fsync`s the directory too. A marker file says the daemon shut down cleanly; it is
//! removed (durably) when the daemon starts.
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
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
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

/// The journal directory (the daemon's state directory).
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    records: PathBuf,
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

impl Journal {
    /// Opens (creating, mode 0700) the journal in `dir`.
    pub fn open(dir: &Path) -> Result<Journal> {
        let records = dir.join(RECORDS);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&records)
            .map_err(io_err("mkdir", &records))?;
        Ok(Journal {
            dir: dir.to_path_buf(),
            records,
        })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record_path(&self, key: &str) -> PathBuf {
        self.records.join(format!("{key}.json"))
    }

    /// Durably replaces the record `key` with `value`. When this returns `Ok`, the new record
    /// survives a crash or power loss.
    pub fn write<T: Serialize>(&self, key: &str, value: &T) -> Result<()> {
        check_key(key)?;
        let bytes = serde_json::to_vec(value).map_err(|source| JournalError::Encode {
            key: key.to_string(),
            source,
        })?;
        let tmp = self.records.join(format!(".{key}.json.tmp"));
        let path = self.record_path(key);
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        f.write_all(&bytes).map_err(io_err("write", &tmp))?;
        f.sync_all().map_err(io_err("fsync", &tmp))?;
        drop(f);
        fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
        sync_dir(&self.records)
    }

    /// Durably removes the record `key` (no error when it does not exist).
    pub fn remove(&self, key: &str) -> Result<()> {
        check_key(key)?;
        let path = self.record_path(key);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.records),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("unlink", &path)(e)),
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
                let _ = fs::remove_file(&path);
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
