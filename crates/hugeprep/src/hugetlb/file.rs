//! Backing files: a hugetlbfs file or a `memfd_create(MFD_HUGETLB)` memfd holding one guest's
//! memory. Sizes are always whole pages; growing and shrinking go through `ftruncate`.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::unistd::{Gid, Uid};

use crate::page_size::PageSize;
use crate::sys::mmap::{MmapError, MmapRegion};

/// The owner a backing file is handed to (the VMM's user, e.g. `libvirt-qemu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl Owner {
    /// Looks up a user by name (or a numeric uid) in the passwd database; the group is the
    /// user's primary group.
    pub fn lookup(user: &str) -> Result<Owner> {
        let found = match user.parse::<u32>() {
            Ok(uid) => nix::unistd::User::from_uid(Uid::from_raw(uid)),
            Err(_) => nix::unistd::User::from_name(user),
        };
        match found {
            Ok(Some(u)) => Ok(Owner {
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
            }),
            _ => Err(FileError::UnknownOwner {
                user: user.to_string(),
            }),
        }
    }
}

/// Errors creating, resizing or mapping a backing file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The size is zero or not a whole number of pages.
    #[error(
        "size {size} is not a positive multiple of the {page_size} page size ({page_bytes} bytes)"
    )]
    Size {
        /// Bytes asked for.
        size: u64,
        /// The file's page size.
        page_size: PageSize,
        /// The page size in bytes.
        page_bytes: u64,
    },
    /// A system call on the file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file (or memfd name).
        path: PathBuf,
        /// The kernel's answer.
        source: io::Error,
    },
    /// The file is not on hugetlbfs, or on one of another page size.
    #[error(
        "{path} is not on a hugetlbfs mount of page size {expected} (block size {found} bytes)"
    )]
    NotHugetlbfs {
        /// The file.
        path: PathBuf,
        /// The page size wanted.
        expected: PageSize,
        /// The file system's block size (`statfs`).
        found: u64,
    },
    /// The owner given does not exist.
    #[error("owner {user:?}: no such user")]
    UnknownOwner {
        /// The name or uid given.
        user: String,
    },
    /// Mapping the file failed.
    #[error("mapping {path}: {source}")]
    Map {
        /// The file.
        path: PathBuf,
        /// The mapping error.
        source: MmapError,
    },
}

/// Result of backing-file operations.
pub type Result<T> = std::result::Result<T, FileError>;

/// `HUGETLBFS_MAGIC` from `linux/magic.h`.
pub const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// One guest's memory: a file on hugetlbfs or a hugetlb memfd, always a whole number of
/// pages long.
#[derive(Debug)]
pub struct BackingFile {
    file: File,
    /// The path on hugetlbfs, or a descriptive `memfd:NAME` for memfds.
    path: PathBuf,
    is_memfd: bool,
    page_size: PageSize,
    size: u64,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FileError + 'a {
    move |source| FileError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Checks that `size` is a positive multiple of the page size.
pub fn check_size(size: u64, page_size: PageSize) -> Result<()> {
    if size == 0 || size % page_size.bytes() != 0 {
        return Err(FileError::Size {
            size,
            page_size,
            page_bytes: page_size.bytes(),
        });
    }
    Ok(())
}

/// The hugetlbfs page size of the file system holding `path`, or `None` when it is not
/// hugetlbfs.
pub fn hugetlbfs_page_size(path: &Path) -> io::Result<Option<PageSize>> {
    let st = nix::sys::statfs::statfs(path).map_err(io::Error::from)?;
    if st.filesystem_type().0 as i64 != HUGETLBFS_MAGIC {
        return Ok(None);
    }
    Ok(PageSize::from_bytes(st.block_size() as u64))
}

impl BackingFile {
    /// Creates a new file at `path` (which must not exist) on a hugetlbfs mount of
    /// `page_size`, mode 0600, owned by `owner` when given, and sets its size to `size`.
    /// No page is faulted yet: use [`crate::prefault`] or [`BackingFile::map`] for that.
    ///
    /// On any failure the half-made file is removed.
    pub fn create(
        path: &Path,
        size: u64,
        page_size: PageSize,
        owner: Option<Owner>,
    ) -> Result<BackingFile> {
        check_size(size, page_size)?;
        let dir = path.parent().unwrap_or(Path::new("/"));
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let found = hugetlbfs_page_size(dir).map_err(io_err("statfs", dir))?;
        if found != Some(page_size) {
            let block = nix::sys::statfs::statfs(dir)
                .map(|s| s.block_size() as u64)
                .unwrap_or(0);
            return Err(FileError::NotHugetlbfs {
                path: path.to_path_buf(),
                expected: page_size,
                found: block,
            });
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io_err("create", path))?;
        let mut backing = BackingFile {
            file,
            path: path.to_path_buf(),
            is_memfd: false,
            page_size,
            size: 0,
        };
        let setup = (|| {
            // The umask may have narrowed the mode; 0600 is the contract.
            fs::set_permissions(path, fs::Permissions::from_mode(0o600))
                .map_err(io_err("chmod", path))?;
            if let Some(owner) = owner {
                backing.chown(owner)?;
            }
            backing.set_len(size)
        })();
        if let Err(e) = setup {
            // The error is `e`; the caller's cleanup (or the pool's recovery) removes a file
            // left behind.
            let _ = fs::remove_file(path);
            return Err(e);
        }
        Ok(backing)
    }

