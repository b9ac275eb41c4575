//! Taking and giving back leases: choosing the source (warm exact, shrunk, grown, or cold),
//! journaling each step before it takes effect, and rolling back a failed lease so that it
//! leaves no file, link or pool state behind.

use super::fault::FaultError;
use super::placement::{self, NodeSupply};
use super::*;
use crate::prefault::PrefaultError;
use crate::sys::priority::{OutOfRealtime, RT_WORK_BYTES};

/// How many times a lease chooses again when the kernel's free pages ran out under its
/// fault.
const FAULT_RETRIES: u32 = 3;

impl Pool {
    /// Checks a request against the limits; allocates and changes nothing.
    pub fn validate(&self, req: &LeaseRequest) -> Result<ValidRequest> {
        check_name(&req.name)?;
        let page_size = req.page_size.unwrap_or(PageSize::Size2M);
        self.mount(page_size)?;
        let node = match req.node {
            Some(node) => node,
            None => self.default_node(req.pid, page_size),
        };
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
        let recycle = self.policy().recycle_for(req.owner.as_deref(), req.recycle);
        Ok(ValidRequest {
            name: req.name.clone(),
            size: req.size,
            page_size,
            node,
            owner,
            pid,
            pin: req.pin,
            recycle,
            principal: None,
        })
    }

    /// The node of a request that names none ([`placement`] has the rule).
    fn default_node(&self, pid: Option<u32>, page_size: PageSize) -> u32 {
        let pid_cpus = pid.and_then(crate::sys::affinity::process_cpus);
        let warm: Vec<(u32, u64)> = {
            let st = self.lock();
            self.topology
                .node_ids()
                .into_iter()
                .map(|node| {
                    let bytes = st
                        .of_kind(node, page_size)
                        .filter(|e| e.busy.is_none() && e.rec.state == FileState::Warm)
                        .map(|e| e.rec.size)
                        .sum();
                    (node, bytes)
                })
                .collect()
        };
        let mount = self
            .mount(page_size)
            .map(|m| m.root.clone())
            .unwrap_or_default();
        let supply: Vec<NodeSupply> = warm
            .into_iter()
            .map(|(node, warm_bytes)| NodeSupply {
                node,
                warm_bytes,
                free_bytes: self.supply.available_bytes(node, page_size, &mount),
            })
            .collect();
        let (node, why) = placement::choose_node(&self.topology, pid_cpus.as_deref(), &supply);
        tracing::debug!(node, ?why, ?pid, "lease names no node");
        node
    }

    /// Takes a lease: a warm file of exactly the size, else a larger one shrunk, else a
    /// smaller one grown, else a new one. Blocks while faulting (call from a blocking
    /// thread). On error nothing stays allocated or changed.
    pub fn lease(&self, req: &LeaseRequest) -> Result<LeaseInfo> {
        self.lease_tagged(req, None, None)
    }

    /// [`Pool::lease`] on behalf of `principal`, which is journaled as the lease's owner.
    pub fn lease_as(&self, req: &LeaseRequest, principal: Option<&str>) -> Result<LeaseInfo> {
        self.lease_tagged(req, None, principal)
    }

