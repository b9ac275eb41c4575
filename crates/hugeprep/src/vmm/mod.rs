//! Handing a backing file over to a VMM: the arguments and API bodies each VMM needs to map a
//! hugeprep file instead of allocating (and zeroing) its own memory.
//!
//! The file must be mapped **shared**: with `share=off` (QEMU) or `shared=off`
//! (cloud-hypervisor) the VMM gets private copy-on-write pages, every page is faulted and zeroed
//! again by the kernel, and the prepared memory is wasted.

pub mod cloud_hypervisor;
#[cfg(feature = "kvm")]
pub mod kvm_guest;
pub mod libvirt;
pub mod pvh_guest;
pub mod qemu;
pub mod qemu_hotplug;
#[cfg(feature = "vm-memory")]
pub mod vm_memory;

use std::path::Path;

/// Where a guest's memory is, as every VMM helper needs it.
#[derive(Debug, Clone, Copy)]
pub struct GuestMemoryFile<'a> {
    /// Backend or zone id (`mem0`).
    pub id: &'a str,
    /// The lease's file on hugetlbfs.
    pub path: &'a Path,
    /// Bytes of guest memory (at most the file's length).
    pub size: u64,
    /// NUMA node to bind the VMM's mapping to, when known.
    pub node: Option<u32>,
}

impl<'a> GuestMemoryFile<'a> {
    /// One backend per lease, named by `ids` in order (bound to the lease's node).
    pub fn for_leases(
        leases: impl IntoIterator<Item = &'a crate::pool::LeaseInfo>,
        ids: &'a [String],
    ) -> Vec<GuestMemoryFile<'a>> {
        leases
            .into_iter()
            .zip(ids)
            .map(|(l, id)| GuestMemoryFile {
                id,
                path: &l.path,
                size: l.size,
                node: Some(l.node),
            })
            .collect()
    }
}
