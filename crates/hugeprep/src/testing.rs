//! Test support: taking hugepages from the kernel for the duration of a test and giving
//! exactly those back.
//!
//! Other processes on a host may use hugepages, so a test never sets the pool to an absolute
//! value: it raises `nr_hugepages` by the shortfall and lowers it by the same amount when
//! done ([`PoolTopUp`]). The machine-wide [`HugepageLock`] serialises every hugepage test
//! (across test binaries and developers' runs), so free-page counts a test reads are not
//! disturbed by another test or benchmark.

use std::io;

use crate::hugetlb::lock::HugepageLock;
use crate::hugetlb::pool::PoolTopUp;
use crate::page_size::PageSize;

pub use crate::hugetlb::lock::LOCK_PATH;

/// Hugepages taken from the kernel for one test; returned on drop, then the lock is released.
#[derive(Debug)]
pub struct HugepageReservation {
    page_size: PageSize,
    // Field order matters: the pages go back before the lock is released.
    _top_up: PoolTopUp,
    _lock: HugepageLock,
}

/// Asks the kernel for room for hugepages: `compact` moves movable pages together
/// (`/proc/sys/vm/compact_memory`); `drop caches` also drops clean page cache first
/// (`/proc/sys/vm/drop_caches`, 1). Failures are ignored: the raise after it says what came of it.
fn make_room(step: &str) {
    if step == "drop caches" {
        // Only clean pages go: nothing is lost, files are read again when next used.
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
    }
    // Ignored as the doc says: the raise after it says what came of it.
    let _ = std::fs::write("/proc/sys/vm/compact_memory", "1");
}

/// Takes the machine-wide hugepage test lock (blocking).
pub fn lock() -> io::Result<HugepageLock> {
    HugepageLock::acquire().map_err(|e| io::Error::other(e.to_string()))
}

impl HugepageReservation {
    /// Takes the test lock and makes sure at least `pages` pages of `page_size` are free,
    /// raising the pool by the shortfall. Returns `Ok(None)` when the kernel cannot supply
    /// them (1 GiB pages after fragmentation), having given back whatever it did get.
    pub fn ensure_free(page_size: PageSize, pages: u64) -> io::Result<Option<Self>> {
        let lock = lock()?;
        let other = |e: crate::hugetlb::PoolError| io::Error::other(e.to_string());
        let mut top_up = PoolTopUp::raise(None, page_size, pages).map_err(other)?;
        // A host hours into its life keeps most free memory in the page cache and in blocks
        // smaller than a page: the kernel's raise stops at the first page it cannot make. Make
        // room as an operator would (compact, then drop clean caches) and ask again.
        for step in ["compact", "drop caches"] {
            if top_up.free_pages().map_err(other)? >= pages {
                break;
            }
            drop(top_up); // gives back what it added, so the retry starts where we began
            make_room(step);
            top_up = PoolTopUp::raise(None, page_size, pages).map_err(other)?;
        }
        if top_up.free_pages().map_err(other)? < pages {
            return Ok(None); // dropping `top_up` gives back what was added
        }
        Ok(Some(HugepageReservation {
            page_size,
            _top_up: top_up,
            _lock: lock,
        }))
    }

    /// The page size reserved.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// Unreserved free pages of this size right now.
    pub fn free_pages(&self) -> u64 {
        self._top_up.free_pages().unwrap_or(0)
    }

    /// Waits (up to 10 s, a liveness bound) until `expected` pages are free and returns the
    /// last count. Closing the last descriptor of a file frees its pages only once no other
    /// process holds a copy: a child that another test thread forks holds every open
    /// descriptor until it execs, so a test checking right after a close can race it.
    pub fn wait_free(&self, expected: u64) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let free = self.free_pages();
            if free == expected || std::time::Instant::now() >= deadline {
                return free;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// Takes every free 2 MiB page other users left in the kernel's pools (memfds faulted on
/// each node), so that a daemon starts from none, as on a fresh host: what it needs, it must
/// raise. The pages go back when the files are dropped. Hold the test [`lock`] meanwhile.
pub fn occupy_free_pages() -> io::Result<Vec<crate::hugetlb::BackingFile>> {
    let other = |e: &dyn std::fmt::Display| io::Error::other(e.to_string());
    let ps = PageSize::Size2M;
    let topology = crate::topology::Topology::detect().map_err(|e| other(&e))?;
    let mut held = Vec::new();
    for node in topology.node_ids() {
        let cpus = &topology.node(node).map_err(|e| other(&e))?.cpus;
        let free = crate::hugetlb::pool::available(Some(node), ps).map_err(|e| other(&e))?;
        if free == 0 {
            continue;
        }
        let size = free * ps.bytes();
        let f = crate::hugetlb::BackingFile::memfd("occupy", size, ps).map_err(|e| other(&e))?;
        crate::pool::fault::fault_range(&f, 0..size, node, cpus).map_err(|e| other(&e))?;
        held.push(f);
    }
    Ok(held)
}

/// Why the kernel gave fewer than `wanted` pages of `page_size`, for a test's skip note: for
/// 1 GiB pages, which pages rule out every aligned range ([`crate::hugetlb::contig::Census`]).
pub fn shortfall_note(page_size: PageSize, wanted: u64) -> String {
    let free = crate::hugetlb::pool::available(None, page_size).unwrap_or(0);
    let mut note =
        format!("the kernel could not supply {wanted} free {page_size} pages ({free} free)");
    if page_size != PageSize::Size2M {
        match crate::hugetlb::contig::Census::take(page_size) {
            Ok(census) => note.push_str(&format!(": {}", census.explain())),
            Err(e) => note.push_str(&format!(" (cannot tell why: {e})")),
        }
    }
    note
}

/// Reports that a tool a test talks to (QEMU, hugeadm, systemd-analyze) is missing. Under
/// `scripts/test`, which installs them, `HUGEPREP_REQUIRE_TOOLS` is set and this panics: a
/// suite that silently skips its real-VMM tests proves nothing. Elsewhere it prints why the
/// test is skipped and the caller returns.
pub fn missing_tool(what: &str) {
    if std::env::var_os("HUGEPREP_REQUIRE_TOOLS").is_some() {
        panic!("{what} (HUGEPREP_REQUIRE_TOOLS is set: scripts/test installs it)");
    }
    eprintln!("SKIPPED: {what}");
}
