//! The background worker: scrubs released files (or deletes them above target), trims the
//! pool to its target and refills it, at idle priority.

use std::fs;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::counters::ReleaseFailure;
use super::reach::Unproven;
use super::shape::Reshape;
use super::{fault, file_key, holes, Entry, FileRecord, FileState, Pool, State, Work};
use crate::background::Yield;
use crate::hugetlb::BackingFile;
use crate::page_size::PageSize;
use crate::policy::pool::Recycle;
use crate::policy::pool::Shape;
use crate::scrub::{ScrubError, ScrubOptions};
use crate::units::format_bytes;

/// How long a release's proof waits for a lessee that has just exited to be torn down.
const TEARDOWN_WAIT: Duration = Duration::from_secs(2);

/// How long refill waits after the kernel could not supply a file.
const REFILL_BACKOFF: Duration = Duration::from_secs(2);

#[derive(Debug)]
enum Job {
    Scrub(u64),
    Delete(u64),
    Fill(u64),
    /// Cut a warm file to a size in demand (see `shape`).
    Shrink(u64, u64),
    Reserve {
        node: u32,
        page_size: PageSize,
        pages: u64,
    },
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
        use crate::sys::priority::{set_current_thread_idle, set_current_thread_normal};
        if let Err(err) = set_current_thread_idle() {
            tracing::warn!(%err, "cannot run the pool worker at idle priority");
        }
        loop {
            // Choosing the next job takes microseconds and runs at normal priority: at idle
            // priority a busy host delays even the choice of work the next lease needs.
            let _ = set_current_thread_normal();
            let (job, pressing) = {
                let mut st = self.lock();
                loop {
                    if self.shutdown.load(Ordering::SeqCst) {
                        return;
                    }
                    let pressing = self.incomplete(&st);
                    if let Some(job) = self.next_job(&mut st) {
                        break (job, pressing);
                    }
                    // Held by a start under way: look again soon after it ends.
                    let wait = if self.gate.under_way() {
                        Duration::from_millis(20)
                    } else {
                        Duration::from_millis(500)
                    };
                    st = st.wait_timeout(&self.changed, wait);
                }
            };
            tracing::debug!(?job, pressing, "pool worker");
            // Work that faults nothing and restores a wanted file (a scrub of a released file,
            // a cut, a give-back) runs at normal priority while the shape lacks a file; the
            // rest (refills, raising the kernel's pool) at idle priority; their calls into the
            // kernel that hold locks a lease needs leave it for their length (`OutOfIdle`).
            let quick = matches!(job, Job::Scrub(_) | Job::Shrink(..) | Job::Delete(_));
            if !(pressing && quick) {
                let _ = set_current_thread_idle();
            }
            match job {
                Job::Scrub(id) => self.scrub_job(id, pressing),
                Job::Delete(id) => self.delete_job(id),
                Job::Fill(id) => self.fill_job(id),
                Job::Shrink(id, size) => self.shrink_job(id, size),
                Job::Reserve {
                    node,
                    page_size,
                    pages,
                } => self.reserve_job(node, page_size, pages),
            }
            self.changed.notify_all();
        }
    }

    /// The bytes to keep warm: the policy's target, or none while the kind is drained.
    fn target(&self, st: &State, node: u32, ps: PageSize) -> u64 {
        if st.drained.contains(&(node, ps)) {
            return 0;
        }
        self.policy().target_bytes(node, ps)
    }

    /// Picks the next job and marks its file busy (journaling the new state first).
    fn next_job(&self, st: &mut State) -> Option<Job> {
        // A VMM is starting on a lease just given out (or a lease was just given back): its
        // pin and first touches fault through the same hugetlb fault mutexes, CPUs and memory
        // bandwidth a refill or scrub would load. Wait, unless a lease waits on this work.
        // Under a stream of leases the grace never ends, so while the pool lacks a wanted
        // file, released files are still scrubbed (and files cut or given back), and once a
        // lease has missed (served grown, shrunk or cold: the pool is short for this rate of
        // leases) refills run too: that lease faulted its size cold, which loads the same
        // mutexes and bandwidth far more (see `shape`).
        let incomplete = self.incomplete(st);
        if !incomplete {
            st.missed = false;
        }
        let urgent = self.control.is_urgent();
        let graced = st.lessee_grace.is_some_and(|t| Instant::now() < t) && !urgent;
        if graced && !incomplete {
            return None;
        }
        // A VMM is starting (a lease being taken, or just taken and its VMM not settled):
        // background work waits for it whatever the pool lacks, unless a lease waits on the
        // work (see `gate`).
        let held = !urgent && self.gate.under_way();
        // 1. Released and unproven files: scrub them back to warm, or delete them.
        let dirty = st
            .files
            .values()
            .find(|e| e.busy.is_none() && e.rec.state == FileState::Dirty)
            .map(|e| e.rec.clone());
        if let Some(rec) = dirty.filter(|_| incomplete || !held) {
            // Under the demand shape a file of a size in demand is kept (cut to a missing
            // size when its own is not), whatever the pool holds (see `shape`).
            let (keep, size) = match self.policy().shape {
                Shape::Demand => match self.reshape_dirty(st, &rec) {
                    Reshape::Keep(_, size) => (true, size),
                    _ => (false, rec.size),
                },
                Shape::Fixed => (
                    st.pool_bytes(rec.node, rec.page_size) + rec.size
                        <= self.target(st, rec.node, rec.page_size),
                    rec.size,
                ),
            };
            if keep {
                let scrubbing = FileRecord {
                    state: FileState::Scrubbing,
                    size,
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
        // 2. Demand shape: cut or give back warm files of sizes not in demand.
        match self.reshape_any(st) {
            Some(Reshape::Shrink(id, size)) => {
                let e = st.files.get_mut(&id)?;
                e.rec.size = size;
                e.busy = Some(Work::Scrub);
                return Some(Job::Shrink(id, size));
            }
            Some(Reshape::Delete(id)) => return self.mark(st, id, Work::Delete).map(Job::Delete),
            _ => {}
        }
        // 2. Above target (the policy changed, or leases came back): give back warm files.
        for (ps, _) in self.mounts.iter() {
            for node in self.topology.node_ids() {
                if st.pool_bytes(node, *ps) > self.target(st, node, *ps) {
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
        if held || (graced && !st.missed) || st.refill_backoff.is_some_and(|t| Instant::now() < t) {
            return None;
        }
        let policy = self.policy();
        for (ps, mount) in self.mounts.iter() {
            for node in self.topology.node_ids() {
                let Some(target) = policy.target(node, *ps) else {
                    continue;
                };
                if st.drained.contains(&(node, *ps)) {
                    continue;
                }
                let deficit = target.warm.saturating_sub(st.pool_bytes(node, *ps));
                if deficit == 0 {
                    self.explain(st, node, *ps, None);
                    continue;
                }
                let n = target.sizes.len();
                // Files come back from leases at their own sizes, so the deficit can be
                // smaller than every size in the mix: fill it exactly then, or the pool would
                // stay below its target for good (a small warm file still serves a grown lease).
                let page = ps.bytes();
                let demand = self.policy().shape == Shape::Demand;
                let size = if demand {
                    self.next_missing(st, node, *ps, deficit)
                } else {
                    (0..n)
                        .map(|i| target.sizes[(st.refill_turn + i) % n])
                        .find(|&s| s <= deficit)
                        .unwrap_or(deficit / page * page)
                };
                if size == 0 {
                    continue;
                }
                let promised = st.promised(node, *ps);
                let free = self
                    .supply
                    .available_after(node, *ps, &mount.root, &promised);
                if free < size {
                    if let Some(pages) = self.shortfall(st, node, *ps, mount, deficit, size) {
                        return Some(Job::Reserve {
                            node,
                            page_size: *ps,
                            pages,
                        });
                    }
                    st.refill_backoff = Some(Instant::now() + REFILL_BACKOFF);
                    continue;
                }
                if !demand {
                    st.refill_turn = st.refill_turn.wrapping_add(1);
                }
                return self.new_fill(st, node, *ps, size);
            }
        }
        None
    }

    /// Journals a new file of `size` as filling and hands it to the worker.
    fn new_fill(&self, st: &mut State, node: u32, ps: PageSize, size: u64) -> Option<Job> {
        let id = st.new_id();
        let rec = FileRecord {
            id,
            page_size: ps,
            node,
            size,
            state: FileState::Filling,
        };
        if let Err(err) = self.journal.write(&rec.key(), &rec) {
            tracing::error!(%err, "cannot journal a refill");
            st.refill_backoff = Some(Instant::now() + REFILL_BACKOFF);
            return None;
        }
        st.start_faulting(id, node, ps, size);
        st.files.insert(id, Entry::new(rec, Some(Work::Refill)));
        Some(Job::Fill(id))
    }

    /// Cuts a warm file to `size` (its record already says `size` in memory), then journals
    /// it; the journal still says the larger size until then, which recovery handles (an
    /// unclean start scrubs it, a clean one cannot happen while the job runs).
    fn shrink_job(&self, id: u64, size: u64) {
        let Some(rec) = self.record(id) else { return };
        let Ok(mount) = self.mount(rec.page_size) else {
            return;
        };
        let cut = BackingFile::open(&mount.file_path(id), rec.page_size).and_then(|mut f| {
            let _lock_holder = crate::sys::priority::OutOfIdle::enter();
            f.set_len(size)?;
            Ok(())
        });
        let warm = FileRecord {
            size,
            state: FileState::Warm,
            ..rec
        };
        let journaled = cut.map_err(|e| e.to_string()).and_then(|()| {
            self.journal
                .write(&warm.key(), &warm)
                .map_err(|e| e.to_string())
        });
        match journaled {
            Ok(()) => {
                tracing::info!(id, size = %format_bytes(size), "warm file cut to a size in demand");
                let mut st = self.lock();
                if let Some(e) = st.files.get_mut(&id) {
                    e.busy = None;
                }
            }
            Err(err) => {
                tracing::error!(id, %err, "cannot cut a warm file: deleting it");
                self.delete_job(id);
            }
        }
    }

    fn mark(&self, st: &mut State, id: u64, work: Work) -> Option<u64> {
        let e = st.files.get_mut(&id)?;
        e.busy = Some(work);
        Some(id)
    }

    /// [`Reach::prove`](super::reach::Reach::prove), given a moment for the teardown of a
    /// lessee that has just exited: its mappings and files are released, and its io_uring
    /// rings torn down, after its pidfd says it exited (from a kernel worker, or after a
    /// `/proc` reader lets go of its memory). Only those two answers wait; every other one
    /// is final at once.
    fn prove_settled(
        &self,
        id: u64,
        file: &std::fs::File,
    ) -> Result<super::reach::Proof, Unproven> {
        let deadline = Instant::now() + TEARDOWN_WAIT;
        loop {
            match self.reach.prove(id, file) {
                Err(Unproven::OpenElsewhere | Unproven::IoUring { .. })
                    if Instant::now() < deadline && !self.shutdown.load(Ordering::SeqCst) =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    fn record(&self, id: u64) -> Option<FileRecord> {
        self.lock().files.get(&id).map(|e| e.rec.clone())
    }

    /// Scrubs a released file back to warm. `pressing`: the shape lacks a file, which this
    /// one restores, and a lease of its size would otherwise be served grown or cold: the
    /// scrub runs at normal priority without the bandwidth cap (a few ms; at idle priority a
    /// busy host starved it), as for a lease that waits.
    fn scrub_job(&self, id: u64, pressing: bool) {
        let Some(rec) = self.record(id) else { return };
        let Ok(mount) = self.mount(rec.page_size) else {
            return;
        };
        let path = mount.file_path(id);
        self.take_back(&path);
        let released = self.lock().files.get(&id).and_then(|e| e.released.clone());
        let opts = ScrubOptions {
            cpus: self.cpus(rec.node),
            bandwidth: self.policy().scrub_bandwidth,
            background: !pressing,
            verify: self.policy().verify,
            yield_to: (!pressing).then(|| Arc::clone(&self.gate) as Arc<dyn Yield>),
        };
        let mut file = match BackingFile::open(&path, rec.page_size) {
            Ok(f) => f,
            Err(err) => {
                tracing::error!(%err, "cannot open a released file: deleting it");
                self.counters.release_failed(ReleaseFailure::Open);
                return self.delete_job(id);
            }
        };
        // Recycled in place only when nobody else can reach these pages (see `reach`).
        let proof = match &released {
            None => Err(Unproven::NotWatched),
            Some(r) if r.recycle == Recycle::Kernel => Err(Unproven::Trust),
            Some(_) => self.prove_settled(id, file.file()),
        };
        match proof {
            Ok(p) => {
                self.counters.proven(p.took);
                tracing::debug!(
                    id,
                    openers = p.openers,
                    took_us = p.took.as_micros() as u64,
                    "released file proven out of reach"
                );
            }
            Err(reason) => {
                drop(file);
                let name = released.as_ref().map_or("", |r| r.name.as_str());
                let lease = released.as_ref().map_or(0, |r| r.lease);
                tracing::warn!(
                    id, lease, name, reason = reason.label(), detail = %reason,
                    "released memory takes the kernel's path: truncated and deleted, the refill faults new pages"
                );
                self.counters.kernel_path(&reason);
                return self.delete_job(id);
            }
        }
        if file.size() > rec.size {
            // Kept at a smaller size in demand: cut first, scrub only what stays.
            if let Err(err) = file.set_len(rec.size) {
                tracing::error!(%err, "cannot cut a released file to the size in demand: deleting it");
                self.counters.release_failed(ReleaseFailure::Cut);
                return self.delete_job(id);
            }
        }
        if file.size() != rec.size {
            // Resized under a crash: scrub what is there and record it.
            tracing::info!(id, size = file.size(), "file size differs from journal");
        }
        // Pages punched out (discard-data, a balloon) come back from the kernel zeroed:
        // only the pages still present are scrubbed.
        let refill = match holes::refill(&file, rec.node, &opts.cpus) {
            Ok(r) => r,
            Err(err) => {
                tracing::warn!(%err, "cannot refill a released file's holes: deleting it");
                self.counters.release_failed(ReleaseFailure::Holes);
                return self.delete_job(id);
            }
        };
        if refill.filled > 0 {
            tracing::info!(
                id,
                filled = refill.filled,
                present = refill.present.iter().map(|r| r.end - r.start).sum::<u64>(),
                "released file had holes: refilled them, scrubbing only the present pages"
            );
        }
        let result = self
            .scrubber
            .scrub_file_ranges(&file, &refill.present, &opts, &self.control)
            .map(|r| (r, file.size()));
        drop(file);
        match result {
            Ok((report, size)) => {
                self.counters.scrubbed(report.bytes, report.seconds);
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
                            e.released = None;
                        }
                    }
                    Err(err) => {
                        tracing::error!(%err, "cannot journal a scrubbed file");
                        self.counters.release_failed(ReleaseFailure::Journal);
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
                self.counters.release_failed(ReleaseFailure::Scrub);
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
        let released = self.lock().files.get(&id).and_then(|e| e.released.clone());
        // Freeing hugepages takes the hugetlb fault mutexes (see `OutOfIdle`).
        let removed = {
            let _lock_holder = crate::sys::priority::OutOfIdle::enter();
            self.remove_file(&path, &rec, released.as_ref())
        };
        match removed {
            Ok(()) => {}
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
        let found = self
            .record(id)
            .and_then(|r| self.mount(r.page_size).ok().map(|m| (r, m)));
        let Some((rec, mount)) = found else {
            self.lock().end_faulting(id);
            return;
        };
        let path = mount.file_path(id);
        let cpus = self.cpus(rec.node);
        let t = Instant::now();
        let taken = self.lock().taken(id).unwrap_or_default();
        let made = BackingFile::create(&path, rec.size, rec.page_size, None)
            .map_err(|e| e.to_string())
            .and_then(|f| {
                let gate = Arc::clone(&self.gate) as Arc<dyn Yield>;
                fault::fault_range_background(&f, 0..rec.size, rec.node, &cpus, gate, taken)
                    .map_err(|e| e.to_string())
            });
        if made.is_ok() {
            self.counters.refill_faulted(rec.size, t.elapsed());
        }
        let mut st = self.lock();
        st.end_faulting(id);
        self.changed.notify_all();
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
