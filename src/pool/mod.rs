//! The warm pool and leases.
//!
//! Each pool file is one hugetlbfs file `p<id>` in the pool directory of its page size's
//! mount (`<mount>/hugeprep/pool/`), journaled in the state directory. A lease is one file:
//! a hard link `<mount>/hugeprep/leases/<name>` handed to the VMM, while hugeprep keeps its
//! own link so that deleting the lease path frees nothing.
//!
//! States and transitions (each journaled before it takes effect):
//!
//! ```text
//!   (refill) Filling ──fault──> Warm ──lease──> Leased ──release──> Dirty ──> Scrubbing ──> Warm
//!   (cold lease) Filling ──fault──> Leased              Dirty ──(above target, or held)──> deleted
//! ```
//!
//! A lease taken from a warm file is resized and linked before the lease is journaled; a
//! crash in between leaves a `Warm` record, which is only trusted after a clean shutdown
//! (and a clean shutdown waits for requests in flight), so the file is scrubbed, never
//! handed out unproven. See `docs/pool.md`.

mod error;
pub mod fault;
mod holders;
mod kernel;
mod record;
mod recover;
mod request;
mod worker;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::clear::ClearPlan;
use crate::hugetlb::{BackingFile, Owner};
use crate::journal::Journal;
use crate::page_size::PageSize;
use crate::scrub::{ScrubControl, ScrubReport, Scrubber};
use crate::topology::Topology;

pub use crate::policy::pool as policy;
pub use crate::policy::pool::{PoolPolicy, Verification};
pub use error::{PoolError, Result};
pub use record::{file_key, FileRecord, FileState, LeaseInfo, LeaseRecord, LeaseSource};
pub use recover::RecoveryReport;
pub use request::{check_name, LeaseRequest, ValidRequest, MAX_NAME};

/// How long a lease waits for dirty memory to be scrubbed before giving up.
const LEASE_WAIT: Duration = Duration::from_secs(120);

/// What the pool needs to start.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The journal directory.
    pub state_dir: PathBuf,
    /// hugetlbfs mounts to use, one per page size (the page size is read from the mount).
    pub mounts: Vec<PathBuf>,
    /// Targets, scrub cap, verification.
    pub policy: PoolPolicy,
    /// How to clear.
    pub plan: ClearPlan,
}

/// The directories hugeprep uses on one hugetlbfs mount.
#[derive(Debug, Clone, Serialize)]
pub struct PoolMount {
    /// Page size of the mount.
    pub page_size: PageSize,
    /// The mount point.
    pub root: PathBuf,
    /// hugeprep's own links (`<root>/hugeprep/pool`, mode 0700).
    pub pool_dir: PathBuf,
    /// Lease paths (`<root>/hugeprep/leases`, mode 0755).
    pub lease_dir: PathBuf,
}

impl PoolMount {
    fn new(root: &Path, page_size: PageSize) -> Result<PoolMount> {
        let base = root.join("hugeprep");
        let pool_dir = base.join("pool");
        let lease_dir = base.join("leases");
        for (dir, mode) in [(&base, 0o755), (&pool_dir, 0o700), (&lease_dir, 0o755)] {
            let mk = fs::DirBuilder::new().recursive(true).mode(mode).create(dir);
            let perm = || fs::set_permissions(dir, fs::Permissions::from_mode(mode));
            mk.and_then(|()| perm()).map_err(|source| PoolError::Io {
                op: "mkdir",
                path: dir.clone(),
                source,
            })?;
        }
        Ok(PoolMount {
            page_size,
            root: root.to_path_buf(),
            pool_dir,
            lease_dir,
        })
    }

    /// The pool file of `id`.
    pub fn file_path(&self, id: u64) -> PathBuf {
        self.pool_dir.join(file_key(id))
    }
}

/// Work in progress on a file, outside the state lock. Only the worker or request that set
/// it touches the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    Leasing,
    Releasing,
    Scrub,
    Refill,
    Delete,
}

#[derive(Debug)]
struct Entry {
    rec: FileRecord,
    busy: Option<Work>,
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<u64, Entry>,
    next_id: u64,
    pending_names: BTreeSet<String>,
    refill_turn: usize,
    refill_backoff: Option<Instant>,
    last_scrub: Option<ScrubReport>,
}

