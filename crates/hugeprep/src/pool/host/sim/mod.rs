//! A simulated host for the pool's driver: files, the journal, the kernel's free pages,
//! the release proof and the clock kept in memory, so the real lease, release, scrub, fill,
//! trim and drain code runs without hugetlbfs or root, and faults can be injected cheaply.
//!
//! Every file keeps the principals whose bytes it may hold ("marks"): a lessee writes to its
//! lease ([`SimHost::write`]); a scrub or the kernel's zeroing clears them. Linking a lease
//! path to a file that holds another principal's bytes is recorded as a leak
//! ([`SimHost::leaks`]): the one thing that must never happen.

mod effects;
mod journal;
mod kept;

#[cfg(test)]
pub(in crate::pool) use kept::Hold;
mod pools;
mod recovery;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::FileAt;
use crate::hugetlb::Scope;
use crate::journal::JournalError;
use crate::page_size::PageSize;
use crate::pool::fault::FaultError;
use crate::pool::record::FileRecord;
use crate::prefault::PrefaultError;

/// One file on the simulated mounts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(in crate::pool) struct SimFile {
    /// Its length.
    pub(in crate::pool) size: u64,
    /// Pages it holds (taken from the node's free pages).
    pub(in crate::pool) pages: u64,
    /// Whether the pool directory still names it.
    pub(in crate::pool) pooled: bool,
    /// Lease paths linked to it.
    pub(in crate::pool) links: BTreeSet<PathBuf>,
    /// Principals whose bytes it may hold.
    pub(in crate::pool) marks: BTreeSet<String>,
    /// The owner a lease handed it to (`None`: the daemon's).
    pub(in crate::pool) owner: Option<u32>,
    /// Whether its opens are watched (a lease linked it while the watch ran).
    pub(in crate::pool) watched: bool,
    /// The node its pages are on.
    pub(in crate::pool) node: u32,
    /// Its name in the pool directory while kept past its release (see `pool::kept`).
    pub(in crate::pool) kept: Option<String>,
    /// A lessee's read lease on it, and the pages of it a holder pins (see [`SimHost::hold`]).
    pub(in crate::pool) held: kept::Hold,
}

/// How the simulated release proof answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(in crate::pool) enum ProofMode {
    /// Every watched file is proven out of reach.
    #[default]
    Pass,
    /// Someone still holds the file (it may wait aside).
    Held,
    /// The proof cannot be made (the kernel's path).
    Fail,
    /// The proof passes, late: the clock moves on [`SLOW_PROOF`] while it runs, and the
    /// hook set with [`SimHost::during_proof`] runs meanwhile (leases go on).
    Slow,
}

/// How long a slow proof takes (see [`ProofMode::Slow`]): past a held file's backoff and
/// a lease's wait.
pub(in crate::pool) const SLOW_PROOF: Duration = Duration::from_secs(3);

/// What a hook run during a slow proof does (see [`SimHost::during_proof`]).
pub(in crate::pool) type ProofHook = Box<dyn FnMut() + Send>;

/// Faults to inject.
#[derive(Debug, Clone, Default)]
pub(in crate::pool) struct Faults {
    /// Journal writes fail with `ENOSPC` from this many writes on (`Some(0)`: the next).
    pub(in crate::pool) journal_full_after: Option<u64>,
    /// The proof's answer.
    pub(in crate::pool) proof: ProofMode,
    /// Scrubs fail (verification finds a byte).
    pub(in crate::pool) scrub_fails: bool,
    /// Creating files fails.
    pub(in crate::pool) create_fails: bool,
    /// The kernel counts this many more free pages than it can really give: faults fail
    /// where the figures said they fit.
    pub(in crate::pool) phantom_pages: u64,
    /// Every reading of the clock moves it on this much (time that jumps; a lease that
    /// waits reaches its deadline in a few turns).
    pub(in crate::pool) tick: Duration,
    /// The daemon is killed before this many more effects (`Some(0)`: before the next):
    /// the host call unwinds with [`Crashed`], and the simulation starts a new daemon on
    /// what the host keeps.
    pub(in crate::pool) crash_after: Option<u64>,
    /// Per mille of resizes, cuts, chowns, links and truncates that fail (`EIO`),
    /// drawn from `io_seed`.
    pub(in crate::pool) io_error_per_mille: u64,
    /// The stream the failures are drawn from (splitmix64).
    pub(in crate::pool) io_seed: u64,
    /// Per mille of pool-file unlinks (the worker's and recovery's) that fail (`EIO` or
    /// `EBUSY`), drawn from `io_seed`.
    pub(in crate::pool) unlink_error_per_mille: u64,
    /// At a crash the journal loses what it had not synced: the last of its unsynced
    /// writes and removals (a suffix drawn from `io_seed`; a clean-shutdown marker syncs),
    /// and the last write it keeps may be cut short (a record that does not decode).
    pub(in crate::pool) lose_unsynced: bool,
    /// Taking released files back from their lessees fails (besides `io_error_per_mille`).
    pub(in crate::pool) take_back_fails: bool,
}

