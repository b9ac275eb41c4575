//! The worker's jobs (chosen by `worker.rs`): each performs its file's I/O outside the state
//! lock (the file is busy meanwhile) and ends with the core's transition for the outcome.

use std::sync::Arc;

use super::aside::Verdict;
use super::core::{Action, Released};
use super::counters::ReleaseFailure;
use super::host::{Background, FileAt, Handle};
use super::reach::Unproven;
use super::{FileRecord, Pool};
use crate::background::Yield;
use crate::policy::pool::Recycle;
use crate::scrub::{ScrubError, ScrubOptions, ScrubReport};
use crate::units::format_bytes;

/// What one proof of a released file found.
enum Proved {
    /// Out of everyone else's reach: recycled in place.
    Yes,
    /// Still held (open, mapped, in an io_uring, or a lessee's teardown not done): it may
    /// wait aside and be proven again (see `aside`).
    Held(Unproven),
    /// Never provable: the kernel's path at once.
    No(Unproven),
}

impl Pool {
    /// The record and last lease of file `id`.
    fn record(&self, id: u64) -> Option<(FileRecord, Option<Released>)> {
        let st = self.lock();
        let e = st.core.get(id)?;
        Some((e.rec().clone(), e.released().cloned()))
    }

    /// Cuts a warm file to `size` (its record already says `size` in memory), then journals
    /// it; the journal still says the larger size until then, which recovery handles (an
    /// unclean start scrubs it, a clean one cannot happen while the job runs).
    pub(super) fn shrink_job(&self, id: u64, size: u64, journal: &Action) {
        let Some((rec, _)) = self.record(id) else {
            return;
        };
        let cut = {
            let _lock_holder = crate::sys::priority::OutOfIdle::enter();
            self.host
                .cut(FileAt::of(&rec), size)
                .map_err(|e| e.to_string())
        };
        let journaled = cut.and_then(|()| self.perform(journal).map_err(|e| e.to_string()));
        let Action::Journal(warm) = journal else {
            return;
        };
        match journaled {
            Ok(()) => {
                tracing::info!(id, size = %format_bytes(size), "warm file cut to a size in demand");
                let mut st = self.lock();
                st.pages_returned();
                if let Err(err) = st.core.cut_done(id, warm.clone()) {
                    tracing::error!(%err, "pool core refused a cut's end");
                }
            }
            Err(err) => {
                tracing::error!(id, %err, "cannot cut a warm file: deleting it");
                self.give_up_unlocked(id);
            }
        }
    }

    /// Whether the released file may be recycled in place: proven out of everyone else's
    /// reach (see `reach`). A file whose history is not known, or whose lease asked for the
    /// kernel's path, is not. One proof, no waiting: a file still held (open, mapped, in an
    /// io_uring, or its lessee's teardown not done) waits aside (see `aside`).
    fn proof(&self, id: u64, released: Option<&Released>, file: &Handle) -> Proved {
        let proof = match released {
            None => Err(Unproven::NotWatched),
            Some(r) if r.recycle == Recycle::Kernel => Err(Unproven::Trust),
            Some(r) if !r.watched => Err(Unproven::NotWatched),
            Some(_) => self.host.prove(id, file),
        };
        match proof {
            Ok(p) => {
                self.table.counters.proven(p.took);
                tracing::debug!(
                    id,
                    openers = p.openers,
                    took_us = p.took.as_micros() as u64,
                    "released file proven out of reach"
                );
                Proved::Yes
            }
            Err(
                reason @ (Unproven::OpenElsewhere
                | Unproven::IoUring { .. }
                | Unproven::Referenced { .. }
                | Unproven::PagesHeld { .. }),
            ) if !self.table.is_shut_down() => Proved::Held(reason),
            Err(reason) => Proved::No(reason),
        }
    }

    /// A released file takes the kernel's path for `reason`: logged and counted.
    fn unproven(&self, id: u64, released: Option<&Released>, reason: &Unproven) {
        let name = released.map_or("", |r| r.name.as_str());
        let lease = released.map_or(0, |r| r.lease);
        tracing::warn!(
            id, lease, name, reason = reason.label(), detail = %reason,
            "released memory takes the kernel's path: truncated and deleted, the refill faults new pages"
        );
        self.table.counters.kernel_path(reason);
    }