impl State {
    fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn name_in_use(&self, name: &str) -> bool {
        self.pending_names.contains(name)
            || self.files.values().any(|e| match &e.rec.state {
                FileState::Leased(l) => l.name == name,
                _ => false,
            })
    }

    fn of_kind(&self, node: u32, ps: PageSize) -> impl Iterator<Item = &Entry> {
        self.files
            .values()
            .filter(move |e| e.rec.node == node && e.rec.page_size == ps)
    }

    /// Bytes that are or will be warm: warm files not on their way out, plus scrubs and
    /// refills in progress.
    fn pool_bytes(&self, node: u32, ps: PageSize) -> u64 {
        self.of_kind(node, ps)
            .filter(|e| match e.busy {
                Some(Work::Scrub) | Some(Work::Refill) => true,
                None => e.rec.state == FileState::Warm,
                _ => false,
            })
            .map(|e| e.rec.size)
            .sum()
    }

    /// Bytes that a waiting lease could get once the worker has caught up.
    fn pending_clean_bytes(&self, node: u32, ps: PageSize) -> u64 {
        self.of_kind(node, ps)
            .filter(|e| {
                matches!(e.busy, Some(Work::Scrub) | Some(Work::Refill))
                    || (e.busy.is_none() && e.rec.state == FileState::Dirty)
            })
            .map(|e| e.rec.size)
            .sum()
    }
}

/// One (node, page size) of `GET /v1/pool`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct KindStatus {
    /// Node.
    pub node: u32,
    /// Page size.
    pub page_size: PageSize,
    /// The hugetlbfs mount.
    pub mount: PathBuf,
    /// Bytes the policy keeps warm.
    pub target_bytes: u64,
    /// File sizes the refill worker makes.
    pub sizes: Vec<u64>,
    /// Warm bytes (ready to lease).
    pub warm_bytes: u64,
    /// Warm files.
    pub warm_files: usize,
    /// Leased bytes.
    pub leased_bytes: u64,
    /// Live leases.
    pub leases: usize,
    /// Released or unproven bytes waiting for a scrub (or deletion).
    pub dirty_bytes: u64,
    /// Bytes being scrubbed.
    pub scrubbing_bytes: u64,
    /// Bytes being created and faulted.
    pub filling_bytes: u64,
    /// The kernel's free pages of this size on the node.
    pub kernel_free_pages: u64,
    /// The kernel's pages of this size on the node.
    pub kernel_total_pages: u64,
    /// Bytes in use on the mount by its size limit (`statfs`), when it has one.
    pub mount_used_bytes: Option<u64>,
}

/// `GET /v1/pool`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct PoolStatus {
    /// Per node and page size.
    pub kinds: Vec<KindStatus>,
    /// Verification level.
    pub verify: Verification,
    /// Background scrub cap, bytes per second.
    pub scrub_bandwidth: Option<u64>,
    /// Whether the last start found a clean-shutdown marker.
    pub clean_start: bool,
    /// The most recent scrub.
    pub last_scrub: Option<ScrubReport>,
}

