//! # hugeprep
//!
//! Pre-zeroed, pre-faulted hugepage memory for virtual machines. Starting a VM with hundreds
//! of GiB of hugepage-backed memory is slow because the kernel zeroes every page when it is
//! first faulted. hugeprep takes that work off the VM-start path:
//!
//! 1. **Reserve** hugepages per NUMA node through sysfs ([`hugetlb`]).
//! 2. **Preallocate** guest backing files in parallel, NUMA-pinned ([`prefault`]).
//! 3. **Zero** with the fastest method for the CPU model ([`clear`], [`policy`], [`cpu`]).
//! 4. **Keep a warm pool** of scrubbed memory and recycle stopped VMs' memory ([`pool`]).
//! 5. **Hand over** memory to the VMM as a hugetlbfs file, an fd or a `GuestMemoryMmap`.
//!
//! The layers, bottom to top: [`sys`] (system calls), [`cpu`], [`clear`], [`policy`],
//! [`topology`], [`hugetlb`], [`prefault`], [`scrub`], [`journal`], [`pool`], [`api`] and
//! [`daemon`]; [`vmm`] hands memory over to QEMU, cloud-hypervisor and `vm-memory`.

pub mod api;
pub mod background;
pub mod clear;
pub mod client;
pub mod cpu;
pub mod daemon;
pub mod doctor;
pub mod hugetlb;
pub mod journal;
pub mod journald;
pub mod page_size;
pub mod perm;
pub mod placement;
pub mod policy;
pub mod pool;
pub mod prefault;
pub mod scrub;
pub mod stats;
pub mod sys;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;
pub mod topology;
pub mod units;
pub mod vmm;

pub use clear::{ClearPlan, Method};
pub use page_size::PageSize;
