//! Thin, safe wrappers over the system calls hugeprep needs. Together with `clear::kernels`
//! this is where the crate's `unsafe` code lives; everything above it is safe Rust.

pub mod activation;
pub mod affinity;
pub mod cgroup;
pub mod fanotify;
#[cfg(feature = "kvm")]
pub mod kvm;
pub mod lease;
pub mod localtime;
pub mod mmap;
pub mod numa;
pub mod peercred;
pub mod pidfd;
pub mod pin;
pub mod priority;
pub mod probe;
pub mod reach_bpf;
pub mod signals;
