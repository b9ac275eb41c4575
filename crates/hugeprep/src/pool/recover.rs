//! Start-up reconciliation of the journal with the files on the mounts: the driver of
//! [`core::recovery`](super::core::recovery), which decides. The host reads the facts and
//! performs the plan's steps in order; for the real host this file does both (the journal,
//! the pool and lease directories through their handles).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;

use super::core::recovery::{self, Facts, LeasePathFact, PoolFileFact, Step};
use super::{file_key, FileRecord, FileState, PoolError, PoolMount, Result};
use crate::journal::Journal;
use crate::page_size::PageSize;

pub use recovery::RecoveryReport;

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

/// Removes a pool or lease directory entry, a file or a directory someone made there.
fn remove_any(path: &std::path::Path) {
    if let Err(err) = fs::remove_file(path).or_else(|_| fs::remove_dir_all(path)) {
        // Found again (and retried) at the next start; nothing hands it out meanwhile.
        tracing::warn!(path = %path.display(), %err, "cannot remove a stray entry");
    }
}

/// Reconciles the host's journal with its mounts; returns the records to keep, the highest
/// id seen and a report.
pub(super) fn reconcile(
    host: &dyn super::host::Host,
    clean: bool,
) -> Result<(Vec<FileRecord>, u64, RecoveryReport)> {
    let facts = host.recovery_facts(clean)?;
    let mut plan = recovery::plan(&facts);
    let steps = std::mem::take(&mut plan.steps);
    // The keys of records whose file could not be removed: kept, not unjournaled.
    let mut unremoved = std::collections::BTreeSet::new();
    for step in &steps {
        if matches!(step, Step::Unjournal(key) if unremoved.contains(key)) {
            continue;
        }
        if host.recovery_step(step)? {
            continue;
        }
        if let Step::RemoveFile(ps, id) = step {
            if let Some(rec) = recovery::unremoved(&facts, &mut plan, *ps, *id) {
                tracing::warn!(file = %file_key(*id), "cannot delete a pool file at start: kept as dirty, removed again by the worker");
                unremoved.insert(rec.key());
                host.recovery_step(&Step::Journal(rec))?;
            }
        }
    }
    host.recovery_finish();
    Ok((plan.kept, plan.max_id, plan.report))
}

/// Removes the tenants' directories (`.uid-N`, `.p-...`) that hold no lease path any more:
/// those recovery just emptied, and those of an earlier naming scheme (before the keyed
/// `.p-<HMAC>` names, a principal's name in hex), which would otherwise name their principal
/// in the world-listable lease directory for good. Only at start: no lease is being made,
/// so none can be linked into a directory this removes. A directory that still holds a
/// lease path stays (`rmdir` refuses it) and goes at a later start.
pub(super) fn remove_empty_scope_dirs(mounts: &BTreeMap<PageSize, PoolMount>) {
    for mount in mounts.values() {
        let Ok(dir) = fs::read_dir(mount.lease_dir_handle().fd_path()) else {
            continue;
        };
        for entry in dir.flatten() {
            let name = entry.file_name();
            if !name.as_encoded_bytes().starts_with(b".") {
                continue;
            }
            // Not empty, not a directory, gone: an error leaves it as it is.
            if rustix::fs::unlinkat(
                mount.lease_dir_handle().fd(),
                name.as_os_str(),
                rustix::fs::AtFlags::REMOVEDIR,
            )
            .is_ok()
            {
                tracing::info!(dir = %name.to_string_lossy(), "removed an empty tenant directory");
            }
        }
    }
}

/// Reads what recovery decides from: the journal and both directories of every mount, each
/// listed through its handle (see `hugetlb::dir`).
pub(super) fn facts(
    journal: &Journal,
    mounts: &BTreeMap<PageSize, PoolMount>,
    clean: bool,
) -> Result<Facts> {
    let mut facts = Facts {
        records: journal.load_raw::<FileRecord>()?,
        served: mounts.keys().copied().collect(),
        clean,
        ..Facts::default()
    };
    for (&ps, mount) in mounts {
        facts.pool_files.insert(ps, pool_files(mount)?);
        facts.lease_paths.insert(ps, lease_paths(mount)?);
    }
    for (_, rec) in &facts.records {
        if let Ok(FileRecord {
            state: FileState::Leased(lease),
            ..
        }) = rec
        {
            if fs::symlink_metadata(&lease.path).is_ok() {
                facts.existing_paths.insert(lease.path.clone());
            }
        }
    }
    Ok(facts)
}