    /// Opens an existing hugetlbfs file; its length must be a whole number of pages.
    pub fn open(path: &Path, page_size: PageSize) -> Result<BackingFile> {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK: a file lease someone else holds (a lessee may take one on its file)
        // fails the open with EWOULDBLOCK instead of stalling it for lease-break-time.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(io_err("open", path))?;
        let size = file.metadata().map_err(io_err("stat", path))?.len();
        if hugetlbfs_page_size(path).map_err(io_err("statfs", path))? != Some(page_size) {
            return Err(FileError::NotHugetlbfs {
                path: path.to_path_buf(),
                expected: page_size,
                found: 0,
            });
        }
        if size % page_size.bytes() != 0 {
            return Err(FileError::Size {
                size,
                page_size,
                page_bytes: page_size.bytes(),
            });
        }
        Ok(BackingFile {
            file,
            path: path.to_path_buf(),
            is_memfd: false,
            page_size,
            size,
        })
    }

    /// Creates an anonymous hugetlb memfd (`memfd_create(MFD_HUGETLB | MFD_HUGE_<size>)`) of
    /// `size` bytes; needs no mount. `name` shows in `/proc/PID/fd` as `memfd:NAME`.
    ///
    /// ```no_run
    /// use hugeprep::{hugetlb::BackingFile, PageSize};
    /// let file = BackingFile::memfd("guest0", 64 << 20, PageSize::Size2M).unwrap();
    /// assert_eq!(file.size(), 64 << 20);
    /// ```
    pub fn memfd(name: &str, size: u64, page_size: PageSize) -> Result<BackingFile> {
        check_size(size, page_size)?;
        let path = PathBuf::from(format!("memfd:{name}"));
        let cname = CString::new(name).map_err(|_| FileError::Io {
            op: "memfd_create",
            path: path.clone(),
            source: io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        // The page size goes in the MFD_HUGE_* bits above MFD_HUGETLB.
        let bits =
            libc::MFD_CLOEXEC | libc::MFD_HUGETLB | (page_size.shift() << libc::MFD_HUGE_SHIFT);
        let fd = memfd_create(&cname, MemFdCreateFlag::from_bits_retain(bits)).map_err(|e| {
            FileError::Io {
                op: "memfd_create",
                path: path.clone(),
                source: e.into(),
            }
        })?;
        let file = File::from(fd);
        let mut backing = BackingFile {
            file,
            path,
            is_memfd: true,
            page_size,
            size: 0,
        };
        backing.set_len(size)?;
        Ok(backing)
    }

    /// The file's path (`memfd:NAME` for a memfd).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this is a memfd rather than a file on a mount.
    pub fn is_memfd(&self) -> bool {
        self.is_memfd
    }

    /// Page size of the file's pages.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// Current length in bytes (always whole pages).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// What the file takes from the host, read now (see [`extent_of`]): its length rounded up to whole pages,
    /// or its allocated pages (hugetlbfs counts them in `st_blocks`; another process may
    /// have allocated pages past its end with `FALLOC_FL_KEEP_SIZE`), whichever is larger.
    /// [`BackingFile::size`] when the file cannot be read.
    pub fn extent(&self) -> u64 {
        let Ok(m) = self.file.metadata() else {
            return self.size;
        };
        extent_of(
            m.len(),
            std::os::unix::fs::MetadataExt::blocks(&m),
            self.page_size,
        )
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Hands the file's ownership to `owner` (the VMM's user), mode 0600: whatever mode a
    /// file came with, only its new owner may open it by name.
    pub fn chown(&self, owner: Owner) -> Result<()> {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.file);
        let io = |op: &'static str| {
            move |e: nix::errno::Errno| FileError::Io {
                op,
                path: self.path.clone(),
                source: e.into(),
            }
        };
        nix::sys::stat::fchmod(fd, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(io("chmod"))?;
        nix::unistd::fchown(
            fd,
            Some(Uid::from_raw(owner.uid)),
            Some(Gid::from_raw(owner.gid)),
        )
        .map_err(io("chown"))
    }

    /// Sets the length to `size` whole pages. Growing adds a hole that the caller populates
    /// (only the new tail: the old pages keep their contents); shrinking frees the tail's
    /// pages back to the kernel's pool at once.
    pub fn set_len(&mut self, size: u64) -> Result<()> {
        check_size(size, self.page_size)?;
        self.file
            .set_len(size)
            .map_err(io_err("ftruncate", &self.path))?;
        self.size = size;
        Ok(())
    }

    /// Allocates (and the kernel zeroes) the pages of `len` bytes from `offset`, both whole
    /// pages, without mapping them (`fallocate`, mode 0). The allocation follows the calling
    /// thread's memory policy. Takes the file's inode lock, not the process's `mmap_lock`.
    pub fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(io::Error::from_raw_os_error(libc::EFBIG));
        };
        // The kernel holds the hugetlb fault mutexes while it zeroes each page.
        let _lock_holder = crate::sys::priority::OutOfIdle::enter();
        nix::fcntl::fallocate(
            self.file.as_raw_fd(),
            nix::fcntl::FallocateFlags::empty(),
            off,
            n,
        )
        .map_err(io::Error::from)
    }

