//! Prefaulting hugetlbfs files: parallel workers, node binding, grow/shrink, rollback,
//! permissions and argument errors, on real hugetlbfs with real pools.

mod hugetlb_support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hugeprep::hugetlb::{BackingFile, Owner};
use hugeprep::prefault::{
    grow, prefault, prefault_mapped, prepare, Populate, PrefaultError, PrefaultOptions,
    PrepareError, PrepareSpec, Target,
};
use hugeprep::sys::numa;
use hugeprep::PageSize;
use hugetlb_support::HugeEnv;

const MIB: u64 = 1 << 20;

fn spec(env: &HugeEnv, size: u64) -> PrepareSpec {
    PrepareSpec {
        size,
        page_size: PageSize::Size2M,
        target: Target::Mount(env.dir().to_path_buf()),
        owner: None,
        prefault: PrefaultOptions {
            node: Some(0),
            ..PrefaultOptions::default()
        },
    }
}

/// The `/proc/self/numa_maps` line of the mapping that starts at `addr`.
fn numa_maps_line(addr: *const u8) -> String {
    let key = format!("{:x} ", addr as usize);
    std::fs::read_to_string("/proc/self/numa_maps")
        .unwrap()
        .lines()
        .find(|l| l.starts_with(&key))
        .unwrap_or_else(|| panic!("no numa_maps line for {key}"))
        .to_string()
}

#[test]
fn two_workers_fault_every_2m_page_on_node_0() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 256) else {
        return;
    };
    let free0 = env.free();
    let file =
        BackingFile::create(&env.dir().join("g"), 512 * MIB, PageSize::Size2M, None).unwrap();
    let opts = PrefaultOptions {
        threads: Some(2),
        node: Some(0),
        extent: 64 * MIB,
        ..PrefaultOptions::default()
    };
    let calls = std::cell::Cell::new(0u64);
    let done = prefault_mapped(
        &file,
        0..file.size(),
        &opts,
        Some(&|_| calls.set(calls.get() + 1)),
    )
    .unwrap();
    let cpus = hugeprep::sys::affinity::allowed_cpus().len();
    assert_eq!(done.report.threads, cpus.min(2));
    assert_eq!(done.report.bytes, 512 * MIB);
    assert_eq!(done.report.method, Populate::PopulateWrite);
    assert!(calls.get() >= 1);
    assert_eq!(env.free(), free0 - 256);
    // Every page present and bound to node 0, as the kernel reports it.
    assert!(done
        .region
        .resident(0, done.region.len())
        .unwrap()
        .iter()
        .all(|&r| r));
    let line = numa_maps_line(done.region.as_ptr());
    assert!(line.contains("bind") && line.contains(":0"), "{line}");
    assert!(line.contains("huge"), "{line}");
    assert!(line.contains("N0=256"), "{line}");
    assert_eq!(numa::node_of(&done.region, 0).unwrap(), 0);
    drop(done);
    file.remove().unwrap();
    assert_eq!(env.free_after_close(free0), free0);
}

#[test]
fn one_gib_pages_are_prefaulted_when_the_kernel_has_them() {
    let Some(env) = HugeEnv::new(PageSize::Size1G, 1) else {
        return;
    };
    let free0 = env.free();
    let file = BackingFile::create(&env.dir().join("g"), 1 << 30, PageSize::Size1G, None).unwrap();
    let report = prefault(&file, 0..1 << 30, &PrefaultOptions::default(), None).unwrap();
    assert_eq!(report.threads, 1);
    assert_eq!(env.free(), free0 - 1);
    file.remove().unwrap();
    assert_eq!(env.free_after_close(free0), free0);
}

#[test]
fn grow_keeps_old_pages_and_zero_fills_the_tail_and_shrink_frees_exactly_the_tail() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 8) else {
        return;
    };
    let free0 = env.free();
    let mut file =
        BackingFile::create(&env.dir().join("g"), 4 * MIB, PageSize::Size2M, None).unwrap();
    {
        let mut m = file.map().unwrap();
        m.as_mut_slice().fill(0x5a);
    }
    assert_eq!(env.free(), free0 - 2);
    let report = grow(&mut file, 10 * MIB, &PrefaultOptions::default(), None).unwrap();
    assert_eq!(report.bytes, 6 * MIB);
    assert_eq!(env.free(), free0 - 5);
    {
        let m = file.map().unwrap();
        assert!(m.as_slice()[..4 * MIB as usize].iter().all(|&b| b == 0x5a));
        assert!(m.as_slice()[4 * MIB as usize..].iter().all(|&b| b == 0));
    }
    file.set_len(6 * MIB).unwrap();
    assert_eq!(
        env.free(),
        free0 - 3,
        "shrinking by 2 pages gives back 2 pages"
    );
    file.remove().unwrap();
    assert_eq!(env.free_after_close(free0), free0);
}