/// The files in a mount's pool directory, by name, with their length and inode.
fn pool_files(mount: &PoolMount) -> Result<BTreeMap<String, Option<PoolFileFact>>> {
    let handle = mount.pool_dir_handle().fd_path();
    let dir = fs::read_dir(&handle).map_err(io("readdir", &mount.pool_dir))?;
    let mut files = BTreeMap::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // A released file kept for a read lease (see `kept`): kept again after recovery.
        if super::kept::parse_kept_name(&name).is_some() {
            continue;
        }
        let file = fs::metadata(entry.path()).ok().map(|m| PoolFileFact {
            len: m.len(),
            inode: (m.dev(), m.ino()),
        });
        files.insert(name, file);
    }
    Ok(files)
}

/// The lease paths in a mount's lease directory, by name (`<dir>/<name>` inside a tenant's
/// directory), with their inode.
fn lease_paths(mount: &PoolMount) -> Result<BTreeMap<String, LeasePathFact>> {
    let handle = mount.lease_dir_handle().fd_path();
    let dir = fs::read_dir(&handle).map_err(io("readdir", &mount.lease_dir))?;
    let mut paths = BTreeMap::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let meta = fs::symlink_metadata(entry.path()).ok();
        // A tenant's directory (`.uid-N`, `.p-...`; see `lease::scope_dir`): its lease
        // paths are facts under `<dir>/<name>`, the directory itself stays.
        if name.starts_with('.') && meta.as_ref().is_some_and(|m| m.is_dir()) {
            let inner = fs::read_dir(entry.path()).map_err(io("readdir", &mount.lease_dir))?;
            for e in inner.flatten() {
                let scoped = format!("{name}/{}", e.file_name().to_string_lossy());
                let inode = fs::symlink_metadata(e.path())
                    .ok()
                    .map(|m| (m.dev(), m.ino()));
                let path = mount.lease_dir.join(&scoped);
                paths.insert(scoped, LeasePathFact { path, inode });
            }
            continue;
        }
        let path = mount.lease_dir.join(&name);
        let inode = meta.map(|m| (m.dev(), m.ino()));
        paths.insert(name, LeasePathFact { path, inode });
    }
    Ok(paths)
}

/// Performs one step of the plan; a journal failure stops recovery (the daemon does not
/// start on a journal it cannot write). `Ok(false)`: a pool file's removal failed (the file
/// is still there).
pub(super) fn perform(
    journal: &Journal,
    mounts: &BTreeMap<PageSize, PoolMount>,
    step: &Step,
) -> Result<bool> {
    let mount = |ps: &PageSize| {
        mounts.get(ps).ok_or_else(|| PoolError::Field {
            field: "page_size",
            message: format!("no mount for {ps} pages"),
        })
    };
    match step {
        Step::Unjournal(key) => journal.remove(key)?,
        Step::Journal(rec) => journal.write(&rec.key(), rec)?,
        Step::RemovePoolEntry(ps, name) => {
            remove_any(&mount(ps)?.pool_dir_handle().fd_path().join(name));
        }
        Step::RemoveFile(ps, id) => {
            let path = mount(ps)?.file_path(*id);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Its record stays (see `recovery::unremoved`): the worker removes it again.
                Err(err) => {
                    tracing::warn!(file = %file_key(*id), %err, "cannot delete a pool file");
                    return Ok(false);
                }
            }
        }
        Step::Relink(ps, id, path) => {
            if let Err(err) = fs::hard_link(mount(ps)?.file_path(*id), path) {
                tracing::warn!(path = %path.display(), %err, "cannot re-link lease path");
            }
        }
        Step::RemoveLeasePath(ps, name) => {
            remove_any(&mount(ps)?.lease_dir_handle().fd_path().join(name));
        }
    }
    Ok(true)
}
