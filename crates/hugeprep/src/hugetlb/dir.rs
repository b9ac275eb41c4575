//! Directories the daemon and the hook own, held by handle.
//!
//! Every directory hugeprep creates or empties on a hugetlbfs mount (`hugeprep/`,
//! `hugeprep/pool`, `hugeprep/leases`, the hook's per-domain directory) is opened relative to
//! its parent's handle without following a symbolic link (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, `openat` with `O_NOFOLLOW` on kernels before
//! 5.6), then checked: a directory, owned by the daemon's user. Only then is its mode set,
//! through the handle. What is done below it afterwards goes through the handle too
//! ([`DirHandle::fd_path`]), so renaming or replacing a path component later (by a user who
//! can write the mount's root) cannot redirect it. A directory that is not the daemon's is
//! refused with an error naming it, and nothing in it or behind it is touched.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// A directory could not be opened, made or trusted.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// A system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The directory.
        path: PathBuf,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// The path is not a directory hugeprep may use; nothing in or behind it was touched.
    #[error("{path}: {reason}; refusing to use it (nothing in or behind it was touched)")]
    NotOurs {
        /// The directory.
        path: PathBuf,
        /// Why it is not ours.
        reason: String,
    },
}

/// A directory's result.
pub type Result<T> = std::result::Result<T, DirError>;

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> DirError + 'a {
    move |e| DirError::Io {
        op,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// An open directory and the path it was opened by (for messages and for what is handed to
/// other processes).
#[derive(Debug, Clone)]
pub struct DirHandle {
    fd: Arc<OwnedFd>,
    path: PathBuf,
}

impl DirHandle {
    /// Opens `path` as a directory. The path itself comes from the configuration (an
    /// administrator's choice), so symbolic links in it are followed; below it none are.
    pub fn open(path: &Path) -> Result<DirHandle> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io("open", path))?;
        Ok(DirHandle {
            fd: Arc::new(fd),
            path: path.to_path_buf(),
        })
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path that names this directory through its handle (`/proc/self/fd/N`): what is
    /// reached through it stays below the directory that was checked, whatever happens to
    /// the names above it.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// The handle.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The subdirectory `name`, made with `mode` when missing, opened without following a
    /// link, and refused unless it is a directory owned by `uid`; its mode is then set to
    /// `mode`.
    pub fn own_subdir(&self, name: impl AsRef<Path>, mode: u32, uid: u32) -> Result<DirHandle> {
        let name = one_component(&self.path, name.as_ref())?;
        let path = self.path.join(name);
        match rustix::fs::mkdirat(&*self.fd, name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(io("mkdir", &path)(e)),
        }
        let dir = self.open_subdir(name)?;
        dir.check_owner(uid)?;
        rustix::fs::fchmod(&*dir.fd, Mode::from_raw_mode(mode)).map_err(io("chmod", &path))?;
        Ok(dir)
    }

    /// Makes the subdirectory `name` with `mode` and opens it; refuses one that exists
    /// already (it was not made by this call, so someone else may have planted it).
    pub fn new_subdir(&self, name: impl AsRef<Path>, mode: u32, uid: u32) -> Result<DirHandle> {
        let name = one_component(&self.path, name.as_ref())?;
        let path = self.path.join(name);
        match rustix::fs::mkdirat(&*self.fd, name, Mode::from_raw_mode(mode)) {
            Ok(()) => {}
            Err(Errno::EXIST) => {
                return Err(DirError::NotOurs {
                    path,
                    reason: "exists already, and only a directory made here is trusted".into(),
                })
            }
            Err(e) => return Err(io("mkdir", &path)(e)),
        }
        let dir = self.open_subdir(name)?;
        // Between mkdir and open another user who can write the parent could have swapped it.
        dir.check_owner(uid)?;
        rustix::fs::fchmod(&*dir.fd, Mode::from_raw_mode(mode)).map_err(io("chmod", &path))?;
        Ok(dir)
    }

    /// The per-domain directory `name` that libvirt makes for a domain's QEMU before the
    /// `start begin` hook (`0700`, owned by the user and group QEMU runs as): opened without
    /// following a link and refused unless it is a directory owned by `uid` that no one else
    /// may write. When it is missing (a hook run without libvirt) it is made as libvirt makes
    /// it. Returns the handle and whether this call made it.
    pub fn qemu_subdir(
        &self,
        name: impl AsRef<Path>,
        uid: u32,
        gid: u32,
    ) -> Result<(DirHandle, bool)> {
        let name = one_component(&self.path, name.as_ref())?;
        let path = self.path.join(name);
        let made = match rustix::fs::mkdirat(&*self.fd, name, Mode::from_raw_mode(0o700)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(e) => return Err(io("mkdir", &path)(e)),
        };
        let dir = self.open_subdir(name)?;
        if made {
            // Between mkdir and open another user who can write the parent could have
            // swapped it: it must still be this process's.
            dir.check_owner(rustix::process::geteuid().as_raw())?;
            rustix::fs::fchown(
                &*dir.fd,
                Some(rustix::process::Uid::from_raw(uid)),
                Some(rustix::process::Gid::from_raw(gid)),
            )
            .map_err(io("chown", &path))?;
            rustix::fs::fchmod(&*dir.fd, Mode::from_raw_mode(0o700)).map_err(io("chmod", &path))?;
        }
        dir.check_owner_as(uid, "QEMU's")?;
        let st = rustix::fs::fstat(&*dir.fd).map_err(io("stat", &path))?;
        if st.st_mode & 0o022 != 0 {
            return Err(DirError::NotOurs {
                path,
                reason: format!(
                    "writable by group or others (mode {:o}): another process could swap \
                     the files QEMU opens",
                    st.st_mode & 0o7777
                ),
            });
        }
        Ok((dir, made))
    }

    /// The subdirectory `name`, made with `mode` when missing, opened without following a
    /// link; whoever owns it (a parent that another service such as libvirt may own).
    pub fn parent_subdir(&self, name: impl AsRef<Path>, mode: u32) -> Result<DirHandle> {
        let name = one_component(&self.path, name.as_ref())?;
        match rustix::fs::mkdirat(&*self.fd, name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(io("mkdir", &self.path.join(name))(e)),
        }
        self.open_subdir(name)
    }

    /// Opens the existing subdirectory `name` without following a link (no owner check).
    pub fn open_subdir(&self, name: impl AsRef<Path>) -> Result<DirHandle> {
        let name = one_component(&self.path, name.as_ref())?;
        let path = self.path.join(name);
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let opened = match rustix::fs::openat2(
            &*self.fd,
            name,
            flags,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Err(Errno::NOSYS) => rustix::fs::openat(&*self.fd, name, flags, Mode::empty()),
            other => other,
        };
        let fd = opened.map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR | Errno::XDEV => DirError::NotOurs {
                path: path.clone(),
                reason: "a symbolic link or not a directory".into(),
            },
            e => io("open", &path)(e),
        })?;
        Ok(DirHandle {
            fd: Arc::new(fd),
            path,
        })
    }

    fn check_owner(&self, uid: u32) -> Result<()> {
        self.check_owner_as(uid, "the daemon's")
    }

    fn check_owner_as(&self, uid: u32, whose: &str) -> Result<()> {
        let st = rustix::fs::fstat(&*self.fd).map_err(io("stat", &self.path))?;
        if st.st_uid != uid {
            return Err(DirError::NotOurs {
                path: self.path.clone(),
                reason: format!(
                    "owned by uid {}, not by {whose} uid {uid} (mode {:o})",
                    st.st_uid,
                    st.st_mode & 0o7777
                ),
            });
        }
        Ok(())
    }

    /// Links the file at `from` (a path that is followed, e.g. a lease path of the daemon)
    /// as `name` in this directory.
    pub fn link_in(&self, from: &Path, name: impl AsRef<Path>) -> std::io::Result<()> {
        let name = name.as_ref();
        rustix::fs::linkat(
            rustix::fs::CWD,
            from,
            &*self.fd,
            name,
            rustix::fs::AtFlags::empty(),
        )
        .map_err(Into::into)
    }

    /// Removes the file `name` in this directory (never a directory, never through a link).
    pub fn unlink(&self, name: impl AsRef<Path>) -> std::io::Result<()> {
        let name = name.as_ref();
        rustix::fs::unlinkat(&*self.fd, name, rustix::fs::AtFlags::empty()).map_err(Into::into)
    }

    /// Removes the empty subdirectory `name`.
    pub fn rmdir(&self, name: impl AsRef<Path>) -> std::io::Result<()> {
        let name = name.as_ref();
        rustix::fs::unlinkat(&*self.fd, name, rustix::fs::AtFlags::REMOVEDIR).map_err(Into::into)
    }
}