    /// A proof found the released file still held: it waits aside at `size` (its size on
    /// the mount) and is proven again later, unless its bound has passed or its lessee has
    /// its limit of held bytes aside already (then `false`: the kernel's path).
    fn set_aside(
        &self,
        id: u64,
        released: Option<&Released>,
        size: u64,
        reason: &Unproven,
    ) -> bool {
        let principal = released.and_then(|r| r.principal.as_deref());
        let limit = self.held_limit(principal);
        let mut st = self.lock();
        st.prune_aside();
        let now = self.host.now();
        let verdict = st.aside.held(id, principal, size, limit, now);
        match verdict {
            Verdict::Wait(due) => {
                if let Err(err) = st.core.held_aside(id, size) {
                    tracing::error!(%err, "pool core refused to set a held file aside");
                    st.aside.remove(id);
                    return false;
                }
                self.table.counters.held_aside();
                tracing::debug!(
                    id,
                    principal,
                    reason = reason.label(),
                    retry_ms = due.saturating_duration_since(now).as_millis() as u64,
                    "released file still held: waits aside"
                );
                true
            }
            Verdict::BoundPassed => false,
            Verdict::OverLimit { held, limit } => {
                tracing::warn!(
                    id,
                    principal,
                    held,
                    limit,
                    "released file still held and its lessee holds its limit of released bytes: the kernel's path at once"
                );
                false
            }
        }
    }

    /// Takes released file `id` back from its lessee (owner and mode) before it is proven.
    /// One that cannot be is still its lessee's and is never recycled: it takes the
    /// kernel's path, and the answer is false.
    fn taken_back(&self, id: u64, at: FileAt) -> bool {
        if self.host.take_back(at).is_ok() {
            return true;
        }
        self.table.counters.release_failed(ReleaseFailure::Open);
        self.lock().aside.remove(id);
        self.give_up_unlocked(id);
        false
    }

    /// Scrubs a released file back to warm: proven out of reach, journaled scrubbing
    /// (`journal`), cut to its size in demand, holes refilled, scrubbed and verified,
    /// journaled warm; a file still held waits aside (see `aside`); on any other failure it
    /// takes the kernel's path. `pressing`: the shape lacks a file, which this one restores,
    /// and a lease of its size would otherwise be served grown or cold: the scrub runs at
    /// normal priority without the bandwidth cap (a few ms; at idle priority a busy host
    /// starved it), as for a lease that waits.
    pub(super) fn scrub_job(&self, id: u64, journal: &Action, pressing: bool) {
        let Some((rec, released)) = self.record(id) else {
            return;
        };
        if self.mount(rec.page_size).is_err() {
            return;
        }
        let at = FileAt::of(&rec);
        if !self.taken_back(id, at) {
            return;
        }
        let opts = ScrubOptions {
            cpus: self.cpus(rec.node),
            bandwidth: self.policy().scrub_bandwidth,
            background: !pressing,
            verify: self.policy().verify,
            yield_to: (!pressing).then(|| Arc::clone(&self.clearing.gate) as Arc<dyn Yield>),
        };
        let file = match self.host.open(at) {
            Ok(f) => f,
            Err(err) => {
                tracing::error!(%err, "cannot open a released file: deleting it");
                self.table.counters.release_failed(ReleaseFailure::Open);
                self.lock().aside.remove(id);
                return self.give_up_unlocked(id);
            }
        };
        // Recycled in place only when nobody else can reach these pages (see `reach`). The
        // proof changes nothing: the journal says dirty until it passes.
        let reason = match self.proof(id, released.as_ref(), &file) {
            Proved::Yes => None,
            // A file its lessee cut to nothing has no page to recycle: waiting for its
            // holder gains nothing, and the kernel's path costs nothing more.
            Proved::Held(reason) if file.size() > 0 => {
                // Counted against `held_bytes` by what it holds, pages allocated past its
                // end included, not by its length.
                if self.set_aside(id, released.as_ref(), file.extent(), &reason) {
                    return;
                }
                Some(reason)
            }
            Proved::Held(reason) => Some(reason),
            Proved::No(reason) => Some(reason),
        };
        self.lock().aside.remove(id);
        if let Some(reason) = reason {
            self.unproven(id, released.as_ref(), &reason);
            drop(file);
            return self.give_up_unlocked(id);
        }
        if let Err(err) = self.perform(journal) {
            tracing::error!(%err, "cannot journal a scrub: deleting the file instead");
            drop(file);
            return self.give_up_unlocked(id);
        }
        let result = self.scrub_in_place(id, &rec, file, &opts);
        self.end_scrub(id, rec, result);
    }

