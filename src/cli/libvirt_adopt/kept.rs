//! What `libvirt-adopt` keeps of each domain it adopts, in `<state_dir>/libvirt-adopt/`:
//! `<uuid>.xml`, the original definition `--revert` defines again, and `<uuid>.adopted.xml`,
//! the definition as libvirt gave it back (`virsh dumpxml --inactive --security-info`) right
//! after adopt's `virsh define`. A revert compares a fresh dumpxml with the second: libvirt
//! normalises what it is given (attribute quotes, defaults it fills in), so only its own
//! rendering of the adopted domain tells whether anyone defined the domain again since, and
//! a revert that did not ask would throw that later change away.
//!
//! Both hold what `--security-info` put in (VNC and SPICE passwords): they are written mode
//! 0600 in a directory of mode 0700.

use std::fs::{DirBuilder, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A failure to read or write the kept definitions; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum KeptError {
    /// Creating the directory of the kept definitions.
    #[error("creating {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Writing, syncing or renaming into place one of the files.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Reading one of the files.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Removing one of the files after a revert.
    #[error("removing {path}: {source}")]
    Remove {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The kept files of one domain (by UUID: a name can be given to another domain).
#[derive(Debug, Clone)]
pub struct Kept {
    dir: PathBuf,
    original: PathBuf,
    adopted: PathBuf,
}

/// What is kept of an adopted domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The definition before adopt.
    pub original: String,
    /// libvirt's rendering of the definition adopt made; `None` when adopt did not get to
    /// record it (interrupted between its define and the record).
    pub adopted: Option<String>,
}

/// How a domain's current definition stands to the one adopt made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Still the definition adopt made.
    AsAdopted,
    /// Defined again since (by an operator or another tool).
    Redefined,
    /// Unknown: adopt's rendering was not recorded.
    Unrecorded,
}

impl Record {
    /// How `current` (a fresh `virsh dumpxml --inactive --security-info`) stands to the
    /// definition adopt made.
    pub fn standing(&self, current: &str) -> Standing {
        match &self.adopted {
            None => Standing::Unrecorded,
            Some(adopted) if adopted == current => Standing::AsAdopted,
            Some(_) => Standing::Redefined,
        }
    }
}

impl Kept {
    /// The files of the domain `uuid` in `dir`.
    pub fn new(dir: &Path, uuid: &str) -> Kept {
        Kept {
            dir: dir.to_path_buf(),
            original: dir.join(format!("{uuid}.xml")),
            adopted: dir.join(format!("{uuid}.adopted.xml")),
        }
    }

    /// The original's file.
    pub fn original_path(&self) -> &Path {
        &self.original
    }

    /// The file of adopt's definition.
    pub fn adopted_path(&self) -> &Path {
        &self.adopted
    }

    /// What is kept, `None` when no original is.
    pub fn load(&self) -> Result<Option<Record>, KeptError> {
        let Some(original) = read_if_present(&self.original)? else {
            return Ok(None);
        };
        let adopted = read_if_present(&self.adopted)?;
        Ok(Some(Record { original, adopted }))
    }

    /// Keeps `original` (before the define, so that a crash never leaves an adopted
    /// domain without it). A record of an earlier adoption whose original is gone is
    /// dropped here: it belongs to no kept original.
    pub fn save_original(&self, original: &str) -> Result<(), KeptError> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|source| KeptError::CreateDir {
                path: self.dir.clone(),
                source,
            })?;
        remove_if_present(&self.adopted)?;
        write_durably(&self.original, original)
    }

    /// Records libvirt's rendering of the definition adopt made.
    pub fn record_adopted(&self, adopted: &str) -> Result<(), KeptError> {
        write_durably(&self.adopted, adopted)
    }

    /// Forgets the domain: the original first, so that an interrupted forget leaves only a
    /// record of no original, which [`Kept::load`] ignores and the next adoption drops.
    pub fn forget(&self) -> Result<(), KeptError> {
        remove_if_present(&self.original)?;
        remove_if_present(&self.adopted)
    }
}

fn read_if_present(path: &Path) -> Result<Option<String>, KeptError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(KeptError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn remove_if_present(path: &Path) -> Result<(), KeptError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(source) => Err(KeptError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes `text` to `path` by a temporary file of mode 0600, `fsync` and `rename`: a crash
/// leaves the old state or the whole new file, never half of one.
pub fn write_durably(path: &Path, text: &str) -> Result<(), KeptError> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        KeptError::Write {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hugeprep-kept-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_revert_sees_whether_the_domain_was_defined_again() {
        let tmp = scratch("revert");
        let kept = Kept::new(&tmp.join("libvirt-adopt"), "u-1");
        assert_eq!(kept.load().unwrap(), None);

        kept.save_original("<domain>original</domain>").unwrap();
        let unrecorded = kept.load().unwrap().unwrap();
        assert_eq!(
            unrecorded.standing("<domain>adopted</domain>"),
            Standing::Unrecorded
        );

        kept.record_adopted("<domain>adopted</domain>").unwrap();
        let record = kept.load().unwrap().unwrap();
        assert_eq!(record.original, "<domain>original</domain>");
        assert_eq!(
            record.standing("<domain>adopted</domain>"),
            Standing::AsAdopted
        );
        assert_eq!(
            record.standing("<domain>adopted, then edited</domain>"),
            Standing::Redefined
        );

        // Passwords may be in there: nobody else reads them.
        for path in [kept.original_path(), kept.adopted_path()] {
            let mode = std::fs::metadata(path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        }
        let dir_mode = std::fs::metadata(tmp.join("libvirt-adopt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);

        kept.forget().unwrap();
        assert_eq!(kept.load().unwrap(), None);
        assert_eq!(
            std::fs::read_dir(tmp.join("libvirt-adopt"))
                .unwrap()
                .count(),
            0
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn a_stale_record_is_dropped_with_a_new_original() {
        let tmp = scratch("stale");
        let kept = Kept::new(&tmp, "u-2");
        // An interrupted forget of an earlier adoption can leave a record alone.
        std::fs::write(kept.adopted_path(), "<domain>old</domain>").unwrap();
        assert_eq!(kept.load().unwrap(), None);
        kept.save_original("<domain>original</domain>").unwrap();
        assert_eq!(kept.load().unwrap().unwrap().adopted, None);
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
