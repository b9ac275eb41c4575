//! `GET /metrics` of the real daemon, read by real Prometheus-format parsers: the
//! `prometheus-parse` crate for the values, and Python's `prometheus_client` OpenMetrics parser
//! (strict: it refuses any malformed line, type or missing `# EOF`).

mod daemon_util;

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};

use daemon_util::{Daemon, Env, MIB};
use prometheus_parse::{Scrape, Value};

fn scrape(d: &Daemon) -> String {
    let (status, body) = d
        .client
        .blocking(d.client.request("GET".parse().unwrap(), "/metrics", None))
        .unwrap();
    assert_eq!(status, 200);
    String::from_utf8(body.to_vec()).unwrap()
}

/// The value of `metric` with exactly `labels` (a counter, gauge or untyped sample).
fn value(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    s.samples
        .iter()
        .find(|x| x.metric == metric && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match &x.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(h) => h.last().map_or(0.0, |b| b.count),
            Value::Summary(_) => f64::NAN,
        })
}

/// Python's strict OpenMetrics parser: metric family name -> type.
fn python_families(text: &str) -> Option<HashMap<String, String>> {
    let script = "import sys, json\n\
        from prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
        fams = {f.name: f.type for f in text_string_to_metric_families(sys.stdin.read())}\n\
        print(json.dumps(fams))\n";
    let child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        hugeprep::testing::missing_tool("python3 (for the OpenMetrics parser)");
        return None;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("No module named 'prometheus_client'") {
        hugeprep::testing::missing_tool(
            "python3 prometheus_client (pip install prometheus-client)",
        );
        return None;
    }
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused:\n{err}\n{text}"
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn metrics_parse_and_count_bytes_leases_scrubs_faults_and_errors() {
    // Room for the warm file and the cold lease only: the released warm file is the pool's
    // only way back to its target, so it is proven and scrubbed, never given back.
    let env = Env::new("metrics", 24 * MIB);
    let mut d = env.spawn(&["--warm", "16M"]);
    d.settle(16 * MIB);
    // After a crash the warm file's history is unknown: the next start gives it back by the
    // kernel's path (a recycle to count).
    d.kill();
    let d = env.spawn(&["--warm", "16M"]);
    d.settle(16 * MIB);
    let warm = d.lease("warm", 16 * MIB).unwrap();
    let cold = d.lease("cold", 8 * MIB).unwrap();
    assert_eq!(warm.source.name(), "warm-exact");
    assert_eq!(cold.source.name(), "cold");
    let (status, _) = d.raw("POST", "/v1/leases", br#"{"name":"x","size":"3M"}"#);
    assert_eq!(status, 400);
    let (status, _) = d.raw("GET", "/v1/leases/77", b"");
    assert_eq!(status, 404);
    d.release(warm.id).unwrap();
    d.settle(16 * MIB);

    let text = scrape(&d);
    // Every line is a comment the format defines or a sample the parser reads.
    for line in text.lines() {
        let known = ["# HELP ", "# TYPE ", "# UNIT ", "# EOF"]
            .iter()
            .any(|p| line.starts_with(p));
        let sample = matches!(
            prometheus_parse::LineInfo::parse(line),
            prometheus_parse::LineInfo::Sample { .. }
        );
        assert!(known || sample, "unparsed line {line:?}");
    }
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    let s = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let kind = [("node", "0"), ("page_size", "2M")];
    let state = |st: &str| {
        value(
            &s,
            "hugeprep_pool_bytes",
            &[kind[0], kind[1], ("state", st)],
        )
        .unwrap()
    };
    assert_eq!(state("warm"), (16 * MIB) as f64, "{text}");
    assert_eq!(state("leased"), (8 * MIB) as f64);
    assert_eq!(state("dirty"), 0.0);
    assert_eq!(
        value(&s, "hugeprep_pool_target_bytes", &kind),
        Some((16 * MIB) as f64)
    );
    // Base units: the kernel's hugepages in bytes, whole pages of 2 MiB.
    let page = (2 * MIB) as f64;
    let free = value(&s, "hugeprep_kernel_hugepages_free_bytes", &kind).unwrap();
    assert!(free >= 0.0 && free % page == 0.0, "{free}");
    let kernel = value(&s, "hugeprep_kernel_hugepages_bytes", &kind).unwrap();
    assert!(kernel >= 12.0 * page && kernel % page == 0.0, "{kernel}");
    assert_eq!(
        value(&s, "hugeprep_reserved_hugepages_bytes", &kind),
        Some(0.0),
        "the test's own reservation, not the daemon's"
    );
    // No metric is counted in pages or MiB any more.
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        assert!(
            !line.contains("_pages") && !line.contains("mebibytes"),
            "not a base unit: {line}"
        );
    }
    assert_eq!(
        value(&s, "hugeprep_leases_total", &[("source", "warm-exact")]),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "hugeprep_leases_total", &[("source", "cold")]),
        Some(1.0)
    );
    let hist = s
        .samples
        .iter()
        .find(|x| {
            x.metric == "hugeprep_lease_duration_seconds"
                && x.labels.get("source") == Some("warm-exact")
        })
        .expect("a lease latency histogram for warm-exact");
    let Value::Histogram(buckets) = &hist.value else {
        panic!("{hist:?}")
    };
    assert!(buckets.len() > 10);
    assert_eq!(buckets.last().unwrap().count, 1.0, "+Inf holds the lease");
    assert!(buckets.windows(2).all(|w| w[0].count <= w[1].count));
    let sum = value(
        &s,
        "hugeprep_lease_duration_seconds_sum",
        &[("source", "cold")],
    )
    .unwrap();
    assert!(sum > 0.0);
    assert!(value(&s, "hugeprep_scrub_bytes_total", &[]).unwrap() >= (16 * MIB) as f64);
    assert_eq!(
        value(
            &s,
            "hugeprep_recycle_total",
            &[("path", "scrub"), ("reason", "proven")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "hugeprep_recycle_total",
            &[("path", "kernel"), ("reason", "not-watched")]
        ),
        Some(1.0)
    );
    assert_eq!(value(&s, "hugeprep_unreturned_bytes_total", &[]), Some(0.0));
    // No raise here (the test hands the daemon its pages): the compaction counters are there,
    // at zero.
    for name in [
        "hugeprep_pool_compactions_total",
        "hugeprep_pool_compaction_added_bytes_total",
        "hugeprep_pool_raise_short_after_compaction_total",
    ] {
        assert_eq!(value(&s, name, &[]), Some(0.0), "{name}");
    }
    assert!(value(&s, "hugeprep_proof_seconds_total", &[]).unwrap() > 0.0);
    for name in ["pool_lock_wait_seconds", "pool_lock_hold_seconds"] {
        let count = value(&s, &format!("hugeprep_{name}_count"), &[]).unwrap();
        assert!(
            count > 0.0,
            "{name}: the lease and the worker took the lock"
        );
        assert!(value(&s, &format!("hugeprep_{name}_sum"), &[]).unwrap() >= 0.0);
    }
    assert!(value(&s, "hugeprep_scrub_seconds_total", &[]).unwrap() > 0.0);
    assert_eq!(
        value(&s, "hugeprep_fault_bytes_total", &[("path", "lease")]),
        Some((8 * MIB) as f64)
    );
    assert!(
        value(&s, "hugeprep_fault_bytes_total", &[("path", "refill")]).unwrap()
            >= (16 * MIB) as f64
    );
    assert!(value(&s, "hugeprep_fault_seconds_total", &[("path", "lease")]).unwrap() > 0.0);
    let cpu = d.client.blocking(d.client.cpu()).unwrap();
    assert_eq!(
        value(
            &s,
            "hugeprep_clearing_info",
            &[("method", &cpu.method.to_string()), ("rule", &cpu.rule)]
        ),
        Some(1.0),
        "{text}"
    );
    // Releases are proven from the kernel's counts here (BPF loads as root on this kernel).
    assert_eq!(
        value(
            &s,
            "hugeprep_release_proof_info",
            &[("method", "kernel-counts")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&s, "hugeprep_errors_total", &[("kind", "bad_request")]),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "hugeprep_errors_total", &[("kind", "not_found")]),
        Some(1.0)
    );
    // The lease errors: the bad size of the lease request, not the GET of a missing lease;
    // the host's kinds are there from the start at 0.
    assert_eq!(
        value(
            &s,
            "hugeprep_lease_errors_total",
            &[("kind", "bad_request")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&s, "hugeprep_lease_errors_total", &[("kind", "not_found")]),
        None
    );
    for kind in hugeprep::api::metrics::HOST_LEASE_ERRORS {
        assert_eq!(
            value(&s, "hugeprep_lease_errors_total", &[("kind", kind)]),
            Some(0.0),
            "{kind}"
        );
    }

    if let Some(fams) = python_families(&text) {
        for (name, ty) in [
            ("hugeprep_pool_bytes", "gauge"),
            ("hugeprep_kernel_hugepages_free_bytes", "gauge"),
            ("hugeprep_lease_errors", "counter"),
            ("hugeprep_lease_duration_seconds", "histogram"),
            ("hugeprep_pool_lock_wait_seconds", "histogram"),
            ("hugeprep_pool_lock_hold_seconds", "histogram"),
            ("hugeprep_leases", "counter"),
            ("hugeprep_scrub_bytes", "counter"),
            ("hugeprep_scrub_seconds", "counter"),
            ("hugeprep_fault_bytes", "counter"),
            ("hugeprep_fault_seconds", "counter"),
            ("hugeprep_clearing", "info"),
            ("hugeprep_errors", "counter"),
        ] {
            assert_eq!(
                fams.get(name).map(String::as_str),
                Some(ty),
                "{name}: {fams:?}"
            );
        }
    }
    d.release(cold.id).unwrap();
}
