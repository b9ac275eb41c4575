//! Long-term pinning of a shared file mapping by io_uring buffer registration
//! (`IORING_REGISTER_BUFFERS`).
//!
//! Registering buffers pins every page with `pin_user_pages(FOLL_LONGTERM)`, the path VFIO
//! type1 and iommufd use for guest RAM: never-faulted pages are faulted (and zeroed) inside
//! the pin, pages in ZONE_MOVABLE or CMA are migrated out first, and the pinned pages can be
//! neither migrated nor reclaimed until the buffers are unregistered. Without CAP_IPC_LOCK
//! the pinned bytes count against RLIMIT_MEMLOCK.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::mmap::{MmapError, MmapRegion};

/// The kernel's limit on one registered buffer (`SZ_1G` in `io_uring/rsrc.c`).
pub const MAX_IOVEC: usize = 1 << 30;

const IORING_REGISTER_BUFFERS: libc::c_uint = 0;
const IORING_UNREGISTER_BUFFERS: libc::c_uint = 1;
/// `sizeof(struct io_uring_params)`.
const PARAMS_WORDS: usize = 30;

/// Pinning failed; nothing stays pinned or mapped.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// Mapping the file failed.
    #[error("pin: {0}")]
    Map(#[from] MmapError),
    /// The kernel has no io_uring, or it is disabled (`kernel.io_uring_disabled`).
    #[error("pin: this kernel offers no io_uring (io_uring_setup: {source}); long-term pinning needs Linux 5.1 or later with kernel.io_uring_disabled=0")]
    NoIoUring {
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// Pinning `len` bytes would exceed RLIMIT_MEMLOCK (the process has no CAP_IPC_LOCK).
    #[error("pin: {len} bytes exceed RLIMIT_MEMLOCK ({limit} bytes) of the daemon; raise LimitMEMLOCK= in its unit or run it with CAP_IPC_LOCK")]
    MemlockLimit {
        /// Bytes to pin.
        len: usize,
        /// The soft limit in force.
        limit: u64,
    },
    /// The kernel could not pin the pages (out of memory, or the file has holes it cannot
    /// fault).
    #[error("pin: registering {len} bytes as {chunks} buffers of at most 1 GiB failed: {source}")]
    Register {
        /// Bytes to pin.
        len: usize,
        /// Number of iovecs.
        chunks: usize,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

/// A shared mapping of a file with every page long-term pinned; the pin is dropped (buffers
/// unregistered, ring closed) before the mapping is unmapped, on drop.
#[derive(Debug)]
pub struct LongTermPin {
    ring: OwnedFd,
    map: MmapRegion,
    took: Duration,
}

/// The soft RLIMIT_MEMLOCK of this process, in bytes (`u64::MAX` when unlimited).
pub fn memlock_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the value we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return u64::MAX;
    }
    lim.rlim_cur
}

/// The error for a failed registration: `ENOMEM` within a memlock limit the pin exceeds is
/// the limit, anything else the kernel's own answer.
fn register_error(len: usize, chunks: usize, source: std::io::Error, limit: u64) -> PinError {
    if source.raw_os_error() == Some(libc::ENOMEM) && (len as u64) > limit {
        PinError::MemlockLimit { len, limit }
    } else {
        PinError::Register {
            len,
            chunks,
            source,
        }
    }
}

impl LongTermPin {
    /// Maps `len` bytes of `fd` shared and pins every page.
    pub fn pin_file(fd: BorrowedFd<'_>, len: usize) -> Result<LongTermPin, PinError> {
        let map = MmapRegion::shared_file(fd, 0, len)?;
        Self::pin(map)
    }

    /// Pins every page of `map` (faulting the missing ones inside the pin).
    pub fn pin(map: MmapRegion) -> Result<LongTermPin, PinError> {
        let ring = setup_ring()?;
        let iovecs: Vec<libc::iovec> = (0..map.len())
            .step_by(MAX_IOVEC)
            .map(|off| libc::iovec {
                // SAFETY: `off` < len, so the pointer stays inside the mapping.
                iov_base: unsafe { map.as_ptr().add(off) }.cast(),
                iov_len: (map.len() - off).min(MAX_IOVEC),
            })
            .collect();
        let started = Instant::now();
        // SAFETY: the iovecs describe live memory of `map`, which outlives the registration
        // (Drop unregisters before unmapping); the kernel only reads the array.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                ring.as_raw_fd(),
                IORING_REGISTER_BUFFERS,
                iovecs.as_ptr(),
                iovecs.len() as libc::c_uint,
            )
        };
        if rc < 0 {
            let source = std::io::Error::last_os_error();
            return Err(register_error(
                map.len(),
                iovecs.len(),
                source,
                memlock_limit(),
            ));
        }
        Ok(LongTermPin {
            ring,
            map,
            took: started.elapsed(),
        })
    }

    /// Bytes pinned.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never true: empty mappings are refused.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// How long the registration (the pin itself, without the mmap) took.
    pub fn took(&self) -> Duration {
        self.took
    }

    /// The pinned mapping.
    pub fn mapping(&self) -> &MmapRegion {
        &self.map
    }

    /// Drops the pin now and returns how long the unpin took; the mapping goes with it.
    pub fn unpin(self) -> Duration {
        let t = Instant::now();
        self.unregister();
        let took = t.elapsed();
        drop(self);
        took
    }

    fn unregister(&self) {
        // SAFETY: unregistering this ring's buffers; no pointer is passed.
        unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.ring.as_raw_fd(),
                IORING_UNREGISTER_BUFFERS,
                std::ptr::null::<libc::c_void>(),
                0 as libc::c_uint,
            );
        }
    }
}

impl Drop for LongTermPin {
    fn drop(&mut self) {
        // Synchronously: closing the ring alone unpins later, from a kernel worker. A second
        // unregister after `unpin` returns ENXIO, which is harmless.
        self.unregister();
    }
}

fn setup_ring() -> Result<OwnedFd, PinError> {
    let mut params = [0u32; PARAMS_WORDS];
    // SAFETY: `params` is a zeroed `struct io_uring_params` of the kernel's size, written by
    // the kernel; one entry is the smallest ring.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            1 as libc::c_uint,
            params.as_mut_ptr(),
        )
    };
    if fd < 0 {
        let source = std::io::Error::last_os_error();
        return Err(PinError::NoIoUring { source });
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_anonymous_memory_and_unpins() {
        let map = MmapRegion::anonymous(4 << 20, None).unwrap();
        let pin = LongTermPin::pin(map).unwrap();
        assert_eq!(pin.len(), 4 << 20);
        // The pin faulted every page in.
        assert!(pin
            .mapping()
            .resident(0, 4 << 20)
            .unwrap()
            .iter()
            .all(|&b| b));
        pin.unpin();
    }

    #[test]
    fn enomem_above_the_memlock_limit_names_the_limit() {
        let e = std::io::Error::from_raw_os_error(libc::ENOMEM);
        let err = register_error(2 << 30, 2, e, 64 << 10);
        assert!(matches!(err, PinError::MemlockLimit { .. }));
        let msg = err.to_string();
        assert!(msg.contains("RLIMIT_MEMLOCK (65536 bytes)"), "{msg}");
        assert!(msg.contains("2147483648 bytes"), "{msg}");
        let e = std::io::Error::from_raw_os_error(libc::ENOMEM);
        assert!(matches!(
            register_error(4096, 1, e, u64::MAX),
            PinError::Register { .. }
        ));
    }
}
