//! What the tests share with the benchmarks (`hugeprep-bench`): the QEMU launcher ([`qemu`]),
//! the cgroups a VMM runs in ([`cgroup`]) and a CPU hog ([`hog`]). A dev-dependency of the
//! root package's tests and a dependency of the benchmarks; never of the library.

pub mod cgroup;
pub mod hog;
pub mod qemu;
