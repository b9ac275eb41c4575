//! What the simulated host gives recovery, and what each step of its plan does there.

use super::{drop_unnamed, unpool, World};
use crate::pool::core::recovery::{Facts, LeasePathFact, PoolFileFact, Step};
use crate::pool::record::{file_key, FileState};

/// The journal's records (those a crash cut short do not decode) and the pool and lease
/// directories (`clean`: the last run ended cleanly).
pub(super) fn facts(w: &World, clean: bool) -> Facts {
    let mut facts = Facts {
        records: w
            .journal
            .values()
            .map(|rec| (rec.key(), Ok(rec.clone())))
            .chain(w.torn.iter().map(|id| {
                let key = file_key(*id);
                let err = format!("{key}.json: EOF while parsing an object");
                (key, Err(err))
            }))
            .collect(),
        served: w.lease_dirs.keys().copied().collect(),
        clean,
        ..Facts::default()
    };
    for (&ps, dir) in &w.lease_dirs {
        let pool = facts.pool_files.entry(ps).or_default();
        for (id, (fps, f)) in &w.files {
            if *fps == ps && f.pooled {
                let fact = PoolFileFact {
                    len: f.size,
                    inode: (0, *id),
                };
                pool.insert(file_key(*id), Some(fact));
            }
        }
        let paths = facts.lease_paths.entry(ps).or_default();
        for (path, id) in &w.lease_paths {
            if let Ok(name) = path.strip_prefix(dir) {
                let fact = LeasePathFact {
                    path: path.clone(),
                    inode: Some((0, *id)),
                };
                paths.insert(name.to_string_lossy().into_owned(), fact);
            }
        }
    }
    for rec in w.journal.values() {
        if let FileState::Leased(lease) = &rec.state {
            if w.lease_paths.contains_key(&lease.path) {
                facts.existing_paths.insert(lease.path.clone());
            }
        }
    }
    facts
}

/// Performs one step of the plan on the simulated host.
pub(super) fn step(w: &mut World, step: &Step) {
    let id_of = |name: &str| name.strip_prefix('p').and_then(|n| n.parse::<u64>().ok());
    match step {
        Step::Unjournal(key) => {
            if let Some(id) = id_of(key) {
                let before = w.journal.remove(&id);
                if before.is_some() || w.torn.contains(&id) {
                    w.journaled(id, before);
                }
            }
        }
        Step::Journal(rec) => {
            let before = w.journal.insert(rec.id, rec.clone());
            w.journaled(rec.id, before);
        }
        Step::RemovePoolEntry(_, name) => {
            if let Some(id) = id_of(name) {
                unpool(w, id);
            }
        }
        Step::RemoveFile(_, id) => unpool(w, *id),
        Step::Relink(_, id, path) => {
            if let Some((_, f)) = w.files.get_mut(id) {
                f.links.insert(path.clone());
                w.lease_paths.insert(path.clone(), *id);
            }
        }
        Step::RemoveLeasePath(ps, name) => {
            let path = w.lease_dirs.get(ps).map(|d| d.join(name));
            if let Some(path) = path {
                if let Some(id) = w.lease_paths.remove(&path) {
                    if let Some((_, f)) = w.files.get_mut(&id) {
                        f.links.remove(&path);
                    }
                    drop_unnamed(w, id);
                }
            }
        }
    }
}
