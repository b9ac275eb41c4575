//! `hugeprep bench recycle --json` on a small configuration, as a user runs it: both paths and
//! the lease latency (quiet, and beside another client's churn) are measured, every hugepage it borrowed is given back, and no process it
//! started is left. No speed is asserted. The benchmark is the binary's (crates/hugeprep-bench):
//! the test runs the command and reads its JSON, it does not link the benchmark code.

use std::collections::BTreeMap;
use std::process::Command;

/// Regression: the top-up was dropped before the benchmark's mount, while the latency pool's
/// warm files still held their pages, so 160 borrowed pages stayed in the kernel's pool.
#[test]
fn small_run_measures_both_paths_and_gives_every_page_back() {
    // Whatever the benchmark (and the daemons it starts) leaves running is re-parented to
    // this process when the command exits, where the check below sees it.
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes integers only and changes no memory.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    // The pools are machine-wide and shared: the benchmark's own pool changes, from its
    // ledger (the command takes the hugepage test lock itself, so this test cannot hold it
    // around the run and compare totals).
    let dir = std::env::temp_dir().join(format!("hugeprep-recycle-bench.{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ledger = dir.join("ledger");
    let json_out = dir.join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["bench", "recycle", "--size", "8M", "--page-size", "2M"])
        .args(["--threads", "1", "--reps", "1", "--leases", "5"])
        .args(["--lease-size", "4M", "--host-processes", "60", "--churn"])
        .arg("--json-out")
        .arg(&json_out)
        .env(hugeprep::hugetlb::ledger::ENV, &ledger)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let table = String::from_utf8_lossy(&out.stdout);
    let changes = std::fs::read_to_string(&ledger).unwrap_or_default();
    // Into the suite's own ledger too, which scripts/test sums.
    if let Some(outer) = std::env::var_os(hugeprep::hugetlb::ledger::ENV).filter(|p| !p.is_empty())
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(outer)
            .unwrap();
        f.write_all(changes.as_bytes()).unwrap();
    }
    assert!(out.status.success(), "{stderr}");
    let mut sums: BTreeMap<&str, i64> = BTreeMap::new();
    for line in changes.lines() {
        let mut fields = line.split_whitespace();
        let (Some(kb), Some(delta)) = (fields.next(), fields.next()) else {
            panic!("ledger line {line:?}")
        };
        *sums.entry(kb).or_default() += delta.parse::<i64>().unwrap();
    }
    assert!(
        sums.values().all(|&s| s == 0),
        "the benchmark left borrowed pages in the pool: {sums:?}\n{changes}"
    );

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_out).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let [run] = report["runs"].as_array().unwrap().as_slice() else {
        panic!("one run (2M pages, 1 thread): {report:#}")
    };
    // Both methods, on the quiet host and beside the 60 processes the bench started (2 of
    // them QEMU-like) and reaped: none of them is left.
    let rows: Vec<(&str, u64)> = run["proofs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["method"].as_str().unwrap(),
                p["host_processes"].as_u64().unwrap(),
            )
        })
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
    assert_eq!(run["proofs"][2]["host_threads"], 2 * 64 + 58);
    let children: String = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|t| std::fs::read_to_string(t.unwrap().path().join("children")).unwrap_or_default())
        .collect();
    assert!(children.trim().is_empty(), "left running: {children}");
    let median = |v: &serde_json::Value| v["gbps"]["median"].as_f64().unwrap();
    assert!(median(&run["scrub"]) > 0.0 && median(&run["kernel_path"]) > 0.0);
    // Goal (b): the scrub against the best raw clear of the same file at the same threads.
    assert!(
        !run["clear_methods"].as_array().unwrap().is_empty(),
        "{run:#}"
    );
    let best = &run["best_clear"];
    assert!(best.is_object(), "methods were timed: {run:#}");
    let ratio = run["scrub_to_best"].as_f64().unwrap();
    // Through JSON: serde_json's float parsing may be a unit in the last place off.
    let expected = median(&run["scrub"]) / median(best);
    assert!(
        (ratio - expected).abs() <= 1e-12 * expected,
        "{ratio} {expected}"
    );
    assert!(ratio > 0.0);
    let paired = run["scrub_to_best_paired"][0].as_f64().unwrap();
    // The goal is 90 % of the best raw clear (hugeprep_bench::recycle::SCRUB_GOAL).
    assert_eq!(run["scrub_goal_met"], paired >= 0.90, "{run:#}");
    assert!(table.contains("(b) scrub / best clear"), "{table}");
    assert!(table.contains("(c) scrub / kernel's path"), "{table}");
    let latency = &run["latency"];
    assert_eq!(latency["warm_exact"], 5, "{latency:#}");
    // --churn: the quiet and the churned batch (one round of each after the warm-up), the
    // churned one timed while the other client's files went through the worker.
    let churn = &run["churn"];
    assert_eq!(churn["quiet"]["leases"], 8, "{churn:#}");
    assert_eq!(churn["churned"]["leases"], 8, "{churn:#}");
    assert!(churn["churn_cycles"].as_u64().unwrap() > 0, "{churn:#}");
    assert!(table.contains("churned / quiet at the client"), "{table}");
}
