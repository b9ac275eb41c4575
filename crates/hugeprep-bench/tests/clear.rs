//! `hugeprep bench clear` as a library call on a small configuration: every combination is
//! reported, skipped ones say why, and the hugepages it borrowed are given back. No speed is
//! asserted (timing belongs to the benchmark's own output). The benchmark crate's own tests:
//! they drive what the command cannot (a rule handed in, progress callbacks, cancelling after
//! one step).

use std::ops::ControlFlow;

use hugeprep::clear::{available_methods, ClearPurpose};
use hugeprep::hugetlb::lock::HugepageLock;
use hugeprep::hugetlb::pool::{self, Scope};
use hugeprep::sys::affinity::allowed_cpus;
use hugeprep::{ClearPlan, Method, PageSize};
use hugeprep_bench::clear::{self, ClearBenchConfig, PolicyChoice};

#[test]
fn small_run_reports_every_combination_and_gives_pages_back() {
    // The benchmark takes the machine-wide hugepage test lock itself (this is that lock), so
    // the pool counters cannot move under us between the two reads.
    let lock = HugepageLock::acquire().unwrap();
    let nr_before = pool::read(Scope::System, PageSize::Size2M).unwrap().total;
    let threads: Vec<usize> = (1..=allowed_cpus().len()).collect();
    let config = ClearBenchConfig {
        methods: vec![Method::RepStosb, Method::WriteBytes],
        chunk_sizes: vec![4 << 10, 2 << 20, 16 << 20],
        threads: threads.clone(),
        buffer_bytes: 8 << 20,
        reps: 5,
        kernel_page_sizes: vec![PageSize::Size2M],
        policy: Some(PolicyChoice::rule_only(
            ClearPlan {
                nt_min_extent: 4 << 20,
                ..ClearPlan::always(Method::Movnti)
            },
            "test rule",
        )),
    };
    let mut steps = Vec::new();
    let report = clear::run(&config, &lock, &mut |p| {
        steps.push(p.clone());
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(
        pool::read(Scope::System, PageSize::Size2M).unwrap().total,
        nr_before,
        "the benchmark must give back exactly the pages it added"
    );

    assert!(report.hugepage_backed, "{:?}", report.notes);
    assert_eq!(report.results.len(), 2 * 2 * threads.len());
    for r in &report.results {
        assert!(r.gbps.min > 0.0 && r.gbps.min <= r.gbps.median && r.gbps.median <= r.gbps.max);
    }
    assert_eq!(report.kernel.len(), threads.len());
    assert!(report
        .kernel
        .iter()
        .all(|k| k.page_size == PageSize::Size2M));
    assert!(
        report.notes.iter().any(|n| n.contains("16 MiB skipped")),
        "{:?}",
        report.notes
    );
    let last = steps.last().unwrap();
    assert_eq!(last.done, last.total);

    // The plan in use, timed for both purposes: a scrub streams at every chunk size, a
    // use-soon clear takes cached rep stosb below nt_min_extent (4 MiB here).
    assert_eq!(report.purposes.len(), 2 * 2 * threads.len());
    for p in &report.purposes {
        let cached = p.purpose == ClearPurpose::UseSoon && p.chunk_bytes < 4 << 20;
        let want = if cached {
            Method::RepStosb
        } else {
            Method::Movnti
        };
        assert_eq!(p.method_used, want, "{p:?}");
    }
    // Goals per thread count: movnti was not among the raw methods, so no cell compares.
    assert!(report.goals.is_empty(), "{:?}", report.goals);

    let table = report.table();
    assert!(table.contains("kernel fault-in"), "{table}");
    assert!(
        table.contains("In use: movnti (rule: test rule)"),
        "{table}"
    );
    assert!(table.contains("use-soon (rep-stosb)"), "{table}");
    assert!(table.contains("Goals (reported, not asserted)"), "{table}");
    assert!(report.svg().contains("<polyline"));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(
        json["results"].as_array().unwrap().len(),
        report.results.len()
    );
}

/// The goals compare the method in use with the best raw method at >= 2 MiB per thread count,
/// next to the kernel's fault-in.
#[test]
fn goals_are_reported_per_thread_count() {
    let lock = HugepageLock::acquire().unwrap();
    let config = ClearBenchConfig {
        methods: vec![Method::RepStosb, Method::WriteBytes],
        chunk_sizes: vec![2 << 20],
        threads: vec![1],
        buffer_bytes: 8 << 20,
        reps: 5,
        kernel_page_sizes: vec![PageSize::Size2M],
        policy: Some(PolicyChoice::rule_only(
            ClearPlan::always(Method::RepStosb),
            "test rule",
        )),
    };
    let report = clear::run(&config, &lock, &mut |_| ControlFlow::Continue(())).unwrap();
    let [g] = report.goals.as_slice() else {
        panic!("{:?}", report.goals)
    };
    assert_eq!((g.threads, g.cells), (1, 1));
    assert!(
        g.kernel_2m_gbps.is_some() && g.in_use_to_kernel.is_some(),
        "{g:?}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["goals"][0]["threads"], 1);
    assert!(available_methods().contains(&Method::RepStosb));
}

#[test]
fn bad_configuration_fails_before_touching_the_pool() {
    let lock = HugepageLock::acquire().unwrap();
    let nr_before = pool::read(Scope::System, PageSize::Size2M).unwrap().total;
    let config = ClearBenchConfig {
        threads: vec![allowed_cpus().len() + 1],
        ..ClearBenchConfig::quick()
    };
    let err = clear::run(&config, &lock, &mut |_| ControlFlow::Continue(())).unwrap_err();
    assert!(err.to_string().contains("`threads`"), "{err}");
    assert_eq!(
        pool::read(Scope::System, PageSize::Size2M).unwrap().total,
        nr_before
    );
}

#[test]
fn cancelling_stops_early_and_gives_pages_back() {
    let lock = HugepageLock::acquire().unwrap();
    let nr_before = pool::read(Scope::System, PageSize::Size2M).unwrap().total;
    let config = ClearBenchConfig {
        methods: vec![Method::RepStosb],
        chunk_sizes: vec![2 << 20],
        threads: vec![1],
        buffer_bytes: 8 << 20,
        reps: 5,
        kernel_page_sizes: vec![PageSize::Size2M],
        policy: None,
    };
    let err = clear::run(&config, &lock, &mut |p| {
        if p.done == 1 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .unwrap_err();
    assert!(err.to_string().contains("cancelled after 1 of 2"), "{err}");
    assert_eq!(
        pool::read(Scope::System, PageSize::Size2M).unwrap().total,
        nr_before
    );
}
