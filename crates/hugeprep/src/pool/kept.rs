//! Released files the kernel's path could not truncate, and their pages kept past the
//! release (see `docs/security.md`, "Pages kept past a release").
//!
//! A lessee that holds a read lease (`F_SETLEASE`, `F_RDLCK`) on its file makes the kernel's
//! path's open for writing fail (`O_NONBLOCK`: `EWOULDBLOCK`), so the file cannot be
//! truncated, and its open descriptor keeps the inode, with every page, after an unlink. So
//! the file is not unlinked: it is renamed within the pool directory (the daemon's, 0700) to
//! `kept-<id>` and kept here, charged to the principal of its last lease (as leased bytes
//! and as a lease: they are still its pages, and its `leases` limit bounds how many files
//! the keeper tries for it), and opened for writing again at every turn of the keeper (a
//! thread, [`KEEP_TURN`]) and at every lease its principal asks for. Each open breaks the
//! lease again; the kernel takes a lease that was not given up within `lease-break-time`
//! (`/proc/sys/fs/lease-break-time`, 45 s by default) away at the next such open. Then the
//! file is truncated (its pages leave every mapping and return to the kernel, but for those
//! a pin holds) and unlinked, and the charge ends.
//!
//! A file whose pages someone else still references when it takes the kernel's path (an
//! io_uring fixed buffer, a `vmsplice`d pipe, a DMA pin: the kernel's counts see them,
//! [`super::reach::Reach::pinned_pages`]) is kept the same way, untruncated: a truncate would
//! take those pages out of the file and leave them with their holder, charged to nobody and
//! out of every count the daemon reads. The keeper reads the file's counts again, at most
//! [`PROOFS_PER_TURN`] pinned files a turn (by turns of principals, the longest unread
//! first), and truncates and unlinks it once no page is pinned and nothing but the keeper
//! reaches it (a mapping or an open file could pin again). It is never recycled into the pool. The pages nobody pins
//! are punched out when it is kept (`kernel_path`). With the walk (no kernel counts) the
//! daemon cannot see pins: such files are truncated as before.
//!
//! The charge outlives a restart in the file's name, `kept-<id>-n<node>-<principal in hex>`:
//! recovery leaves such names alone and the new daemon keeps them again, charged to the
//! same principal (a principal longer than 100 bytes, a long certificate subject, is not
//! named: its file is still truncated when it can be, but charged to nobody after a
//! restart).

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::host::{FileAt, Keeper, KeptAt, Opened};
use super::{FileRecord, PageSize, Pool};

/// How often the keeper opens the kept files again.
pub const KEEP_TURN: Duration = Duration::from_millis(250);

/// How many pinned kept files the keeper reads the counts of in one turn (by turns of
/// principals): each read is a run of the probe over the file's pages, so a tenant that pins
/// many files makes its own wait longer (its `leases` and `leased_bytes` bound how many), not
/// the daemon's work or another principal's wait.
pub const PROOFS_PER_TURN: usize = 8;

/// The prefix of a kept file's name in the pool directory (pool files are `p<id>`; recovery
/// leaves names with this prefix alone).
pub const KEPT_PREFIX: &str = "kept-";

/// One released file kept for its holder.
#[derive(Debug)]
struct KeptFile {
    /// Its name in the pool directory of its page size.
    at: KeptAt,
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
    /// Some of its pages were referenced beyond the page cache at the last look (a pin, a
    /// pipe): only the keeper reads its counts again, [`PROOFS_PER_TURN`] files a turn.
    pinned: bool,
    /// When its counts were last read (the keeper reads the longest unread first).
    proven: Instant,
}

impl KeptFile {
    /// What the file takes from the host now, read with one `statat` of its name (through
    /// the pool directory's handle), not the figure taken when it was kept: a file kept for
    /// a read lease may still be mapped by that lease's holder, who can fault pages in up to
    /// its length (a length it may have grown before the release), so it counts by its
    /// length rounded up to whole pages or its pages, whichever is larger. A file kept for
    /// pins is reached by nothing else (the rule it was kept by) and had its unpinned pages
    /// punched out: it counts by its pages. The figure taken when it was kept when the name
    /// cannot be read.
    fn charge<K: Keeper + ?Sized>(&self, host: &K) -> u64 {
        let Some((len, bytes)) = host.kept_size(&self.at) else {
            return self.bytes;
        };
        if self.pinned {
            return bytes;
        }
        crate::hugetlb::extent_of(len, bytes / 512, self.page_size)
    }
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

