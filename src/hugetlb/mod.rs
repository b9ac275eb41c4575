//! The kernel's hugetlb facilities: per-node page pools, hugetlbfs mounts and the backing
//! files that hold guest memory.

mod file;

pub use file::{BackingFile, FileError, Owner};
