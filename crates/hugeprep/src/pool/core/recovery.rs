//! Start-up recovery as a pure plan: what the journal and the mounts say (the [`Facts`] the
//! driver gathers) in, the steps to take and the records to keep out. The daemon
//! (`pool::recover`) and the simulator run the same plan.
//!
//! - Leased records stay leased (their lease path is re-linked if it went missing).
//! - Dirty, scrubbing and warm records after an unclean stop: dirty (the worker then gives
//!   them the kernel's path, their history being unknown).
//! - Warm records after a clean shutdown: trusted.
//! - Filling records: the file is deleted (it was never handed out).
//! - Records without a file are dropped; records that do not decode or do not match their
//!   key are dropped (their file, unnamed now, is deleted); files in the pool directory
//!   without a record are deleted, never handed out; lease paths that are not the inode of
//!   a kept lease are removed.
//! - Record sizes are corrected from the file.
//!
//! Every step is idempotent, and every prefix of the plan leaves a state the plan of the
//! next start handles: a crash in the middle of recovery is recovered from like any other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::Serialize;

use crate::page_size::PageSize;
use crate::pool::record::{file_key, FileRecord, FileState};

/// A file in a pool directory, as `fstatat` saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolFileFact {
    /// Its length.
    pub len: u64,
    /// Its inode: `(st_dev, st_ino)`.
    pub inode: (u64, u64),
}

/// An entry of a lease directory: its path and the inode it names (`None`: gone by its
/// `lstat`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasePathFact {
    /// The lease path.
    pub path: PathBuf,
    /// `(st_dev, st_ino)`.
    pub inode: Option<(u64, u64)>,
}

/// What the driver read before recovery: the journal, the pool and lease directories.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Every journal record by key, `Err` for one that does not decode.
    pub records: Vec<(String, Result<FileRecord, String>)>,
    /// The page sizes this run serves (a record of another is left for a run that does).
    pub served: BTreeSet<PageSize>,
    /// Each served page size's pool directory: name to the file (`None`: not a file, or
    /// gone by its `stat`).
    pub pool_files: BTreeMap<PageSize, BTreeMap<String, Option<PoolFileFact>>>,
    /// Each served page size's lease directory, by name.
    pub lease_paths: BTreeMap<PageSize, BTreeMap<String, LeasePathFact>>,
    /// The lease paths that exist, of every leased record (a path may lie outside the lease
    /// directory of this run).
    pub existing_paths: BTreeSet<PathBuf>,
    /// Whether the last run ended with a clean shutdown.
    pub clean: bool,
}

/// One step of a recovery plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Remove the journal record `key`.
    Unjournal(String),
    /// Remove the entry `name` of a pool directory (a file, or a directory someone made).
    RemovePoolEntry(PageSize, String),
    /// Remove the pool file of a record.
    RemoveFile(PageSize, u64),
    /// Replace a record.
    Journal(FileRecord),
    /// Link the lease path of a kept lease to its file again.
    Relink(PageSize, u64, PathBuf),
    /// Remove the entry `name` of a lease directory.
    RemoveLeasePath(PageSize, String),
}

/// What reconciliation found.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct RecoveryReport {
    /// Leases kept.
    pub leases: usize,
    /// Warm files trusted.
    pub warm: usize,
    /// Files to scrub again.
    pub dirty: usize,
    /// Files deleted (unknown, filling, or broken).
    pub deleted_files: usize,
    /// Records dropped because their file was gone.
    pub dropped_records: usize,
}

/// The plan: steps in order, the records to keep, the highest id seen, and a report.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// What to do, in order.
    pub steps: Vec<Step>,
    /// The records to start with.
    pub kept: Vec<FileRecord>,
    /// The highest file or lease id any record names (new ids start above it).
    pub max_id: u64,
    /// What was found.
    pub report: RecoveryReport,
}

/// Plans recovery from `facts` (see the module documentation).
pub fn plan(facts: &Facts) -> Plan {
    let mut plan = Plan::default();
    let records = usable_records(facts, &mut plan);
    unknown_files(facts, &records, &mut plan);
    for rec in records.into_values() {
        keep_or_drop(facts, rec, &mut plan);
    }
    stray_lease_paths(facts, &mut plan);
    plan
}

/// The records of served page sizes that decode and match their key; the others are
/// dropped (those of other page sizes are left, their ids counted).
fn usable_records(facts: &Facts, plan: &mut Plan) -> BTreeMap<String, FileRecord> {
    let mut records = BTreeMap::new();
    for (key, rec) in &facts.records {
        match rec {
            Ok(rec) if rec.key() == *key && facts.served.contains(&rec.page_size) => {
                records.insert(key.clone(), rec.clone());
            }
            Ok(rec) if rec.key() == *key => plan.max_id = plan.max_id.max(rec.id),
            Ok(_) => {
                tracing::warn!(key, "journal record does not match its key: dropping it");
                plan.steps.push(Step::Unjournal(key.clone()));
            }
            Err(err) => {
                tracing::warn!(
                    key,
                    err,
                    "undecodable journal record: its file will be deleted"
                );
                plan.steps.push(Step::Unjournal(key.clone()));
            }
        }
    }
    records
}

