//! rust-vmm VMMs: a `vm_memory::GuestMemoryMmap` over a prepared backing file, so a VMM built on
//! `vm-memory` uses hugeprep's pages directly (mapped shared, no page faulted twice).

use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

use crate::hugetlb::BackingFile;

/// Building the guest memory failed.
#[derive(Debug, thiserror::Error)]
pub enum VmMemoryError {
    /// Duplicating the file descriptor failed.
    #[error("duplicating the descriptor of {path}: {source}")]
    Dup {
        /// The backing file.
        path: std::path::PathBuf,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// vm-memory refused the region (size, overflow or mmap failure).
    #[error("mapping {path} as guest memory at {base:#x}: {source}")]
    Region {
        /// The backing file.
        path: std::path::PathBuf,
        /// Guest physical base address.
        base: u64,
        /// vm-memory's error.
        source: vm_memory::mmap::Error,
    },
}

/// Maps all of `file` as guest memory starting at guest physical address `base`.
///
/// ```no_run
/// use hugeprep::{hugetlb::BackingFile, vmm::vm_memory::guest_memory, PageSize};
/// use vm_memory::{Bytes, GuestAddress};
/// let file = BackingFile::memfd("guest", 64 << 20, PageSize::Size2M).unwrap();
/// let mem = guest_memory(&file, GuestAddress(0)).unwrap();
/// mem.write_obj(0xdead_beef_u32, GuestAddress(0x1000)).unwrap();
/// ```
pub fn guest_memory(
    file: &BackingFile,
    base: GuestAddress,
) -> Result<GuestMemoryMmap, VmMemoryError> {
    let dup = file
        .file()
        .try_clone()
        .map_err(|source| VmMemoryError::Dup {
            path: file.path().to_path_buf(),
            source,
        })?;
    let range = (base, file.size() as usize, Some(FileOffset::new(dup, 0)));
    GuestMemoryMmap::from_ranges_with_files([range]).map_err(|source| VmMemoryError::Region {
        path: file.path().to_path_buf(),
        base: base.0,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::HugepageReservation;
    use crate::PageSize;
    use vm_memory::{Bytes, GuestMemory};

    #[test]
    fn guest_writes_land_in_the_backing_file() {
        let Some(_res) = HugepageReservation::ensure_free(PageSize::Size2M, 2).unwrap() else {
            panic!("cannot reserve 2 pages of 2M");
        };
        let file = BackingFile::memfd("vmm-test", 4 << 20, PageSize::Size2M).unwrap();
        // vm-memory maps with MAP_NORESERVE; fault the pages in through a reserving mapping
        // first, as hugeprep does for every file it hands over.
        file.map().unwrap().populate_write(0, 4 << 20).unwrap();
        let mem = guest_memory(&file, GuestAddress(0x1_0000_0000)).unwrap();
        assert_eq!(mem.num_regions(), 1);
        mem.write_obj(0x5a5a_u16, GuestAddress(0x1_0020_0000))
            .unwrap();
        let view = file.map().unwrap();
        assert_eq!(&view.as_slice()[2 << 20..(2 << 20) + 2], &[0x5a, 0x5a]);
    }
}
