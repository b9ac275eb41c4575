//! Hugepage pools through sysfs: readings checked against `hugeadm --pool-list` (a tool we
//! did not write), resizing by the shortfall, the in-use floor and giving pages back.

mod hugetlb_support;

use std::process::Command;

use hugeprep::hugetlb::pool::{self, PoolTopUp, Scope};
use hugeprep::hugetlb::BackingFile;
use hugeprep::PageSize;
use hugetlb_support::HugeEnv;

/// `hugeadm --pool-list` rows: (page bytes, minimum, current, maximum).
fn hugeadm_pools() -> Option<Vec<(u64, u64, u64, u64)>> {
    let out = Command::new("hugeadm").arg("--pool-list").output().ok()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        text.lines()
            .skip(1)
            .filter_map(|l| {
                let v: Vec<u64> = l
                    .split_whitespace()
                    .take(4)
                    .filter_map(|f| f.parse().ok())
                    .collect();
                (v.len() == 4).then(|| (v[0], v[1], v[2], v[3]))
            })
            .collect(),
    )
}

#[test]
fn readings_agree_with_hugeadm() {
    // Hold pages in the pool (and the test lock) so the figures are not all zero.
    let Some(env) = HugeEnv::new(PageSize::Size2M, 3) else {
        return;
    };
    let file = BackingFile::create(&env.dir().join("f"), 2 << 20, PageSize::Size2M, None).unwrap();
    let _map = file.map().unwrap(); // one page reserved, not yet faulted
    let Some(rows) = hugeadm_pools() else {
        hugeprep::testing::missing_tool("hugeadm not installed (apt install libhugetlbfs-bin)");
        return;
    };
    for size in pool::page_sizes() {
        let ours = pool::read(Scope::System, size).unwrap();
        let theirs = rows
            .iter()
            .find(|r| r.0 == size.bytes())
            .unwrap_or_else(|| panic!("hugeadm lists no {size} pool: {rows:?}"));
        // hugeadm: minimum = total - surplus, current = total, maximum = minimum + overcommit.
        assert_eq!(theirs.2, ours.total, "{size}: current");
        assert_eq!(theirs.1, ours.total - ours.surplus, "{size}: minimum");
        assert_eq!(
            theirs.3,
            ours.total - ours.surplus + ours.overcommit.unwrap(),
            "{size}: maximum"
        );
    }
    let two = pool::read(Scope::System, PageSize::Size2M).unwrap();
    assert!(two.reserved.unwrap() >= 1, "{two:?}");
    assert!(two.in_use() >= 1);
}

#[test]
fn nodes_add_up_to_the_system_pool() {
    let Some(_env) = HugeEnv::new(PageSize::Size2M, 2) else {
        return;
    };
    let all = pool::read_all().unwrap();
    for size in pool::page_sizes() {
        let system = all
            .iter()
            .find(|p| p.scope == Scope::System && p.page_size == size)
            .unwrap();
        let nodes: Vec<_> = all
            .iter()
            .filter(|p| p.scope != Scope::System && p.page_size == size)
            .collect();
        assert!(!nodes.is_empty());
        assert!(nodes.iter().all(|n| n.reserved.is_none()));
        assert_eq!(nodes.iter().map(|n| n.total).sum::<u64>(), system.total);
        assert_eq!(nodes.iter().map(|n| n.free).sum::<u64>(), system.free);
    }
}

#[test]
fn the_pool_is_never_lowered_below_what_is_in_use() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 4) else {
        return;
    };
    let file = BackingFile::create(&env.dir().join("f"), 4 << 20, PageSize::Size2M, None).unwrap();
    let mut map = file.map().unwrap();
    map.as_mut_slice()[0] = 1; // one page faulted, one reserved
    let resize = pool::set_pages(Scope::Node(0), PageSize::Size2M, 0).unwrap();
    assert_eq!(resize.requested, 0);
    assert!(resize.floor >= 2, "{resize:?}");
    assert!(resize.after >= resize.floor, "{resize:?}");
    assert_eq!(map.as_slice()[0], 1);
    // Give back what the test lowered, as a delta: other processes may have changed the pool
    // meanwhile, and writing back the total read before would undo what they did.
    let lowered = resize.before - resize.after;
    let now = pool::read(Scope::Node(0), PageSize::Size2M).unwrap().total;
    let back = pool::set_pages(Scope::Node(0), PageSize::Size2M, now + lowered).unwrap();
    assert!(back.complete(), "{back:?}");
    drop(map);
    file.remove().unwrap();
}

#[test]
fn a_top_up_adds_the_shortfall_and_gives_exactly_it_back() {
    let _lock = hugeprep::testing::lock().unwrap();
    let before = pool::read(Scope::System, PageSize::Size2M).unwrap();
    // 3 short of what is free now. Other processes on the host may take or free pages between
    // the reading and the raise, so the shortfall is about 3, and what goes back is exactly
    // what was added.
    let want = before.available() + 3;
    let top_up = PoolTopUp::raise(Some(0), PageSize::Size2M, want).unwrap();
    let added = top_up.added();
    assert!(added > 0, "a shortfall of about 3 pages added {added}");
    let resize = top_up.release().unwrap().unwrap();
    assert_eq!(resize.before - resize.after, added, "{resize:?}");
}

