//! The background worker: scrubs released files (or deletes them above target), trims the
//! pool to its target and refills it, at idle priority.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{fault, file_key, holders, kernel, Entry, FileRecord, FileState, Pool, State, Work};
use crate::hugetlb::BackingFile;
use crate::page_size::PageSize;
use crate::scrub::{ScrubError, ScrubOptions};

/// How long refill waits after the kernel could not supply a file.
const REFILL_BACKOFF: Duration = Duration::from_secs(2);

#[derive(Debug)]
enum Job {
    Scrub(u64),
    Delete(u64),
    Fill(u64),
}

impl Pool {
    /// Starts the background worker thread; it runs until [`Pool::shutdown`].
    pub fn spawn_worker(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let pool = Arc::clone(self);
        std::thread::Builder::new()
            .name("hugeprep-pool".into())
            .spawn(move || pool.run_worker())
    }

    fn run_worker(&self) {
        if let Err(err) = crate::sys::priority::set_current_thread_idle() {
            tracing::warn!(%err, "cannot run the pool worker at idle priority");
        }
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    if self.shutdown.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Some(job) = self.next_job(&mut st) {
                        break job;
                    }
                    st = self
                        .changed
                        .wait_timeout(st, Duration::from_millis(500))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            };
            tracing::debug!(?job, "pool worker");
            match job {
                Job::Scrub(id) => self.scrub_job(id),
                Job::Delete(id) => self.delete_job(id),
                Job::Fill(id) => self.fill_job(id),
            }
            self.changed.notify_all();
        }
    }

    fn target(&self, node: u32, ps: PageSize) -> u64 {
        self.policy.target_bytes(node, ps)
    }

    /// Picks the next job and marks its file busy (journaling the new state first).
    fn next_job(&self, st: &mut State) -> Option<Job> {
        // A VMM is starting on a lease just given out (or a lease was just given back): its
        // pin and first touches fault through the same hugetlb fault mutexes, CPUs and memory
        // bandwidth a refill or scrub would load. Wait, unless a lease waits on this work.
        if st.lessee_grace.is_some_and(|t| Instant::now() < t) && !self.control.is_urgent() {
            return None;
        }
        // 1. Released and unproven files: scrub them back to warm, or delete them.
        let dirty = st
            .files
            .values()
            .find(|e| e.busy.is_none() && e.rec.state == FileState::Dirty)
            .map(|e| e.rec.clone());
        if let Some(rec) = dirty {
            let keep = st.pool_bytes(rec.node, rec.page_size) + rec.size
                <= self.target(rec.node, rec.page_size);
            if keep {
                let scrubbing = FileRecord {
                    state: FileState::Scrubbing,
                    ..rec.clone()
                };
                if let Err(err) = self.journal.write(&scrubbing.key(), &scrubbing) {
                    tracing::error!(%err, "cannot journal a scrub: deleting the file instead");
                    return self.mark(st, rec.id, Work::Delete).map(Job::Delete);
                }
                if let Some(e) = st.files.get_mut(&rec.id) {
                    e.rec = scrubbing;
                }
                return self.mark(st, rec.id, Work::Scrub).map(Job::Scrub);
            }
            return self.mark(st, rec.id, Work::Delete).map(Job::Delete);
        }
        // 2. Above target (the policy changed, or leases came back): give back warm files.
        for (ps, _) in self.mounts.iter() {
            for node in self.topology.node_ids() {
                if st.pool_bytes(node, *ps) > self.target(node, *ps) {
                    let victim = st
                        .of_kind(node, *ps)
                        .filter(|e| e.busy.is_none() && e.rec.state == FileState::Warm)
                        .max_by_key(|e| e.rec.size)
                        .map(|e| e.rec.id);
                    if let Some(id) = victim {
                        return self.mark(st, id, Work::Delete).map(Job::Delete);
                    }
                }
            }
        }
        // 3. Below target: make a new warm file of the next size in the mix that fits.
        if st.refill_backoff.is_some_and(|t| Instant::now() < t) {
            return None;
        }
        for (ps, mount) in self.mounts.iter() {
            for node in self.topology.node_ids() {
                let Some(target) = self.policy.target(node, *ps) else {
                    continue;
                };
                let deficit = target.warm.saturating_sub(st.pool_bytes(node, *ps));
                let n = target.sizes.len();
                // Files come back from leases at their own sizes, so the deficit can be
                // smaller than every size in the mix: fill it exactly then, or the pool would
                // stay below its target for good (a small warm file still serves a grown lease).
                let page = ps.bytes();
                let size = (0..n)
                    .map(|i| target.sizes[(st.refill_turn + i) % n])
                    .find(|&s| s <= deficit)
                    .or(Some(deficit / page * page))
                    .filter(|&s| s > 0);
                let Some(size) = size else { continue };
                if kernel::available_bytes(node, *ps, &mount.root) < size {
                    st.refill_backoff = Some(Instant::now() + REFILL_BACKOFF);
                    continue;
                }
                st.refill_turn = st.refill_turn.wrapping_add(1);
                let id = st.new_id();
                let rec = FileRecord {
                    id,
                    page_size: *ps,
                    node,
                    size,
                    state: FileState::Filling,
                };
                if let Err(err) = self.journal.write(&rec.key(), &rec) {
                    tracing::error!(%err, "cannot journal a refill");
                    st.refill_backoff = Some(Instant::now() + REFILL_BACKOFF);
                    return None;
                }
                st.files.insert(
                    id,
                    Entry {
                        rec,
                        busy: Some(Work::Refill),
                    },
                );
                return Some(Job::Fill(id));
            }
        }
        None
    }

    fn mark(&self, st: &mut State, id: u64, work: Work) -> Option<u64> {
        let e = st.files.get_mut(&id)?;
        e.busy = Some(work);
        Some(id)
    }

    fn record(&self, id: u64) -> Option<FileRecord> {
        self.lock().files.get(&id).map(|e| e.rec.clone())
    }

    fn scrub_job(&self, id: u64) {
        let Some(rec) = self.record(id) else { return };
        let Ok(mount) = self.mount(rec.page_size) else {
            return;
        };
        let path = mount.file_path(id);
        self.take_back(&path);
        if let Ok(m) = fs::metadata(&path) {
            let holders = holders::other_holders(m.dev(), m.ino());
            if !holders.is_empty() {
                tracing::warn!(
                    file = %path.display(), ?holders,
                    "released file still open or mapped elsewhere: deleting instead of recycling"
                );
                return self.delete_job(id);
            }
        }
        let opts = ScrubOptions {
            cpus: self.cpus(rec.node),
            bandwidth: self.policy.scrub_bandwidth,
            background: true,
            verify: self.policy.verify,
        };
        let result = BackingFile::open(&path, rec.page_size)
            .map_err(ScrubError::from)
            .and_then(|f| {
                if f.size() != rec.size {
                    // Resized under a crash: scrub what is there and record it.
                    tracing::info!(id, size = f.size(), "file size differs from journal");
                }
                self.scrubber
                    .scrub_file(&f, &opts, &self.control)
                    .map(|r| (r, f.size()))
            });
        match result {
            Ok((report, size)) => {
                let mut st = self.lock();
                let warm = FileRecord {
                    size,
                    state: FileState::Warm,
                    ..rec
                };
                match self.journal.write(&warm.key(), &warm) {
                    Ok(()) => {
                        tracing::info!(
                            id,
                            bytes = report.bytes,
                            gbps = report.gbps(),
                            "scrubbed and verified"
                        );
                        st.last_scrub = Some(report);
                        if let Some(e) = st.files.get_mut(&id) {
                            e.rec = warm;
                            e.busy = None;
                        }
                    }
                    Err(err) => {
                        tracing::error!(%err, "cannot journal a scrubbed file");
                        drop(st);
                        self.delete_job(id);
                    }
                }
            }
            Err(ScrubError::Cancelled { .. }) => {
                // Journaled as scrubbing: the next start scrubs it again.
                let mut st = self.lock();
                if let Some(e) = st.files.get_mut(&id) {
                    e.busy = None;
                    e.rec.state = FileState::Dirty;
                }
            }
            Err(err) => {
                tracing::error!(%err, "scrub failed: deleting the file");
                self.delete_job(id);
            }
        }
    }

    fn delete_job(&self, id: u64) {
        let Some(rec) = self.record(id) else { return };
        let Ok(mount) = self.mount(rec.page_size) else {
            return;
        };
        let path = mount.file_path(id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                tracing::error!(file = %path.display(), %err, "cannot delete pool file");
                let mut st = self.lock();
                if let Some(e) = st.files.get_mut(&id) {
                    e.busy = None;
                }
                return;
            }
        }
        let mut st = self.lock();
        match self.journal.remove(&file_key(id)) {
            Ok(()) => {
                st.files.remove(&id);
            }
            Err(err) => {
                // The record outlives the file; the next start drops it.
                tracing::error!(%err, "cannot remove journal record");
                st.files.remove(&id);
            }
        }
    }

    fn fill_job(&self, id: u64) {
        let Some(rec) = self.record(id) else { return };
        let Ok(mount) = self.mount(rec.page_size) else {
            return;
        };
        let path = mount.file_path(id);
        let threads = self.cpus(rec.node).len();
        let made = BackingFile::create(&path, rec.size, rec.page_size, None)
            .map_err(|e| e.to_string())
            .and_then(|f| {
                fault::fault_range(&f, 0..rec.size, rec.node, threads).map_err(|e| e.to_string())
            });
        let mut st = self.lock();
        match made {
            Ok(()) => {
                let warm = FileRecord {
                    state: FileState::Warm,
                    ..rec
                };
                if let Err(err) = self.journal.write(&warm.key(), &warm) {
                    tracing::error!(%err, "cannot journal a refilled file");
                } else if let Some(e) = st.files.get_mut(&id) {
                    e.rec = warm;
                    e.busy = None;
                    return;
                }
            }
            Err(err) => {
                tracing::warn!(%err, size = rec.size, "refill failed; retrying later");
                st.refill_backoff = Some(Instant::now() + REFILL_BACKOFF);
            }
        }
        let _ = fs::remove_file(&path);
        let _ = self.journal.remove(&file_key(id));
        st.files.remove(&id);
    }
}