    /// Files kept for `principal`, and their bytes per page size.
    pub(super) fn of<K: Keeper + ?Sized>(
        &self,
        principal: &str,
        host: &K,
    ) -> (u64, BTreeMap<PageSize, u64>) {
        let mut bytes = BTreeMap::new();
        let mut files = 0;
        for f in self
            .lock()
            .iter()
            .filter(|f| f.principal.as_deref() == Some(principal))
        {
            files += 1;
            let sum: &mut u64 = bytes.entry(f.page_size).or_default();
            *sum = sum.saturating_add(f.charge(host));
        }
        (files, bytes)
    }

    /// Files and bytes kept in all.
    pub(super) fn totals<K: Keeper + ?Sized>(&self, host: &K) -> (usize, u64) {
        let files = self.lock();
        (
            files.len(),
            files
                .iter()
                .fold(0u64, |sum, f| sum.saturating_add(f.charge(host))),
        )
    }

    /// Takes kept file `at` out of the list (`None`: another turn took it).
    fn take(&self, at: &KeptAt) -> Option<KeptFile> {
        let mut files = self.lock();
        let i = files.iter().position(|f| f.at == *at)?;
        Some(files.swap_remove(i))
    }

    /// Whether `principal` (or, with `None`, anyone) has a file kept.
    fn any(&self, principal: Option<&str>) -> bool {
        self.lock()
            .iter()
            .any(|f| principal.is_none() || f.principal.as_deref() == principal)
    }
}

/// The longest principal written into a kept file's name (in hex, twice as long: the name
/// stays well under 255 bytes).
const NAMED_PRINCIPAL: usize = 100;

/// The name of the kept file of pool file `id` on `node`, charged to `principal`.
fn kept_name(id: u64, node: u32, principal: Option<&str>) -> String {
    let mut name = format!("{KEPT_PREFIX}{id}-n{node}");
    if let Some(p) = principal.filter(|p| p.len() <= NAMED_PRINCIPAL) {
        name.push('-');
        for b in p.bytes() {
            name.push_str(&format!("{b:02x}"));
        }
    }
    name
}

/// The pool file id, node and principal a kept file's name holds; `None` for any other name.
pub(super) fn parse_kept_name(name: &str) -> Option<(u64, u32, Option<String>)> {
    let mut parts = name.strip_prefix(KEPT_PREFIX)?.splitn(3, '-');
    let id = parts.next()?.parse().ok()?;
    let node = parts.next()?.strip_prefix('n')?.parse().ok()?;
    let principal = match parts.next() {
        None => None,
        Some(hex) => {
            if hex.len() % 2 != 0 || hex.len() > 2 * NAMED_PRINCIPAL {
                return None;
            }
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                .collect::<Option<Vec<u8>>>()?;
            Some(String::from_utf8(bytes).ok()?)
        }
    };
    Some((id, node, principal))
}

/// The pinned files whose counts the keeper reads this turn, at most `n`, by turns of
/// principals: each principal's longest unread file, then each one's second, and so on, the
/// longest unread first within a round. A tenant that pins many files lengthens its own
/// wait, not another principal's.
fn proof_turns(files: &[KeptFile], n: usize) -> Vec<usize> {
    let mut pinned: Vec<usize> = (0..files.len()).filter(|&i| files[i].pinned).collect();
    pinned.sort_by_key(|&i| files[i].proven);
    let mut rounds: BTreeMap<Option<&str>, usize> = BTreeMap::new();
    let mut ranked: Vec<(usize, Instant, usize)> = pinned
        .into_iter()
        .map(|i| {
            let round = rounds.entry(files[i].principal.as_deref()).or_default();
            *round += 1;
            (*round, files[i].proven, i)
        })
        .collect();
    ranked.sort_unstable();
    ranked.into_iter().take(n).map(|(_, _, i)| i).collect()
}

