//! The transitions: one method per event, each checking the phase it leaves, moving the
//! file, returning what the driver must do, and checking the invariants afterwards.

use super::{Action, Core, CoreError, Entry, Phase, Released, Result, Work};
use crate::page_size::PageSize;
use crate::pool::record::{FileRecord, FileState, LeaseRecord, LeaseSource};

impl Core {
    /// A lease chose the warm file `id`: it is the request's until [`Core::leased`] or
    /// [`Core::abort_warm`]. No journal write: the record still says warm, which is trusted
    /// only after a clean shutdown, and a clean shutdown waits for this request.
    pub(crate) fn take_warm(&mut self, id: u64, name: &str) -> Result<()> {
        self.claim_name(name)?;
        let e = self.expect("take-warm", id, &[Phase::Warm])?;
        e.busy = Some(Work::Leasing);
        self.pending.insert(name.to_string(), id);
        self.assert_valid("take-warm");
        Ok(())
    }

    /// A lease needs a new file of `size`: its id and the record to journal before the file
    /// is created. A failed write undoes it with [`Core::forget_unjournaled`].
    pub(crate) fn new_cold(
        &mut self,
        node: u32,
        page_size: PageSize,
        size: u64,
        name: &str,
    ) -> Result<(u64, Action)> {
        self.claim_name(name)?;
        let (id, rec) = self.new_file(node, page_size, size, Work::Leasing);
        self.pending.insert(name.to_string(), id);
        self.assert_valid("new-cold");
        Ok((id, Action::Journal(rec)))
    }

    /// The worker refills: a new file of `size`, its id and the record to journal before
    /// the file is created. A failed write undoes it with [`Core::forget_unjournaled`].
    pub(crate) fn new_fill(&mut self, node: u32, page_size: PageSize, size: u64) -> (u64, Action) {
        let (id, rec) = self.new_file(node, page_size, size, Work::Refill);
        self.assert_valid("new-fill");
        (id, Action::Journal(rec))
    }

    fn new_file(
        &mut self,
        node: u32,
        page_size: PageSize,
        size: u64,
        work: Work,
    ) -> (u64, FileRecord) {
        let id = self.new_id();
        let rec = FileRecord {
            id,
            page_size,
            node,
            size,
            state: FileState::Filling,
        };
        self.files.insert(id, Entry::new(rec.clone(), Some(work)));
        (id, rec)
    }

    /// The filling record of a new file could not be journaled: the file was never created
    /// and is forgotten.
    pub(crate) fn forget_unjournaled(&mut self, id: u64) -> Result<()> {
        self.expect(
            "forget-unjournaled",
            id,
            &[Phase::Filling, Phase::ColdLeasing],
        )?;
        self.files.remove(&id);
        self.pending.retain(|_, f| *f != id);
        self.assert_valid("forget-unjournaled");
        Ok(())
    }

    fn claim_name(&self, name: &str) -> Result<()> {
        if self.name_in_use(name) {
            return Err(CoreError::Name {
                name: name.to_string(),
            });
        }
        Ok(())
    }

    /// The record that makes file `id` the lease `lease` at `size`, to journal before
    /// [`Core::leased`]. A cold lease's file must come from [`Core::new_cold`], every other
    /// from a warm file: never a dirty one.
    pub(crate) fn lease_record(
        &self,
        id: u64,
        size: u64,
        lease: LeaseRecord,
    ) -> Result<FileRecord> {
        let e = self.files.get(&id).ok_or(CoreError::NoFile {
            event: "lease-record",
            id,
        })?;
        let phase = e.phase();
        let fits = match phase {
            Some(Phase::ColdLeasing) => lease.source == LeaseSource::Cold,
            Some(Phase::Leasing) => lease.source != LeaseSource::Cold,
            _ => false,
        };
        if !fits {
            return Err(CoreError::Phase {
                event: "lease-record",
                id,
                phase,
            });
        }
        Ok(FileRecord {
            size,
            state: FileState::Leased(lease),
            ..e.rec.clone()
        })
    }

