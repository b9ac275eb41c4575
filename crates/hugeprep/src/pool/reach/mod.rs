//! Proof that a released pool file can be reached by nobody but the daemon, so that its
//! pages may be scrubbed in place and leased again (see `docs/security.md`).
//!
//! The kernel never gives a hugetlb page to a new owner while anyone references it. The
//! daemon's fast path reuses the same pages, so it recycles a released file in place only
//! when nobody else can reach them; otherwise the file takes the kernel's path.
//!
//! By default the proof reads the kernel's own reference counts of the file ([`kernel`],
//! [`Method::KernelCounts`]): its cost is bounded by the file, and nobody's open waits for
//! the daemon. Where the counts cannot be read it falls back to the walk
//! ([`Method::ProcWalk`]), which holds when each of these holds:
//!
//! 1. the file was watched from before its lease path existed until now (fanotify open
//!    permission events, [`crate::sys::fanotify`]: each opener is recorded before its open
//!    returns), with no event lost;
//! 2. it has one name, the daemon's own (`st_nlink == 1`): no hard link elsewhere;
//! 3. it has no open file but the daemon's anywhere (a write lease is granted,
//!    [`crate::sys::lease`]): no descriptor in any process or in flight, no mapping, no
//!    io_uring registered file;
//! 4. every process that opened it has exited, and with it everything it started: one of
//!    the non-root cgroups it was in when it opened is empty ([`cgroup`]);
//! 5. no process but the daemon holds a descriptor of it (an `O_PATH` one is no open file
//!    and makes no open event), a mount inside its hugetlbfs (a bind mount in a user
//!    namespace), or an io_uring with registered buffers, the page reference that can outlive
//!    all of the above in a process outside the openers' cgroups ([`scan`]);
//! 6. no process opened it while the proof ran; from then until the next lease, opens by
//!    anyone but the daemon and root are refused.
//!
//! Page references (a long-term pin, pages `vmsplice`d into a pipe, a DMA mapping) can only
//! be taken through a mapping, and a mapping only through an open file: 1-4 bound who can
//! hold them. What no check sees is a page reference other than an io_uring buffer (a pipe,
//! a DMA mapping), or a descriptor in flight in a unix socket, that an opener handed to a
//! live process outside its cgroups; `recycle = "kernel"` closes that too.

pub mod cgroup;
pub mod kernel;
mod reader;
pub mod scan;
mod unproven;

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sys::fanotify::OpenWatch;
use crate::sys::reach_bpf::Probe;
pub use unproven::Unproven;

/// Openers recorded per file before the record stops proving anything (each keeps a pidfd).
const MAX_OPENERS: usize = 64;

/// How long the reader thread may go without finishing a turn (a wait of at most 250 ms, or
/// a batch of answers) before it is called stalled: opens of leased files wait for it.
pub const READER_STALL: Duration = Duration::from_secs(10);

/// A process that opened a watched file.
#[derive(Debug)]
struct Opener {
    pid: u32,
    pidfd: Option<OwnedFd>,
    /// Its non-root cgroups when it opened; `None` when they could not be read while it ran.
    cgroups: Option<Vec<cgroup::Cgroup>>,
}

