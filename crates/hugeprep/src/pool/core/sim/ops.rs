//! The simulated requests and worker jobs: each step of a lease, a release, a scrub, a
//! refill, a cut or a deletion, as the driver (`lease.rs`, `jobs.rs`, `driver.rs`) takes it,
//! through the core's transitions and the fake driver's actions.

use super::{lease_record, Crashed, FakeFile, Fault, LeaseAt, Op, ReleaseAt, Sim, Step_, PS};
use crate::policy::pool::Recycle;
use crate::pool::core::{Action, Phase, Released};
use crate::pool::record::{FileState, LeaseSource};

impl Sim {
    /// Takes the next step of `op`; the op again if it has more.
    pub(super) fn advance(&mut self, op: Op) -> Result<Option<Op>, Crashed> {
        match op {
            Op::Lease { name, size, at } => self.lease(name, size, at),
            Op::Release { lease, at } => self.release(lease, at),
            Op::Scrub { id, journal, at } => self.scrub(id, journal, at),
            Op::Delete { id, remove } => {
                let removed = self.perform("delete: truncate and unlink", &remove)?;
                self.finish_delete(id, removed)?;
                Ok(None)
            }
            Op::Fill {
                id,
                journal,
                faulted,
            } => self.fill(id, journal, faulted),
            Op::Cut {
                id,
                size,
                journal,
                cut,
            } => self.cut(id, size, journal, cut),
        }
    }

    fn finish_delete(&mut self, id: u64, removed: bool) -> Step_ {
        if removed {
            let unjournal = self.core.deleted(id).expect("deleted");
            self.stats.deleted += 1;
            self.perform("delete: unjournal", &unjournal)?;
        } else {
            let on_mount = self.world.pool.get(&id).map(|f| f.size);
            if let Some(record) = self
                .core
                .delete_failed(id, on_mount)
                .expect("delete failed")
            {
                self.perform("delete failed: journal the size on the mount", &record)?;
            }
        }
        Ok(())
    }

    /// Gives up a file (the driver's `give_up`).
    pub(super) fn give_up(&mut self, id: u64) -> Step_ {
        let remove = self.core.begin_delete(id).expect("give up");
        let removed = self.perform("give up: truncate and unlink", &remove)?;
        self.finish_delete(id, removed)
    }

    fn lease(&mut self, name: String, size: u64, at: LeaseAt) -> Result<Option<Op>, Crashed> {
        let again = |at| {
            Ok(Some(Op::Lease {
                name: name.clone(),
                size,
                at,
            }))
        };
        match at {
            LeaseAt::Choose => Ok(self.choose(&name, size).map(|at| Op::Lease {
                name: name.clone(),
                size,
                at,
            })),
            LeaseAt::ColdJournal { id, journal } => {
                // Under the lock in the daemon, as one step with the choice.
                if self.perform("cold lease: journal filling", &journal)? {
                    again(LeaseAt::Prepare {
                        id,
                        source: LeaseSource::Cold,
                    })
                } else {
                    self.core.forget_unjournaled(id).expect("forget");
                    Ok(None)
                }
            }
            LeaseAt::Prepare { id, source } => {
                // Resize or create and fault, then link the lease path.
                if !self.io("lease: resize, or create and fault")? {
                    self.abort(id, source, &name, size, false)?;
                    return Ok(None);
                }
                self.prepare(id, source, size);
                if !self.io("lease: link the lease path")? {
                    self.abort(id, source, &name, size, false)?;
                    return Ok(None);
                }
                let f = self.world.pool.get_mut(&id).expect("prepared file");
                assert!(
                    f.bytes_of.is_none(),
                    "file {id} handed to {name} holds the bytes of lease {:?}",
                    f.bytes_of
                );
                // The lessee may open and write it from here on (its name can be guessed).
                f.bytes_of = Some(0);
                f.watched_by = Some(self.world.run);
                self.world.links.insert(name.clone(), id);
                again(LeaseAt::Commit {
                    id,
                    source,
                    rec: None,
                })
            }
            LeaseAt::Commit { id, source, rec } => {
                let Some(rec) = rec else {
                    let lease_id = self.core.new_id();
                    let lease = lease_record(lease_id, &name, source);
                    let rec = self
                        .core
                        .lease_record(id, size, lease)
                        .expect("lease record");
                    if let Some(f) = self.world.pool.get_mut(&id) {
                        f.bytes_of = Some(lease_id);
                    }
                    return again(LeaseAt::Commit {
                        id,
                        source,
                        rec: Some(rec),
                    });
                };
                if self.perform("lease: journal leased", &Action::Journal(rec.clone()))? {
                    self.core.leased(id, rec).expect("leased");
                    self.stats.leases += 1;
                    self.schedule.grace_from(self.clock, super::GRACE);
                    if source != LeaseSource::WarmExact {
                        self.schedule.missed();
                    }
                } else {
                    self.abort(id, source, &name, size, true)?;
                }
                Ok(None)
            }
        }
    }

