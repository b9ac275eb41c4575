//! The kernel's hugetlb facilities: per-node page pools, hugetlbfs mounts and the backing
//! files that hold guest memory.

pub mod contig;
pub mod dir;
mod file;
pub mod free;
pub mod ledger;
pub mod lock;
pub mod mount;
pub mod pool;

pub use file::{check_size, extent_of, hugetlbfs_page_size, BackingFile, FileError, Owner};
pub use mount::{HugetlbfsMount, MountError, MountOptions, OwnedMount};
pub use pool::{PoolCounts, PoolError, PoolTopUp, Resize, Scope};