    /// The lease's record (from [`Core::lease_record`]) is journaled: the file is leased and
    /// the request's name is the lease's.
    pub(crate) fn leased(&mut self, id: u64, rec: FileRecord) -> Result<()> {
        let FileState::Leased(lease) = &rec.state else {
            return Err(CoreError::Phase {
                event: "leased",
                id,
                phase: self.files.get(&id).and_then(Entry::phase),
            });
        };
        let name = lease.name.clone();
        let e = self.expect("leased", id, &[Phase::Leasing, Phase::ColdLeasing])?;
        e.rec = rec;
        e.busy = None;
        e.watched = true;
        self.pending.remove(&name);
        self.assert_valid("leased");
        Ok(())
    }

    /// A cold lease failed: its file is removed, then its record. The file is forgotten at
    /// once (a record left behind names no file, and the next start drops it).
    pub(crate) fn abort_cold(&mut self, id: u64) -> Result<Vec<Action>> {
        let e = self.expect("abort-cold", id, &[Phase::ColdLeasing])?;
        let rec = e.rec.clone();
        self.files.remove(&id);
        self.pending.retain(|_, f| *f != id);
        self.assert_valid("abort-cold");
        Ok(vec![
            Action::RemoveFile {
                rec,
                released: None,
            },
            Action::Unjournal(id),
        ])
    }

    /// A lease of a warm file failed after it may have been resized, linked or handed to its
    /// owner: the file is dirty at `size` (what is on the mount), proven like any release.
    pub(crate) fn abort_warm(&mut self, id: u64, size: u64, released: Released) -> Result<Action> {
        self.expect("abort-warm", id, &[Phase::Leasing])?;
        let at = self.next_release();
        let e = self.expect("abort-warm", id, &[Phase::Leasing])?;
        e.released_at = at;
        e.rec.size = size;
        e.rec.state = FileState::Dirty;
        e.busy = None;
        e.released = Some(released);
        let rec = e.rec.clone();
        self.pending.retain(|_, f| *f != id);
        self.assert_valid("abort-warm");
        Ok(Action::Journal(rec))
    }

    /// A release of lease `lease_id` begins: its file (busy from here, so that a second
    /// release finds nothing) and the dirty record to journal. `None`: no such idle lease.
    pub(crate) fn begin_release(&mut self, lease_id: u64) -> Option<(u64, FileRecord)> {
        let e = self.files.values_mut().find(|e| {
            e.busy.is_none() && matches!(&e.rec.state, FileState::Leased(l) if l.id == lease_id)
        })?;
        let FileState::Leased(lease) = &e.rec.state else {
            return None;
        };
        e.released = Some(Released {
            lease: lease.id,
            name: lease.name.clone(),
            recycle: lease.recycle,
            watched: e.watched,
            principal: lease.principal.clone(),
        });
        e.busy = Some(Work::Releasing);
        let dirty = FileRecord {
            state: FileState::Dirty,
            ..e.rec.clone()
        };
        let id = e.rec.id;
        self.assert_valid("begin-release");
        Some((id, dirty))
    }

    /// The release's dirty record is journaled (from here a crash scrubs or deletes it).
    pub(crate) fn release_journaled(&mut self, id: u64) -> Result<()> {
        let e = self.expect("release-journaled", id, &[Phase::Releasing])?;
        e.rec.state = FileState::Dirty;
        self.assert_valid("release-journaled");
        Ok(())
    }

    /// The release's dirty record could not be journaled: the lease stays.
    pub(crate) fn release_failed(&mut self, id: u64) -> Result<()> {
        let e = self.expect("release-failed", id, &[Phase::Releasing])?;
        if !matches!(e.rec.state, FileState::Leased(_)) {
            return Err(CoreError::Phase {
                event: "release-failed",
                id,
                phase: e.phase(),
            });
        }
        e.busy = None;
        e.released = None;
        self.assert_valid("release-failed");
        Ok(())
    }

    /// The released file's lease path is gone and the file taken back: the worker's.
    pub(crate) fn release_done(&mut self, id: u64) -> Result<()> {
        let e = self.expect("release-done", id, &[Phase::Releasing])?;
        if e.rec.state != FileState::Dirty {
            return Err(CoreError::Phase {
                event: "release-done",
                id,
                phase: e.phase(),
            });
        }
        let at = self.next_release();
        let e = self.expect("release-done", id, &[Phase::Releasing])?;
        e.released_at = at;
        e.busy = None;
        self.assert_valid("release-done");
        Ok(())
    }