    /// Makes a hard link to the file at `to` (hugetlbfs supports them), so that whoever
    /// deletes one name does not free the pages.
    pub fn link(&self, to: &Path) -> Result<()> {
        fs::hard_link(&self.path, to).map_err(io_err("link", to))
    }

    /// Maps the whole file shared and writable.
    pub fn map(&self) -> Result<MmapRegion> {
        self.map_range(0, self.size)
    }

    /// Maps `len` bytes from `offset` (both whole pages) shared and writable.
    pub fn map_range(&self, offset: u64, len: u64) -> Result<MmapRegion> {
        MmapRegion::shared_file(self.file.as_fd(), offset, len as usize).map_err(|source| {
            FileError::Map {
                path: self.path.clone(),
                source,
            }
        })
    }

    /// Renames the file on its mount (the path is updated).
    pub fn rename(&mut self, to: &Path) -> Result<()> {
        fs::rename(&self.path, to).map_err(io_err("rename", to))?;
        self.path = to.to_path_buf();
        Ok(())
    }

    /// Unlinks the file's path; the pages are freed once the last link and mapping are gone.
    pub fn remove(self) -> Result<()> {
        if self.is_memfd {
            return Ok(());
        }
        fs::remove_file(&self.path).map_err(io_err("unlink", &self.path))
    }
}

impl AsFd for BackingFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// What a hugetlbfs file of `length` bytes with `blocks` 512-byte blocks allocated takes
/// from the host: its length rounded up to whole pages of `page_size`, or its allocated
/// pages (hugetlbfs counts them in `st_blocks`, also past its end), whichever is larger.
pub fn extent_of(length: u64, blocks: u64, page_size: PageSize) -> u64 {
    let page = page_size.bytes();
    let length = length.div_ceil(page).saturating_mul(page);
    length.max(blocks.saturating_mul(512))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::HugepageReservation;

    #[test]
    fn an_extent_is_the_larger_of_the_rounded_length_and_the_allocated_pages() {
        let m = 1u64 << 20;
        assert_eq!(extent_of(2 * m + 1, 0, PageSize::Size2M), 4 * m);
        assert_eq!(extent_of(2 * m, 8 * m / 512, PageSize::Size2M), 8 * m);
        assert_eq!(extent_of(u64::MAX, u64::MAX, PageSize::Size2M), u64::MAX);
    }

    #[test]
    fn sizes_must_be_whole_pages() {
        let err = check_size(3 << 20, PageSize::Size2M).unwrap_err();
        assert!(err.to_string().contains("3145728"), "{err}");
        assert!(check_size(0, PageSize::Size2M).is_err());
        assert!(check_size(4 << 20, PageSize::Size2M).is_ok());
    }

    #[test]
    fn memfd_grow_keeps_old_pages_and_shrink_frees_the_tail() {
        let Some(res) = HugepageReservation::ensure_free(PageSize::Size2M, 4).unwrap() else {
            panic!("cannot reserve 4 2M pages");
        };
        let free0 = res.free_pages();
        let mut f = BackingFile::memfd("t", 2 << 20, PageSize::Size2M).unwrap();
        {
            let mut m = f.map().unwrap();
            m.as_mut_slice().fill(0x5a);
        }
        f.set_len(6 << 20).unwrap();
        {
            let m = f.map().unwrap();
            m.populate_write(0, 6 << 20).unwrap();
            assert!(m.as_slice()[..2 << 20].iter().all(|&b| b == 0x5a));
            assert!(m.as_slice()[2 << 20..].iter().all(|&b| b == 0));
        }
        assert_eq!(res.free_pages(), free0 - 3);
        f.set_len(2 << 20).unwrap();
        assert_eq!(res.free_pages(), free0 - 1);
        drop(f);
        assert_eq!(res.wait_free(free0), free0);
    }

    #[test]
    fn create_refuses_a_path_outside_hugetlbfs() {
        let dir = std::env::temp_dir().join(format!("hugeprep-nothuge-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let err = BackingFile::create(&dir.join("f"), 2 << 20, PageSize::Size2M, None).unwrap_err();
        assert!(matches!(err, FileError::NotHugetlbfs { .. }), "{err}");
        assert!(!dir.join("f").exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