    /// Cuts a proven file to its size in demand, refills its holes and scrubs the pages still
    /// present; the report and the file's size. `Err(None)`: the file must take the kernel's
    /// path (logged).
    fn scrub_in_place(
        &self,
        id: u64,
        rec: &FileRecord,
        mut file: Handle,
        opts: &ScrubOptions,
    ) -> Result<(ScrubReport, u64), Option<ScrubError>> {
        if file.size() >= rec.size {
            // Kept at a smaller size in demand: cut first, scrub only what stays. Cut at the
            // same size too: a lessee may have allocated pages past the end
            // (`fallocate(FALLOC_FL_KEEP_SIZE)`), which no size, hole or count shows, and
            // hugetlbfs frees every page past the end on any truncate.
            if let Err(err) = self.host.resize(&mut file, rec.size) {
                tracing::error!(%err, "cannot cut a released file to the size in demand: deleting it");
                self.table.counters.release_failed(ReleaseFailure::Cut);
                return Err(None);
            }
        }
        if file.size() != rec.size {
            // Resized under a crash: scrub what is there and record it.
            tracing::info!(id, size = file.size(), "file size differs from journal");
        }
        // Pages punched out (discard-data, a balloon) come back from the kernel zeroed:
        // only the pages still present are scrubbed.
        let refill = match self.host.refill_holes(&file, rec.node, &opts.cpus) {
            Ok(r) => r,
            Err(err) => {
                tracing::warn!(%err, "cannot refill a released file's holes: deleting it");
                self.table.counters.release_failed(ReleaseFailure::Holes);
                return Err(None);
            }
        };
        if refill.filled > 0 {
            tracing::info!(
                id,
                filled = refill.filled,
                present = refill.present.iter().map(|r| r.end - r.start).sum::<u64>(),
                "released file had holes: refilled them, scrubbing only the present pages"
            );
        }
        // Every page present now: each must still be on the file's node (`on_node`).
        if let Err(reason) = self.all_on_node(&file, rec) {
            tracing::warn!(
                id, reason = reason.label(), detail = %reason,
                "released memory takes the kernel's path: truncated and deleted, the refill faults new pages"
            );
            self.table.counters.proven_then_kernel_path(&reason);
            return Err(None);
        }
        self.host
            .scrub(&file, &refill.present, opts, &self.clearing.control)
            .map(|r| (r, file.size()))
            .map_err(Some)
    }

    /// Whether every page `file` holds is on the node `rec` names; why not otherwise.
    fn all_on_node(&self, file: &Handle, rec: &FileRecord) -> Result<(), Unproven> {
        let stray = self
            .host
            .stray_page(file, rec.node, rec.page_size.bytes())
            .map_err(|e| Unproven::Error {
                step: "pages' nodes",
                message: e.to_string(),
            })?;
        match stray {
            None => Ok(()),
            Some(s) => Err(Unproven::Node {
                page: s.page,
                found: s.node,
                node: rec.node,
            }),
        }
    }