/// Files in pool directories that no record names are deleted, never handed out.
fn unknown_files(facts: &Facts, records: &BTreeMap<String, FileRecord>, plan: &mut Plan) {
    for (&ps, dir) in &facts.pool_files {
        for name in dir.keys() {
            let known = records.get(name).is_some_and(|r| r.page_size == ps);
            if !known {
                tracing::warn!(page_size = %ps, file = name, "file hugeprep did not create (or lost track of): deleting");
                plan.steps.push(Step::RemovePoolEntry(ps, name.clone()));
                plan.report.deleted_files += 1;
            }
        }
    }
}

/// One usable record: kept (its size and state corrected), or dropped with its file.
fn keep_or_drop(facts: &Facts, mut rec: FileRecord, plan: &mut Plan) {
    let key = rec.key();
    plan.max_id = plan.max_id.max(rec.id);
    if let FileState::Leased(l) = &rec.state {
        plan.max_id = plan.max_id.max(l.id);
    }
    let ps = rec.page_size;
    let file = facts
        .pool_files
        .get(&ps)
        .and_then(|d| d.get(&key))
        .copied()
        .flatten();
    let Some(file) = file else {
        plan.steps.push(Step::Unjournal(key));
        plan.report.dropped_records += 1;
        return;
    };
    let mut changed = false;
    if file.len != rec.size {
        rec.size = file.len;
        changed = true;
    }
    // A file of nothing (a lessee cut its lease to nothing, or the kernel's path truncated
    // it) is deleted whatever its record says: before any relink, so that no lease path is
    // linked again to a file no record keeps.
    if rec.state == FileState::Filling || rec.size == 0 {
        plan.steps.push(Step::RemoveFile(ps, rec.id));
        plan.steps.push(Step::Unjournal(key));
        plan.report.deleted_files += 1;
        return;
    }
    match &rec.state {
        FileState::Leased(lease) => {
            if !facts.existing_paths.contains(&lease.path) {
                plan.steps
                    .push(Step::Relink(ps, rec.id, lease.path.clone()));
            }
            plan.report.leases += 1;
        }
        FileState::Warm if facts.clean && rec.size > 0 => plan.report.warm += 1,
        _ => {
            if rec.state != FileState::Dirty {
                rec.state = FileState::Dirty;
                changed = true;
            }
            plan.report.dirty += 1;
        }
    }
    if changed {
        plan.steps.push(Step::Journal(rec.clone()));
    }
    plan.kept.push(rec);
}

/// The removal of the file of record `id` (a [`Step::RemoveFile`]) failed (`EIO`,
/// `EBUSY`): its record is kept instead of dropped, as dirty and at the file's length when
/// that is whole pages (its history unknown: the worker gives it the kernel's path and
/// removes it again), so the file's pages are the pool's, not nobody's until the next
/// start. The record to journal; the driver skips the plan's later step that unjournals
/// it. `None`: no such record (nothing to keep).
pub fn unremoved(facts: &Facts, plan: &mut Plan, ps: PageSize, id: u64) -> Option<FileRecord> {
    let mut rec = facts.records.iter().find_map(|(_, r)| match r {
        Ok(r) if r.id == id && r.page_size == ps => Some(r.clone()),
        _ => None,
    })?;
    let on_mount = facts
        .pool_files
        .get(&ps)
        .and_then(|d| d.get(&rec.key()))
        .copied()
        .flatten()
        .map(|f| f.len);
    if let Some(len) = on_mount.filter(|&l| l > 0 && l % ps.bytes() == 0) {
        rec.size = len;
    }
    rec.state = FileState::Dirty;
    plan.kept.retain(|r| r.id != id);
    plan.kept.push(rec.clone());
    plan.report.deleted_files = plan.report.deleted_files.saturating_sub(1);
    plan.report.dirty += 1;
    Some(rec)
}

/// Lease paths that are not the inode of a kept lease at that very path are removed.
fn stray_lease_paths(facts: &Facts, plan: &mut Plan) {
    for (&ps, dir) in &facts.lease_paths {
        for (name, LeasePathFact { path, inode }) in dir {
            let ours = plan.kept.iter().any(|r| match &r.state {
                FileState::Leased(l) if l.path == *path => {
                    let pool = facts
                        .pool_files
                        .get(&r.page_size)
                        .and_then(|d| d.get(&file_key(r.id)))
                        .copied()
                        .flatten();
                    matches!((pool, inode), (Some(p), Some(i)) if p.inode == *i)
                }
                _ => false,
            });
            if !ours {
                tracing::warn!(path = %path.display(), "lease path of no live lease: removing");
                plan.steps.push(Step::RemoveLeasePath(ps, name.clone()));
            }
        }
    }
}