/// `name` when it is one path component (no `/`, not `.` or `..`): `mkdirat` would follow
/// links in the components before the last.
fn one_component<'a>(parent: &Path, name: &'a Path) -> Result<&'a Path> {
    let mut parts = name.components();
    match (parts.next(), parts.next()) {
        (Some(std::path::Component::Normal(_)), None) => Ok(name),
        _ => Err(DirError::NotOurs {
            path: parent.join(name),
            reason: "not a single path component".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("hugeprep-dir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_symlinked_subdir_is_refused_and_its_target_untouched() {
        let d = tmp("link");
        let outside = d.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("pool")).unwrap();
        let root = DirHandle::open(&d).unwrap();
        let e = root.own_subdir("pool", 0o700, 0).unwrap_err().to_string();
        assert!(e.contains("pool") && e.contains("symbolic link"), "{e}");
        let mode = std::fs::metadata(&outside).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o777, "the link's target was chmod'ed");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_subdir_of_another_user_is_refused_and_an_existing_one_is_not_new() {
        let d = tmp("owner");
        let root = DirHandle::open(&d).unwrap();
        let mine = root
            .own_subdir("mine", 0o700, rustix::process::geteuid().as_raw())
            .unwrap();
        assert_eq!(
            std::fs::metadata(mine.fd_path())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        let e = root
            .own_subdir("mine", 0o700, 12345)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not by the daemon's uid 12345"), "{e}");
        let e = root.new_subdir("mine", 0o700, 0).unwrap_err().to_string();
        assert!(e.contains("exists already"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
