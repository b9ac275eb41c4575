//! The adaptive targets' forecasts kept across restarts: one file in the daemon's state
//! directory, [`FILE`], written hourly and at a clean stop (a temporary file, fsync, rename,
//! fsync of the directory: a crash leaves the old file or the new one) and read at start.
//!
//! The file lies in root's state directory, but what it says is treated as untrusted: it is
//! read only up to [`MAX_FILE_BYTES`], holds at most [`MAX_TARGETS`] targets, and each
//! forecast is bounded as the forecast bounds its own (`forecast::file::restore`). A file
//! that is damaged, of another format or version, or out of bounds is refused with one log
//! line naming the path and the field, and the daemon learns from nothing: it never fails
//! to start for it.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Key;
use crate::page_size::PageSize;
use crate::pool::core::forecast::file::SavedForecast;

/// The file's name in the state directory.
pub const FILE: &str = "adaptive-forecasts.json";

/// What the file's `format` says.
pub const FORMAT: &str = "hugeprep-adaptive-forecasts";

/// The file's version.
pub const VERSION: u32 = 1;

/// The largest file read (a target's full sample store is about 5 MB of JSON).
pub const MAX_FILE_BYTES: u64 = 128 << 20;

/// The most targets read from the file.
pub const MAX_TARGETS: usize = 64;

/// One target's forecast in the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedTarget {
    /// Its node (`null`: every node).
    pub node: Option<u32>,
    /// Its page size.
    pub page_size: PageSize,
    /// What its forecast has seen.
    pub forecast: SavedForecast,
}

/// The file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Saved {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// The targets.
    pub targets: Vec<SavedTarget>,
}

/// The file's path in `state_dir`.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Reads the file: the targets' forecasts by place (empty when there is none), or why it
/// is refused (the field at fault).
pub fn read(path: &Path) -> Result<BTreeMap<Key, SavedForecast>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("cannot open: {e}")),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    let saved: Saved = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if saved.format != FORMAT {
        return Err(format!("format: {:?}, not {FORMAT:?}", saved.format));
    }
    if saved.version != VERSION {
        return Err(format!("version: {}, not {VERSION}", saved.version));
    }
    if saved.targets.len() > MAX_TARGETS {
        return Err(format!(
            "targets: {} targets, more than {MAX_TARGETS}",
            saved.targets.len()
        ));
    }
    Ok(saved
        .targets
        .into_iter()
        .map(|t| ((t.node, t.page_size), t.forecast))
        .collect())
}

/// Writes `targets` to `path` atomically (temporary file, fsync, rename, fsync of the
/// directory).
///
/// Only as many targets as [`read`] takes back are written (at most [`MAX_FILE_BYTES`] in
/// all); those left out are named in a warning and learn from nothing after a restart.
pub fn write(path: &Path, targets: Vec<(Key, SavedForecast)>) -> std::io::Result<()> {
    let mut room = MAX_FILE_BYTES.saturating_sub(4096);
    let mut kept = Vec::with_capacity(targets.len());
    for ((node, page_size), forecast) in targets.into_iter().take(MAX_TARGETS) {
        let t = SavedTarget {
            node,
            page_size,
            forecast,
        };
        let len = serde_json::to_vec(&t).map_or(u64::MAX, |v| v.len() as u64 + 1);
        if len > room {
            tracing::warn!(?node, %page_size, path = %path.display(), "adaptive forecast not saved: the file would be larger than it may be read back ({MAX_FILE_BYTES} bytes)");
            continue;
        }
        room -= len;
        kept.push(t);
    }
    let saved = Saved {
        format: FORMAT.into(),
        version: VERSION,
        targets: kept,
    };
    let text = serde_json::to_vec(&saved).map_err(std::io::Error::other)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension("json.tmp");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            // Never through a link planted in its place.
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(&text)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_foreign_and_large_files_are_refused_by_field() {
        let dir = std::env::temp_dir().join(format!("hugeprep-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = path(&dir);
        assert_eq!(read(&p), Ok(BTreeMap::new()), "no file: nothing learnt");
        for (text, words) in [
            ("{\"format\":", "EOF"),
            ("{\"format\":\"other\",\"version\":1,\"targets\":[]}", "format"),
            (
                "{\"format\":\"hugeprep-adaptive-forecasts\",\"version\":9,\"targets\":[]}",
                "version",
            ),
            (
                "{\"format\":\"hugeprep-adaptive-forecasts\",\"version\":1,\"targets\":[{\"node\":0}]}",
                "page_size",
            ),
        ] {
            std::fs::write(&p, text).unwrap();
            let err = read(&p).unwrap_err();
            assert!(err.contains(words), "{text}: {err}");
        }
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(MAX_FILE_BYTES + 1).unwrap();
        assert!(read(&p).unwrap_err().contains("larger than"));
        write(&p, Vec::new()).unwrap();
        assert_eq!(read(&p), Ok(BTreeMap::new()));
        assert!(!p.with_extension("json.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
