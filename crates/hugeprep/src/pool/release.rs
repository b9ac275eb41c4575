//! Giving a lease back: the file is journaled dirty, its lease path removed, the file taken
//! back from its owner; the worker proves and scrubs it (see `jobs`).

use super::*;

use super::lease::action_error;

impl Pool {
    /// Releases a lease: the file is journaled dirty, the lease path removed, the file taken
    /// back from its owner, and the worker scrubs it (or deletes it above target).
    pub fn release(&self, lease_id: u64) -> Result<LeaseInfo> {
        let (id, info, page_size, dirty) = {
            let mut st = self.lock();
            // Busy from here: a second release of the same lease finds nothing.
            let Some((id, dirty)) = st.core.begin_release(lease_id) else {
                return Err(PoolError::NotFound { id: lease_id });
            };
            let Some(e) = st.core.get(id) else {
                return Err(PoolError::NotFound { id: lease_id });
            };
            let FileState::Leased(lease) = &e.rec().state else {
                return Err(PoolError::NotFound { id: lease_id });
            };
            let info = LeaseInfo::of(e.rec(), lease);
            let page_size = self.mount(dirty.page_size)?.page_size;
            (id, info, page_size, dirty)
        };
        // The write runs outside the lock (see `commit`).
        let written = self.perform(&core::Action::Journal(dirty));
        {
            let mut st = self.lock();
            let outcome = match written {
                Ok(()) => st.core.release_journaled(id).map(|()| None),
                Err(err) => st.core.release_failed(id).map(|()| Some(err)),
            };
            match outcome {
                Ok(None) => {}
                Ok(Some(err)) => return Err(action_error(err)),
                Err(_) => return Err(PoolError::NotFound { id: lease_id }),
            }
        }
        let at = host::FileAt { page_size, id };
        self.host.unlink_lease(at, &info.path);
        // A file not taken back here is tried again before its scrub, and takes the
        // kernel's path if it still cannot be.
        let _ = self.host.take_back(at);
        // Before the scrub can start: the file leaves the lease unpinned.
        self.unpin(id);
        self.clearing.gate.forget(id);
        let mut st = self.lock();
        if let Err(err) = st.core.release_done(id) {
            tracing::error!(%err, "pool core refused a release's end");
        }
        st.schedule
            .grace_from(self.host.now(), self.clearing.gate.grace());
        self.table.changed.notify_all();
        drop(st);
        tracing::info!(lease = lease_id, name = %info.name, file = id, "released");
        Ok(info)
    }
}