    /// The lease's choice, as `lease::choose` makes it (minus the kernel's free pages):
    /// exact, else larger, else smaller warm file, else a new one.
    fn choose(&mut self, name: &str, size: u64) -> Option<LeaseAt> {
        if self.core.name_in_use(name) {
            return None;
        }
        let warm: Vec<(u64, u64)> = self
            .core
            .files()
            .filter(|e| e.phase() == Some(Phase::Warm))
            .map(|e| (e.rec().id, e.rec().size))
            .collect();
        let pick = warm
            .iter()
            .find(|w| w.1 == size)
            .or_else(|| warm.iter().filter(|w| w.1 > size).min_by_key(|w| w.1))
            .or_else(|| warm.iter().max_by_key(|w| w.1));
        Some(match pick {
            Some(&(id, old)) => {
                self.core.take_warm(id, name).expect("take warm");
                let source = match old.cmp(&size) {
                    std::cmp::Ordering::Equal => LeaseSource::WarmExact,
                    std::cmp::Ordering::Greater => LeaseSource::WarmShrunk,
                    std::cmp::Ordering::Less => LeaseSource::WarmGrown,
                };
                LeaseAt::Prepare { id, source }
            }
            None => {
                let (id, journal) = self.core.new_cold(0, PS, size, name).expect("cold");
                LeaseAt::ColdJournal { id, journal }
            }
        })
    }

    /// Resizes or creates the file as the lease's `prepare` does.
    fn prepare(&mut self, id: u64, source: LeaseSource, size: u64) {
        match source {
            LeaseSource::Cold => {
                self.world.pool.insert(id, FakeFile::fresh(size));
            }
            _ => {
                if let Some(f) = self.world.pool.get_mut(&id) {
                    f.size = size;
                }
            }
        }
    }

    /// The lease failed: the driver's `abort` (the link is removed when it was made).
    fn abort(
        &mut self,
        id: u64,
        source: LeaseSource,
        name: &str,
        size: u64,
        linked: bool,
    ) -> Step_ {
        if linked && self.world.links.get(name) == Some(&id) {
            self.world.links.remove(name);
        }
        if source == LeaseSource::Cold {
            for action in self.core.abort_cold(id).expect("abort cold") {
                self.perform("failed cold lease: remove file, unjournal", &action)?;
            }
            return Ok(());
        }
        let on_mount = self.world.pool.get(&id).map_or(size, |f| f.size);
        let released = Released {
            lease: 0,
            name: name.to_string(),
            recycle: Recycle::Proven,
            watched: true,
            principal: None,
        };
        let journal = self
            .core
            .abort_warm(id, on_mount, released)
            .expect("abort warm");
        self.perform("failed warm lease: journal dirty", &journal)?;
        Ok(())
    }

    fn release(&mut self, lease: u64, at: ReleaseAt) -> Result<Option<Op>, Crashed> {
        match at {
            ReleaseAt::Begin => Ok(self
                .core
                .begin_release(lease)
                .map(|(id, dirty)| Op::Release {
                    lease,
                    at: ReleaseAt::Journal { id, dirty },
                })),
            ReleaseAt::Journal { id, dirty } => {
                let name = match &self.core.get(id).expect("releasing").rec().state {
                    FileState::Leased(l) => l.name.clone(),
                    _ => String::new(),
                };
                if self.perform("release: journal dirty", &Action::Journal(dirty))? {
                    self.core.release_journaled(id).expect("release journaled");
                    Ok(Some(Op::Release {
                        lease,
                        at: ReleaseAt::Unlink { id, name },
                    }))
                } else {
                    self.core.release_failed(id).expect("release failed");
                    Ok(None)
                }
            }
            ReleaseAt::Unlink { id, name } => {
                if self.io("release: unlink the lease path, take back")?
                    && self.world.links.get(&name) == Some(&id)
                {
                    self.world.links.remove(&name);
                }
                self.core.release_done(id).expect("release done");
                Ok(None)
            }
        }
    }

