//! The thin driver of the pool's core: performs the [`Action`]s that
//! [`core`](super::core)'s transitions return, on the journal and the mounts, and feeds the
//! outcome back as the next transition. Decisions stay in the core and in the callers
//! (`lease`, `worker`, `drain`); this file only moves bytes.

use super::core::Action;
use super::locked::Locked;
use super::*;

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
                self.remove_file(&path, rec, released.as_ref())
                    .map_err(|source| ActionError::File { path, source })
            }
        }
    }

    /// Gives up the file `id` (idle, or its work failed): truncated when released memory may
    /// be in it, unlinked, forgotten, its record removed; the truncate and unlink run outside
    /// the lock, the file being busy meanwhile. Returns the lock taken again.
    pub(super) fn give_up<'a>(&'a self, mut st: Locked<'a>, id: u64) -> Locked<'a> {
        let remove = match st.core.begin_delete(id) {
            Ok(action) => action,
            Err(err) => {
                tracing::error!(%err, "cannot give up a pool file");
                return st;
            }
        };
        drop(st);
        let removed = self.perform(&remove);
        let mut st = self.lock();
        self.finish_delete(&mut st, id, removed);
        st
    }

    /// [`Pool::give_up`] without the lock held.
    pub(super) fn give_up_unlocked(&self, id: u64) {
        drop(self.give_up(self.lock(), id));
    }

    /// Ends a deletion whose file removal returned `removed`: the file is forgotten and its
    /// record removed, or it stays (idle) when the file could not be removed.
    pub(super) fn finish_delete(
        &self,
        st: &mut State,
        id: u64,
        removed: std::result::Result<(), ActionError>,
    ) {
        let outcome = match removed {
            Ok(()) => {
                st.pages_returned();
                st.core.deleted(id).map(Some)
            }
            Err(err) => {
                tracing::error!(id, %err, "cannot delete pool file");
                st.core.delete_failed(id, self.size_on_mount(st, id))
            }
        };
        match outcome {
            Ok(Some(record)) => {
                // The record outlives the file (the next start drops it), or keeps the size
                // the file had before (the next start corrects it from the file).
                if let Err(err) = self.perform(&record) {
                    tracing::error!(id, %err, "cannot update the journal record of a pool file");
                }
            }
            Ok(None) => {}
            Err(err) => tracing::error!(%err, "pool core refused the end of a deletion"),
        }
        self.table.changed.notify_all();
    }

    /// The length of file `id` on its mount, if it can be read.
    fn size_on_mount(&self, st: &State, id: u64) -> Option<u64> {
        let page_size = st.core.get(id)?.rec().page_size;
        self.host.file_size(host::FileAt { page_size, id }).ok()
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