    /// The worker keeps a dirty file at `size`: it is proven and scrubbed; the record to
    /// journal first. A failed write gives it up ([`Core::begin_delete`]).
    pub(crate) fn begin_scrub(&mut self, id: u64, size: u64) -> Result<Action> {
        self.expect("begin-scrub", id, &[Phase::Dirty])?;
        self.serve(id);
        let e = self.expect("begin-scrub", id, &[Phase::Dirty])?;
        e.rec.state = FileState::Scrubbing;
        e.rec.size = size;
        e.busy = Some(Work::Scrub);
        let rec = e.rec.clone();
        self.assert_valid("begin-scrub");
        Ok(Action::Journal(rec))
    }

    /// The record that says file `id` is warm at `size` after its scrub, to journal before
    /// [`Core::scrubbed`].
    pub(crate) fn warm_record(&self, id: u64, size: u64) -> Result<FileRecord> {
        let e = self.files.get(&id).ok_or(CoreError::NoFile {
            event: "warm-record",
            id,
        })?;
        match e.phase() {
            Some(Phase::Scrubbing | Phase::Filling | Phase::Cutting) => Ok(FileRecord {
                size,
                state: FileState::Warm,
                ..e.rec.clone()
            }),
            phase => Err(CoreError::Phase {
                event: "warm-record",
                id,
                phase,
            }),
        }
    }

    /// The file is scrubbed, verified and journaled warm ([`Core::warm_record`]).
    pub(crate) fn scrubbed(&mut self, id: u64, rec: FileRecord) -> Result<()> {
        self.make_warm("scrubbed", id, rec, Phase::Scrubbing)
    }

    /// A refilled file is faulted and journaled warm ([`Core::warm_record`]).
    pub(crate) fn filled(&mut self, id: u64, rec: FileRecord) -> Result<()> {
        self.make_warm("filled", id, rec, Phase::Filling)
    }

    /// A cut warm file is cut and journaled at its new size ([`Core::warm_record`]).
    pub(crate) fn cut_done(&mut self, id: u64, rec: FileRecord) -> Result<()> {
        self.make_warm("cut-done", id, rec, Phase::Cutting)
    }

    fn make_warm(
        &mut self,
        event: &'static str,
        id: u64,
        rec: FileRecord,
        from: Phase,
    ) -> Result<()> {
        let e = self.expect(event, id, &[from])?;
        if rec.state != FileState::Warm || rec.id != id {
            return Err(CoreError::Phase {
                event,
                id,
                phase: Some(from),
            });
        }
        e.rec = rec;
        e.busy = None;
        e.released = None;
        e.watched = false;
        self.assert_valid(event);
        Ok(())
    }

    /// A released file's proof found it still held: dirty again at `size` (what the journal
    /// says: the scrubbing record is written only once the proof passes), to wait aside.
    /// Refused for a size of no pages (the file then takes the kernel's path).
    pub(crate) fn held_aside(&mut self, id: u64, size: u64) -> Result<()> {
        let e = self.expect("held-aside", id, &[Phase::Scrubbing])?;
        // A lessee may cut its file to nothing and keep it open: such a file holds no page
        // to wait for, and a record of no pages is none the journal can hold.
        let page = e.rec.page_size.bytes();
        if size == 0 || size % page != 0 {
            return Err(CoreError::Size {
                event: "held-aside",
                id,
                size,
            });
        }
        e.rec.state = FileState::Dirty;
        e.rec.size = size;
        e.busy = None;
        self.assert_valid("held-aside");
        Ok(())
    }

    /// A scrub was cancelled (shutdown): dirty again in memory; the journal says scrubbing,
    /// which the next start scrubs or deletes.
    pub(crate) fn scrub_cancelled(&mut self, id: u64) -> Result<()> {
        let e = self.expect("scrub-cancelled", id, &[Phase::Scrubbing])?;
        e.rec.state = FileState::Dirty;
        e.busy = None;
        self.assert_valid("scrub-cancelled");
        Ok(())
    }

    /// The worker cuts the warm file `id` to `size` (a size in demand): the record to
    /// journal once the file is cut. A failure gives it up ([`Core::begin_delete`]).
    pub(crate) fn begin_cut(&mut self, id: u64, size: u64) -> Result<Action> {
        let e = self.expect("begin-cut", id, &[Phase::Warm])?;
        e.rec.size = size;
        e.busy = Some(Work::Scrub);
        let rec = e.rec.clone();
        self.assert_valid("begin-cut");
        Ok(Action::Journal(rec))
    }