/// The warm pool: files, leases, the journal and the background worker's shared state.
#[derive(Debug)]
pub struct Pool {
    mounts: BTreeMap<PageSize, PoolMount>,
    topology: Topology,
    policy: PoolPolicy,
    journal: Journal,
    scrubber: Scrubber,
    control: ScrubControl,
    state: Mutex<State>,
    changed: Condvar,
    shutdown: AtomicBool,
    clean_start: bool,
    daemon_owner: Owner,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Removes `link` only when it is still the inode `(dev, ino)`: a user may have replaced
/// the lease path with something else, which is not ours to delete.
fn unlink_if_same(link: &Path, dev: u64, ino: u64) {
    if let Ok(m) = fs::symlink_metadata(link) {
        if m.dev() == dev && m.ino() == ino {
            let _ = fs::remove_file(link);
        }
    }
}

impl Pool {
    /// Opens the journal, reconciles it with the files on the mounts (see
    /// [`recover`](RecoveryReport)) and returns the pool. Start the worker with
    /// [`Pool::spawn_worker`].
    pub fn open(config: PoolConfig) -> Result<Arc<Pool>> {
        let topology = Topology::detect().map_err(|e| PoolError::Io {
            op: "reading topology",
            path: "/sys/devices/system/node".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let mut mounts = BTreeMap::new();
        for root in &config.mounts {
            let ps = crate::hugetlb::hugetlbfs_page_size(root)
                .map_err(|source| PoolError::Io {
                    op: "statfs",
                    path: root.clone(),
                    source,
                })?
                .ok_or_else(|| PoolError::Field {
                    field: "mount",
                    message: format!("{} is not a hugetlbfs mount", root.display()),
                })?;
            mounts.insert(ps, PoolMount::new(root, ps)?);
        }
        let journal = Journal::open(&config.state_dir)?;
        let clean_start = journal.was_clean_shutdown();
        let (files, max_id, report) = recover::reconcile(&journal, &mounts, clean_start)?;
        // From here on a crash means warm records must be proven again.
        journal.clear_clean_shutdown()?;
        tracing::info!(
            clean = clean_start,
            kept_leases = report.leases,
            warm = report.warm,
            dirty = report.dirty,
            deleted = report.deleted_files,
            "pool recovered from journal"
        );
        let next_id = (max_id + 1).max(now_unix() << 20);
        let state = State {
            files: files
                .into_iter()
                .map(|rec| (rec.id, Entry { rec, busy: None }))
                .collect(),
            next_id,
            ..State::default()
        };
        Ok(Arc::new(Pool {
            mounts,
            topology,
            scrubber: Scrubber::new(config.plan).map_err(|e| PoolError::Field {
                field: "method",
                message: e.to_string(),
            })?,
            policy: config.policy,
            journal,
            control: ScrubControl::default(),
            state: Mutex::new(state),
            changed: Condvar::new(),
            shutdown: AtomicBool::new(false),
            clean_start,
            daemon_owner: Owner {
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
            },
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The mounts in use, by page size.
    pub fn mounts(&self) -> &BTreeMap<PageSize, PoolMount> {
        &self.mounts
    }

    /// The policy in force.
    pub fn policy(&self) -> &PoolPolicy {
        &self.policy
    }

    /// The scrubber (clearing method).
    pub fn scrubber(&self) -> &Scrubber {
        &self.scrubber
    }

    fn mount(&self, ps: PageSize) -> Result<&PoolMount> {
        self.mounts.get(&ps).ok_or_else(|| PoolError::Field {
            field: "page_size",
            message: format!(
                "no hugetlbfs mount for {ps} pages: this daemon serves {}",
                self.mounts
                    .keys()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }

    /// The CPUs that fault and scrub memory of `node`.
    fn cpus(&self, node: u32) -> Vec<usize> {
        let mut cpus = self
            .topology
            .node(node)
            .map(|n| n.cpus.clone())
            .unwrap_or_default();
        if cpus.is_empty() {
            cpus = crate::sys::affinity::allowed_cpus();
        }
        if self.policy.threads > 0 {
            cpus.truncate(self.policy.threads);
        }
        cpus
    }

    /// Checks a request against the limits; allocates and changes nothing.
    pub fn validate(&self, req: &LeaseRequest) -> Result<ValidRequest> {
        check_name(&req.name)?;
        let page_size = req.page_size.unwrap_or(PageSize::Size2M);
        self.mount(page_size)?;
        let node = req.node.unwrap_or(0);
        self.topology.node(node).map_err(|e| PoolError::Field {
            field: "node",
            message: e.to_string(),
        })?;
        crate::hugetlb::check_size(req.size, page_size).map_err(|e| PoolError::Field {
            field: "size",
            message: e.to_string(),
        })?;
        let owner = match &req.owner {
            None => None,
            Some(user) => Some(Owner::lookup(user).map_err(|e| PoolError::Field {
                field: "owner",
                message: e.to_string(),
            })?),
        };
        let pid = match req.pid {
            None => None,
            Some(pid) => {
                let start =
                    crate::sys::pidfd::process_start_time(pid).ok_or_else(|| PoolError::Field {
                        field: "pid",
                        message: format!("no process with pid {pid}"),
                    })?;
                Some((pid, start))
            }
        };
        Ok(ValidRequest {
            name: req.name.clone(),
            size: req.size,
            page_size,
            node,
            owner,
            pid,
        })
    }

    /// Takes a lease: a warm file of exactly the size, else a larger one shrunk, else a
    /// smaller one grown, else a new one. Blocks while faulting (call from a blocking
    /// thread). On error nothing stays allocated or changed.
    pub fn lease(&self, req: &LeaseRequest) -> Result<LeaseInfo> {
        let started = Instant::now();
        let v = self.validate(req)?;
        let (id, source, old_size) = self.reserve(&v)?;
        let mount = self.mount(v.page_size)?;
        let lease_path = mount.lease_dir.join(&v.name);
        match self.prepare(&v, id, source, old_size, &lease_path) {
            Ok(linked) => match self.commit(&v, id, source, &lease_path, started) {
                Ok(info) => Ok(info),
                Err(e) => {
                    self.abort(&v, id, source, Some(linked));
                    Err(e)
                }
            },
            Err((e, linked)) => {
                self.abort(&v, id, source, linked);
                Err(e)
            }
        }
    }

    /// Chooses the file (under the lock) and journals the pre-lease state.
    fn reserve(&self, v: &ValidRequest) -> Result<(u64, LeaseSource, u64)> {
        let mount = self.mount(v.page_size)?;
        let deadline = Instant::now() + LEASE_WAIT;
        let mut st = self.lock();
        let mut waiting = false;
        let result = loop {
            if self.shutdown.load(Ordering::SeqCst) {
                break Err(PoolError::ShuttingDown);
            }
            if st.name_in_use(&v.name) {
                break Err(PoolError::DuplicateName {
                    name: v.name.clone(),
                });
            }
            let avail = kernel::available_bytes(v.node, v.page_size, &mount.root);
            let warm: Vec<(u64, u64)> = st
                .of_kind(v.node, v.page_size)
                .filter(|e| e.busy.is_none() && e.rec.state == FileState::Warm)
                .map(|e| (e.rec.id, e.rec.size))
                .collect();
            let warm_bytes: u64 = warm.iter().map(|w| w.1).sum();
            let pending = st.pending_clean_bytes(v.node, v.page_size);
            let supply = avail + warm_bytes + pending;
            if v.size > supply {
                break Err(PoolError::Insufficient {
                    size: v.size,
                    page_size: v.page_size,
                    node: v.node,
                    available: supply,
                });
            }
            let exact = warm.iter().find(|w| w.1 == v.size);
            let larger = warm.iter().filter(|w| w.1 > v.size).min_by_key(|w| w.1);
            let smaller = warm.iter().filter(|w| w.1 < v.size).max_by_key(|w| w.1);
            let (choice, source, need) = match (exact, larger, smaller) {
                (Some(w), _, _) => (Some(*w), LeaseSource::WarmExact, 0),
                (None, Some(w), _) => (Some(*w), LeaseSource::WarmShrunk, 0),
                (None, None, Some(w)) => (Some(*w), LeaseSource::WarmGrown, v.size - w.1),
                (None, None, None) => (None, LeaseSource::Cold, v.size),
            };
            if need > avail {
                // Make room: give back another warm file, or wait for dirty memory.
                let victim = warm
                    .iter()
                    .filter(|w| Some(w.0) != choice.map(|c| c.0))
                    .min_by_key(|w| w.1);
                if let Some(&(vid, _)) = victim {
                    self.delete_locked(&mut st, vid);
                    continue;
                }
                if pending > 0 && Instant::now() < deadline {
                    if !waiting {
                        waiting = true;
                        self.control.begin_urgent();
                        self.changed.notify_all();
                    }
                    st = self
                        .changed
                        .wait_timeout(st, Duration::from_millis(50))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    continue;
                }
                break Err(PoolError::Insufficient {
                    size: v.size,
                    page_size: v.page_size,
                    node: v.node,
                    available: avail + warm_bytes,
                });
            }
            let reserved = match choice {
                Some((id, old)) => {
                    // No journal write here: until the lease is journaled the record still
                    // says warm, and a warm record is only trusted after a clean shutdown,
                    // which waits for this request. A crash in between makes it dirty.
                    let Some(e) = st.files.get_mut(&id) else {
                        continue;
                    };
                    e.busy = Some(Work::Leasing);
                    (id, source, old)
                }
                None => {
                    let id = st.new_id();
                    let rec = FileRecord {
                        id,
                        page_size: v.page_size,
                        node: v.node,
                        size: v.size,
                        state: FileState::Filling,
                    };
                    if let Err(err) = self.journal.write(&rec.key(), &rec) {
                        break Err(err.into());
                    }
                    st.files.insert(
                        id,
                        Entry {
                            rec,
                            busy: Some(Work::Leasing),
                        },
                    );
                    (id, source, 0)
                }
            };
            st.pending_names.insert(v.name.clone());
            break Ok(reserved);
        };
        if waiting {
            self.control.end_urgent();
        }
        result
    }

    /// Resizes or creates and faults the file, links the lease path and hands it to the
    /// owner (outside the lock). On error says whether the link was made.
    fn prepare(
        &self,
        v: &ValidRequest,
        id: u64,
        source: LeaseSource,
        old_size: u64,
        lease_path: &Path,
    ) -> std::result::Result<bool, (PoolError, Option<bool>)> {
        let mount = self.mount(v.page_size).map_err(|e| (e, None))?;
        let path = mount.file_path(id);
        let threads = self.cpus(v.node).len();
        let file = (|| -> Result<BackingFile> {
            match source {
                LeaseSource::WarmExact => Ok(BackingFile::open(&path, v.page_size)?),
                LeaseSource::WarmShrunk => {
                    let mut f = BackingFile::open(&path, v.page_size)?;
                    f.set_len(v.size)?;
                    Ok(f)
                }
                LeaseSource::WarmGrown => {
                    let mut f = BackingFile::open(&path, v.page_size)?;
                    f.set_len(v.size)?;
                    let grown = fault::fault_range(&f, old_size..v.size, v.node, threads);
                    if let Err(e) = grown {
                        let _ = f.set_len(old_size);
                        return Err(e.into());
                    }
                    Ok(f)
                }
                LeaseSource::Cold => {
                    let f = BackingFile::create(&path, v.size, v.page_size, None)?;
                    if let Err(e) = fault::fault_range(&f, 0..v.size, v.node, threads) {
                        let _ = fs::remove_file(&path);
                        return Err(e.into());
                    }
                    Ok(f)
                }
            }
        })()
        .map_err(|e| (e, None))?;
        if let Some(owner) = v.owner {
            file.chown(owner).map_err(|e| (e.into(), Some(false)))?;
        }
        if fs::symlink_metadata(lease_path).is_ok() {
            return Err((
                PoolError::Field {
                    field: "name",
                    message: format!("{} already exists", lease_path.display()),
                },
                Some(false),
            ));
        }
        file.link(lease_path).map_err(|e| (e.into(), Some(false)))?;
        Ok(true)
    }

    /// Journals the lease and makes it visible.
    fn commit(
        &self,
        v: &ValidRequest,
        id: u64,
        source: LeaseSource,
        lease_path: &Path,
        started: Instant,
    ) -> Result<LeaseInfo> {
        let mut st = self.lock();
        let lease_id = st.new_id();
        let lease = LeaseRecord {
            id: lease_id,
            name: v.name.clone(),
            path: lease_path.to_path_buf(),
            uid: v.owner.map(|o| o.uid),
            gid: v.owner.map(|o| o.gid),
            pid: v.pid.map(|p| p.0),
            pid_start: v.pid.map(|p| p.1),
            source,
            ready_ms: started.elapsed().as_secs_f64() * 1e3,
            created_unix: now_unix(),
        };
        let Some(entry) = st.files.get(&id) else {
            return Err(PoolError::NotFound { id });
        };
        let rec = FileRecord {
            size: v.size,
            state: FileState::Leased(lease.clone()),
            ..entry.rec.clone()
        };
        self.journal.write(&rec.key(), &rec)?;
        let info = LeaseInfo::of(&rec, &lease);
        if let Some(e) = st.files.get_mut(&id) {
            e.rec = rec;
            e.busy = None;
        }
        st.pending_names.remove(&v.name);
        self.changed.notify_all();
        Ok(info)
    }

    /// Undoes a failed lease: a new file is deleted, a warm one goes to the scrubber.
    fn abort(&self, v: &ValidRequest, id: u64, source: LeaseSource, linked: Option<bool>) {
        let Ok(mount) = self.mount(v.page_size) else {
            return;
        };
        let path = mount.file_path(id);
        if linked == Some(true) {
            if let Ok(m) = fs::metadata(&path) {
                unlink_if_same(&mount.lease_dir.join(&v.name), m.dev(), m.ino());
            }
        }
        let mut st = self.lock();
        st.pending_names.remove(&v.name);
        if source == LeaseSource::Cold {
            let _ = fs::remove_file(&path);
            if self.journal.remove(&file_key(id)).is_ok() {
                st.files.remove(&id);
            }
        } else if let Some(e) = st.files.get_mut(&id) {
            // It may have been resized or handed to the owner: scrub it before reuse.
            if let Ok(m) = fs::metadata(&path) {
                e.rec.size = m.len();
            }
            e.rec.state = FileState::Dirty;
            if let Err(err) = self.journal.write(&e.rec.key(), &e.rec) {
                tracing::error!(%err, "cannot journal an aborted lease as dirty");
            }
            e.busy = None;
        }
        self.changed.notify_all();
    }

    /// Deletes an idle file under the lock (used to make room for a lease).
    fn delete_locked(&self, st: &mut State, id: u64) {
        let Some(e) = st.files.get(&id) else { return };
        let Ok(mount) = self.mount(e.rec.page_size) else {
            return;
        };
        match fs::remove_file(mount.file_path(id)) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                tracing::warn!(id, %err, "cannot delete pool file");
                return;
            }
        }
        if let Err(err) = self.journal.remove(&file_key(id)) {
            tracing::error!(id, %err, "cannot remove journal record of deleted file");
        }
        st.files.remove(&id);
    }

    /// Releases a lease: the file is journaled dirty, the lease path removed, the file taken
    /// back from its owner, and the worker scrubs it (or deletes it above target).
    pub fn release(&self, lease_id: u64) -> Result<LeaseInfo> {
        let (id, info, mount) = {
            let mut st = self.lock();
            let found = st.files.values_mut().find(|e| {
                e.busy.is_none() && matches!(&e.rec.state, FileState::Leased(l) if l.id == lease_id)
            });
            let Some(entry) = found else {
                return Err(PoolError::NotFound { id: lease_id });
            };
            let FileState::Leased(lease) = &entry.rec.state else {
                return Err(PoolError::NotFound { id: lease_id });
            };
            let info = LeaseInfo::of(&entry.rec, lease);
            let mount = self.mount(entry.rec.page_size)?.clone();
            let dirty = FileRecord {
                state: FileState::Dirty,
                ..entry.rec.clone()
            };
            self.journal.write(&dirty.key(), &dirty)?;
            entry.rec = dirty;
            entry.busy = Some(Work::Releasing);
            (entry.rec.id, info, mount)
        };
        let path = mount.file_path(id);
        if let Ok(m) = fs::metadata(&path) {
            unlink_if_same(&info.path, m.dev(), m.ino());
        }
        self.take_back(&path);
        let mut st = self.lock();
        if let Some(e) = st.files.get_mut(&id) {
            e.busy = None;
        }
        self.changed.notify_all();
        tracing::info!(lease = lease_id, name = %info.name, "released");
        Ok(info)
    }

    /// Gives the file back to the daemon's user, mode 0600, so that its last owner cannot
    /// open it again.
    fn take_back(&self, path: &Path) {
        let o = self.daemon_owner;
        let _ = std::os::unix::fs::chown(path, Some(o.uid), Some(o.gid));
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o600));
    }

    /// The lease with `id`.
    pub fn get(&self, lease_id: u64) -> Result<LeaseInfo> {
        self.leases()
            .into_iter()
            .find(|l| l.id == lease_id)
            .ok_or(PoolError::NotFound { id: lease_id })
    }

    /// Every live lease, by id.
    pub fn leases(&self) -> Vec<LeaseInfo> {
        let st = self.lock();
        let mut out: Vec<LeaseInfo> = st
            .files
            .values()
            .filter_map(|e| match &e.rec.state {
                FileState::Leased(l) => Some(LeaseInfo::of(&e.rec, l)),
                _ => None,
            })
            .collect();
        out.sort_by_key(|l| l.id);
        out
    }

    /// The leases that name a process, with the process's start time.
    pub fn leases_with_pid(&self) -> Vec<(u64, u32, Option<u64>)> {
        let st = self.lock();
        st.files
            .values()
            .filter_map(|e| match &e.rec.state {
                FileState::Leased(l) => l.pid.map(|p| (l.id, p, l.pid_start)),
                _ => None,
            })
            .collect()
    }

    /// Counts per node and page size.
    pub fn status(&self) -> PoolStatus {
        let st = self.lock();
        let mut kinds = Vec::new();
        for (ps, mount) in &self.mounts {
            for node in &self.topology.nodes {
                let n = node.id;
                let sum = |f: &dyn Fn(&Entry) -> bool| -> (u64, usize) {
                    st.of_kind(n, *ps)
                        .filter(|e| f(e))
                        .fold((0, 0), |(b, c), e| (b + e.rec.size, c + 1))
                };
                let warm = sum(&|e| e.rec.state == FileState::Warm);
                let leased = sum(&|e| matches!(e.rec.state, FileState::Leased(_)));
                let dirty = sum(&|e| e.rec.state == FileState::Dirty);
                let scrubbing = sum(&|e| e.rec.state == FileState::Scrubbing);
                let filling = sum(&|e| e.rec.state == FileState::Filling);
                let target = self.policy.target(n, *ps);
                kinds.push(KindStatus {
                    node: n,
                    page_size: *ps,
                    mount: mount.root.clone(),
                    target_bytes: target.map_or(0, |t| t.warm),
                    sizes: target.map_or(Vec::new(), |t| t.sizes.clone()),
                    warm_bytes: warm.0,
                    warm_files: warm.1,
                    leased_bytes: leased.0,
                    leases: leased.1,
                    dirty_bytes: dirty.0,
                    scrubbing_bytes: scrubbing.0,
                    filling_bytes: filling.0,
                    kernel_free_pages: kernel::node_free_pages(n, *ps).unwrap_or(0),
                    kernel_total_pages: kernel::node_total_pages(n, *ps).unwrap_or(0),
                    mount_used_bytes: kernel::mount_used_pages(&mount.root).map(|p| p * ps.bytes()),
                });
            }
        }
        PoolStatus {
            kinds,
            verify: self.policy.verify,
            scrub_bandwidth: self.policy.scrub_bandwidth,
            clean_start: self.clean_start,
            last_scrub: st.last_scrub.clone(),
        }
    }

    /// Whether every file is settled: nothing dirty, scrubbing, filling or in flight, and
    /// every target met as far as the kernel allows.
    pub fn is_idle(&self) -> bool {
        let st = self.lock();
        st.files.values().all(|e| {
            e.busy.is_none() && matches!(e.rec.state, FileState::Warm | FileState::Leased(_))
        })
    }

    /// Stops the worker and running scrubs; requests fail with `ShuttingDown`.
    pub fn shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.control.cancel();
        self.changed.notify_all();
    }

    /// After [`Pool::shutdown`] and the worker has exited: records that every warm record
    /// is true, so the next start trusts them.
    pub fn mark_clean_shutdown(&self) -> Result<()> {
        let st = self.lock();
        if st.files.values().any(|e| e.busy.is_some()) {
            tracing::warn!("work still in flight: not marking a clean shutdown");
            return Ok(());
        }
        Ok(self.journal.mark_clean_shutdown()?)
    }
}