impl Pool {
    /// The kernel's path could not truncate the released file `rec` (a read lease
    /// on it), or must not (`pinned`: pages of it still referenced): renames it to
    /// `kept-<id>` and keeps it, charged to `principal`, until it can be truncated with
    /// every page coming back. `bytes`: its pages. Returns false when it could not be
    /// renamed (it is then truncated or unlinked as before, its held pages with their
    /// holder, charged to nobody).
    pub(super) fn keep(
        &self,
        rec: &FileRecord,
        (principal, lease): (Option<String>, u64),
        bytes: u64,
        pinned: bool,
    ) -> bool {
        let name = kept_name(rec.id, rec.node, principal.as_deref());
        // Never over another kept file: a name that clashed (ids come from the clock, which
        // may step back across a restart) would lose that file's charge.
        if let Err(err) = self.host.keep_as(FileAt::of(rec), &name) {
            tracing::warn!(id = rec.id, %err, "cannot keep a released file that another process holds a lease on");
            return false;
        }
        let now = self.host.now();
        self.tenants.kept.lock().push(KeptFile {
            at: KeptAt {
                page_size: rec.page_size,
                name,
            },
            principal,
            page_size: rec.page_size,
            node: rec.node,
            bytes,
            id: rec.id,
            lease,
            since: now,
            pinned,
            proven: now,
        });
        true
    }

    /// Tries the files kept for `principal` (`None`: the keeper's turn, all of them): each
    /// that opens for writing (its holder gave up its lease, or the kernel took it away) and
    /// whose pages nobody references any more is truncated and unlinked, and no longer
    /// charged. A file whose pages are still referenced (a pin, a pipe) is marked pinned;
    /// pinned files are read again by the keeper only, [`PROOFS_PER_TURN`] a turn, the
    /// longest unread first, so a lease asks for one open per kept file of its principal and
    /// no run of the probe for a file already found pinned. Runs without the state lock; the
    /// truncates free pages.
    pub(super) fn reclaim_kept(&self, principal: Option<&str>) {
        if !self.tenants.kept.any(principal) {
            return;
        }
        let now = self.host.now();
        let tries: Vec<KeptAt> = {
            let mut files = self.tenants.kept.lock();
            let mut tries: Vec<KeptAt> = files
                .iter()
                .filter(|f| !f.pinned)
                .filter(|f| principal.is_none() || f.principal.as_deref() == principal)
                .map(|f| f.at.clone())
                .collect();
            if principal.is_none() {
                for i in proof_turns(&files, PROOFS_PER_TURN) {
                    files[i].proven = now;
                    tries.push(files[i].at.clone());
                }
            }
            tries
        };
        for at in tries {
            let file = match self.host.open_kept(&at) {
                Ok(file) => Some(file),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                // A lease still held (`EWOULDBLOCK`), or anything else: tried again at the
                // next turn.
                Err(_) => continue,
            };
            if let Some(still) = file.as_ref().and_then(|f| self.still_held(&at, f)) {
                self.still_pinned(&at, still);
                continue;
            }
            let Some(f) = self.tenants.kept.take(&at) else {
                continue;
            };
            self.truncate_kept(f, file);
        }
    }

