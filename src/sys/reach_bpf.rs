//! The kernel's own counts of who can still reach a pool file, read by a BPF iterator
//! (`src/sys/bpf/reach.bpf.c`) over one thread of the daemon: O(the daemon's descriptors
//! and the file's pages), whatever runs on the host.
//!
//! For the daemon's descriptor of a file, one [`Report`] says:
//! - how many references its dentry has (each open file of it holds one, `O_PATH` ones and
//!   those in flight in a unix socket too, and so does a mount of the file), and whether
//!   the inode has any other dentry (a name unlinked while something held it);
//! - how many mounts of its file system exist, in any mount namespace or none, and how many
//!   of them show less than the whole file system (a bind mount of a directory or the file);
//! - the reference count of every folio in its page cache: the page cache holds one per
//!   page, and every other holder (a mapping, a pin, a pipe buffer, a DMA mapping) adds one.
//!
//! Loading needs `CAP_BPF` and `CAP_PERFMON` (or `CAP_SYS_ADMIN`), BTF of the running kernel
//! (`/sys/kernel/btf/vmlinux`) and a kernel with task iterators given a thread (6.1) and
//! `bpf_loop` (5.17); no LSM or trampoline program is needed. A lockdown in
//! "confidentiality" mode refuses the kernel reads: then [`Probe::load`] fails, and the
//! caller falls back.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use libbpf_rs::{MapCore, MapFlags, MapHandle};

/// The BPF object built by `build.rs`.
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/reach.bpf.o"));

/// `struct target`'s flag: walk the page cache too.
const PROBE_FOLIOS: u32 = 1;

/// The layout version of `struct report` this reader knows.
const REPORT_VERSION: u32 = 1;

/// Bytes of one `struct report`.
const REPORT_BYTES: usize = 120;

/// Why the probe cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// libbpf refused to open or load the object (no BTF, no `CAP_BPF`, a verifier error).
    #[error("cannot load the release proof's BPF program: {0}")]
    Load(String),
    /// The object lacks a part this code expects (a build mismatch).
    #[error("the BPF object has no {0}")]
    Missing(&'static str),
    /// A BPF system call failed.
    #[error("{call}: {source}")]
    Sys {
        /// The call.
        call: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The iterator wrote no report, or one of another layout.
    #[error("the probe of descriptor {fd} wrote {bytes} bytes, not one report")]
    NoReport {
        /// The descriptor asked about.
        fd: i32,
        /// What it wrote.
        bytes: usize,
    },
}

fn sys(call: &'static str) -> impl FnOnce(std::io::Error) -> BpfError {
    move |source| BpfError::Sys { call, source }
}

/// What the kernel says of one file (see the module's notes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// The kernel's `s_dev` of its file system (`MAJOR << 20 | MINOR`).
    pub dev: u32,
    /// Its inode number.
    pub ino: u64,
    /// Its names (`i_nlink`).
    pub nlink: u32,
    /// References to the dentry of the daemon's descriptor.
    pub dentry_count: i32,
    /// Other dentries of the inode.
    pub other_aliases: u32,
    /// More dentries than the probe reads (16).
    pub aliases_truncated: bool,
    /// Mounts of its file system.
    pub mounts: u32,
    /// Mounts whose root is not the file system's root.
    pub partial_mounts: u32,
    /// Mounts whose root is the file itself.
    pub file_mounts: u32,
    /// More mounts than the probe reads (4096).
    pub mounts_truncated: bool,
    /// The page cache was walked.
    pub walked: bool,
    /// The walk could not finish (too large, or a read failed).
    pub incomplete: bool,
    /// Folios in the page cache.
    pub folios: u64,
    /// Base pages they hold.
    pub pages: u64,
    /// Folios referenced beyond the page cache (mapped, pinned, in a pipe, ...).
    pub held_folios: u64,
    /// The first such folio's reference count, pin count and mapping count.
    pub first_held: (i64, i64, i64),
    /// Page-cache entries that are no folio (a change under way).
    pub odd_entries: u64,
    /// xarray nodes read.
    pub nodes: u64,
}

impl Report {
    fn parse(b: &[u8]) -> Option<Report> {
        let u32_at = |at: usize| Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?));
        let u64_at = |at: usize| Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?));
        if b.len() != REPORT_BYTES || u32_at(0)? != REPORT_VERSION {
            return None;
        }
        Some(Report {
            dev: u32_at(4)?,
            ino: u64_at(8)?,
            nlink: u32_at(16)?,
            dentry_count: u32_at(20)? as i32,
            other_aliases: u32_at(24)?,
            aliases_truncated: u32_at(28)? != 0,
            mounts: u32_at(32)?,
            partial_mounts: u32_at(36)?,
            file_mounts: u32_at(40)?,
            mounts_truncated: u32_at(44)? != 0,
            walked: u32_at(48)? != 0,
            incomplete: u32_at(52)? != 0,
            folios: u64_at(56)?,
            pages: u64_at(64)?,
            held_folios: u64_at(72)?,
            first_held: (u64_at(80)? as i64, u64_at(88)? as i64, u64_at(96)? as i64),
            odd_entries: u64_at(104)?,
            nodes: u64_at(112)?,
        })
    }
}

/// The loaded probe.
#[derive(Debug)]
pub struct Probe {
    /// Keeps the programs and maps loaded.
    _object: libbpf_rs::Object,
    prog: OwnedFd,
    targets: MapHandle,
}