    /// The file is given up (above target, not wanted, room for a lease, a drain, or an
    /// error on the way): the file to truncate and unlink, then [`Core::deleted`].
    pub(crate) fn begin_delete(&mut self, id: u64) -> Result<Action> {
        let from = [Phase::Warm, Phase::Dirty, Phase::Scrubbing, Phase::Cutting];
        self.expect("begin-delete", id, &from)?;
        self.serve(id);
        let e = self.expect("begin-delete", id, &from)?;
        e.busy = Some(Work::Delete);
        let action = Action::RemoveFile {
            rec: e.rec.clone(),
            released: e.released.clone(),
        };
        self.assert_valid("begin-delete");
        Ok(action)
    }

    /// The file is truncated and unlinked: it is forgotten, and its record is removed next
    /// (a record left behind names no file, and the next start drops it).
    pub(crate) fn deleted(&mut self, id: u64) -> Result<Action> {
        self.expect("deleted", id, &[Phase::Deleting])?;
        self.files.remove(&id);
        self.assert_valid("deleted");
        Ok(Action::Unjournal(id))
    }

    /// The file could not be deleted: idle again, in what its record says (a file given up
    /// in the middle of its scrub is dirty, so that the worker tries again), at the size it
    /// has on the mount (`on_mount`; a cut that failed half-way changed it): the record to
    /// journal when that size differs.
    pub(crate) fn delete_failed(
        &mut self,
        id: u64,
        on_mount: Option<u64>,
    ) -> Result<Option<Action>> {
        let e = self.expect("delete-failed", id, &[Phase::Deleting])?;
        // A scrub given up (its proof failed) was never journaled scrubbing, but its record
        // here may have taken the size in demand already (`begin_scrub`): journaled dirty
        // again, so that the journal says what the core holds.
        let scrubbing = e.rec.state == FileState::Scrubbing;
        if scrubbing {
            e.rec.state = FileState::Dirty;
        }
        e.busy = None;
        if on_mount == Some(0) {
            // Truncated by the kernel's path, then not unlinked: nothing is left to recycle,
            // and its history is dropped, so that the next round proves nothing and deletes
            // it again (a proof that passed would scrub and journal warm a file of nothing).
            e.released = None;
        }
        let page = e.rec.page_size.bytes();
        let resized = match on_mount {
            Some(size) if size != e.rec.size && size > 0 && size % page == 0 => {
                e.rec.size = size;
                Some(Action::Journal(e.rec.clone()))
            }
            _ if scrubbing => Some(Action::Journal(e.rec.clone())),
            _ => None,
        };
        self.assert_valid("delete-failed");
        Ok(resized)
    }

    /// A file forgotten by [`Core::abort_cold`] or [`Core::fill_failed`] could not be
    /// removed: it comes back as dirty and idle, its history unknown (never proven: the
    /// worker gives it the kernel's path and tries the removal again), at the size it has
    /// on the mount (`on_mount`) when that is whole pages, else its record's. The record to
    /// journal instead of the removal of the old one: until the file is gone a record names
    /// it, so its pages are the pool's, not leaked until the next start.
    pub(crate) fn unremoved(
        &mut self,
        mut rec: FileRecord,
        on_mount: Option<u64>,
    ) -> Result<Action> {
        let id = rec.id;
        if self.files.contains_key(&id) {
            return Err(CoreError::Phase {
                event: "unremoved",
                id,
                phase: self.files.get(&id).and_then(Entry::phase),
            });
        }
        let page = rec.page_size.bytes();
        if let Some(size) = on_mount.filter(|&s| s > 0 && s % page == 0) {
            rec.size = size;
        }
        rec.state = FileState::Dirty;
        self.files.insert(id, Entry::new(rec.clone(), None));
        self.assert_valid("unremoved");
        Ok(Action::Journal(rec))
    }

    /// A refill failed: the file is forgotten, then removed, then its record.
    pub(crate) fn fill_failed(&mut self, id: u64) -> Result<Vec<Action>> {
        let e = self.expect("fill-failed", id, &[Phase::Filling])?;
        let rec = e.rec.clone();
        self.files.remove(&id);
        self.assert_valid("fill-failed");
        Ok(vec![
            Action::RemoveFile {
                rec,
                released: None,
            },
            Action::Unjournal(id),
        ])
    }
}