#[test]
fn the_mlock_fallback_faults_every_page() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 4) else {
        return;
    };
    let free0 = env.free();
    let file = BackingFile::memfd("fallback", 8 * MIB, PageSize::Size2M).unwrap();
    let opts = PrefaultOptions {
        populate: Populate::Mlock,
        extent: 2 * MIB,
        ..PrefaultOptions::default()
    };
    let report = prefault(&file, 0..8 * MIB, &opts, None).unwrap();
    assert_eq!(report.method, Populate::Mlock);
    assert_eq!(env.free(), free0 - 4);
    drop(file);
    assert_eq!(env.free_after_close(free0), free0);
}

#[test]
fn fallocate_faults_every_page_on_the_node_without_a_mapping() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 8) else {
        return;
    };
    let free0 = env.free();
    // One worker (the calling thread when it runs on the node), bound to node 0, extents of
    // one page: every page allocated and zeroed by the kernel.
    let file = BackingFile::memfd("fallocate", 8 * MIB, PageSize::Size2M).unwrap();
    let progress = std::sync::Mutex::new(Vec::new());
    let opts = PrefaultOptions {
        populate: Populate::Fallocate,
        extent: 2 * MIB,
        lock: false,
        node: Some(0),
        ..PrefaultOptions::default()
    };
    let report = prefault(
        &file,
        0..8 * MIB,
        &opts,
        Some(&|done| progress.lock().unwrap().push(done)),
    )
    .unwrap();
    assert_eq!(report.method, Populate::Fallocate);
    assert_eq!((report.threads, report.locked), (1, false));
    assert_eq!(progress.lock().unwrap().last(), Some(&(8 * MIB)));
    assert_eq!(env.free(), free0 - 4);
    assert_eq!(file.file().metadata().unwrap().blocks() * 512, 8 * MIB);
    // Zeroed by the kernel, on the node.
    let region = file.map().unwrap();
    assert_eq!(numa::node_of(&region, 0).unwrap(), 0);
    assert!(region.as_slice().iter().all(|&b| b == 0));
    drop(region);

    // With `lock`, the range is mapped afterwards, proven present and locked.
    let locked = BackingFile::memfd("fallocate-locked", 4 * MIB, PageSize::Size2M).unwrap();
    let opts = PrefaultOptions { lock: true, ..opts };
    let done = prefault_mapped(&locked, 0..4 * MIB, &opts, None).unwrap();
    assert_eq!(
        (done.report.method, done.report.locked),
        (Populate::Fallocate, true)
    );
    assert_eq!(env.free(), free0 - 6);
    drop(done);
    drop((file, locked));
    assert_eq!(env.free_after_close(free0), free0);
}

#[test]
fn a_request_larger_than_the_free_pool_fails_before_touching_memory() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 4) else {
        return;
    };
    let free0 = env.free();
    let too_big = (free0 + 1) * 2 * MIB;
    let err = prepare(&spec(&env, too_big), None).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            PrepareError::Prefault(PrefaultError::Insufficient { .. })
        ),
        "{msg}"
    );
    assert!(msg.contains("node 0") && msg.contains("2M"), "{msg}");
    assert!(msg.contains(&format!("only {free0} free")), "{msg}");
    assert!(env.files().is_empty(), "{:?}", env.files());
    assert_eq!(env.free(), free0);

    // Past the check, the kernel's own reservation at mmap refuses it: no page is touched.
    let file =
        BackingFile::create(&env.dir().join("big"), too_big, PageSize::Size2M, None).unwrap();
    let map = file.map();
    assert!(
        map.is_err(),
        "mmap of more pages than free must fail with ENOMEM"
    );
    assert_eq!(env.free(), free0);
    file.remove().unwrap();
}

#[test]
fn a_failure_half_way_removes_the_file_and_gives_back_every_page() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 1024) else {
        return;
    };
    let free0 = env.free();
    let cancel = Arc::new(AtomicBool::new(false));
    let mut spec = spec(&env, 2048 * MIB);
    spec.prefault.extent = 2 * MIB;
    spec.prefault.threads = Some(1);
    spec.prefault.cancel = Some(cancel.clone());
    // Induce the failure once the file holds its first pages, so that it is partly filled.
    let dir = env.dir().to_path_buf();
    let watcher = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            while !cancel.load(Ordering::Relaxed) {
                let filled = std::fs::read_dir(&dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|e| e.metadata().is_ok_and(|m| m.blocks() > 0));
                if filled {
                    cancel.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        })
    };
    let result = prepare(&spec, None);
    cancel.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    match result {
        Err(PrepareError::Prefault(PrefaultError::Cancelled { done, bytes, .. })) => {
            assert!(done < bytes, "{done} of {bytes}");
        }
        other => panic!("expected a cancelled prefault, got {other:?}"),
    }
    assert!(env.files().is_empty(), "{:?}", env.files());
    assert_eq!(env.free_after_close(free0), free0);
}