#[test]
fn a_one_gib_raise_reports_what_the_kernel_gave() {
    let _lock = hugeprep::testing::lock().unwrap();
    let before = pool::read(Scope::System, PageSize::Size1G).unwrap();
    let resize = pool::set_pages(Scope::System, PageSize::Size1G, before.total + 2).unwrap();
    assert!(resize.after <= before.total + 2);
    assert_eq!(resize.shortfall(), before.total + 2 - resize.after);
    if resize.after < before.total + 2 {
        // Says which pages rule out each aligned GiB (hugeprep::hugetlb::contig).
        eprintln!("{}", hugeprep::testing::shortfall_note(PageSize::Size1G, 2));
    }
    // Lower by exactly what the kernel gave, a delta on the pool as it is now.
    let added = resize.after - resize.before;
    let now = pool::read(Scope::System, PageSize::Size1G).unwrap().total;
    let back = pool::set_pages(Scope::System, PageSize::Size1G, now - added).unwrap();
    assert_eq!(back.before - back.after, added, "{back:?}");
}

/// A pull-in raises the 2M pool and lowers it by exactly what that raise added, with 2M pages
/// someone holds (this test's) untouched.
#[test]
fn a_pull_in_leaves_the_two_meg_pool_as_it_found_it() {
    let env = HugeEnv::new(PageSize::Size2M, 4).unwrap();
    let held =
        BackingFile::create(&env.dir().join("held"), 4 << 21, PageSize::Size2M, None).unwrap();
    held.allocate(0, 4 << 21).unwrap();
    let pulled = pool::pull_in(Scope::System, 64 << 20).unwrap();
    assert_eq!(pulled.asked, 32);
    assert!(pulled.added <= 32, "{pulled:?}");
    // Exactly what it added went back (the machine's totals prove nothing on a shared host:
    // other processes change the pool meanwhile; scripts/test's ledger sums the deltas).
    assert_eq!(pulled.returned, pulled.added, "{pulled:?}");
    let after = pool::read(Scope::System, PageSize::Size2M).unwrap();
    assert!(
        after.free + 4 <= after.total,
        "the held pages stay held: {after:?}"
    );
    held.remove().unwrap();
}

/// A 1G raise the kernel falls short of pulls memory in once per node and asks again; what it
/// got is recorded and given back like any raise. (With every free 1G page held the kernel
/// refuses unless it finds a new free GiB, which a lazily initialising kernel may after the
/// pull-in; both outcomes are checked.)
#[test]
fn a_short_one_gig_raise_pulls_memory_in_once_per_node() {
    use hugeprep::pool::reserve::Reservations;
    let _lock = hugeprep::testing::lock().unwrap();
    let held: Vec<BackingFile> = (0..pool::available(None, PageSize::Size1G).unwrap())
        .map(|i| {
            let f = BackingFile::memfd(&format!("held-{i}"), 1 << 30, PageSize::Size1G).unwrap();
            f.allocate(0, 1 << 30).unwrap();
            f
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("hugeprep-pull-in-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ledger = Reservations::open(&dir).unwrap();
    let first = ledger.raise(0, PageSize::Size1G, 1, 64 << 20).unwrap();
    assert_eq!(first.asked, 1);
    if first.added == 0 {
        let pulled = first.pulled_in.expect("a short 1G raise pulls memory in");
        assert_eq!(pulled.asked, 32);
        // The 2M pool gets back exactly what the pull-in added (a delta: other processes on
        // the host change its total meanwhile).
        assert_eq!(pulled.returned, pulled.added);
        // Once per node: memory once pulled in stays so.
        let second = ledger.raise(0, PageSize::Size1G, 1, 64 << 20).unwrap();
        assert!(second.pulled_in.is_none(), "{second:?}");
    } else {
        eprintln!("the kernel gave a 1G page: {first:?}");
    }
    // A 2M raise never pulls in.
    let two = ledger.raise(0, PageSize::Size2M, 0, 64 << 20).unwrap();
    assert!(two.pulled_in.is_none());
    let given = ledger.release(0, PageSize::Size1G).unwrap();
    assert_eq!(given.kept, 0, "{given:?}");
    assert_eq!(ledger.added(0, PageSize::Size1G), 0);
    drop(held);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The census behind every 1G shortfall note reads the kernel's page flags right: a 2M pool
/// this test holds shows up as hugetlb pages, the kernel's own slab as slab pages, and all of
/// memory is counted.
#[test]
fn the_one_gib_census_sees_a_two_meg_pool_and_the_kernels_slab() {
    use hugeprep::hugetlb::contig::Census;
    let env = HugeEnv::new(PageSize::Size2M, 64).unwrap();
    let census = Census::take(PageSize::Size1G).unwrap();
    let hugetlb: u64 = census.ranges.iter().map(|r| r.hugetlb).sum();
    // 64 free 2M pages held (other pools may add more): 512 small pages each.
    assert!(env.free() >= 64);
    assert!(hugetlb >= 64 * 512, "{hugetlb} hugetlb pages counted");
    assert!(census.ranges.iter().any(|r| r.slab > 0), "{census:?}");
    let mem_total_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap();
    let counted = census.ranges.len() as u64 * (1 << 30);
    assert!(counted >= mem_total_kib * 1024, "{counted} bytes of ranges");
    assert!(census.explain().contains("hugepagesz=1G hugepages=N"));
}
