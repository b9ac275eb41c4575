//! The thin driver of the pool's core: performs the [`Action`]s that
//! [`core`](super::core)'s transitions return, on the journal and the mounts, and feeds the
//! outcome back as the next transition. Decisions stay in the core and in the callers
//! (`lease`, `worker`, `drain`); this file only moves bytes.

use super::core::Action;
use super::locked::Locked;
use super::*;

/// A file removal performed outside the lock (see [`Pool::remove`]).
pub(super) struct Removal {
    result: std::result::Result<(), ActionError>,
    /// The file's length on the mount when the removal failed (a cut that failed half-way
    /// changed it), read outside the lock.
    on_mount: Option<u64>,
}

/// An action the driver could not perform.
#[derive(Debug, thiserror::Error)]
pub(super) enum ActionError {
    /// The journal refused the write or the removal.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// The file could not be truncated or unlinked.
    #[error("{path}: {source}")]
    File {
        /// The pool file.
        path: PathBuf,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// No mount serves the file's page size any more.
    #[error(transparent)]
    Mount(#[from] PoolError),
}

impl Pool {
    /// Performs one action of the core.
    pub(super) fn perform(&self, action: &Action) -> std::result::Result<(), ActionError> {
        match action {
            Action::Journal(rec) => Ok(self.host.journal_write(rec)?),
            Action::Unjournal(id) => Ok(self.host.journal_remove(*id)?),
            Action::RemoveFile { rec, released } => {
                let path = self.mount(rec.page_size)?.file_path(rec.id);
                // Freeing hugepages takes the hugetlb fault mutexes (see `OutOfIdle`).
                let _lock_holder = crate::sys::priority::OutOfIdle::enter();
                self.remove_file(rec, released.as_ref())
                    .map_err(|source| ActionError::File { path, source })
            }
        }
    }

    /// Gives up the file `id` (idle, or its work failed): truncated when released memory may
    /// be in it, unlinked, forgotten, its record removed; the truncate, the unlink and the
    /// record's removal run outside the lock, the file being busy (then forgotten) meanwhile.
    /// Returns the lock taken again.
    pub(super) fn give_up<'a>(&'a self, mut st: Locked<'a>, id: u64) -> Locked<'a> {
        let remove = match st.core.begin_delete(id) {
            Ok(action) => action,
            Err(err) => {
                tracing::error!(%err, "cannot give up a pool file");
                return st;
            }
        };
        drop(st);
        let removal = self.remove(&remove);
        let after = self.finish_delete(&mut self.lock(), id, removal);
        self.perform_after(after);
        self.lock()
    }

    /// [`Pool::give_up`] without the lock held.
    pub(super) fn give_up_unlocked(&self, id: u64) {
        drop(self.give_up(self.lock(), id));
    }

    /// Performs a file's removal (outside the lock: the file is busy deleting), reading the
    /// length it kept when the removal failed.
    pub(super) fn remove(&self, remove: &Action) -> Removal {
        let result = self.perform(remove);
        let on_mount = match (&result, remove) {
            (Err(_), Action::RemoveFile { rec, .. }) => {
                self.host.file_size(host::FileAt::of(rec)).ok()
            }
            _ => None,
        };
        Removal { result, on_mount }
    }

    /// Ends a deletion: the file is forgotten and its record is to be removed (returned, to
    /// perform once the lock is released: the id is never given again, so no later record of
    /// it can be overtaken), or it stays (idle) when the file could not be removed.
    pub(super) fn finish_delete(
        &self,
        st: &mut State,
        id: u64,
        removal: Removal,
    ) -> Option<Action> {
        let outcome = match removal.result {
            Ok(()) => {
                st.pages_returned();
                st.core.deleted(id).map(Some)
            }
            Err(err) => {
                tracing::error!(id, %err, "cannot delete pool file");
                match st.core.delete_failed(id, removal.on_mount) {
                    // A file that could not be removed keeps the size it has on the mount.
                    // Journaled under the lock on purpose: the file is idle again from here,
                    // and a later record of it (a scrub, a lease) must not be overtaken by
                    // this one. A rare error path (a failed unlink), not a lease's.
                    Ok(Some(record)) => {
                        if let Err(err) = self.perform(&record) {
                            tracing::error!(id, %err, "cannot update the journal record of a pool file");
                        }
                        Ok(None)
                    }
                    other => other,
                }
            }
        };
        self.table.changed.notify_all();
        match outcome {
            Ok(after) => after,
            Err(err) => {
                tracing::error!(%err, "pool core refused the end of a deletion");
                None
            }
        }
    }

    /// Performs what [`Pool::finish_delete`] left for after the lock: the record of a deleted
    /// file removed (a record left behind names no file, and the next start drops it).
    pub(super) fn perform_after(&self, after: Option<Action>) {
        if let Some(action) = after {
            if let Err(err) = self.perform(&action) {
                tracing::error!(%err, "cannot remove the journal record of a deleted pool file");
            }
        }
    }

    /// Undoes a file the core forgot ([`core::Core::abort_cold`], `fill_failed`): its
    /// removal, then the removal of its record. When the file cannot be removed (`EIO`,
    /// `EBUSY`) its record stays, as a dirty file the worker gives the kernel's path and
    /// removes again (see [`core::Core::unremoved`]): dropping the record would leave the
    /// file's pages to nobody until the next start. `what` names the undo in the log.
    /// Runs outside the state lock (the id is never given again, so nothing else writes the
    /// file or its record meanwhile); the lock is taken only to hand a file back to the core.
    pub(super) fn undo_forgotten(&self, undo: &[Action], what: &'static str) {
        for action in undo {
            let Action::RemoveFile { rec, .. } = action else {
                self.perform_all(std::slice::from_ref(action), what);
                continue;
            };
            let Err(err) = self.perform(action) else {
                continue;
            };
            // Gone after all (the failure was not the unlink's): nothing to keep.
            let on_mount = match self.host.file_size(host::FileAt::of(rec)) {
                Err(host::HostError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    continue;
                }
                on_mount => on_mount.ok(),
            };
            tracing::warn!(id = rec.id, %err, what, "cannot remove the file of a failed lease or refill: kept as dirty, removed again later");
            let kept = self.lock().core.unremoved(rec.clone(), on_mount);
            match kept {
                // Written outside the lock: should the worker delete the file first, the
                // record names no file, and the next start drops it.
                Ok(journal) => {
                    if let Err(err) = self.perform(&journal) {
                        tracing::error!(id = rec.id, %err, "cannot journal an unremoved file dirty");
                    }
                    self.table.changed.notify_all();
                }
                Err(err) => tracing::error!(%err, "pool core refused an unremoved file"),
            }
            // Its record stays: the steps after the removal (unjournaling it) are not taken.
            return;
        }
    }

    /// Performs actions in order, logging (not stopping at) a failure: for undoing work
    /// whose every step is worth trying (`what` names it in the log).
    pub(super) fn perform_all(&self, actions: &[Action], what: &'static str) {
        for action in actions {
            if let Err(err) = self.perform(action) {
                tracing::warn!(%err, what, "cannot undo a step");
            }
        }
    }
}