impl Opener {
    /// Whether this opener is gone with everything it could have handed on: it exited, and
    /// one of its cgroups is empty (what it forked stayed there). Any doubt is an
    /// [`Unproven`].
    fn gone(&self) -> Result<(), Unproven> {
        let fail = |step: &'static str| {
            move |e: std::io::Error| Unproven::Error {
                step,
                message: e.to_string(),
            }
        };
        let unknown = || Unproven::OpenerUnknown { pid: self.pid };
        let pidfd = self.pidfd.as_ref().ok_or_else(unknown)?;
        if !crate::sys::pidfd::exited(pidfd.as_fd()).map_err(fail("pidfd"))? {
            return Err(Unproven::OpenerAlive { pid: self.pid });
        }
        let cgroups = self.cgroups.as_ref().ok_or_else(unknown)?;
        for cg in cgroups {
            if cg.is_empty().map_err(fail("cgroup"))? {
                return Ok(());
            }
        }
        Err(Unproven::OpenerCgroup {
            pid: self.pid,
            cgroups: cgroups
                .iter()
                .map(|c| c.dir.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

#[derive(Debug, Default)]
struct Record {
    /// No event was lost and no mark failed since the watch began.
    complete: bool,
    openers: Vec<Opener>,
    /// When a process other than the daemon first opened the file (its VMM starting).
    first_open: Option<Instant>,
    /// Proven out of reach and recycled: until the next lease, an open by anyone but the
    /// daemon and root is refused (one that passed its permission check before the lease
    /// path went would otherwise reach the next lessee's memory).
    recycled: bool,
    /// Kernel counts: opens by anyone but the daemon and root are refused, from before the
    /// counts are read until the next lease.
    refusing: bool,
    /// Kernel counts: opens by other processes reported since the lease began.
    opens: usize,
}

#[derive(Debug, Default)]
struct Watched {
    by_inode: HashMap<(u64, u64), u64>,
    files: HashMap<u64, Record>,
}

/// What a successful proof looked at.
#[derive(Debug, Clone, Copy)]
pub struct Proof {
    /// Processes other than the daemon that opened the file during the lease.
    pub openers: usize,
    /// How long the proof took.
    pub took: Duration,
}

/// How releases are proven (see `docs/security.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// The kernel's own reference counts of the file, read by a BPF iterator: cost bounded
    /// by the file ([`kernel`]).
    KernelCounts,
    /// Openers recorded by fanotify permission events, their cgroups, and a walk of every
    /// thread in `/proc` ([`scan`]): cost grows with the host.
    ProcWalk,
    /// No fanotify watch: every release takes the kernel's path.
    None,
}

impl Method {
    /// A short label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Method::KernelCounts => "kernel-counts",
            Method::ProcWalk => "proc-walk",
            Method::None => "none",
        }
    }
}

/// The open watch over leased files and the proofs made from it.
#[derive(Debug)]
pub struct Reach {
    watch: Option<OpenWatch>,
    /// The kernel-counts probe; `None`: the proof walks `/proc`.
    probe: Option<Probe>,
    /// Whether the kernel's counts of a quiet file match the proof's model.
    model: Mutex<kernel::Model>,
    /// Why the model check failed, when it did ([`kernel::Model::Differs`]).
    model_error: Mutex<Option<String>>,
    hierarchies: cgroup::Hierarchies,
    watched: Mutex<Watched>,
    /// Milliseconds after `born` at which the reader thread last finished a turn.
    beat_ms: AtomicU64,
    born: Instant,
    /// Proofs whose file system had more mounts than the kernel counts' walk reads.
    beyond_mount_bound: AtomicU64,
}

impl Reach {
    /// Starts the watch and the thread that reads its events as they come (each opener's
    /// open waits for it; see [`crate::sys::fanotify`]). Without fanotify (no
    /// CAP_SYS_ADMIN, an old kernel) or that thread, every proof fails and released memory
    /// takes the kernel's path; the log says so once. The thread ends once the last
    /// reference is gone.
    pub fn new() -> Arc<Reach> {
        Reach::proving(None)
    }

    /// [`Reach::new`] with the method chosen: `Some(Method::ProcWalk)` never loads the
    /// kernel counts' probe (as `HUGEPREP_REACH=walk` does); `None` prefers the counts.
    pub fn proving(method: Option<Method>) -> Arc<Reach> {
        let watch = match OpenWatch::new() {
            Ok(w) => Some(w),
            Err(err) => {
                tracing::warn!(%err, "no fanotify open watch: released leases take the kernel's path (truncate and refault)");
                None
            }
        };
        let hierarchies = cgroup::Hierarchies::detect().unwrap_or_else(|err| {
            tracing::warn!(%err, "cannot read the cgroup mounts: no opener can be proven gone");
            cgroup::Hierarchies::default()
        });
        let walk = method == Some(Method::ProcWalk)
            || std::env::var("HUGEPREP_REACH").as_deref() == Ok("walk");
        if walk {
            tracing::info!("HUGEPREP_REACH=walk: the release proof walks /proc");
        }
        let probe = match &watch {
            Some(_) if !walk => match Probe::load() {
                Ok(p) => Some(p),
                Err(err) => {
                    tracing::warn!(%err, "the release proof cannot read the kernel's counts: it walks /proc, and its cost grows with the processes on the host");
                    None
                }
            },
            _ => None,
        };
        let reach = Arc::new(Reach::of(watch, probe, hierarchies));
        tracing::info!(method = reach.method().label(), "release proof");
        if reach.watch.is_none() {
            return reach;
        }
        let weak = Arc::downgrade(&reach);
        let reader = std::thread::Builder::new()
            .name("hugeprep-reach".into())
            .spawn(move || reader::read_events(weak));
        match reader {
            Ok(_) => reach,
            Err(err) => {
                // No thread would answer the opens of a marked file: mark none.
                tracing::warn!(%err, "cannot start the open watch's reader: released leases take the kernel's path");
                Arc::new(Reach::of(None, None, reach.hierarchies.clone()))
            }
        }
    }

