//! `hugeprep bench recycle` as a library call on a small configuration: both paths and the
//! lease latency are measured, and every hugepage it borrowed is given back. No speed is
//! asserted.

use hugeprep::bench::recycle::{self, RecycleBenchConfig};
use hugeprep::hugetlb::lock::HugepageLock;
use hugeprep::hugetlb::pool::{self, Scope};
use hugeprep::{ClearPlan, Method, PageSize};

/// Regression: the top-up was dropped before the benchmark's mount, while the latency pool's
/// warm files still held their pages, so 160 borrowed pages stayed in the kernel's pool.
#[test]
fn small_run_measures_both_paths_and_gives_every_page_back() {
    let _lock = HugepageLock::acquire().unwrap();
    let nr_before = pool::read(Scope::System, PageSize::Size2M).unwrap().total;
    let config = RecycleBenchConfig {
        size: 8 << 20,
        page_size: PageSize::Size2M,
        threads: 1,
        reps: 1,
        leases: 5,
        lease_size: 4 << 20,
        plan: ClearPlan::always(Method::WriteBytes),
        methods: vec![Method::WriteBytes, Method::RepStosb],
        state_dir: None,
        hog: false,
        client_nice: None,
        host_processes: 60,
        flood: Vec::new(),
    };
    std::env::set_var("HUGEPREP_BENCH_EXE", env!("CARGO_BIN_EXE_hugeprep"));
    let report = recycle::run(&config, &|_| {}).unwrap();
    // Both methods, on the quiet host and beside the 60 processes the bench started (2 of
    // them QEMU-like) and reaped: none of them is left.
    let rows: Vec<(&str, usize)> = report
        .proofs
        .iter()
        .map(|p| (p.method, p.host_processes))
        .collect();
    assert_eq!(
        rows,
        [
            ("kernel-counts", 0),
            ("proc-walk", 0),
            ("kernel-counts", 60),
            ("proc-walk", 60)
        ]
    );
    assert_eq!(report.proofs[2].host_threads, 2 * 64 + 58);
    let children: String = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|t| std::fs::read_to_string(t.unwrap().path().join("children")).unwrap_or_default())
        .collect();
    assert!(children.trim().is_empty(), "left running: {children}");
    assert!(report.scrub.gbps.median > 0.0 && report.kernel_path.gbps.median > 0.0);
    // Goal (b): the scrub against the best raw clear of the same file at the same threads.
    let methods: Vec<Method> = report.clear_methods.iter().map(|m| m.method).collect();
    assert_eq!(methods, [Method::WriteBytes, Method::RepStosb]);
    let best = report.best_clear.as_ref().expect("methods were timed");
    let ratio = report.scrub_to_best.unwrap();
    assert_eq!(ratio, report.scrub.gbps.median / best.gbps.median);
    assert!(ratio > 0.0);
    let (paired, _) = report.scrub_to_best_paired.unwrap();
    assert_eq!(report.scrub_goal_met, Some(paired >= recycle::SCRUB_GOAL));
    let table = report.table();
    assert!(table.contains("(b) scrub / best clear"), "{table}");
    assert!(table.contains("(c) scrub / kernel's path"), "{table}");
    let latency = report.latency.expect("latency part ran");
    assert_eq!(latency.warm_exact, 5, "{latency:?}");
    assert_eq!(
        pool::read(Scope::System, PageSize::Size2M).unwrap().total,
        nr_before,
        "the benchmark left borrowed pages in the pool"
    );
}