#[test]
fn created_files_are_0600_and_owned_by_the_owner() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 2) else {
        return;
    };
    let mut spec = spec(&env, 4 * MIB);
    spec.owner = Some("nobody".into());
    let prepared = prepare(&spec, None).unwrap();
    let meta = std::fs::metadata(prepared.file.path()).unwrap();
    let nobody = Owner::lookup("nobody").unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    assert_eq!((meta.uid(), meta.gid()), (nobody.uid, nobody.gid));
    assert_eq!(meta.len(), 4 * MIB);
    prepared.file.remove().unwrap();
}

#[test]
fn bad_arguments_name_the_argument_and_leave_nothing_behind() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 2) else {
        return;
    };
    let free0 = env.free();
    let outside = std::env::temp_dir().join(format!("hugeprep-outside-{}", std::process::id()));
    type Change<'a> = Box<dyn Fn(&mut PrepareSpec) + 'a>;
    let cases: Vec<(&str, Change)> = vec![
        ("size", Box::new(|s| s.size = 0)),
        ("size", Box::new(|s| s.size = 3 * MIB)),
        ("node", Box::new(|s| s.prefault.node = Some(999))),
        ("threads", Box::new(|s| s.prefault.threads = Some(0))),
        (
            "owner",
            Box::new(|s| s.owner = Some("no-such-user-hugeprep".into())),
        ),
        (
            "path",
            Box::new(|s| s.target = Target::Path(outside.join("f"))),
        ),
        (
            "mount",
            Box::new(|s| s.target = Target::Mount(std::env::temp_dir())),
        ),
        // A mount of another page size is refused for the page size asked for.
        (
            "mount",
            Box::new(|s| {
                s.page_size = PageSize::Size1G;
                s.size = 1 << 30;
            }),
        ),
    ];
    for (field, change) in cases {
        let mut s = spec(&env, 4 * MIB);
        change(&mut s);
        let err = prepare(&s, None).unwrap_err();
        assert_eq!(err.field(), Some(field), "{err}");
        assert!(err.to_string().starts_with(field), "{err}");
        assert!(env.files().is_empty(), "{field}: {:?}", env.files());
        assert_eq!(env.free(), free0);
    }
    assert!(!outside.exists());
    // A path that exists is refused, not overwritten.
    std::fs::write(env.dir().join("taken"), b"").ok();
    let mut s = spec(&env, 4 * MIB);
    s.target = Target::Path(env.dir().join("taken"));
    assert_eq!(prepare(&s, None).unwrap_err().field(), Some("path"));
}

/// The pool subtracts from the kernel's free counts what a fault in progress was promised
/// and the counts do not show yet (`prefault::Taken`): at every progress report of a
/// mapped run and of a `fallocate` run, what the run says is reserved is gone from the
/// mount's free blocks (a limited mount: its count is this test's alone) and what it says
/// is allocated is in the file; at the end both are the whole range.
#[test]
fn taken_never_runs_ahead_of_the_kernels_counters() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 128) else {
        return;
    };
    let dir = env.dir().join("limited");
    std::fs::create_dir(&dir).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "hugetlbfs", "-o", "pagesize=2M,size=256M", "none"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(ok.success());
    struct Unmount<'a>(&'a std::path::Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&dir);
    let used = || {
        let st = nix::sys::statfs::statfs(&dir).unwrap();
        (st.blocks() - st.blocks_free()) * 2 * MIB
    };
    for (name, populate, threads) in [
        ("mapped", Populate::Auto, 2),
        ("fallocate", Populate::Fallocate, 1),
    ] {
        let file = BackingFile::create(&dir.join(name), 256 * MIB, PageSize::Size2M, None).unwrap();
        let taken = Arc::new(hugeprep::prefault::Taken::default());
        let opts = PrefaultOptions {
            threads: Some(threads),
            node: Some(0),
            extent: 16 * MIB,
            lock: false,
            populate,
            taken: Some(Arc::clone(&taken)),
            ..PrefaultOptions::default()
        };
        let reports = std::cell::Cell::new(0);
        let check = |_: u64| {
            // Read the run's figures first: they only move after the kernel's counters.
            let reserved = taken.reserved();
            let allocated = taken.allocated();
            assert!(reserved <= used(), "{name}: {reserved} reserved");
            let blocks = std::fs::metadata(file.path()).unwrap().blocks() * 512;
            assert!(allocated <= blocks, "{name}: {allocated} allocated");
            reports.set(reports.get() + 1);
        };
        prefault(&file, 0..file.size(), &opts, Some(&check)).unwrap();
        assert!(reports.get() >= 1, "{name}");
        assert_eq!(taken.reserved(), 256 * MIB, "{name}");
        assert_eq!(taken.allocated(), 256 * MIB, "{name}");
        assert_eq!(used(), 256 * MIB, "{name}");
        drop(file);
        std::fs::remove_file(dir.join(name)).unwrap();
    }
}