    /// The scrub's outcome: warm once journaled; dirty again when cancelled (journaled as
    /// scrubbing: the next start scrubs it again); the kernel's path on any failure.
    fn end_scrub(
        &self,
        id: u64,
        rec: FileRecord,
        result: Result<(ScrubReport, u64), Option<ScrubError>>,
    ) {
        match result {
            Ok((report, size)) => {
                self.table.counters.scrubbed(report.bytes, report.seconds);
                let warm = FileRecord {
                    size,
                    state: super::FileState::Warm,
                    ..rec
                };
                // Outside the lock: the file is busy scrubbing until `scrubbed` below, so no
                // other record of it is written meanwhile; a crash before `scrubbed` leaves a
                // warm record that only a clean stop (none while busy) makes trusted.
                if let Err(err) = self.perform(&Action::Journal(warm.clone())) {
                    tracing::error!(%err, "cannot journal a scrubbed file");
                    self.table.counters.release_failed(ReleaseFailure::Journal);
                    self.give_up_unlocked(id);
                    return;
                }
                let mut st = self.lock();
                tracing::info!(
                    id,
                    bytes = report.bytes,
                    gbps = report.gbps(),
                    "scrubbed and verified"
                );
                st.last_scrub = Some(report);
                // The scrub cut the file to its size in demand, and every page a lessee
                // allocated past its end with it.
                st.pages_returned();
                if let Err(err) = st.core.scrubbed(id, warm) {
                    tracing::error!(%err, "pool core refused a scrub's end");
                }
            }
            Err(Some(ScrubError::Cancelled { .. })) => {
                if let Err(err) = self.lock().core.scrub_cancelled(id) {
                    tracing::error!(%err, "pool core refused a cancelled scrub");
                }
            }
            Err(err) => {
                if let Some(err) = err {
                    tracing::error!(%err, "scrub failed: deleting the file");
                    self.table.counters.release_failed(ReleaseFailure::Scrub);
                }
                self.give_up_unlocked(id);
            }
        }
    }

    /// Truncates and unlinks a file the worker gives back (`remove`, from the core).
    pub(super) fn delete_job(&self, id: u64, remove: &Action) {
        let removal = self.remove(remove);
        let after = self.finish_delete(&mut self.lock(), id, removal);
        self.perform_after(after);
    }

    /// Journals a new file filling (`journal`), creates it and faults it at idle priority,
    /// yielding to VM starts; journals it warm. On failure the file is removed and refills
    /// back off.
    pub(super) fn fill_job(&self, id: u64, journal: &Action) {
        if let Err(err) = self.perform(journal) {
            tracing::error!(%err, "cannot journal a refill");
            let mut st = self.lock();
            st.end_faulting(id);
            st.schedule.refill_failed(self.host.now());
            if let Err(err) = st.core.forget_unjournaled(id) {
                tracing::error!(%err, "pool core refused to forget a refill");
            }
            return;
        }
        let Some((rec, _)) = self.record(id) else {
            self.lock().end_faulting(id);
            return;
        };
        let cpus = self.cpus(rec.node);
        let t = self.host.now();
        let background = Background {
            gate: Arc::clone(&self.clearing.gate) as Arc<dyn Yield>,
            taken: self.lock().taken(id).unwrap_or_default(),
        };
        let made = self
            .host
            .fill(FileAt::of(&rec), rec.size, rec.node, &cpus, background)
            .map_err(|e| e.to_string());
        if made.is_ok() {
            self.table
                .counters
                .refill_faulted(rec.size, self.host.now().saturating_duration_since(t));
        }
        self.lock().end_faulting(id);
        self.table.changed.notify_all();
        match made {
            Ok(()) => match self.journal_filled(id, rec.size) {
                Ok(()) => return,
                Err(err) => tracing::error!(%err, "cannot journal a refilled file"),
            },
            Err(err) => {
                tracing::warn!(%err, size = rec.size, "refill failed; retrying later");
                self.lock().schedule.refill_failed(self.host.now());
            }
        }
        // The file is forgotten under the lock; it is removed, then its record, outside it.
        let undo = self.lock().core.fill_failed(id);
        match undo {
            Ok(undo) => self.undo_forgotten(&undo, "a failed refill"),
            Err(err) => tracing::error!(%err, "pool core refused a failed refill"),
        }
    }

    /// Journals a refilled file warm and makes it so: the write runs outside the lock, the
    /// file being busy filling until `filled`.
    fn journal_filled(&self, id: u64, size: u64) -> Result<(), String> {
        let warm = self
            .lock()
            .core
            .warm_record(id, size)
            .map_err(|e| e.to_string())?;
        self.perform(&Action::Journal(warm.clone()))
            .map_err(|e| e.to_string())?;
        self.lock().core.filled(id, warm).map_err(|e| e.to_string())
    }
}
