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
    /// The directory is not one only this user can write (a link, another owner, or
    /// writable by others): the kept definitions hold the domain's secrets.
    #[error("{path} must be a directory owned by uid {uid} and writable by it alone (mode {mode:o}, owner {owner}): the kept definitions hold the domain's secrets")]
    UnsafeDir {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Its mode bits.
        mode: u32,
        /// The user hugeprep runs as.
        uid: u32,
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
        self.check_dir()?;
        remove_if_present(&self.adopted)?;
        write_durably(&self.original, original)
    }

    /// Records libvirt's rendering of the definition adopt made.
    pub fn record_adopted(&self, adopted: &str) -> Result<(), KeptError> {
        self.check_dir()?;
        write_durably(&self.adopted, adopted)
    }

    /// Refuses a directory that another user could have put there or can write into (a
    /// link in it would send root's writes elsewhere): an existing one keeps its mode, so it
    /// is checked rather than trusted.
    fn check_dir(&self) -> Result<(), KeptError> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(&self.dir).map_err(|source| KeptError::CreateDir {
            path: self.dir.clone(),
            source,
        })?;
        let uid = nix::unistd::geteuid().as_raw();
        if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
            return Err(KeptError::UnsafeDir {
                path: self.dir.clone(),
                owner: meta.uid(),
                mode: meta.mode() & 0o7777,
                uid,
            });
        }
        Ok(())
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
        // A leftover of a crash goes first; then a new file only (`O_EXCL`: never through a
        // link someone left in its place).
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|source| {
        // The write's error is the one to report; a temporary left is rewritten next time.
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
    fn a_directory_others_can_write_or_a_link_is_refused_and_no_link_is_followed() {
        let tmp = scratch("unsafe");
        let dir = tmp.join("libvirt-adopt");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let kept = Kept::new(&dir, "u-3");
        assert!(matches!(
            kept.save_original("<domain/>"),
            Err(KeptError::UnsafeDir { .. })
        ));
        assert!(!kept.original_path().exists());

        std::fs::remove_dir(&dir).unwrap();
        let elsewhere = tmp.join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        assert!(matches!(
            kept.save_original("<domain/>"),
            Err(KeptError::UnsafeDir { .. })
        ));

        // A link left where the temporary file goes is replaced, never written through.
        let safe = tmp.join("safe");
        let target = tmp.join("target");
        std::fs::write(&target, "keep").unwrap();
        std::fs::create_dir(&safe).unwrap();
        std::os::unix::fs::symlink(&target, safe.join("x.tmp")).unwrap();
        write_durably(&safe.join("x.xml"), "new").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(safe.join("x.xml")).unwrap(), "new");
        std::fs::remove_dir_all(&tmp).unwrap();
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