/// The payload of a simulated crash (see [`Faults::crash_after`]).
#[derive(Debug)]
pub(in crate::pool) struct Crashed;

#[derive(Debug, Default)]
struct World {
    files: BTreeMap<u64, (PageSize, SimFile)>,
    journal: BTreeMap<u64, FileRecord>,
    clean: bool,
    journal_writes: u64,
    free: BTreeMap<(u32, PageSize), u64>,
    total: BTreeMap<(u32, PageSize), u64>,
    lease_paths: BTreeMap<PathBuf, u64>,
    /// The lease directory of each page size (recovery lists lease paths by name).
    lease_dirs: BTreeMap<PageSize, PathBuf>,
    /// Crashes injected, by the effect they came before.
    crashed_at: BTreeMap<&'static str, u64>,
    elapsed: Duration,
    faults: Faults,
    leaks: Vec<String>,
    /// Journal changes not synced yet, oldest first: the file and its record before it.
    unsynced: Vec<(u64, Option<FileRecord>)>,
    /// Records cut short by a crash (they do not decode), until written or removed again.
    torn: BTreeSet<u64>,
    /// Faults other than crashes injected so far, by name (a run must hit each).
    injected: BTreeMap<&'static str, u64>,
    /// The memory behind the kernel's pools, other users' pages, the reservations' ledger.
    machine: pools::Machine,
    /// Files whose pages the daemon pinned (held by the process: a crash drops them).
    pins: BTreeSet<u64>,
}

/// The simulated host.
pub(in crate::pool) struct SimHost {
    start: Instant,
    world: Mutex<World>,
    /// Runs inside a slow proof, outside the world's lock (see [`ProofMode::Slow`]).
    during_proof: Mutex<Option<ProofHook>>,
}

impl std::fmt::Debug for SimHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHost")
            .field("start", &self.start)
            .field("world", &self.world)
            .finish_non_exhaustive()
    }
}

fn enospc() -> JournalError {
    JournalError::Io {
        op: "write",
        path: PathBuf::from("sim-journal"),
        source: io::Error::from_raw_os_error(libc::ENOSPC),
    }
}

impl SimHost {
    /// A host whose kernel has `pages` free pages of each `(node, page size)`.
    pub(in crate::pool) fn new(pages: &[((u32, PageSize), u64)]) -> Arc<SimHost> {
        let mut world = World::default();
        for &(kind, n) in pages {
            world.free.insert(kind, n);
            world.total.insert(kind, n);
        }
        Arc::new(SimHost {
            start: Instant::now(),
            world: Mutex::new(world),
            during_proof: Mutex::new(None),
        })
    }

    fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Before every effect (`site` names it): the daemon may be killed here.
    fn effect(&self, site: &'static str) {
        let crash = {
            let mut w = self.world();
            match w.faults.crash_after {
                Some(0) => {
                    w.faults.crash_after = None;
                    *w.crashed_at.entry(site).or_default() += 1;
                    w.crash();
                    true
                }
                Some(n) => {
                    w.faults.crash_after = Some(n - 1);
                    false
                }
                None => false,
            }
        };
        if crash {
            std::panic::panic_any(Crashed);
        }
    }

    /// Whether the effect under way fails (see [`Faults::io_error_per_mille`]).
    fn io_fails(&self) -> bool {
        let mut w = self.world();
        let rate = w.faults.io_error_per_mille;
        rate > 0 && w.draw() % 1000 < rate
    }

