//! The kernel's path for a pool file: what happens to released memory that is not proven
//! out of everyone else's reach, and to any file the pool gives back.
//!
//! A released file is truncated before it is unlinked: the kernel then detaches every page
//! from the inode, frees those nobody else references and leaves the others with whoever
//! holds them (a pin, a pipe), exactly as when a VM's own file is deleted. Truncating first
//! also frees the pages of an inode that another name still links to, which a plain unlink
//! would leave behind. The refill then faults new pages, which the kernel zeroes.

use std::io;

use super::host::FileAt;
use super::{FileRecord, FileState, Pool, Released};

impl Pool {
    /// Deletes the pool file `rec` (a missing file is fine). A released file (dirty, or
    /// scrubbing when the scrub gave up) is truncated first and the pages that did not return
    /// to the node's free list are counted and logged with its lease.
    pub(super) fn remove_file(
        &self,
        rec: &FileRecord,
        released: Option<&Released>,
    ) -> io::Result<()> {
        if matches!(rec.state, FileState::Dirty | FileState::Scrubbing)
            && (self.keep_pinned(rec, released) || self.truncate_released(rec, released)?)
        {
            self.host.forget(rec.id);
            return Ok(());
        }
        match self.host.unlink(FileAt::of(rec)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.host.forget(rec.id);
        Ok(())
    }

    /// Truncates a released file before its unlink, counting and logging the pages that did
    /// not return to the node's free list. `Ok(true)`: kept instead (a lessee's file lease
    /// holds it, see [`Pool::kept_for_file_lease`]).
    fn truncate_released(&self, rec: &FileRecord, released: Option<&Released>) -> io::Result<bool> {
        match self.host.truncate(FileAt::of(rec), rec.node) {
            Ok(0) => Ok(false),
            Ok(unreturned) => {
                self.table
                    .counters
                    .unreturned(unreturned, rec.page_size.bytes());
                tracing::warn!(
                    id = rec.id,
                    lease = released.map_or(0, |r| r.lease),
                    name = released.map_or("", |r| r.name.as_str()),
                    unreturned_pages = unreturned,
                    page_size = %rec.page_size,
                    node = rec.node,
                    "pages of a released lease did not return to the kernel: another process still holds them (they return when it lets go)"
                );
                Ok(false)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                Ok(self.kept_for_file_lease(rec, released))
            }
            Err(e) => Err(e),
        }
    }

    /// A lessee's read lease (`F_SETLEASE`, `F_RDLCK`) refused the truncate: its open file
    /// holds the inode, and with it every page, after an unlink. None of them comes back
    /// until it lets go: all are counted. Kept, not unlinked, when it can be charged to its
    /// lessee (truncated once the lease is gone; the kernel takes it away within
    /// `lease-break-time`): `true`.
    fn kept_for_file_lease(&self, rec: &FileRecord, released: Option<&Released>) -> bool {
        let held = self.host.held_bytes_at(FileAt::of(rec)) / rec.page_size.bytes();
        self.table.counters.unreturned(held, rec.page_size.bytes());
        let kept = self.keep(rec, lessee(released), held * rec.page_size.bytes(), false);
        if kept {
            tracing::warn!(
                id = rec.id,
                lease = released.map_or(0, |r| r.lease),
                name = released.map_or("", |r| r.name.as_str()),
                principal = released.and_then(|r| r.principal.as_deref()).unwrap_or(""),
                unreturned_pages = held,
                page_size = %rec.page_size,
                node = rec.node,
                "another process holds a file lease on a released file: kept and charged to its lessee until the lease is gone, then truncated"
            );
        } else {
            tracing::warn!(
                id = rec.id,
                lease = released.map_or(0, |r| r.lease),
                name = released.map_or("", |r| r.name.as_str()),
                unreturned_pages = held,
                page_size = %rec.page_size,
                node = rec.node,
                "another process holds a file lease on a released file: deleted without truncating, its pages did not return to the kernel (they return when it lets go)"
            );
        }
        kept
    }

    /// Before the truncate: when the kernel's counts show pages of the released file still
    /// referenced beyond the page cache and any mapping (an io_uring fixed buffer, a
    /// `vmsplice`d pipe; a mapping alone loses its pages to the truncate), keeps it untruncated, charged to its lessee, until nobody holds one (see
    /// `kept`): truncated, those pages would leave the file and stay with their holder,
    /// charged to nobody. Whether it was kept. Without the counts (the walk), or when they
    /// cannot be read, it is not: the truncate follows as before.
    fn keep_pinned(&self, rec: &FileRecord, released: Option<&Released>) -> bool {
        // For writing (the punch below): a read lease fails it at once (`O_NONBLOCK`), and
        // the truncate below keeps such a file for its lease first.
        let Ok(file) = self.host.open_released(FileAt::of(rec)) else {
            return false;
        };
        let pins = match self.host.pinned_pages(&file) {
            Ok(Some(pins)) if pins.keep_file() => pins,
            Ok(Some(pins)) if pins.pages > 0 => {
                tracing::warn!(
                    id = rec.id,
                    held_pages = pins.pages,
                    "pages of a released file are pinned and the file is still reached (an open file, a mapping): truncated, the pinned pages stay with their holder uncharged"
                );
                return false;
            }
            Ok(_) => return false,
            Err(err) => {
                tracing::warn!(id = rec.id, %err, "cannot read the kernel's counts of a released file before its truncate: pages a pin holds, if any, leave it charged to nobody");
                return false;
            }
        };
        let held = pins.pages;
        // Nothing else reaches the file (nothing can pin another page of it meanwhile) and
        // every pinned page is known: the others go back now.
        self.host.punch_unpinned(&file, &pins, rec.page_size);
        let bytes = self.host.held_bytes(&file);
        drop(file);
        if !self.keep(rec, lessee(released), bytes, true) {
            return false;
        }
        self.table.counters.unreturned(held, rec.page_size.bytes());
        tracing::warn!(
            id = rec.id,
            lease = released.map_or(0, |r| r.lease),
            name = released.map_or("", |r| r.name.as_str()),
            principal = released.and_then(|r| r.principal.as_deref()).unwrap_or(""),
            held_pages = held,
            kept_bytes = bytes,
            page_size = %rec.page_size,
            node = rec.node,
            "pages of a released file are still referenced (a pin, a pipe): kept untruncated and charged to its lessee until nobody holds one, then truncated"
        );
        true
    }
}

/// The principal and lease a kept file is charged to.
fn lessee(released: Option<&Released>) -> (Option<String>, u64) {
    (
        released.and_then(|r| r.principal.clone()),
        released.map_or(0, |r| r.lease),
    )
}
