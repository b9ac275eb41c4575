//! libvirt: the `hugeprep libvirt-hook` logic that gives a file-backed domain its memory from
//! the warm pool.
//!
//! With `<memoryBacking><source type='file'/><access mode='shared'/></memoryBacking>` and
//! `memory_backing_dir` on a hugetlbfs mount, libvirt tells QEMU to map the FILE
//! `<memory_backing_dir>/libvirt/qemu/<id>-<name cut to 20>/<alias>` (alias `pc.ram` without
//! guest NUMA, `ram-nodeN` per cell). At `start begin`, when libvirt has made that directory
//! for the user QEMU runs as, the hook takes one lease per backend, has it handed to that
//! user, and hard-links it there; QEMU opens it as is (same inode, no new pages, no zeroing). At
//! `release end` the leases go back to the daemon, which scrubs them.
//!
//! - [`domain`]: the domain XML model.
//! - [`plan`]: opt-in, backends, host node per cell, names and paths (pure).
//! - [`hook`]: the actions against the daemon.
//! - [`config`]: the hook's configuration file.
//! - [`qemu_conf`]: who QEMU runs as (the domain's DAC label, qemu.conf, the packaged default).
//! - [`sandbox`]: a private libvirtd for tests and benchmarks.
//! - [`adopt`]: rewriting a `<hugepages>` domain into file-backed memory the hook serves.

pub mod adopt;
pub mod config;
pub mod domain;
pub mod error;
pub mod hook;
pub mod plan;
pub mod qemu_conf;
#[doc(hidden)]
pub mod sandbox;

pub use config::{Fallback, HookConfig, DEFAULT_CONFIG, RECOMMENDED_MEMORY_BACKING_DIR};
pub use domain::{parse_nodeset, Domain, METADATA_NS};
pub use error::HookError;
pub use hook::{Hook, Outcome};
pub use plan::{lease_name, opts_in, plan, select_host_node, Backend, NotOptedIn, Plan};
