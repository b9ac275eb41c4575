//! Probes for kernel features, made by calling them (a version number says little: distro
//! kernels backport, and sysctls such as `kernel.io_uring_disabled` switch features off).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use nix::sys::memfd::{memfd_create, MemFdCreateFlag};

use crate::page_size::PageSize;
use crate::sys::mmap::{MmapError, MmapRegion};

/// `MADV_POPULATE_WRITE` (Linux 5.14) on one anonymous page.
pub fn madv_populate_write() -> Result<(), MmapError> {
    let region = MmapRegion::anonymous(4096, None)?;
    region.populate_write(0, 4096)
}

/// `pidfd_open` (Linux 5.3) on this process.
pub fn pidfd() -> io::Result<()> {
    crate::sys::pidfd::pidfd_open(std::process::id()).map(drop)
}

/// `io_uring_setup` with one entry (Linux 5.1; `EPERM` when `kernel.io_uring_disabled`
/// forbids it, `ENOSYS` when compiled out).
pub fn io_uring() -> io::Result<()> {
    // struct io_uring_params: 120 bytes, zeroed input.
    let mut params = [0u64; 15];
    // SAFETY: io_uring_setup reads and writes the 120-byte params struct we own for the
    // duration of the call and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
    drop(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
    Ok(())
}

/// `memfd_create(MFD_HUGETLB)` of `page_size` (Linux 4.14); creating one takes no pages.
pub fn memfd_hugetlb(page_size: PageSize) -> io::Result<()> {
    let bits = libc::MFD_CLOEXEC | libc::MFD_HUGETLB | (page_size.shift() << libc::MFD_HUGE_SHIFT);
    memfd_create(c"hugeprep-probe", MemFdCreateFlag::from_bits_retain(bits))
        .map(drop)
        .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_has_what_hugeprep_uses() {
        madv_populate_write().unwrap();
        pidfd().unwrap();
        memfd_hugetlb(PageSize::Size2M).unwrap();
        // io_uring may be disabled by sysctl; the probe must answer either way.
        let _ = io_uring();
    }
}
