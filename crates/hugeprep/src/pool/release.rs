//! Giving a lease back: the file is journaled dirty, its lease path removed, the file taken
//! back from its owner; the worker proves and scrubs it (see `jobs`).

use super::*;

use super::lease::action_error;

impl Pool {
    /// Releases a lease: the file is journaled dirty, the lease path removed, the file taken
    /// back from its owner, and the worker scrubs it (or deletes it above target).
    pub fn release(&self, lease_id: u64) -> Result<LeaseInfo> {
        let (id, info, mount, dirty) = {
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
            let mount = self.mount(dirty.page_size)?.clone();
            (id, info, mount, dirty)
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
        let path = mount.file_path(id);
        if let Ok(m) = fs::metadata(&path) {
            unlink_if_same(&info.path, m.dev(), m.ino());
        }
        self.take_back(&path);
        // Before the scrub can start: the file leaves the lease unpinned.
        self.unpin(id);
        self.gate.forget(id);
        let mut st = self.lock();
        if let Err(err) = st.core.release_done(id) {
            tracing::error!(%err, "pool core refused a release's end");
        }
        st.schedule
            .grace_from(std::time::Instant::now(), self.gate.grace());
        self.changed.notify_all();
        tracing::info!(lease = lease_id, name = %info.name, file = id, "released");
        Ok(info)
    }

    /// Gives the file back to the daemon's user, mode 0600, so that its last owner cannot
    /// open it again.
    pub(super) fn take_back(&self, path: &Path) {
        let o = self.daemon_owner;
        // The pool directory (0700, the daemon's) keeps the file from anyone else by name
        // either way, and the release proof does not depend on it; but a file its lessee
        // still owns is worth a warning.
        if let Err(err) = std::os::unix::fs::chown(path, Some(o.uid), Some(o.gid))
            .and_then(|()| fs::set_permissions(path, fs::Permissions::from_mode(0o600)))
        {
            if err.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = %path.display(), %err, "cannot take a released file back from its owner");
            }
        }
    }
}
