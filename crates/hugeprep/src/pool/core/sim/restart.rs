//! Restarts and checks: a clean stop and start, a crash, recovery from the fake journal and
//! mounts with the daemon's plan, and the invariants checked after every step and every
//! recovery.

use std::collections::BTreeMap;

use super::{lease_path, recovery_site, Crashed, Fault, Sim, Step_, PS};
use crate::pool::core::recovery::{self, Facts, LeasePathFact, PoolFileFact, Step};
use crate::pool::core::{Core, Phase};
use crate::pool::record::{file_key, FileRecord, FileState};

impl Sim {
    /// A clean stop when nothing is in flight (`mark_clean_shutdown`), then a start.
    pub(super) fn clean_restart(&mut self) -> Step_ {
        if !self.ops.is_empty() || self.core.any_busy() {
            return Ok(());
        }
        self.note("clean shutdown".into());
        self.core
            .prepare_clean_shutdown()
            .into_iter()
            .try_for_each(|a| {
                if self.perform("clean shutdown: journal dirty files", &a)? {
                    Ok(())
                } else {
                    Err(Crashed)
                }
            })?;
        if self.fault("clean shutdown: marker") != Fault::None {
            return Err(Crashed);
        }
        self.world.clean = true;
        self.stats.clean_restarts += 1;
        self.restart()
    }

    /// SIGKILL: everything in memory is gone; the next run recovers.
    pub(super) fn crash(&mut self) {
        self.note("CRASH".into());
        self.stats.crashes += 1;
        self.ops.clear();
        while self.restart().is_err() {
            self.note("CRASH in recovery".into());
            self.stats.crashes += 1;
        }
    }

    /// A start: the clean marker is read and cleared, recovery planned and performed (it
    /// may crash too), the core rebuilt from the kept records.
    fn restart(&mut self) -> Step_ {
        self.ops.clear();
        self.world.run += 1;
        let clean = std::mem::take(&mut self.world.clean);
        let plan = recovery::plan(&self.facts(clean));
        for step in &plan.steps {
            self.note(format!("  {step:?}"));
            if self.fault(recovery_site(step)) == Fault::Crash {
                // The marker was cleared before recovery: the next start is unclean.
                return Err(Crashed);
            }
            self.recovery_step(step);
        }
        self.core = Core::with_files(plan.kept.clone(), plan.max_id + 1);
        self.schedule = Default::default();
        self.check_recovered(&plan.kept, clean);
        Ok(())
    }

    fn facts(&self, clean: bool) -> Facts {
        let mut facts = Facts {
            records: self
                .world
                .journal
                .iter()
                .map(|(k, r)| (k.clone(), Ok(r.clone())))
                .collect(),
            served: [PS].into(),
            clean,
            ..Facts::default()
        };
        let files = self
            .world
            .pool
            .iter()
            .map(|(id, f)| {
                let fact = PoolFileFact {
                    len: f.size,
                    inode: (1, *id),
                };
                (file_key(*id), Some(fact))
            })
            .collect();
        facts.pool_files.insert(PS, files);
        let links = self
            .world
            .links
            .iter()
            .map(|(name, id)| {
                let fact = LeasePathFact {
                    path: lease_path(name),
                    inode: Some((1, *id)),
                };
                (name.clone(), fact)
            })
            .collect();
        facts.lease_paths.insert(PS, links);
        facts.existing_paths = self.world.links.keys().map(|n| lease_path(n)).collect();
        facts
    }

    fn recovery_step(&mut self, step: &Step) {
        match step {
            Step::Unjournal(key) => {
                self.world.journal.remove(key);
            }
            Step::Journal(rec) => {
                self.world.journal.insert(rec.key(), rec.clone());
            }
            Step::RemovePoolEntry(_, name) => {
                let id = name.trim_start_matches('p').parse::<u64>().ok();
                if let Some(id) = id {
                    self.world.pool.remove(&id);
                }
            }
            Step::RemoveFile(_, id) => {
                self.world.pool.remove(id);
            }
            Step::Relink(_, id, path) => {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                if let Some(name) = name {
                    self.world.links.insert(name, *id);
                }
            }
            Step::RemoveLeasePath(_, name) => {
                self.world.links.remove(name);
            }
        }
    }

    /// After recovery: the journal, the pool directory and the kept records agree, lease
    /// paths belong to kept leases, and a warm file holds no lessee's bytes.
    fn check_recovered(&self, kept: &[FileRecord], clean: bool) {
        let kept_ids: std::collections::BTreeSet<u64> = kept.iter().map(|r| r.id).collect();
        let files: std::collections::BTreeSet<u64> = self.world.pool.keys().copied().collect();
        assert_eq!(files, kept_ids, "pool files against kept records");
        let kept_records: BTreeMap<String, FileRecord> =
            kept.iter().map(|r| (r.key(), r.clone())).collect();
        assert_eq!(
            self.world.journal, kept_records,
            "journal against kept records"
        );
        for rec in kept {
            let f = &self.world.pool[&rec.id];
            assert_eq!(f.size, rec.size, "size of file {}", rec.id);
            match &rec.state {
                FileState::Warm => {
                    assert!(clean, "file {} trusted warm after a crash", rec.id);
                    assert!(
                        f.bytes_of.is_none(),
                        "warm file {} holds a lessee's bytes",
                        rec.id
                    );
                }
                FileState::Leased(l) => {
                    assert_eq!(self.world.links.get(&l.name), Some(&rec.id), "lease path");
                }
                FileState::Dirty => {}
                other => panic!("file {} recovered {}", rec.id, other.name()),
            }
        }
        for (name, id) in &self.world.links {
            let ours = kept.iter().any(|r| {
                r.id == *id && matches!(&r.state, FileState::Leased(l) if l.name == *name)
            });
            assert!(ours, "lease path {name} of no kept lease");
        }
    }

    /// After every step: the core's invariants, and the core against the world for every
    /// idle file.
    pub(super) fn check(&self) {
        if let Err(v) = self.core.check() {
            panic!("{v}");
        }
        for e in self.core.files() {
            let rec = e.rec();
            let journaled = self.world.journal.get(&rec.key());
            let file = self.world.pool.get(&rec.id);
            match e.phase() {
                Some(Phase::Warm) => {
                    let f = file.unwrap_or_else(|| panic!("warm file {} missing", rec.id));
                    assert!(
                        f.bytes_of.is_none(),
                        "warm file {} holds a lessee's bytes",
                        rec.id
                    );
                    assert_eq!(f.size, rec.size, "warm file {} size", rec.id);
                    // Its size may lag in the journal after failed writes: the next start
                    // reads it from the file.
                    let state = journaled.map(|r| &r.state);
                    assert_eq!(
                        state,
                        Some(&FileState::Warm),
                        "warm file {} journal",
                        rec.id
                    );
                }
                Some(Phase::Leased) => {
                    assert!(file.is_some(), "leased file {} missing", rec.id);
                    assert_eq!(journaled, Some(rec), "leased file {} journal", rec.id);
                }
                _ => {}
            }
        }
    }
}