    /// A proof over `watch` and `probe`, nothing watched yet.
    fn of(
        watch: Option<OpenWatch>,
        probe: Option<Probe>,
        hierarchies: cgroup::Hierarchies,
    ) -> Reach {
        Reach {
            watch,
            probe,
            model: Mutex::new(kernel::Model::Unchecked),
            model_error: Mutex::new(None),
            hierarchies,
            watched: Mutex::new(Watched::default()),
            beat_ms: AtomicU64::new(0),
            born: Instant::now(),
            beyond_mount_bound: AtomicU64::new(0),
        }
    }

    /// How releases are proven.
    pub fn method(&self) -> Method {
        match (&self.watch, &self.probe) {
            (None, _) => Method::None,
            (Some(_), Some(_)) => Method::KernelCounts,
            (Some(_), None) => Method::ProcWalk,
        }
    }

    /// Why every release takes the kernel's path, when one thing makes them all do so: no
    /// open watch (the proof cannot see who opened a file), or the kernel's counts of a quiet
    /// pool file do not match the proof's model. `None` while releases can be proven (each
    /// release that is not, for its own reason, is counted in the metrics instead).
    pub fn fallback(&self) -> Option<String> {
        if self.watch.is_none() {
            return Some(
                "no open watch (fanotify needs CAP_SYS_ADMIN and a kernel with \
                 CONFIG_FANOTIFY_ACCESS_PERMISSIONS): every release takes the kernel's path \
                 (safe; the memory is faulted anew instead of scrubbed in place)"
                    .into(),
            );
        }
        let model = *self.model.lock().unwrap_or_else(|e| e.into_inner());
        (model == kernel::Model::Differs).then(|| {
            let why = self
                .model_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_default();
            format!(
                "the kernel's counts of a quiet pool file do not match the release proof's \
                 model ({why}): every release takes the kernel's path (safe; the memory is \
                 faulted anew instead of scrubbed in place). Report it with the kernel \
                 version; HUGEPREP_REACH=walk in the unit's environment proves by walking /proc \
                 instead"
            )
        })
    }

    /// Proofs by the kernel's counts whose file system had more mounts than their walk reads
    /// (the rest were read from `/proc`): a local user making mounts by the thousand.
    pub fn proofs_beyond_mount_bound(&self) -> u64 {
        self.beyond_mount_bound.load(Ordering::Relaxed)
    }

    /// The reader thread finished a turn.
    fn beat(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.beat_ms.store(ms, Ordering::Relaxed);
    }

