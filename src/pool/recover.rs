//! Start-up reconciliation of the journal with the files on the mounts.
//!
//! - Leased files stay leased (their lease path is re-linked if it went missing).
//! - Dirty, scrubbing and undecodable records: the file is scrubbed again.
//! - Filling records: the file is deleted (it was never handed out).
//! - Warm records are trusted only after a clean shutdown; otherwise scrubbed again.
//! - Records without a file are dropped; files in the pool directory without a record are
//!   deleted, never handed out; lease paths that belong to no lease are removed.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;

use serde::Serialize;

use super::{file_key, FileRecord, FileState, PoolError, PoolMount, Result};
use crate::journal::Journal;
use crate::page_size::PageSize;

/// What reconciliation found.
#[derive(Debug, Default, Clone, Serialize)]
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

fn io<'a>(
    op: &'static str,
    path: &'a std::path::Path,
) -> impl FnOnce(std::io::Error) -> PoolError + 'a {
    move |source| PoolError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn remove_any(path: &std::path::Path) {
    let _ = fs::remove_file(path).or_else(|_| fs::remove_dir_all(path));
}

/// Reconciles; returns the records to keep, the highest id seen and a report.
pub(super) fn reconcile(
    journal: &Journal,
    mounts: &BTreeMap<PageSize, PoolMount>,
    clean: bool,
) -> Result<(Vec<FileRecord>, u64, RecoveryReport)> {
    let mut report = RecoveryReport::default();
    let mut max_id = 0;
    let mut records: BTreeMap<String, FileRecord> = BTreeMap::new();
    for (key, rec) in journal.load_raw::<FileRecord>()? {
        match rec {
            Ok(rec) if rec.key() == key && mounts.contains_key(&rec.page_size) => {
                records.insert(key, rec);
            }
            Ok(rec) => {
                // A page size this run does not serve: leave the record for a run that does.
                if !mounts.contains_key(&rec.page_size) && rec.key() == key {
                    max_id = max_id.max(rec.id);
                    continue;
                }
                tracing::warn!(key, "journal record does not match its key: dropping it");
                journal.remove(&key)?;
            }
            Err(err) => {
                tracing::warn!(
                    key,
                    err,
                    "undecodable journal record: its file will be deleted"
                );
                journal.remove(&key)?;
            }
        }
    }
    // Files in pool directories that no record names are deleted.
    // Both directories are listed and emptied through their handles (see `hugetlb::dir`).
    for mount in mounts.values() {
        let handle = mount.pool_dir_handle().fd_path();
        let dir = fs::read_dir(&handle).map_err(io("readdir", &mount.pool_dir))?;
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let known = records
                .get(&name)
                .is_some_and(|r| r.page_size == mount.page_size);
            if !known {
                tracing::warn!(file = %mount.pool_dir.join(&name).display(), "file hugeprep did not create (or lost track of): deleting");
                remove_any(&entry.path());
                report.deleted_files += 1;
            }
        }
    }
    let mut kept = Vec::new();
    for (key, mut rec) in records {
        max_id = max_id.max(rec.id);
        if let FileState::Leased(l) = &rec.state {
            max_id = max_id.max(l.id);
        }
        let mount = &mounts[&rec.page_size];
        let path = mount.file_path(rec.id);
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(_) => {
                journal.remove(&key)?;
                report.dropped_records += 1;
                continue;
            }
        };
        let mut changed = false;
        if meta.len() != rec.size {
            rec.size = meta.len();
            changed = true;
        }
        match &rec.state {
            FileState::Filling => {
                let _ = fs::remove_file(&path);
                journal.remove(&key)?;
                report.deleted_files += 1;
                continue;
            }
            FileState::Leased(lease) => {
                if fs::symlink_metadata(&lease.path).is_err() {
                    if let Err(err) = fs::hard_link(&path, &lease.path) {
                        tracing::warn!(path = %lease.path.display(), %err, "cannot re-link lease path");
                    }
                }
                report.leases += 1;
            }
            FileState::Warm if clean && rec.size > 0 => report.warm += 1,
            _ => {
                if rec.state != FileState::Dirty {
                    rec.state = FileState::Dirty;
                    changed = true;
                }
                report.dirty += 1;
            }
        }
        if rec.size == 0 {
            let _ = fs::remove_file(&path);
            journal.remove(&key)?;
            report.deleted_files += 1;
            continue;
        }
        if changed {
            journal.write(&key, &rec)?;
        }
        kept.push(rec);
    }
    // Lease paths that belong to no kept lease.
    for mount in mounts.values() {
        let handle = mount.lease_dir_handle().fd_path();
        let dir = fs::read_dir(&handle).map_err(io("readdir", &mount.lease_dir))?;
        for entry in dir.flatten() {
            let path = mount.lease_dir.join(entry.file_name());
            let ours = kept.iter().any(|r| match &r.state {
                FileState::Leased(l) if l.path == path => {
                    let pool = fs::metadata(mount.file_path(r.id));
                    let link = fs::symlink_metadata(entry.path());
                    matches!((pool, link), (Ok(a), Ok(b)) if a.ino() == b.ino() && a.dev() == b.dev())
                }
                _ => false,
            });
            if !ours {
                tracing::warn!(path = %path.display(), "lease path of no live lease: removing");
                remove_any(&entry.path());
            }
        }
    }
    let _ = file_key;
    Ok((kept, max_id, report))
}
