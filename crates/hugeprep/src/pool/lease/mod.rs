//! Taking and giving back leases: choosing the source (warm exact, shrunk, grown, or cold),
//! journaling each step before it takes effect, and rolling back a failed lease so that it
//! leaves no file, link or pool state behind.

use super::fault::FaultError;
use super::tenant::{check_reserved_name, scope_dir};
use super::*;
use crate::prefault::PrefaultError;
use crate::sys::priority::{OutOfRealtime, RT_WORK_BYTES};

mod choose;
mod prepare;
mod validate;

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

/// A claimed file (id, source) and how its preparation went (see `prepare`).
type Reserved = (
    u64,
    LeaseSource,
    std::result::Result<bool, (PoolError, Option<bool>)>,
);

/// How many times a lease chooses again when the kernel's free pages ran out under its
/// fault.
const FAULT_RETRIES: u32 = 3;

impl Pool {
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
        let v = self.validate_for(req, tenant)?;
        let lease_path = self.mount(v.page_size)?.lease_dir.join(&v.name);
        let (id, source, prepared) = self.reserve_and_prepare(&v, &lease_path)?;
        match prepared {
            Ok(linked) => self.pin_and_commit(&v, (id, source), linked, &lease_path, started, tag),
            Err((e, linked)) => {
                self.abort(&v, id, source, linked);
                Err(e)
            }
        }
    }

    /// [`Pool::validate`], then what `tenant` adds: its reserved names, its kept files tried
    /// again, the owner rule of its unix principal, and its names scoped to its directory.
    fn validate_for(&self, req: &LeaseRequest, tenant: Option<&Tenant>) -> Result<ValidRequest> {
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
        Ok(v)
    }

    /// Claims a file and prepares it, choosing again (at most [`FAULT_RETRIES`] times) when
    /// the kernel's free pages ran out under the fault.
    fn reserve_and_prepare(&self, v: &ValidRequest, lease_path: &Path) -> Result<Reserved> {
        let mut attempts = 0;
        loop {
            let (id, source, old_size) = self.reserve(v)?;
            let prepared = self.prepare(v, id, source, old_size, lease_path);
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
                    self.abort(v, id, source, *linked);
                    continue;
                }
            }
            return Ok((id, source, prepared));
        }
    }

    /// Pins a prepared lease (when asked) and commits it; undoes it on failure.
    fn pin_and_commit(
        &self,
        v: &ValidRequest,
        (id, source): (u64, LeaseSource),
        linked: bool,
        lease_path: &Path,
        started: Instant,
        tag: Option<&Idempotency>,
    ) -> Result<LeaseInfo> {
        let pin = match self.pin_lease(v, id) {
            Ok(pin) => pin,
            Err(e) => {
                self.abort(v, id, source, Some(linked));
                return Err(e);
            }
        };
        match self.commit(v, id, source, lease_path, started, tag) {
            Ok(mut info) => {
                info.pinned = self.hold_pin(id, pin);
                Ok(info)
            }
            Err(e) => {
                if let Some(pin) = pin {
                    self.host.unpin(pin);
                }
                self.abort(v, id, source, Some(linked));
                Err(e)
            }
        }
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
        // The worker's schedule runs on the host's clock (simulated in the driver's tests),
        // the start gate on the real one.
        st.schedule
            .grace_from(self.host.now(), self.clearing.gate.grace());
        self.clearing.gate.leased(id, Instant::now());
        self.table.changed.notify_all();
        drop(st);
        // A tenant's starts count up to its share (see `adaptive::weigh`).
        let who = adaptive::Starter::of(v.tenant.as_ref(), &v.name);
        self.adaptive_started(info.node, info.page_size, who, info.size);
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
            // Forgotten under the lock; the file and its record are removed outside it (the
            // id is never given again, so nothing else writes them).
            let undo = st.core.abort_cold(id);
            drop(st);
            match undo {
                Ok(undo) => self.undo_forgotten(&undo, "a cold lease"),
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
            // Journaled under the lock on purpose: the file is idle (dirty) from here, and
            // this record must land before any later one of it (its scrub's, a lease's), or a
            // crash could recover a leased file as dirty. A failed lease's rare path.
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