impl Probe {
    /// Loads the program (relocated against the running kernel's BTF).
    pub fn load() -> Result<Probe, BpfError> {
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Warn, libbpf_log)));
        let open = libbpf_rs::ObjectBuilder::default()
            .open_memory(OBJECT)
            .map_err(|e| BpfError::Load(e.to_string()))?;
        let object = open.load().map_err(|e| BpfError::Load(e.to_string()))?;
        let prog = object
            .progs()
            .find(|p| p.name() == "hugeprep_probe")
            .ok_or(BpfError::Missing("program hugeprep_probe"))?
            .as_fd()
            .try_clone_to_owned()
            .map_err(sys("dup of the program"))?;
        let targets = object
            .maps()
            .find(|m| m.name() == "targets")
            .ok_or(BpfError::Missing("map targets"))
            .and_then(|m| MapHandle::try_from(&m).map_err(|e| BpfError::Load(e.to_string())))?;
        Ok(Probe {
            _object: object,
            prog,
            targets,
        })
    }

    /// What the kernel says of `file`, a descriptor this thread holds; the page cache is
    /// walked when `folios`.
    pub fn report(&self, file: &File, folios: bool) -> Result<Report, BpfError> {
        let tid = nix::unistd::gettid().as_raw() as u32;
        let fd = file.as_raw_fd();
        let mut target = [0u8; 8];
        target[..4].copy_from_slice(&(fd as u32).to_ne_bytes());
        let flags = if folios { PROBE_FOLIOS } else { 0 };
        target[4..].copy_from_slice(&flags.to_ne_bytes());
        self.targets
            .update(&tid.to_ne_bytes(), &target, MapFlags::ANY)
            .map_err(|e| BpfError::Sys {
                call: "update of the target",
                source: std::io::Error::other(e.to_string()),
            })?;
        let out = self.run(tid);
        let _ = self.targets.delete(&tid.to_ne_bytes());
        let out = out?;
        Report::parse(&out).ok_or(BpfError::NoReport {
            fd,
            bytes: out.len(),
        })
    }

    /// Runs the iterator over thread `tid`'s descriptors; what it wrote.
    fn run(&self, tid: u32) -> Result<Vec<u8>, BpfError> {
        let mut info = libbpf_rs::libbpf_sys::bpf_iter_link_info::default();
        info.task.tid = tid;
        let opts = libbpf_rs::libbpf_sys::bpf_link_create_opts {
            sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_link_create_opts>() as _,
            iter_info: &mut info,
            iter_info_len: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_iter_link_info>() as _,
            ..Default::default()
        };
        // SAFETY: `opts` and the `info` it points to live for the call; the kernel copies
        // them. The program descriptor is valid while `self` lives.
        let link = unsafe {
            libbpf_rs::libbpf_sys::bpf_link_create(
                self.prog.as_raw_fd(),
                0,
                libbpf_rs::libbpf_sys::BPF_TRACE_ITER,
                &opts,
            )
        };
        let link = owned(link).map_err(sys("bpf_link_create of the iterator"))?;
        // SAFETY: takes a link descriptor and returns a new descriptor or a negative errno.
        let iter = unsafe { libbpf_rs::libbpf_sys::bpf_iter_create(link.as_raw_fd()) };
        let mut iter = File::from(owned(iter).map_err(sys("bpf_iter_create"))?);
        let mut out = Vec::with_capacity(REPORT_BYTES);
        iter.read_to_end(&mut out)
            .map_err(sys("read of the iterator"))?;
        Ok(out)
    }
}

/// A descriptor libbpf returned (negative: `-errno`).
fn owned(rc: i32) -> std::io::Result<OwnedFd> {
    if rc < 0 {
        return Err(std::io::Error::from_raw_os_error(-rc));
    }
    // SAFETY: a non-negative return is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc) })
}

fn libbpf_log(level: libbpf_rs::PrintLevel, msg: String) {
    match level {
        libbpf_rs::PrintLevel::Warn => tracing::debug!(target: "libbpf", "{}", msg.trim_end()),
        _ => tracing::trace!(target: "libbpf", "{}", msg.trim_end()),
    }
}

/// The kernel's `s_dev` of a file system whose `st_dev` is `dev` (the kernel keeps
/// `MAJOR << 20 | MINOR`; `stat` encodes it differently).
pub fn kernel_dev(dev: u64) -> u32 {
    ((libc::major(dev) << 20) | libc::minor(dev)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_report_names_the_file_and_counts_every_descriptor() {
        let Ok(probe) = Probe::load() else {
            return; // not root, or no BPF here: the daemon falls back
        };
        let memfd =
            rustix::fs::memfd_create("hugeprep-probe", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let file = File::from(memfd);
        let meta = file.metadata().unwrap();
        let r = probe.report(&file, false).unwrap();
        assert_eq!((r.dev, r.ino), (kernel_dev(meta.dev()), meta.ino()));
        let base = r.dentry_count;
        // A dup is the same open file; an O_PATH descriptor is another.
        let dup = file.try_clone().unwrap();
        assert_eq!(probe.report(&file, false).unwrap().dentry_count, base);
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        let o_path = nix::fcntl::open(
            path.as_str(),
            nix::fcntl::OFlag::O_PATH,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap();
        assert_eq!(probe.report(&file, false).unwrap().dentry_count, base + 1);
        drop(dup);
        nix::unistd::close(o_path).unwrap();
        assert_eq!(probe.report(&file, false).unwrap().dentry_count, base);
    }
}