    /// Whether the unlink of a pool file under way fails, and with which error (see
    /// [`Faults::unlink_error_per_mille`]); `name` counts it in [`SimHost::injected`].
    fn unlink_fails(&self, name: &'static str) -> Option<io::Error> {
        let mut w = self.world();
        let rate = w.faults.unlink_error_per_mille;
        if rate == 0 || w.draw() % 1000 >= rate {
            return None;
        }
        w.inject(name);
        let errno = if w.draw() % 2 == 0 {
            libc::EIO
        } else {
            libc::EBUSY
        };
        Some(io::Error::from_raw_os_error(errno))
    }

    /// Faults other than crashes injected so far, by name.
    pub(in crate::pool) fn injected(&self) -> BTreeMap<&'static str, u64> {
        self.world().injected.clone()
    }

    /// Sets what runs inside a slow proof (see [`ProofMode::Slow`]).
    pub(in crate::pool) fn during_proof(&self, hook: Option<ProofHook>) {
        *self.during_proof.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    /// A slow proof: the clock moves on and the hook runs (taken out while it runs, so
    /// that a proof inside it is not slowed again).
    fn slow_proof(&self) {
        {
            let mut w = self.world();
            w.elapsed += SLOW_PROOF;
            w.inject("slow proof");
        }
        let hook = self
            .during_proof
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut hook) = hook {
            hook();
            let mut slot = self.during_proof.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(hook);
            }
        }
    }

    /// A new daemon starts on what the host keeps: the dead one's open watch is gone (a
    /// crash still injected may kill the new one during its recovery).
    pub(in crate::pool) fn restart(&self) {
        let mut w = self.world();
        for (_, f) in w.files.values_mut() {
            f.watched = false;
        }
        w.pins.clear();
    }

    /// Crashes injected so far, by the effect they came before.
    pub(in crate::pool) fn crashed_at(&self) -> BTreeMap<&'static str, u64> {
        self.world().crashed_at.clone()
    }

    /// Where the lease paths of `ps` are (set when a pool is built on the host).
    pub(in crate::pool) fn set_lease_dir(&self, ps: PageSize, dir: PathBuf) {
        self.world().lease_dirs.insert(ps, dir);
    }

    /// Changes the faults injected from now on.
    pub(in crate::pool) fn inject(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.world().faults);
    }

    /// Moves the clock on.
    pub(in crate::pool) fn advance(&self, by: Duration) {
        self.world().elapsed += by;
    }

    /// Another user of the machine takes `pages` free pages of a kind or, with a negative
    /// count, gives back (frees) pages it took.
    pub(in crate::pool) fn take_free(&self, node: u32, ps: PageSize, pages: i64) {
        let mut w = self.world();
        let free = w.free.get(&(node, ps)).copied().unwrap_or(0);
        let others = w.machine.others.get(&(node, ps)).copied().unwrap_or(0);
        // The other user takes free pages only, and gives back only its own.
        let pages = pages
            .min(i64::try_from(free).unwrap_or(i64::MAX))
            .max(-i64::try_from(others).unwrap_or(i64::MAX));
        w.free
            .insert((node, ps), free.saturating_add_signed(-pages));
        w.machine
            .others
            .insert((node, ps), others.saturating_add_signed(pages));
        let total = w.total.entry((node, ps)).or_default();
        *total = total.saturating_add_signed(-pages);
    }

    /// Free pages plus the pages of every file, per kind: what the kernel's pools hold.
    pub(in crate::pool) fn total_pages(&self, node: u32, ps: PageSize) -> u64 {
        self.world().total.get(&(node, ps)).copied().unwrap_or(0)
    }

    /// A lessee writes its bytes into the file its lease path names.
    pub(in crate::pool) fn write(&self, lease_path: &Path, principal: &str) {
        let mut w = self.world();
        let Some(&id) = w.lease_paths.get(lease_path) else {
            panic!("{} is not linked", lease_path.display());
        };
        if let Some((_, f)) = w.files.get_mut(&id) {
            f.marks.insert(principal.to_string());
        }
    }

    /// The VMM's manager deletes a lease path (libvirt does at a VM's stop): the pool keeps
    /// its own link, and a restart links the path again.
    pub(in crate::pool) fn delete_lease_path(&self, lease_path: &Path) {
        let mut w = self.world();
        if let Some(id) = w.lease_paths.remove(lease_path) {
            if let Some((_, f)) = w.files.get_mut(&id) {
                f.links.remove(lease_path);
            }
            drop_unnamed(&mut w, id);
        }
    }

    /// Files on the mounts, by id.
    pub(in crate::pool) fn files(&self) -> BTreeMap<u64, (PageSize, SimFile)> {
        self.world().files.clone()
    }

    /// The journal's file records, by id.
    pub(in crate::pool) fn journal(&self) -> BTreeMap<u64, FileRecord> {
        self.world().journal.clone()
    }

    /// Whether the journal says the last shutdown was clean.
    pub(in crate::pool) fn clean(&self) -> bool {
        self.world().clean
    }

    /// Free pages of a kind.
    pub(in crate::pool) fn free_pages(&self, node: u32, ps: PageSize) -> u64 {
        self.world().free.get(&(node, ps)).copied().unwrap_or(0)
    }

    /// Files whose pages are pinned.
    pub(in crate::pool) fn pins(&self) -> BTreeSet<u64> {
        self.world().pins.clone()
    }

    /// Lease paths, with the file each names.
    pub(in crate::pool) fn lease_paths(&self) -> BTreeMap<PathBuf, u64> {
        self.world().lease_paths.clone()
    }

    /// Every time a lease path was linked to a file holding another principal's bytes.
    pub(in crate::pool) fn leaks(&self) -> Vec<String> {
        self.world().leaks.clone()
    }

    /// Checks that every page the host holds is in exactly one file and every file is
    /// named by the pool directory or a lease path: free pages plus the pages of every file
    /// make each kind's total. The error says what is off.
    pub(in crate::pool) fn check_pages(&self) -> Result<(), String> {
        let w = self.world();
        for (kind, total) in &w.total {
            let held: u64 = w
                .files
                .values()
                .filter(|(ps, _)| *ps == kind.1)
                .map(|(_, f)| f.pages)
                .sum();
            let free = w.free.get(kind).copied().unwrap_or(0);
            if held + free != *total {
                return Err(format!(
                    "{kind:?}: {held} pages in files + {free} free != {total} in the pool"
                ));
            }
        }
        for (id, (_, f)) in &w.files {
            if !f.named() {
                return Err(format!("file {id} is named by nothing"));
            }
            if f.pages > 0 && f.size == 0 {
                return Err(format!("file {id} holds pages past its end"));
            }
        }
        Ok(())
    }

    fn fault(
        &self,
        w: &mut World,
        at: FileAt,
        range: &Range<u64>,
        node: u32,
    ) -> Result<(), FaultError> {
        let page = at.page_size.bytes();
        let needed = (range.end - range.start).div_ceil(page);
        let free = w.free.get(&(node, at.page_size)).copied().unwrap_or(0);
        let phantom = w.faults.phantom_pages;
        if needed > free {
            return Err(FaultError(PrefaultError::Insufficient {
                scope: Scope::Node(node),
                page_size: at.page_size,
                needed,
                free: free + phantom,
                path: crate::pool::file_key(at.id).into(),
            }));
        }
        w.free.insert((node, at.page_size), free - needed);
        if let Some((_, f)) = w.files.get_mut(&at.id) {
            f.pages += needed;
        }
        Ok(())
    }

    fn resize_in(w: &mut World, at: FileAt, size: u64, node: u32) {
        let page = at.page_size.bytes();
        if let Some((_, f)) = w.files.get_mut(&at.id) {
            f.size = size;
            let keep = size.div_ceil(page);
            if f.pages > keep {
                let back = f.pages - keep;
                f.pages = keep;
                *w.free.entry((node, at.page_size)).or_default() += back;
            }
        }
    }
}

/// The pool directory no longer names file `id`.
fn unpool(w: &mut World, id: u64) {
    if let Some((_, f)) = w.files.get_mut(&id) {
        f.pooled = false;
    }
    drop_unnamed(w, id);
}

/// A file nothing names any more is freed, its pages back to the kernel.
fn drop_unnamed(w: &mut World, id: u64) {
    let unnamed = w.files.get(&id).is_some_and(|(_, f)| !f.named());
    if unnamed {
        let node = node_of(w, id);
        if let Some((ps, f)) = w.files.remove(&id) {
            *w.free.entry((node, ps)).or_default() += f.pages;
        }
    }
}

/// The node of file `id` (set at its first fault).
fn node_of(w: &World, id: u64) -> u32 {
    w.files.get(&id).map_or(0, |(_, f)| f.node)
}

fn set_node(w: &mut World, id: u64, node: u32) {
    if let Some((_, f)) = w.files.get_mut(&id) {
        f.node = node;
    }
}