    fn scrub(&mut self, id: u64, journal: Option<Action>, at: u8) -> Result<Option<Op>, Crashed> {
        if let Some(journal) = journal {
            if !self.perform("scrub: journal scrubbing", &journal)? {
                self.give_up(id)?;
                return Ok(None);
            }
            return Ok(Some(Op::Scrub {
                id,
                journal: None,
                at,
            }));
        }
        let e = self.core.get(id).expect("scrubbing").clone();
        // The proof (the driver's `proven`): a file whose history is unknown (recovered), or
        // leased before a restart, is never proven.
        let proven =
            e.released().is_some_and(|r| r.watched) && self.io("scrub: prove out of reach")?;
        if !proven {
            self.give_up(id)?;
            return Ok(None);
        }
        let f = self.world.pool.get(&id).cloned().expect("scrubbed file");
        if f.bytes_of.is_some() {
            assert_eq!(
                f.watched_by,
                Some(self.world.run),
                "file {id} scrubbed in place without the watch of the run that leased it"
            );
        }
        match self.fault("scrub: clear and verify") {
            Fault::Crash => return Err(Crashed),
            Fault::Error if at == 0 => {
                self.core.scrub_cancelled(id).expect("cancelled");
                return Ok(None);
            }
            Fault::Error => {
                self.give_up(id)?;
                return Ok(None);
            }
            Fault::None => {}
        }
        let size = e.rec().size;
        if let Some(f) = self.world.pool.get_mut(&id) {
            f.size = size;
            f.bytes_of = None;
        }
        let warm = self.core.warm_record(id, size).expect("warm record");
        if self.perform("scrub: journal warm", &Action::Journal(warm.clone()))? {
            self.core.scrubbed(id, warm).expect("scrubbed");
            self.stats.scrubbed += 1;
        } else {
            self.give_up(id)?;
        }
        Ok(None)
    }

    fn fill(
        &mut self,
        id: u64,
        journal: Option<Action>,
        faulted: bool,
    ) -> Result<Option<Op>, Crashed> {
        if let Some(journal) = journal {
            if !self.perform("refill: journal filling", &journal)? {
                self.core.forget_unjournaled(id).expect("forget fill");
                return Ok(None);
            }
            return Ok(Some(Op::Fill {
                id,
                journal: None,
                faulted,
            }));
        }
        let size = self.core.get(id).expect("filling").rec().size;
        if !faulted {
            let made = self.io("refill: create and fault")?;
            if made {
                self.world.pool.insert(id, FakeFile::fresh(size));
                return Ok(Some(Op::Fill {
                    id,
                    journal: None,
                    faulted: true,
                }));
            }
        } else {
            let warm = self.core.warm_record(id, size).expect("warm record");
            if self.perform("refill: journal warm", &Action::Journal(warm.clone()))? {
                self.core.filled(id, warm).expect("filled");
                return Ok(None);
            }
        }
        self.schedule.refill_failed(self.clock);
        for action in self.core.fill_failed(id).expect("fill failed") {
            self.perform("failed refill: remove file, unjournal", &action)?;
        }
        Ok(None)
    }

    fn cut(
        &mut self,
        id: u64,
        size: u64,
        journal: Action,
        cut: bool,
    ) -> Result<Option<Op>, Crashed> {
        if !cut {
            if !self.io("cut: ftruncate")? {
                self.give_up(id)?;
                return Ok(None);
            }
            if let Some(f) = self.world.pool.get_mut(&id) {
                f.size = size;
            }
            return Ok(Some(Op::Cut {
                id,
                size,
                journal,
                cut: true,
            }));
        }
        if self.perform("cut: journal", &journal)? {
            let Action::Journal(rec) = journal else {
                unreachable!("a cut journals")
            };
            self.core.cut_done(id, rec).expect("cut done");
        } else {
            self.give_up(id)?;
        }
        Ok(None)
    }
}