    /// Whether kept file `at` (open for writing: `file`) must stay untruncated: pages of
    /// it are pinned and nothing but the keeper reaches it (`Ok`: so many pages;
    /// [`keep_file`](super::reach::kernel::Pins::keep_file), the rule the release applied), or its counts cannot be read
    /// (`Err`). `None`: truncate it, also when something else still reaches it (a read
    /// lease's holder that kept its descriptor, a mapping) whether pinned or not, and
    /// without kernel counts, where pins cannot be seen. A file that turns out pinned here
    /// for the first time (it was kept for a read lease) has its unpinned pages punched out,
    /// as the release does.
    fn still_held(&self, at: &KeptAt, file: &Opened) -> Option<Result<u64, String>> {
        let (was_pinned, page_size, id) = {
            let files = self.tenants.kept.lock();
            let f = files.iter().find(|f| f.at == *at)?;
            (f.pinned, f.page_size, f.id)
        };
        match self.host.pinned_pages(file) {
            Ok(Some(p)) if p.keep_file() => {
                if !was_pinned {
                    self.host.punch_unpinned(file, &p, page_size);
                }
                Some(Ok(p.pages))
            }
            Ok(Some(p)) => {
                if p.pages > 0 {
                    tracing::warn!(
                        id,
                        held_pages = p.pages,
                        "pages of a kept released file are pinned and the file is still reached (an open file, a mapping): truncated, the pinned pages stay with their holder uncharged"
                    );
                }
                None
            }
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Kept file `at`'s pages are still referenced (`Ok`: so many), or its counts could
    /// not be read (`Err`): kept, and read again at a later turn of the keeper.
    fn still_pinned(&self, at: &KeptAt, still: Result<u64, String>) {
        let mut files = self.tenants.kept.lock();
        let Some(f) = files.iter_mut().find(|f| f.at == *at) else {
            return;
        };
        if !f.pinned {
            match &still {
                Ok(pages) => tracing::warn!(
                    id = f.id,
                    lease = f.lease,
                    principal = f.principal.as_deref().unwrap_or(""),
                    held_pages = pages,
                    "pages of a kept released file are still referenced (a pin, a pipe): kept untruncated, charged to its lessee, until nobody holds one"
                ),
                Err(err) => tracing::warn!(
                    id = f.id,
                    %err,
                    "cannot read the kernel's counts of a kept released file: kept, read again later"
                ),
            }
        }
        f.pinned = true;
    }

    /// Truncates and unlinks kept file `f` (`file`: open for writing; `None`: gone).
    fn truncate_kept(&self, f: KeptFile, file: Option<Opened>) {
        let _lock_holder = crate::sys::priority::OutOfIdle::enter();
        let (truncated, returned) = match file {
            Some(file) => {
                let (truncated, pages) = self.host.truncate_kept(file, f.node, f.page_size);
                (Some(truncated), pages * f.page_size.bytes())
            }
            None => (None, 0),
        };
        if let Err(err) = self.host.remove_kept(&f.at) {
            if err.kind() != io::ErrorKind::NotFound {
                tracing::warn!(file = f.at.name, %err, "cannot remove a kept file");
            }
        }
        tracing::info!(
            id = f.id,
            lease = f.lease,
            principal = f.principal.as_deref().unwrap_or(""),
            kept_bytes = f.bytes,
            returned_bytes = returned,
            pinned = f.pinned,
            kept_ms = u64::try_from(self.host.now().saturating_duration_since(f.since).as_millis())
                .unwrap_or(u64::MAX),
            truncated = ?truncated.map(|r| r.map_err(|e| e.to_string())),
            "a kept released file is no longer held by a lease or a pin: truncated, no longer charged"
        );
    }

    /// Keeps again the files a previous run kept (found by their names in the pool
    /// directories), charged to the principal each name holds.
    pub(super) fn adopt_kept(&self) {
        for &page_size in self.settings.mounts.keys() {
            for (name, bytes) in self.host.kept_names(page_size) {
                let Some((id, node, principal)) = parse_kept_name(&name) else {
                    continue;
                };
                tracing::warn!(
                    id,
                    principal = principal.as_deref().unwrap_or(""),
                    kept_bytes = bytes,
                    "a released file kept for a read lease before the restart is kept again, charged to its lessee"
                );
                let now = self.host.now();
                self.tenants.kept.lock().push(KeptFile {
                    at: KeptAt { page_size, name },
                    principal,
                    page_size,
                    node,
                    bytes,
                    id,
                    lease: 0,
                    since: now,
                    // Whether a pin holds pages of it is read at its next try.
                    pinned: false,
                    proven: now,
                });
            }
        }
    }

    /// The kept files, by name (the driver tests' accounting).
    #[cfg(test)]
    pub(super) fn kept_names(&self) -> Vec<KeptAt> {
        self.tenants
            .kept
            .lock()
            .iter()
            .map(|f| f.at.clone())
            .collect()
    }

    /// Files and bytes kept past the kernel's path, waiting for their holders.
    pub fn kept_totals(&self) -> (usize, u64) {
        self.tenants.kept.totals(&*self.host)
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
                if pool.table.is_shut_down() {
                    return;
                }
                pool.reclaim_kept(None);
            });
        if let Err(err) = spawned {
            tracing::warn!(%err, "cannot start the keeper of released files held by a lease: they are tried again at their principal's next lease only");
        }
    }
}

#[cfg(test)]
#[path = "tests/kept.rs"]
mod tests;
