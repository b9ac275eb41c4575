//! Released files the kernel's path could not truncate, and their pages kept past the
//! release (see `docs/security.md`, "Pages kept past a release").
//!
//! A lessee that holds a read lease (`F_SETLEASE`, `F_RDLCK`) on its file makes the kernel's
//! path's open for writing fail (`O_NONBLOCK`: `EWOULDBLOCK`), so the file cannot be
//! truncated, and its open descriptor keeps the inode, with every page, after an unlink. So
//! the file is not unlinked: it is renamed within the pool directory (the daemon's, 0700) to
//! `kept-<id>` and kept here, charged to the principal of its last lease (as leased bytes:
//! they are still its pages), and opened for writing again at every turn of the keeper (a
//! thread, [`KEEP_TURN`]) and at every lease its principal asks for. Each open breaks the
//! lease again; the kernel takes a lease that was not given up within `lease-break-time`
//! (`/proc/sys/fs/lease-break-time`, 45 s by default) away at the next such open. Then the
//! file is truncated (its pages leave every mapping and return to the kernel, but for those
//! a pin holds) and unlinked, and the charge ends.
//!
//! The charge is not journaled: a restart removes the `kept-` names as strays (the pages
//! stay with their holder, as before this module) and forgets the charge.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::kernel::node_free_pages;
use super::{FileRecord, PageSize, Pool};

/// How often the keeper opens the kept files again.
pub const KEEP_TURN: Duration = Duration::from_millis(250);

/// The prefix of a kept file's name in the pool directory (pool files are `p<id>`).
pub const KEPT_PREFIX: &str = "kept-";

/// One released file kept for its holder.
#[derive(Debug)]
struct KeptFile {
    /// Its name in the pool directory.
    path: PathBuf,
    /// The principal of its last lease (`None`: a lease no tenant made).
    principal: Option<String>,
    page_size: PageSize,
    node: u32,
    /// Bytes of its pages (`st_blocks`) when it was kept.
    bytes: u64,
    /// The pool file's id, its lease and name (for the log).
    id: u64,
    lease: u64,
    since: Instant,
}

/// The kept files.
#[derive(Debug, Default)]
pub(super) struct Kept {
    files: Mutex<Vec<KeptFile>>,
}

impl Kept {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<KeptFile>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes kept for `principal`, per page size.
    pub(super) fn bytes_of(&self, principal: &str) -> BTreeMap<PageSize, u64> {
        let mut out = BTreeMap::new();
        for f in self
            .lock()
            .iter()
            .filter(|f| f.principal.as_deref() == Some(principal))
        {
            *out.entry(f.page_size).or_default() += f.bytes;
        }
        out
    }

    /// Files and bytes kept in all.
    pub(super) fn totals(&self) -> (usize, u64) {
        let files = self.lock();
        (files.len(), files.iter().map(|f| f.bytes).sum())
    }

    /// Whether `principal` (or, with `None`, anyone) has a file kept.
    fn any(&self, principal: Option<&str>) -> bool {
        self.lock()
            .iter()
            .any(|f| principal.is_none() || f.principal.as_deref() == principal)
    }
}

/// Opens a kept file for writing without waiting for a lease to be given up.
fn open_for_truncate(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
}

impl Pool {
    /// The kernel's path could not truncate the released file `rec` at `path` (a read lease
    /// on it): renames it to `kept-<id>` and keeps it, charged to `principal`, until it can
    /// be truncated. `bytes`: its pages. Returns false when it could not be renamed (it is
    /// then unlinked as before, its pages with their holder, charged to nobody).
    pub(super) fn keep(
        &self,
        path: &Path,
        rec: &FileRecord,
        principal: Option<String>,
        lease: u64,
        bytes: u64,
    ) -> bool {
        let kept = path.with_file_name(format!("{KEPT_PREFIX}{}", rec.id));
        if let Err(err) = fs::rename(path, &kept) {
            tracing::warn!(id = rec.id, %err, "cannot keep a released file that another process holds a lease on");
            return false;
        }
        self.kept.lock().push(KeptFile {
            path: kept,
            principal,
            page_size: rec.page_size,
            node: rec.node,
            bytes,
            id: rec.id,
            lease,
            since: Instant::now(),
        });
        true
    }

    /// Opens every file kept for `principal` (`None`: all) for writing; each one that opens
    /// (its holder gave up its lease, or the kernel took it away) is truncated and unlinked,
    /// and no longer charged. Runs without the state lock; the truncates free pages.
    pub(super) fn reclaim_kept(&self, principal: Option<&str>) {
        if !self.kept.any(principal) {
            return;
        }
        let mut opened = Vec::new();
        {
            let mut files = self.kept.lock();
            let mut i = 0;
            while i < files.len() {
                let f = &files[i];
                if principal.is_some() && f.principal.as_deref() != principal {
                    i += 1;
                    continue;
                }
                match open_for_truncate(&f.path) {
                    Ok(file) => opened.push((files.swap_remove(i), Some(file))),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        opened.push((files.swap_remove(i), None));
                    }
                    // A lease still held (`EWOULDBLOCK`), or anything else: tried again at
                    // the next turn.
                    Err(_) => i += 1,
                }
            }
        }
        for (f, file) in opened {
            let _lock_holder = crate::sys::priority::OutOfIdle::enter();
            let before = node_free_pages(f.node, f.page_size);
            let truncated = file.map(|file| file.set_len(0));
            let after = node_free_pages(f.node, f.page_size);
            if let Err(err) = fs::remove_file(&f.path) {
                if err.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(file = %f.path.display(), %err, "cannot remove a kept file");
                }
            }
            let returned = match (before, after) {
                (Some(b), Some(a)) => a.saturating_sub(b) * f.page_size.bytes(),
                _ => 0,
            };
            tracing::info!(
                id = f.id,
                lease = f.lease,
                principal = f.principal.as_deref().unwrap_or(""),
                kept_bytes = f.bytes,
                returned_bytes = returned,
                kept_ms = u64::try_from(f.since.elapsed().as_millis()).unwrap_or(u64::MAX),
                truncated = ?truncated.map(|r| r.map_err(|e| e.to_string())),
                "a kept released file is no longer held by a lease: truncated, no longer charged"
            );
        }
    }

    /// Files and bytes kept past the kernel's path, waiting for their holders.
    pub fn kept_totals(&self) -> (usize, u64) {
        self.kept.totals()
    }

    /// Starts the keeper: a thread that tries the kept files again every [`KEEP_TURN`]
    /// until the pool shuts down or is dropped.
    pub(super) fn spawn_keeper(pool: &Arc<Pool>) {
        let weak: Weak<Pool> = Arc::downgrade(pool);
        let spawned = std::thread::Builder::new()
            .name("hugeprep-keeper".into())
            .spawn(move || loop {
                std::thread::sleep(KEEP_TURN);
                let Some(pool) = weak.upgrade() else {
                    return;
                };
                if pool.shutdown.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                pool.reclaim_kept(None);
            });
        if let Err(err) = spawned {
            tracing::warn!(%err, "cannot start the keeper of released files held by a lease: they are tried again at their principal's next lease only");
        }
    }
}
