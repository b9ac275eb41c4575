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

/// Mounts of a file system the program reads (`MAX_MOUNTS` in `reach.bpf.c`).
pub const MAX_MOUNTS: u32 = 4096;

/// `struct target`'s flag: walk the page cache too.
const PROBE_FOLIOS: u32 = 1;

/// The layout version of `struct report` this reader knows.
const REPORT_VERSION: u32 = 3;

/// Bytes of one `struct report`.
const REPORT_BYTES: usize = 144 + 8 * PINNED_AT;

/// Pinned folios whose page-cache index a report gives (`PINNED_AT` in `reach.bpf.c`).
pub const PINNED_AT: usize = 16;

/// Bytes of `struct target` (`fd`, `flags`, `run`, `slot`, `pad`).
const TARGET_BYTES: usize = 24;

/// Slots of the `walks` map (`WALK_SLOTS` in `reach.bpf.c`): runs at the same time.
const WALK_SLOTS: u32 = 64;

/// The last run number given out ([`Probe::report`]): each run has its own, and its report
/// must carry it back.
static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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
    /// The report answers another run than this one, or another run used the same scratch
    /// while it was written: nothing in it can be trusted.
    #[error("the probe of descriptor {fd} answered run {got}, not run {run}, or shared its scratch with another run")]
    OtherRun {
        /// The descriptor asked about.
        fd: i32,
        /// This run's number.
        run: u64,
        /// The number the report carries.
        got: u64,
    },
    /// Every slot of the walks' scratch is taken by another run.
    #[error("all {WALK_SLOTS} slots of the probe's scratch are taken by other runs")]
    Busy,
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
    /// The run this report answers ([`Probe::report`] checks it).
    pub run: u64,
    /// Another run used this run's scratch meanwhile ([`Probe::report`] refuses it).
    pub interleaved: bool,
    /// Folios referenced beyond the page cache (mapped, pinned, in a pipe, ...).
    pub held_folios: u64,
    /// The first such folio's reference count, pin count and mapping count.
    pub first_held: (i64, i64, i64),
    /// Held folios whose references a mapping does not explain (a pin, a pipe buffer):
    /// a truncate would leave them with their holder.
    pub pinned_folios: u64,
    /// The page-cache index (in base pages, as kernels since 6.7 keep hugetlb's) of the
    /// first [`PINNED_AT`] of them.
    pub pinned_at: [u64; PINNED_AT],
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
            run: u64_at(120)?,
            interleaved: u32_at(128)? != 0,
            pinned_folios: u64_at(136)?,
            pinned_at: {
                let mut at = [0; PINNED_AT];
                for (i, a) in at.iter_mut().enumerate() {
                    *a = u64_at(144 + 8 * i)?;
                }
                at
            },
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
    /// The slots of `walks` taken by runs under way (bit N: slot N).
    slots: std::sync::Mutex<u64>,
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
            slots: std::sync::Mutex::new(0),
        })
    }

    /// What the kernel says of `file`, a descriptor this thread holds; the page cache is
    /// walked when `folios`.
    ///
    /// Safe to call from any number of threads at once, whatever their priorities: the
    /// walk's scratch is a slot of the `walks` map taken for this run alone (and given back
    /// after it), never memory shared by the runs of one CPU, and the report must carry
    /// back this run's number and say that no other run used the slot meanwhile.
    pub fn report(&self, file: &File, folios: bool) -> Result<Report, BpfError> {
        let slot = self.take_slot()?;
        let out = self.report_in(slot, file, folios);
        self.give_back(slot);
        out
    }

    /// Takes a free slot of the walks' scratch.
    fn take_slot(&self) -> Result<u32, BpfError> {
        let mut taken = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (!*taken).trailing_zeros();
        if slot >= WALK_SLOTS {
            return Err(BpfError::Busy);
        }
        *taken |= 1 << slot;
        Ok(slot)
    }

    fn give_back(&self, slot: u32) {
        let mut taken = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        *taken &= !(1u64 << slot);
    }

    /// [`Probe::report`] with the walk in `slot`.
    fn report_in(&self, slot: u32, file: &File, folios: bool) -> Result<Report, BpfError> {
        let tid = nix::unistd::gettid().as_raw() as u32;
        let fd = file.as_raw_fd();
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let mut target = [0u8; TARGET_BYTES];
        target[..4].copy_from_slice(&(fd as u32).to_ne_bytes());
        let flags = if folios { PROBE_FOLIOS } else { 0 };
        target[4..8].copy_from_slice(&flags.to_ne_bytes());
        target[8..16].copy_from_slice(&run.to_ne_bytes());
        target[16..20].copy_from_slice(&slot.to_ne_bytes());
        self.targets
            .update(&tid.to_ne_bytes(), &target, MapFlags::ANY)
            .map_err(|e| BpfError::Sys {
                call: "update of the target",
                source: std::io::Error::other(e.to_string()),
            })?;
        let out = self.run(tid);
        // The run's outcome is what counts: an entry left behind is replaced by this
        // thread's next update (`MapFlags::ANY`) and names a file only this probe opens.
        let _ = self.targets.delete(&tid.to_ne_bytes());
        let out = out?;
        let report = Report::parse(&out).ok_or(BpfError::NoReport {
            fd,
            bytes: out.len(),
        })?;
        if report.run != run || report.interleaved {
            return Err(BpfError::OtherRun {
                fd,
                run,
                got: report.run,
            });
        }
        Ok(report)
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

    /// Runs the calling thread under `policy` (SCHED_FIFO at priority 1, or a priority-0
    /// policy) on CPU 0 only.
    fn on_cpu0_as(policy: libc::c_int) {
        // SAFETY: a zeroed cpu_set_t with one bit set, read by the call only.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: CPU 0 is within the set's bits.
        unsafe { libc::CPU_SET(0, &mut set) };
        // SAFETY: pid 0 is the calling thread; `set` lives for the call.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        assert_eq!(
            rc,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
        let param = libc::sched_param {
            sched_priority: i32::from(policy == libc::SCHED_FIFO),
        };
        // SAFETY: pid 0 is the calling thread; `param` lives for the call.
        let rc = unsafe { libc::sched_setscheduler(0, policy, &param) };
        assert_eq!(
            rc,
            0,
            "sched_setscheduler: {}",
            std::io::Error::last_os_error()
        );
    }

    /// The daemon proves from an API thread at SCHED_FIFO and from its worker at SCHED_IDLE:
    /// runs on one CPU at different priorities, which preempt each other in the middle of a
    /// walk, each get the report of their own file and run (before, every run of a CPU
    /// shared one scratch, and a preempting run could rewrite another's report).
    #[test]
    fn runs_at_different_priorities_on_one_cpu_each_answer_their_own_file() {
        let Ok(probe) = Probe::load() else {
            return; // not root, or no BPF here: the daemon falls back
        };
        let probe = std::sync::Arc::new(probe);
        let policies = [
            libc::SCHED_FIFO,
            libc::SCHED_OTHER,
            libc::SCHED_BATCH,
            libc::SCHED_IDLE,
        ];
        let threads: Vec<_> = policies
            .iter()
            .enumerate()
            .map(|(i, &policy)| {
                let probe = std::sync::Arc::clone(&probe);
                std::thread::spawn(move || {
                    on_cpu0_as(policy);
                    // A file of its own, of a size no other thread's has.
                    let memfd = rustix::fs::memfd_create(
                        "hugeprep-probe-prio",
                        rustix::fs::MemfdFlags::CLOEXEC,
                    )
                    .unwrap();
                    let file = File::from(memfd);
                    let pages = 16 * (i as u64 + 1);
                    std::io::Write::write_all(&mut &file, &vec![1u8; pages as usize * 4096])
                        .unwrap();
                    let meta = file.metadata().unwrap();
                    let mut wrong = Vec::new();
                    for n in 0..3000u32 {
                        match probe.report(&file, true) {
                            // Folios, not pages: a memfd's small folios have no page count to read.
                            Ok(r) if (r.ino, r.folios, r.walked) == (meta.ino(), pages, true) => {}
                            other => wrong.push(format!("run {n}: {other:?}")),
                        }
                        if policy == libc::SCHED_FIFO && n % 4 == 0 {
                            // Wake later, in the middle of another thread's walk.
                            std::thread::sleep(std::time::Duration::from_micros(50));
                        }
                    }
                    (policy, wrong)
                })
            })
            .collect();
        for t in threads {
            let (policy, wrong) = t.join().unwrap();
            assert!(
                wrong.is_empty(),
                "policy {policy}: {} wrong answers, the first: {}",
                wrong.len(),
                wrong[0]
            );
        }
    }
}
