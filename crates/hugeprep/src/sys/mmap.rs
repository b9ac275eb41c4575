//! Owned memory mappings: anonymous (optionally hugetlb-backed) scratch buffers and shared
//! mappings of hugetlbfs files or memfds.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use crate::page_size::PageSize;

/// `MADV_POPULATE_WRITE` (Linux 5.14); not yet in every libc release.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Faults in the pages under `buf` for writing (`MADV_POPULATE_WRITE`): for a worker that
/// holds one part of a mapping as a slice. `buf` must start on a 4 KiB boundary (`EINVAL`
/// otherwise); an empty slice does nothing.
pub fn populate_write_slice(buf: &mut [u8]) -> std::io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    // SAFETY: `buf` is mapped, writable memory of this process (we hold it mutably), so
    // madvise can only fault its pages in; no Rust-visible state changes.
    let r = unsafe { libc::madvise(buf.as_mut_ptr().cast(), buf.len(), MADV_POPULATE_WRITE) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A failed memory-mapping call, with the length and errno the kernel gave.
#[derive(Debug, thiserror::Error)]
pub enum MmapError {
    /// `mmap` itself failed; `ENOMEM` on a hugetlb mapping means the pool cannot reserve it.
    #[error("mmap of {len} bytes ({what}) failed: {source}")]
    Map {
        /// Bytes asked for.
        len: usize,
        /// What kind of mapping.
        what: &'static str,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// A zero-length mapping was asked for.
    #[error("cannot map 0 bytes ({what})")]
    Empty {
        /// What kind of mapping.
        what: &'static str,
    },
    /// `madvise`/`mlock` on a range of the mapping failed.
    #[error("{call} on bytes {offset}..{end} of a {len}-byte mapping failed: {source}")]
    Range {
        /// The call that failed.
        call: &'static str,
        /// Start of the range.
        offset: usize,
        /// End of the range.
        end: usize,
        /// Length of the whole mapping.
        len: usize,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

/// An owned `mmap` region, unmapped on drop.
///
/// The region is readable and writable. It hands out slices, so callers must not let another
/// process truncate a file they map while they hold the mapping (hugeprep owns every file it
/// maps).
#[derive(Debug)]
pub struct MmapRegion {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; access goes through `&`/`&mut`
// borrows, so Rust's aliasing rules apply across threads as for a `Vec<u8>`.
unsafe impl Send for MmapRegion {}
// SAFETY: as above; shared references only allow reads.
unsafe impl Sync for MmapRegion {}

impl MmapRegion {
    /// Maps `len` bytes of private anonymous memory, backed by hugepages of `huge` when given.
    ///
    /// A hugetlb mapping is made without `MAP_NORESERVE`, so the kernel reserves every page at
    /// `mmap` time and fails with `ENOMEM` up front when the pool is too small, instead of
    /// sending `SIGBUS` on a later fault. `len` must be a multiple of the page size for hugetlb.
    ///
    /// ```
    /// use hugeprep::sys::mmap::MmapRegion;
    /// let mut r = MmapRegion::anonymous(1 << 20, None).unwrap();
    /// r.as_mut_slice()[0] = 7;
    /// assert_eq!(r.as_slice()[0], 7);
    /// ```
    pub fn anonymous(len: usize, huge: Option<PageSize>) -> Result<Self, MmapError> {
        let what = if huge.is_some() {
            "anonymous hugetlb"
        } else {
            "anonymous"
        };
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if let Some(page) = huge {
            flags |= libc::MAP_HUGETLB | ((page.shift() as libc::c_int) << libc::MAP_HUGE_SHIFT);
        }
        Self::map(len, flags, -1, 0, what)
    }

    /// Maps `len` bytes of `fd` from `offset`, shared and writable, so that stores reach the
    /// file's pages (hugetlbfs file or memfd).
    pub fn shared_file(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Self, MmapError> {
        Self::map(
            len,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset as libc::off_t,
            "shared file",
        )
    }

    fn map(
        len: usize,
        flags: libc::c_int,
        fd: libc::c_int,
        offset: libc::off_t,
        what: &'static str,
    ) -> Result<Self, MmapError> {
        if len == 0 {
            return Err(MmapError::Empty { what });
        }
        let _lock_holder = crate::sys::priority::OutOfIdle::enter();
        // SAFETY: a fresh mapping at an address of the kernel's choosing aliases nothing; the
        // result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(MmapError::Map {
                len,
                what,
                source: std::io::Error::last_os_error(),
            });
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(MmapError::Map {
            len,
            what,
            source: std::io::Error::from_raw_os_error(libc::EFAULT),
        })?;
        Ok(MmapRegion { ptr, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never true: zero-length mappings are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start address, for kernels and system calls that take raw pointers.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The whole region as bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is a live, readable mapping of `len` bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole region as mutable bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live, writable mapping of `len` bytes owned by `self`, and
        // `&mut self` guarantees the slice is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn check_range(&self, call: &'static str, offset: usize, len: usize) -> Result<(), MmapError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MmapError::Range {
                call,
                offset,
                end: offset.saturating_add(len),
                len: self.len,
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            }),
        }
    }

    fn range_call(
        &self,
        call: &'static str,
        offset: usize,
        len: usize,
        f: impl FnOnce(*mut libc::c_void, usize) -> libc::c_int,
    ) -> Result<(), MmapError> {
        self.check_range(call, offset, len)?;
        // SAFETY: the range was checked to lie inside the mapping.
        let addr = unsafe { self.ptr.as_ptr().add(offset) };
        if f(addr.cast(), len) == 0 {
            Ok(())
        } else {
            Err(MmapError::Range {
                call,
                offset,
                end: offset + len,
                len: self.len,
                source: std::io::Error::last_os_error(),
            })
        }
    }

    /// Faults in `len` bytes from `offset` for writing in one call (`MADV_POPULATE_WRITE`):
    /// the kernel allocates and zeroes every missing page. Fails with `EINVAL` on kernels
    /// before 5.14 and `ENOMEM`/`EFAULT` when the pool runs out (never `SIGBUS`).
    pub fn populate_write(&self, offset: usize, len: usize) -> Result<(), MmapError> {
        let _lock_holder = crate::sys::priority::OutOfIdle::enter();
        // SAFETY: madvise on a checked range of our own mapping changes no Rust-visible state
        // beyond faulting pages in.
        self.range_call("madvise(MADV_POPULATE_WRITE)", offset, len, |a, l| unsafe {
            libc::madvise(a, l, MADV_POPULATE_WRITE)
        })
    }

    /// Locks `len` bytes from `offset` in memory (`mlock`): the bulk pin that makes later
    /// VFIO pins only take references.
    pub fn lock(&self, offset: usize, len: usize) -> Result<(), MmapError> {
        // SAFETY: mlock on a checked range of our own mapping.
        self.range_call("mlock", offset, len, |a, l| unsafe { libc::mlock(a, l) })
    }

    /// Which pages of the given range are resident, one entry per 4 KiB base page
    /// (`mincore`), for proving that a populate left no hole.
    pub fn resident(&self, offset: usize, len: usize) -> Result<Vec<bool>, MmapError> {
        let pages = len.div_ceil(4096);
        let mut vec = vec![0u8; pages];
        // SAFETY: `vec` has one byte per 4 KiB page of the checked range, as mincore requires.
        self.range_call("mincore", offset, len, |a, l| unsafe {
            libc::mincore(a, l, vec.as_mut_ptr())
        })?;
        Ok(vec.into_iter().map(|b| b & 1 == 1).collect())
    }
}

impl Drop for MmapRegion {
    fn drop(&mut self) {
        let _lock_holder = crate::sys::priority::OutOfIdle::enter();
        // SAFETY: unmapping exactly the region this value owns; no borrow outlives `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_round_trip_and_populate() {
        let mut r = MmapRegion::anonymous(8 << 20, None).unwrap();
        r.populate_write(0, 8 << 20).unwrap();
        assert!(r.resident(0, 8 << 20).unwrap().iter().all(|&b| b));
        r.as_mut_slice().fill(0xa5);
        assert!(r.as_slice().iter().all(|&b| b == 0xa5));
    }

    #[test]
    fn ranges_outside_the_mapping_are_refused() {
        let r = MmapRegion::anonymous(4096, None).unwrap();
        let err = r.populate_write(0, 8192).unwrap_err();
        assert!(err.to_string().contains("0..8192"), "{err}");
        assert!(matches!(
            MmapRegion::anonymous(0, None),
            Err(MmapError::Empty { .. })
        ));
    }
}