    /// How long the reader thread has gone without finishing a turn, when that is longer
    /// than [`READER_STALL`]: every open of a leased file waits meanwhile. The daemon stops
    /// its systemd watchdog pings then, so that systemd restarts it (the kernel lets the
    /// waiting opens go on once the watch is closed).
    pub fn reader_stalled(&self) -> Option<Duration> {
        self.watch.as_ref()?;
        let beat = Duration::from_millis(self.beat_ms.load(Ordering::Relaxed));
        reader::stalled(self.born.elapsed(), beat)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watched> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lose_all(&self) {
        for r in self.lock().files.values_mut() {
            r.complete = false;
        }
    }

    /// Begins a lease's watch of file `id` (call before anyone else can open it): opens
    /// from now on are recorded; earlier records of the file are dropped. Events of the
    /// file's earlier life still queued can only add openers.
    pub fn watch(&self, id: u64, file: &File) {
        let Some(w) = &self.watch else { return };
        let inode = match file.metadata() {
            Ok(m) => Some((m.dev(), m.ino())),
            Err(err) => {
                tracing::warn!(id, %err, "cannot watch a leased file's opens: it will take the kernel's path");
                None
            }
        };
        {
            let mut st = self.lock();
            if let Some(inode) = inode {
                st.by_inode.insert(inode, id);
            }
            st.files.insert(
                id,
                Record {
                    complete: inode.is_some(),
                    ..Record::default()
                },
            );
        }
        if self.probe.is_some() {
            self.watch_by_counts(w, id, file);
            return;
        }
        // Marked once the record is there: the first open finds it.
        if let Err(err) = w.watch(file.as_fd()) {
            tracing::warn!(id, %err, "cannot watch a leased file's opens: it will take the kernel's path");
            if let Some(r) = self.lock().files.get_mut(&id) {
                r.complete = false;
            }
        }
    }

    /// When a process other than the daemon first opened file `id` since its lease began,
    /// as far as the events read so far tell (the reader thread reads them as they come).
    pub fn first_open(&self, id: u64) -> Option<Instant> {
        self.lock().files.get(&id).and_then(|r| r.first_open)
    }

    /// Drops what is known of file `id` (deleted).
    pub fn forget(&self, id: u64) {
        let mut st = self.lock();
        st.files.remove(&id);
        st.by_inode.retain(|_, v| *v != id);
    }

    /// Proves that file `id`, opened by the daemon as `file` and out of every lessee's
    /// reach by name (lease path gone, owned by the daemon, mode 0600), can be reached by
    /// nobody else. Any failure or doubt is an [`Unproven`].
    pub fn prove(&self, id: u64, file: &File) -> Result<Proof, Unproven> {
        let started = Instant::now();
        if self.watch.is_none() {
            return Err(Unproven::NotWatched);
        }
        if let Some(probe) = &self.probe {
            return self.prove_by_counts(probe, id, file, started);
        }
        // Every open that returned is recorded; one still waiting for its answer is an
        // open file, which the write lease below sees.
        let fail = |step: &'static str| {
            move |e: std::io::Error| Unproven::Error {
                step,
                message: e.to_string(),
            }
        };
        let nlink = file.metadata().map_err(fail("fstat"))?.nlink();
        if nlink != 1 {
            return Err(Unproven::Links { nlink });
        }
        if !crate::sys::lease::sole_open_file(file).map_err(fail("write lease"))? {
            return Err(Unproven::OpenElsewhere);
        }
        let openers = {
            let st = self.lock();
            let record = st.files.get(&id).ok_or(Unproven::NotWatched)?;
            if !record.complete {
                return Err(Unproven::Lost);
            }
            for o in &record.openers {
                o.gone()?;
            }
            record.openers.len()
        };
        // Descriptors (O_PATH ones too), mounts and io_uring buffers are found by no open
        // event: every release walks /proc.
        let meta = file.metadata().map_err(fail("fstat"))?;
        match scan::find(meta.dev(), meta.ino()).map_err(fail("scan of /proc"))? {
            None => {}
            Some(scan::Finding::Descriptor { pid }) => return Err(Unproven::Descriptor { pid }),
            Some(scan::Finding::Mount { pid }) => return Err(Unproven::Mount { pid }),
            Some(scan::Finding::IoUring { pid }) => return Err(Unproven::IoUring { pid }),
        }
        // An open that passed its permission check before the lease path went may have
        // counted itself only after the write lease: recorded by now, or refused from now.
        {
            let mut st = self.lock();
            let record = st.files.get_mut(&id).ok_or(Unproven::NotWatched)?;
            if !record.complete || record.openers.len() != openers {
                return Err(Unproven::OpenedMeanwhile);
            }
            record.recycled = true;
        }
        Ok(Proof {
            openers,
            took: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests;
