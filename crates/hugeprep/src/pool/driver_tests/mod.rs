//! Unit tests of the pool's driver (lease, release, the worker's scrub, fill, trim and
//! delete jobs, drain) on the simulated host: the real code, no hugetlbfs, no BPF, no root
//! (`scripts/pool-unprivileged` runs them as uid 65534). After every step each test checks
//! that every page the host holds is in exactly one file, every file is the pool's or a
//! lease's, no lease path ever named another lessee's bytes, and the core's invariants hold.

mod faults;
mod kept;
mod lease;
mod release;
mod reserve;
mod sim;
mod sim_faults;
mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::host::sim::SimHost;
use super::*;

const PS: PageSize = PageSize::Size2M;
const MIB: u64 = 1 << 20;

/// A pool on a simulated host, and the directory standing for its mounts.
struct Rig {
    dir: PathBuf,
    host: Arc<SimHost>,
    pool: Arc<Pool>,
    policy: PoolPolicy,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.pool.shutdown();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A pool with `free` free 2M pages on node 0 and the policy lines `toml` (reserve off, no
/// lessee grace: the tests drive time and the kernel's pools themselves).
fn rig(toml: &str, free: u64) -> Rig {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "hugeprep-driver-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let host = SimHost::new(&[((0, PS), free)]);
    let text = format!("reserve = false\nlessee_grace_ms = 0\nverify = \"full\"\n{toml}");
    let policy = PoolPolicy::from_toml(&text).expect("test policy");
    let pool = Pool::with_host(Arc::clone(&host), &dir, &[PS], policy.clone())
        .expect("a pool on the simulated host");
    pool.set_start_gate(false);
    Rig {
        dir,
        host,
        pool,
        policy,
    }
}

/// The policy lines of a warm target of `mib` MiB in files of `sizes` (MiB).
fn target(mib: u64, sizes: &[u64]) -> String {
    let sizes: Vec<String> = sizes.iter().map(|s| format!("\"{s}M\"")).collect();
    format!(
        "shape = \"fixed\"\n[[target]]\npage_size = \"2M\"\nwarm = \"{mib}M\"\nsizes = [{}]\n",
        sizes.join(", ")
    )
}

fn request(name: &str, mib: u64) -> LeaseRequest {
    LeaseRequest {
        name: name.into(),
        size: mib * MIB,
        page_size: Some(PS),
        node: Some(0),
        owner: None,
        pid: None,
        pin: false,
        recycle: None,
    }
}

impl Rig {
    /// A new daemon on what the host keeps (after a crash, or a clean shutdown), recovering
    /// with the daemon's own recovery; a crash inside recovery starts it again.
    fn restart(&mut self) {
        let clean = self.host.clean();
        loop {
            self.host.restart();
            let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                Pool::with_host(
                    Arc::clone(&self.host),
                    &self.dir,
                    &[PS],
                    self.policy.clone(),
                )
            }));
            match built {
                Ok(pool) => {
                    self.pool = pool.expect("recovery on the simulated host");
                    self.pool.set_start_gate(false);
                    if !clean {
                        // After a crash no warm record is trusted: each is proven again.
                        let st = self.pool.lock();
                        let warm = st.core.files().find(|e| e.rec().state == FileState::Warm);
                        assert!(warm.is_none(), "trusted warm after a crash: {warm:?}");
                    }
                    return;
                }
                Err(panic) if panic.is::<host::sim::Crashed>() => continue,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    }

    fn lease(&self, name: &str, mib: u64) -> Result<LeaseInfo> {
        let r = self.pool.lease(&request(name, mib));
        self.check();
        r
    }

    fn release(&self, info: &LeaseInfo) -> Result<LeaseInfo> {
        let r = self.pool.release(info.id);
        self.check();
        r
    }

    /// Runs the worker's jobs until it has none, checking after each; panics on a livelock.
    fn settle(&self) -> usize {
        for jobs in 0..1000 {
            if !self.pool.work_once() {
                return jobs;
            }
            self.check();
        }
        panic!("the worker never settles");
    }

    /// What must hold after every step.
    fn check(&self) {
        if let Err(e) = self.host.check_pages() {
            panic!("pages: {e}");
        }
        if let Err(e) = self.host.check_ledger() {
            panic!("reservations: {e}");
        }
        for id in self.host.pins() {
            let st = self.pool.lock();
            let leased = st
                .core
                .get(id)
                .is_some_and(|e| matches!(e.rec().state, FileState::Leased(_)));
            assert!(leased, "file {id} is pinned but not leased");
        }
        let leaks = self.host.leaks();
        assert!(
            leaks.is_empty(),
            "a lessee's bytes reached another: {leaks:?}"
        );
        let st = self.pool.lock();
        if let Err(v) = st.core.check() {
            panic!("core invariant: {v:?}");
        }
        let files = self.host.files();
        for (path, id) in self.host.lease_paths() {
            let ours = st
                .core
                .get(id)
                .is_some_and(|e| matches!(&e.rec().state, FileState::Leased(l) if l.path == path));
            assert!(ours, "lease path {} of no lease", path.display());
        }
        check_files(&st, &files, &self.pool.kept_names());
        let journal = self.host.journal();
        for e in st.core.files().filter(|e| e.busy().is_none()) {
            check_idle(e.rec(), &files, &journal);
        }
    }

    fn states(&self) -> Vec<String> {
        let st = self.pool.lock();
        st.core
            .files()
            .map(|e| match &e.rec().state {
                FileState::Leased(_) => "leased".to_string(),
                s => format!("{s:?}").to_lowercase(),
            })
            .collect()
    }

    fn warm_bytes(&self) -> u64 {
        let st = self.pool.lock();
        st.core
            .files()
            .filter(|e| e.is_idle(&FileState::Warm))
            .map(|e| e.rec().size)
            .sum()
    }

    fn free(&self) -> u64 {
        self.host.free_pages(0, PS)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.pool.mounts()[&PS].lease_dir.join(name)
    }
}

/// Every file on the host is exactly one pool file's, lease's or kept file's (`kept_names`:
/// the keeper's), and every file the keeper keeps is on the host.
fn check_files(
    st: &State,
    files: &BTreeMap<u64, (PageSize, host::sim::SimFile)>,
    kept_names: &[host::KeptAt],
) {
    for (id, (ps, f)) in files {
        let known = st.core.get(*id).is_some();
        let linked = !f.pooled && !f.links.is_empty();
        // A file kept past its release is the keeper's alone, under its kept name.
        let kept = f.kept.as_ref().map(|name| {
            let at = host::KeptAt {
                page_size: *ps,
                name: name.clone(),
            };
            kept_names.iter().filter(|k| **k == at).count()
        });
        match kept {
            Some(n) => assert!(
                n == 1 && !known && !f.pooled && f.links.is_empty(),
                "kept file {id} is the keeper's {n} times, the pool's: {known}"
            ),
            None => assert!(
                known || linked,
                "file {id} on the host is no pool file's or lease's"
            ),
        }
    }
    for k in kept_names {
        let on_host = files
            .values()
            .any(|(ps, f)| *ps == k.page_size && f.kept.as_ref() == Some(&k.name));
        assert!(
            on_host,
            "the keeper keeps {} the host does not have",
            k.name
        );
    }
}

/// A warm file holds nobody's bytes and is the daemon's: one its last lessee still owns is
/// never recycled.
fn check_warm(rec: &FileRecord, files: &BTreeMap<u64, (PageSize, host::sim::SimFile)>) {
    let marks = files.get(&rec.id).map(|(_, f)| f.marks.clone());
    assert!(
        marks.as_ref().is_none_or(|m| m.is_empty()),
        "warm file {} holds bytes of {marks:?}",
        rec.id
    );
    let owner = files.get(&rec.id).and_then(|(_, f)| f.owner);
    assert_eq!(
        owner, None,
        "warm file {} is still owned by uid {owner:?}",
        rec.id
    );
}

/// What must hold of an idle file's record `rec`, against the host's `files` and `journal`.
fn check_idle(
    rec: &FileRecord,
    files: &BTreeMap<u64, (PageSize, host::sim::SimFile)>,
    journal: &BTreeMap<u64, FileRecord>,
) {
    if rec.state == FileState::Warm {
        check_warm(rec, files);
    }
    let on_host = files.get(&rec.id).map(|(_, f)| f.size);
    // A dirty file the kernel's path truncated and then could not unlink stays
    // at its recorded size in the core (a record has whole pages) and is deleted at
    // the worker's next round.
    let truncated = rec.state == FileState::Dirty && on_host == Some(0);
    if rec.size > 0 && !truncated {
        assert_eq!(on_host, Some(rec.size), "file {} on the host", rec.id);
    }
    // The journal may still say warm where the core says dirty (an aborted lease
    // whose dirty record could not be written, at the size before it grew): safe, as
    // warm records are proven again after an unclean start (sizes read from the
    // files) and a clean one journals dirty files first.
    let journaled = journal.get(&rec.id).cloned();
    // Or scrubbing (a scrub given up whose file could not be deleted): both are
    // unproven to recovery, which never trusts either. Or dirty at the size before a
    // scrub meant to cut it, given up, whose dirty record a full journal refused:
    // recovery reads every size from the file. Or filling (a failed cold lease's or
    // refill's file that could not be removed, whose dirty record a full journal refused):
    // recovery deletes a filling file, never hands it out.
    let behind = rec.state == FileState::Dirty
        && journaled.as_ref().is_some_and(|j| {
            matches!(
                j.state,
                FileState::Warm | FileState::Scrubbing | FileState::Dirty | FileState::Filling
            )
        });
    // Or at another size than the file's, which the core follows (a cut done whose record
    // a full journal refused, and whose file then could not be deleted): recovery reads
    // every size from the file.
    let resized = journaled
        .as_ref()
        .is_some_and(|j| j.state == rec.state && j.size != rec.size)
        && on_host == Some(rec.size);
    if !behind && !resized {
        assert_eq!(
            journaled.as_ref(),
            Some(rec),
            "journal of idle file {}",
            rec.id
        );
    }
}