    /// [`Pool::lease`], journaling `tag` (an idempotency key) with the lease.
    pub(super) fn lease_tagged(
        &self,
        req: &LeaseRequest,
        tag: Option<&Idempotency>,
        principal: Option<&str>,
    ) -> Result<LeaseInfo> {
        let started = Instant::now();
        // The lease, and the VMM start that follows it, go first (see `gate`).
        let _taking = self.gate.taking();
        let mut v = self.validate(req)?;
        v.principal = principal.map(str::to_owned);
        let mount = self.mount(v.page_size)?;
        let lease_path = mount.lease_dir.join(&v.name);
        let mut attempts = 0;
        let (id, source, prepared) = loop {
            let (id, source, old_size) = self.reserve(&v)?;
            let prepared = self.prepare(&v, id, source, old_size, &lease_path);
            let faulted = match source {
                LeaseSource::Cold => v.size,
                LeaseSource::WarmGrown => v.size - old_size,
                _ => 0,
            };
            if faulted > 0 {
                self.lock().end_faulting(id);
                self.changed.notify_all();
            }
            // The kernel had fewer free pages at the fault than when the file was chosen
            // (another user of the machine's hugepages took some meanwhile): choose again,
            // which waits for memory on its way back, rather than fail the lease.
            if let Err((PoolError::Fault(FaultError(PrefaultError::Insufficient { .. })), linked)) =
                &prepared
            {
                if attempts < FAULT_RETRIES {
                    attempts += 1;
                    tracing::info!(name = %v.name, attempts, "free pages taken during the lease's fault: choosing again");
                    self.abort(&v, id, source, *linked);
                    continue;
                }
            }
            break (id, source, prepared);
        };
        match prepared {
            Ok(linked) => {
                let pin = match self.pin_lease(&v, id) {
                    Ok(pin) => pin,
                    Err(e) => {
                        self.abort(&v, id, source, Some(linked));
                        return Err(e);
                    }
                };
                match self.commit(&v, id, source, &lease_path, started, tag) {
                    Ok(mut info) => {
                        info.pinned = self.hold_pin(id, pin);
                        Ok(info)
                    }
                    Err(e) => {
                        drop(pin);
                        self.abort(&v, id, source, Some(linked));
                        Err(e)
                    }
                }
            }
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
        // The kernel's pool is raised for this lease at most once (see `raise_for_lease`).
        let mut raised = false;
        let result = loop {
            if self.shutdown.load(Ordering::SeqCst) {
                break Err(PoolError::ShuttingDown);
            }
            if st.name_in_use(&v.name) {
                break Err(PoolError::DuplicateName {
                    name: v.name.clone(),
                });
            }
            let promised = st.promised(v.node, v.page_size);
            let faulting = promised.bytes;
            let avail = self
                .supply
                .available_after(v.node, v.page_size, &mount.root, &promised);
            let warm: Vec<(u64, u64)> = st
                .of_kind(v.node, v.page_size)
                .filter(|e| e.busy.is_none() && e.rec.state == FileState::Warm)
                .map(|e| (e.rec.id, e.rec.size))
                .collect();
            let warm_bytes: u64 = warm.iter().map(|w| w.1).sum();
            let pending = st.pending_clean_bytes(v.node, v.page_size);
            let supply = avail + warm_bytes + pending;
            // Pages promised to faults in progress come back once those end (a failed fault)
            // or as warm files (a refill): wait for them before saying no.
            let settling = pending > 0 || faulting > 0;
            // A failing request changes nothing: a lease larger than all the kind could ever
            // supply (faults in progress included, should they fail) is refused before any
            // file is touched; one that only the end of a fault could make room for waits for
            // it without deleting anything meanwhile.
            if v.size > supply.saturating_add(faulting)
                || (v.size > supply && !(faulting > 0 && Instant::now() < deadline))
            {
                if !raised {
                    raised = true;
                    drop(st);
                    self.raise_for_lease(v.node, v.page_size, &mount.root, v.size - supply);
                    st = self.lock();
                    continue;
                }
                break Err(PoolError::Insufficient {
                    size: v.size,
                    page_size: v.page_size,
                    node: v.node,
                    available: supply,
                });
            }
            if v.size > supply {
                // Waits for faults in progress (a refill among them): urgent, so that the
                // start gate and the scrub's cap let that work finish (see `gate`).
                if !waiting {
                    tracing::debug!(
                        name = %v.name,
                        size = v.size,
                        supply,
                        promised = faulting,
                        "lease waits for faults in progress"
                    );
                }
                self.wait_urgently(&mut waiting);
                st = st.wait_timeout(&self.changed, Duration::from_millis(50));
                continue;
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
                // Make room: give back another warm file, else a released file still waiting
                // for the worker (its pages go back to the kernel, which zeroes them again
                // in this lease's fault), else wait for the memory being cleaned now. A lease
                // never queues behind the worker's backlog: under pressure every lease thread
                // makes its own pages, in parallel, instead of one worker scrubbing for all.
                // Nothing is deleted unless deleting is enough to serve the lease now.
                let deletable = warm
                    .iter()
                    .filter(|w| Some(w.0) != choice.map(|c| c.0))
                    .map(|w| w.1)
                    .sum::<u64>()
                    + st.dirty_idle_bytes(v.node, v.page_size);
                let victim = warm
                    .iter()
                    .filter(|w| Some(w.0) != choice.map(|c| c.0))
                    .min_by_key(|w| w.1)
                    .map(|w| w.0)
                    .or_else(|| st.dirty_victim(v.node, v.page_size, need - avail))
                    .filter(|_| avail + deletable >= need);
                if let Some(vid) = victim {
                    self.delete_locked(&mut st, vid);
                    continue;
                }
                if settling && Instant::now() < deadline {
                    self.wait_urgently(&mut waiting);
                    st = st.wait_timeout(&self.changed, Duration::from_millis(50));
                    continue;
                }
                if !raised {
                    raised = true;
                    drop(st);
                    self.raise_for_lease(v.node, v.page_size, &mount.root, need - avail);
                    st = self.lock();
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
                    st.files.insert(id, Entry::new(rec, Some(Work::Leasing)));
                    (id, source, 0)
                }
            };
            if need > 0 {
                st.start_faulting(reserved.0, v.node, v.page_size, need);
            }
            st.pending_names.insert(v.name.clone());
            st.note_demand(v.node, v.page_size, v.size);
            st.missed |= source != LeaseSource::WarmExact;
            break Ok(reserved);
        };
        if waiting {
            self.control.end_urgent();
        }
        result
    }

    /// A lease starts waiting for background work (once per lease; `reserve` ends it):
    /// scrubs and refills run at full speed and through the start gate meanwhile.
    fn wait_urgently(&self, waiting: &mut bool) {
        if !*waiting {
            *waiting = true;
            self.control.begin_urgent();
            self.changed.notify_all();
        }
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
        let cpus = self.cpus(v.node);
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
                    let t = Instant::now();
                    let _long = long_work(v.size - old_size);
                    let grown = self.fault_lease(id, &f, old_size..v.size, v.node, &cpus);
                    if let Err(e) = grown {
                        let _ = f.set_len(old_size);
                        return Err(e.into());
                    }
                    self.counters.lease_faulted(v.size - old_size, t.elapsed());
                    Ok(f)
                }
                LeaseSource::Cold => {
                    let f = BackingFile::create(&path, v.size, v.page_size, None)?;
                    let t = Instant::now();
                    let _long = long_work(v.size);
                    if let Err(e) = self.fault_lease(id, &f, 0..v.size, v.node, &cpus) {
                        let _ = fs::remove_file(&path);
                        return Err(e.into());
                    }
                    self.counters.lease_faulted(v.size, t.elapsed());
                    Ok(f)
                }
            }
        })()
        .map_err(|e| (e, None))?;
        // From before anyone else can open it until its release: who opens it.
        self.reach.watch(id, file.file());
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

    /// Faults a lease's new pages: with the node's workers when the fault is alone, with
    /// one `fallocate` worker beside other faults (see [`fault::fault_range_beside_others`]).
    fn fault_lease(
        &self,
        id: u64,
        file: &BackingFile,
        range: std::ops::Range<u64>,
        node: u32,
        cpus: &[usize],
    ) -> std::result::Result<(), fault::FaultError> {
        let (others, taken) = {
            let st = self.lock();
            // This lease's own fault is one of them.
            (st.faulting.len() > 1, st.taken(id).unwrap_or_default())
        };
        fault::fault_lease_range(file, range, node, cpus, others, taken)
    }

    /// Journals the lease and makes it visible.
    fn commit(
        &self,
        v: &ValidRequest,
        id: u64,
        source: LeaseSource,
        lease_path: &Path,
        started: Instant,
        tag: Option<&Idempotency>,
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
            idempotency: tag.cloned().map(Box::new),
            recycle: v.recycle,
            principal: v.principal.clone(),
        };
        let Some(entry) = st.files.get(&id) else {
            return Err(PoolError::NotFound { id });
        };
        let rec = FileRecord {
            size: v.size,
            state: FileState::Leased(lease.clone()),
            ..entry.rec.clone()
        };
        // The fsync runs outside the lock: the file is busy leasing, so nothing else touches
        // it, and the other leases need not wait for this one's journal.
        drop(st);
        self.journal.write(&rec.key(), &rec)?;
        let info = LeaseInfo::of(&rec, &lease);
        let mut st = self.lock();
        if let Some(e) = st.files.get_mut(&id) {
            e.rec = rec;
            e.busy = None;
        }
        st.pending_names.remove(&v.name);
        st.lessee_grace = self.lessee_grace_until();
        self.gate.leased(id);
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
            // It may have been linked and handed to the owner: proven like any release
            // (`take_back` runs again before the proof).
            e.released = Some(Released {
                lease: 0,
                name: v.name.clone(),
                recycle: v.recycle,
            });
        }
        self.changed.notify_all();
    }

    /// Deletes an idle file under the lock (used to make room for a lease).
    pub(super) fn delete_locked(&self, st: &mut State, id: u64) {
        let Some(e) = st.files.get(&id) else { return };
        let Ok(mount) = self.mount(e.rec.page_size) else {
            return;
        };
        let path = mount.file_path(id);
        let rec = e.rec.clone();
        let released = e.released.clone();
        if let Err(err) = self.remove_file(&path, &rec, released.as_ref()) {
            tracing::warn!(id, %err, "cannot delete pool file");
            return;
        }
        if let Err(err) = self.journal.remove(&file_key(id)) {
            tracing::error!(id, %err, "cannot remove journal record of deleted file");
        }
        st.files.remove(&id);
    }

    /// Releases a lease: the file is journaled dirty, the lease path removed, the file taken
    /// back from its owner, and the worker scrubs it (or deletes it above target).
    pub fn release(&self, lease_id: u64) -> Result<LeaseInfo> {
        let (id, info, mount, dirty) = {
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
            entry.released = Some(Released {
                lease: lease.id,
                name: lease.name.clone(),
                recycle: lease.recycle,
            });
            // Busy from here: a second release of the same lease finds nothing.
            entry.busy = Some(Work::Releasing);
            (entry.rec.id, info, mount, dirty)
        };
        // The fsync runs outside the lock (see `commit`).
        let written = self.journal.write(&dirty.key(), &dirty);
        {
            let mut st = self.lock();
            let Some(entry) = st.files.get_mut(&id) else {
                return Err(PoolError::NotFound { id: lease_id });
            };
            if let Err(err) = written {
                entry.busy = None;
                return Err(err.into());
            }
            entry.rec = dirty;
        }
        let path = mount.file_path(id);
        if let Ok(m) = fs::metadata(&path) {
            unlink_if_same(&info.path, m.dev(), m.ino());
        }
        self.take_back(&path);
        // Before the scrub can start: the file leaves the lease unpinned.
        self.unpin(id);
        self.gate.forget(id);
        let mut st = self.lock();
        if let Some(e) = st.files.get_mut(&id) {
            e.busy = None;
        }
        st.lessee_grace = self.lessee_grace_until();
        self.changed.notify_all();
        tracing::info!(lease = lease_id, name = %info.name, "released");
        Ok(info)
    }

    /// Gives the file back to the daemon's user, mode 0600, so that its last owner cannot
    /// open it again.
    pub(super) fn take_back(&self, path: &Path) {
        let o = self.daemon_owner;
        let _ = std::os::unix::fs::chown(path, Some(o.uid), Some(o.gid));
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o600));
    }
}

/// Work of `bytes` on an API thread: above [`RT_WORK_BYTES`] it runs outside the real-time
/// class (see `sys::priority`), so a large cold lease cannot hold a CPU from the host's VMs.
pub(super) fn long_work(bytes: u64) -> Option<OutOfRealtime> {
    (bytes > RT_WORK_BYTES).then(OutOfRealtime::enter)
}
