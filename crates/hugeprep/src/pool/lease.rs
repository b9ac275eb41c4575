//! Taking and giving back leases: choosing the source (warm exact, shrunk, grown, or cold),
//! journaling each step before it takes effect, and rolling back a failed lease so that it
//! leaves no file, link or pool state behind.

use super::core::choice::{choose, Choice, LeaseView};
use super::fault::FaultError;
use super::placement::{self, NodeSupply};
use super::tenant::{check_reserved_name, scope_dir};
use super::*;
use crate::prefault::PrefaultError;
use crate::sys::priority::{OutOfRealtime, RT_WORK_BYTES};

/// A driver's failure as the request's error.
pub(super) fn action_error(err: super::driver::ActionError) -> PoolError {
    match err {
        super::driver::ActionError::Journal(e) => PoolError::Journal(e),
        super::driver::ActionError::Mount(e) => e,
        super::driver::ActionError::File { path, source } => PoolError::Io {
            op: "removing",
            path,
            source,
        },
    }
}

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
        self.settings
            .topology
            .node(node)
            .map_err(|e| PoolError::Field {
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
        // The owner's rule by its uid, however the request named it (the libvirt hook sends
        // a number, a client may send a name).
        let recycle = self.policy().recycle_for(owner.map(|o| o.uid), req.recycle);
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
            tenant: None,
        })
    }

    /// The node of a request that names none ([`placement`] has the rule).
    fn default_node(&self, pid: Option<u32>, page_size: PageSize) -> u32 {
        let pid_cpus = pid.and_then(crate::sys::affinity::process_cpus);
        let warm: Vec<(u32, u64)> = {
            let st = self.lock();
            self.settings
                .topology
                .node_ids()
                .into_iter()
                .map(|node| {
                    let bytes = st
                        .of_kind(node, page_size)
                        .filter(|e| e.is_idle(&FileState::Warm))
                        .map(|e| e.rec().size)
                        .sum();
                    (node, bytes)
                })
                .collect()
        };
        let supply: Vec<NodeSupply> = warm
            .into_iter()
            .map(|(node, warm_bytes)| NodeSupply {
                node,
                warm_bytes,
                free_bytes: self.host.available_bytes(node, page_size),
            })
            .collect();
        let (node, why) =
            placement::choose_node(&self.settings.topology, pid_cpus.as_deref(), &supply);
        tracing::debug!(node, ?why, ?pid, "lease names no node");
        node
    }

    /// Takes a lease: a warm file of exactly the size, else a larger one shrunk, else a
    /// smaller one grown, else a new one. Blocks while faulting (call from a blocking
    /// thread). On error nothing stays allocated or changed.
    pub fn lease(&self, req: &LeaseRequest) -> Result<LeaseInfo> {
        self.lease_tagged(req, None, None)
    }

    /// [`Pool::lease`] on behalf of `tenant`, whose principal is journaled as the lease's
    /// owner and whose limits it must fit (see `tenant`).
    pub fn lease_as(&self, req: &LeaseRequest, tenant: Option<&Tenant>) -> Result<LeaseInfo> {
        self.lease_tagged(req, None, tenant)
    }

    /// [`Pool::lease`], journaling `tag` (an idempotency key) with the lease.
    pub(super) fn lease_tagged(
        &self,
        req: &LeaseRequest,
        tag: Option<&Idempotency>,
        tenant: Option<&Tenant>,
    ) -> Result<LeaseInfo> {
        let started = self.host.now();
        // The lease, and the VMM start that follows it, go first (see `gate`).
        let _taking = self.clearing.gate.taking();
        let mut v = self.validate(req)?;
        if let Some(t) = tenant {
            check_reserved_name(&v.name, t)?;
            self.note_tenant(t);
            // Its files kept past a release count against it until they can be truncated:
            // try them now (one open each, and only when it has any), not at the keeper's
            // next turn.
            self.reclaim_kept(Some(&t.principal));
            // A lease that names no owner is its unix principal's: the owner rule applies.
            if v.owner.is_none() {
                let uid = t
                    .principal
                    .strip_prefix("uid:")
                    .and_then(|u| u.parse().ok());
                v.recycle = v.recycle.max_strict(self.policy().recycle_for(uid, None));
            }
        }
        v.principal = tenant.map(|t| t.principal.clone());
        v.tenant = tenant.cloned();
        // A tenant's names are its own: kept under a directory of its principal (see
        // `tenant::scope_dir`), so nobody else can learn, block or answer for them.
        let scope = tenant
            .filter(|t| !t.admin)
            .map(|t| scope_dir(&t.principal, &self.tenants.scope_key));
        if let Some(dir) = &scope {
            v.name = format!("{dir}/{}", v.name);
        }
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
                self.table.changed.notify_all();
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
        let deadline = self.host.now() + LEASE_WAIT;
        let mut st = self.lock();
        let mut waiting = false;
        // The kernel's pool is raised for this lease at most once (see `raise_for_lease`).
        let mut raised = false;
        let mut capped = None;
        let result = loop {
            if self.table.is_shut_down() {
                break Err(PoolError::ShuttingDown);
            }
            if st.core.name_in_use(&v.name) {
                break Err(PoolError::DuplicateName {
                    name: super::record::display_name(&v.name).to_string(),
                });
            }
            // Checked again at every turn: the same lock hold claims the file below.
            if let Err(e) = self.check_limits(&st, v) {
                break Err(e);
            }
            let view = self.view(&st, v, deadline);
            match choose(&view) {
                // More than the kind can supply: raise the node's kernel pool by what the
                // kernel's free pages lack for the whole lease, once, then choose again.
                Choice::Refuse { .. } if !raised => {
                    raised = true;
                    drop(st);
                    capped = self
                        .raise_for_lease(
                            v.node,
                            v.page_size,
                            &mount.root,
                            v.size.saturating_sub(view.avail),
                        )
                        .capped;
                    st = self.lock();
                }
                // `reserve_limit` kept the kernel's pool from growing for it: a limit, as
                // for a tenant's (429).
                Choice::Refuse { available } if capped.is_some() => {
                    // The host's own limit kept a VM from starting: /health and doctor say so.
                    self.note_refused(v.node, v.page_size, v.size, available);
                    let (max, in_use, asked) = capped.unwrap_or_default();
                    break Err(PoolError::OverLimit {
                        principal: v.principal.clone().unwrap_or_else(|| "the daemon".into()),
                        limit: format!("reserve_limit (node {})", v.node),
                        max,
                        in_use,
                        asked,
                    });
                }
                Choice::Refuse { available } => {
                    self.note_refused(v.node, v.page_size, v.size, available);
                    break Err(PoolError::Insufficient {
                        size: v.size,
                        page_size: v.page_size,
                        node: v.node,
                        available,
                    });
                }
                Choice::Wait { for_faults } => {
                    if for_faults && !waiting {
                        tracing::debug!(name = %v.name, size = v.size, "lease waits for faults in progress");
                    }
                    self.wait_urgently(&mut waiting);
                    st = st.wait_timeout(&self.table.changed, Duration::from_millis(50));
                }
                // Room for the lease: the victim's truncate and unlink run outside the lock.
                Choice::MakeRoom(victim) => st = self.give_up(st, victim),
                Choice::Take { file, source, need } => {
                    break self.claim(&mut st, v, file, source, need);
                }
            }
        };
        if waiting {
            self.clearing.control.end_urgent();
        }
        result
    }

    /// What the lease sees of its kind: the pool's files under the lock, the kernel's free
    /// pages and the clock ([`core::choice::choose`] decides from it).
    fn view(&self, st: &State, v: &ValidRequest, deadline: Instant) -> LeaseView {
        let promised = st.promised(v.node, v.page_size);
        let idle = |state: FileState| -> Vec<(u64, u64)> {
            st.of_kind(v.node, v.page_size)
                .filter(|e| e.is_idle(&state))
                .map(|e| (e.rec().id, e.rec().size))
                .collect()
        };
        LeaseView {
            size: v.size,
            avail: self.host.available_after(v.node, v.page_size, &promised),
            faulting: promised.bytes,
            warm: idle(FileState::Warm),
            dirty: idle(FileState::Dirty),
            pending: st.pending_clean_bytes(v.node, v.page_size),
            may_wait: self.host.now() < deadline,
        }
    }

    /// Makes the chosen file the request's (a warm one as it is, a new one journaled
    /// filling first) and promises the pages its fault needs.
    fn claim(
        &self,
        st: &mut State,
        v: &ValidRequest,
        file: Option<(u64, u64)>,
        source: LeaseSource,
        need: u64,
    ) -> Result<(u64, LeaseSource, u64)> {
        let core_err = |e: core::CoreError| PoolError::Field {
            field: "name",
            message: e.to_string(),
        };
        let claimed = match file {
            Some((id, old)) => {
                st.core.take_warm(id, &v.name).map_err(core_err)?;
                (id, source, old)
            }
            None => {
                let (id, journal) = st
                    .core
                    .new_cold(v.node, v.page_size, v.size, &v.name)
                    .map_err(core_err)?;
                if let Err(err) = self.perform(&journal) {
                    if let Err(refused) = st.core.forget_unjournaled(id) {
                        tracing::error!(%refused, "pool core refused to forget a cold lease");
                    }
                    return Err(action_error(err));
                }
                (id, source, 0)
            }
        };
        if need > 0 {
            st.start_faulting(claimed.0, v.node, v.page_size, need);
        }
        self.start_taking(st, v, claimed.0);
        st.note_demand(v.node, v.page_size, v.size);
        if source != LeaseSource::WarmExact {
            st.schedule.missed();
        }
        Ok(claimed)
    }

    /// A lease starts waiting for background work (once per lease; `reserve` ends it):
    /// scrubs and refills run at full speed and through the start gate meanwhile.
    fn wait_urgently(&self, waiting: &mut bool) {
        if !*waiting {
            *waiting = true;
            self.clearing.control.begin_urgent();
            self.table.changed.notify_all();
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
        let at = host::FileAt {
            page_size: v.page_size,
            id,
        };
        let cpus = self.cpus(v.node);
        let file = (|| -> Result<host::Handle> {
            match source {
                LeaseSource::WarmExact => Ok(self.host.open(at)?),
                LeaseSource::WarmShrunk => {
                    let mut f = self.host.open(at)?;
                    self.host.resize(&mut f, v.size)?;
                    Ok(f)
                }
                LeaseSource::WarmGrown => {
                    let mut f = self.host.open(at)?;
                    self.host.resize(&mut f, v.size)?;
                    let t = self.host.now();
                    let _long = long_work(v.size - old_size);
                    let grown = self.fault_lease(id, &f, old_size..v.size, v.node, &cpus);
                    if let Err(e) = grown {
                        // The abort journals the file dirty at the size it has on the mount,
                        // whichever that is.
                        let _ = self.host.resize(&mut f, old_size);
                        return Err(e.into());
                    }
                    let took = self.host.now().saturating_duration_since(t);
                    self.table.counters.lease_faulted(v.size - old_size, took);
                    Ok(f)
                }
                LeaseSource::Cold => {
                    let f = self.host.create(at, v.size)?;
                    let t = self.host.now();
                    let _long = long_work(v.size);
                    if let Err(e) = self.fault_lease(id, &f, 0..v.size, v.node, &cpus) {
                        // The abort removes it again (and its record), logging a failure.
                        let _ = self.host.unlink(at);
                        return Err(e.into());
                    }
                    let took = self.host.now().saturating_duration_since(t);
                    self.table.counters.lease_faulted(v.size, took);
                    Ok(f)
                }
            }
        })()
        .map_err(|e| (e, None))?;
        // From before anyone else can open it until its release: who opens it.
        self.host.watch(id, &file);
        if let Some(owner) = v.owner {
            self.host
                .chown(&file, owner)
                .map_err(|e| (e.into(), Some(false)))?;
        }
        if self.host.lease_path_taken(lease_path) {
            return Err((
                PoolError::Field {
                    field: "name",
                    message: format!("{} already exists", lease_path.display()),
                },
                Some(false),
            ));
        }
        if let Some((dir, _)) = v.name.split_once('/') {
            // A tenant's directory (see `tenant::scope_dir`): others may pass through it to the
            // paths they were given, not list it.
            self.host
                .tenant_dir(v.page_size, dir)
                .map_err(|e| (e.into(), Some(false)))?;
        }
        self.host
            .link_lease(&file, lease_path)
            .map_err(|e| (e.into(), Some(false)))?;
        Ok(true)
    }

    /// Faults a lease's new pages: with the node's workers when the fault is alone, with
    /// one `fallocate` worker beside other faults (see [`fault::fault_range_beside_others`]).
    fn fault_lease(
        &self,
        id: u64,
        file: &host::Handle,
        range: std::ops::Range<u64>,
        node: u32,
        cpus: &[usize],
    ) -> std::result::Result<(), fault::FaultError> {
        let (others, taken) = {
            let st = self.lock();
            // This lease's own fault is one of them.
            (st.faulting.len() > 1, st.taken(id).unwrap_or_default())
        };
        self.host
            .fault_lease(file, range, node, cpus, others, taken)
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
        let lease_id = st.core.new_id();
        let lease = LeaseRecord {
            id: lease_id,
            name: v.name.clone(),
            path: lease_path.to_path_buf(),
            uid: v.owner.map(|o| o.uid),
            gid: v.owner.map(|o| o.gid),
            pid: v.pid.map(|p| p.0),
            pid_start: v.pid.map(|p| p.1),
            source,
            ready_ms: self
                .host
                .now()
                .saturating_duration_since(started)
                .as_secs_f64()
                * 1e3,
            created_unix: now_unix(),
            idempotency: tag.cloned().map(Box::new),
            recycle: v.recycle,
            principal: v.principal.clone(),
        };
        let rec = st
            .core
            .lease_record(id, v.size, lease.clone())
            .map_err(|_| PoolError::NotFound { id })?;
        // The write runs outside the lock: the file is busy leasing, so nothing else touches
        // it, and the other leases need not wait for this one's journal.
        drop(st);
        self.perform(&core::Action::Journal(rec.clone()))
            .map_err(action_error)?;
        let info = LeaseInfo::of(&rec, &lease);
        let mut st = self.lock();
        if let Err(err) = st.core.leased(id, rec) {
            tracing::error!(%err, "pool core refused a lease's commit");
        }
        // Counted by its journaled record from here.
        st.taking.remove(&id);
        let now = Instant::now();
        st.schedule.grace_from(now, self.clearing.gate.grace());
        self.clearing.gate.leased(id, now);
        self.table.changed.notify_all();
        Ok(info)
    }

    /// Undoes a failed lease: a new file is deleted, a warm one goes to the scrubber.
    fn abort(&self, v: &ValidRequest, id: u64, source: LeaseSource, linked: Option<bool>) {
        let Ok(mount) = self.mount(v.page_size) else {
            return;
        };
        let at = host::FileAt {
            page_size: v.page_size,
            id,
        };
        if linked == Some(true) {
            self.host.unlink_lease(at, &mount.lease_dir.join(&v.name));
        }
        let size = self.host.file_size(at);
        let mut st = self.lock();
        st.taking.remove(&id);
        if source == LeaseSource::Cold {
            match st.core.abort_cold(id) {
                Ok(undo) => self.perform_all(&undo, "a cold lease"),
                Err(err) => tracing::error!(%err, "pool core refused a cold lease's abort"),
            }
        } else {
            // It may have been resized or handed to the owner: scrub it before reuse. It may
            // have been linked and handed to the owner: proven like any release (`take_back`
            // runs again before the proof).
            let size = size.unwrap_or_else(|_| st.core.get(id).map_or(0, |e| e.rec().size));
            let released = Released {
                lease: 0,
                name: v.name.clone(),
                recycle: v.recycle,
                // Watched from `prepare` on, before anyone but the daemon could open it.
                watched: true,
                principal: v.principal.clone(),
            };
            match st.core.abort_warm(id, size, released) {
                Ok(journal) => {
                    if let Err(err) = self.perform(&journal) {
                        tracing::error!(%err, "cannot journal an aborted lease as dirty");
                    }
                }
                Err(err) => tracing::error!(%err, "pool core refused a lease's abort"),
            }
        }
        self.table.changed.notify_all();
    }
}

/// Work of `bytes` on an API thread: above [`RT_WORK_BYTES`] it runs outside the real-time
/// class (see `sys::priority`), so a large cold lease cannot hold a CPU from the host's VMs.
pub(super) fn long_work(bytes: u64) -> Option<OutOfRealtime> {
    (bytes > RT_WORK_BYTES).then(OutOfRealtime::enter)
}
