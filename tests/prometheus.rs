//! Monitoring as operators run it: the daemon's read-only metrics listener, scraped by the
//! real Prometheus (Debian's `prometheus`, started here on loopback with its own config and
//! storage), PromQL queries that must return the pool's figures, the shipped alert rules
//! loaded and evaluated by it and unit-tested by `promtool`, and the shipped Grafana
//! dashboard, whose every query must name only metrics the daemon exports and be accepted by
//! Prometheus.

mod daemon_util;
#[path = "monitor_util/mod.rs"]
mod monitor_util;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use daemon_util::{Env, MIB};
use monitor_util::{escape, free_port, http, json, metrics_addr, wait_for, Guard};

fn prometheus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("integration/prometheus")
}

fn have(tool: &str) -> bool {
    if Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return true;
    }
    hugeprep::testing::missing_tool(&format!(
        "{tool} (Debian package prometheus; scripts/test installs it)"
    ));
    false
}

#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    if !have("promtool") {
        return;
    }
    let dir = prometheus_dir();
    for args in [
        &["check", "rules", "alerts.yml"][..],
        &["test", "rules", "alerts-test.yml"][..],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Metric families of an exposition text: every name a series of it can have.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let (Some(name), Some(kind)) = (it.next(), it.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "info" => &["_info"],
            "stateset" | "gauge" | "unknown" => &[""],
            _ => &[""],
        };
        for s in suffixes {
            names.insert(format!("{name}{s}"));
        }
    }
    names
}

/// The `hugeprep_*` metric names a PromQL expression refers to.
fn referenced(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("hugeprep_") {
        let start = i + at;
        let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let preceded = start > 0 && ident(bytes[start - 1]);
        let mut end = start;
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        if !preceded {
            out.insert(expr[start..end].to_string());
        }
        i = end;
    }
    out
}

/// Every PromQL expression of the dashboard: panel targets and template queries.
fn dashboard_exprs() -> Vec<String> {
    let d: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(prometheus_dir().join("dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            out.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        // Grafana's `label_values(METRIC, LABEL)`: Prometheus is asked for METRIC.
        if let Some(q) = v["query"]["query"].as_str() {
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.rsplit_once(','))
                .map_or(q, |(metric, _)| metric);
            out.push(inner.to_string());
        }
    }
    assert!(out.len() > 15, "{out:?}");
    out
}

/// Every expression of the alert rules.
fn rule_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(prometheus_dir().join("alerts.yml")).unwrap();
    let v: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    v["groups"][0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r["expr"].as_str().unwrap().to_string())
        .collect()
}

/// A PromQL instant query's result vector.
fn query(prom: &str, q: &str) -> Vec<serde_json::Value> {
    let a = http(
        "GET",
        &format!("{prom}/api/v1/query?query={}", escape(q)),
        &[],
        None,
    );
    let v = json(&a);
    assert_eq!(v["status"], "success", "{q}: {v}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// The single value of `q`, if it has exactly one series.
fn scalar(prom: &str, q: &str) -> Option<f64> {
    let r = query(prom, q);
    (r.len() == 1).then(|| r[0]["value"][1].as_str().unwrap().parse().unwrap())
}

#[test]
fn prometheus_scrapes_the_daemon_and_the_dashboard_and_rules_use_only_its_metrics() {
    if !have("prometheus") {
        return;
    }
    let t0 = std::time::Instant::now();
    let env = Env::new("prometheus", 24 * MIB);
    // A Placement that refuses connections: the publisher must back off and say so while
    // leases go on, and health must say degraded.
    let dead = free_port();
    let config = env.dir.join("hugeprep.toml");
    std::fs::write(
        &config,
        format!(
            "[placement]\nendpoint = \"http://127.0.0.1:{dead}\"\ntoken = \"admin\"\ncompute_node = \"nowhere\"\n"
        ),
    )
    .unwrap();
    let d = env.spawn(&[
        "--warm",
        "16M",
        "--metrics-listen",
        "127.0.0.1:0",
        "--config",
        config.to_str().unwrap(),
    ]);
    let addr = metrics_addr(&env.log()).expect("the listener's address in the log");
    let base = format!("http://{addr}");
    d.settle(16 * MIB);
    eprintln!("daemon settled after {:?}", t0.elapsed());

    // The listener: GET of its two paths, nothing else.
    let m = http("GET", &format!("{base}/metrics"), &[], None);
    assert_eq!(m.status, 200);
    assert!(m.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    for method in ["HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        for path in ["/metrics", "/health"] {
            let a = http(method, &format!("{base}{path}"), &[], Some("{}"));
            assert_eq!(a.status, 405, "{method} {path}");
            assert_eq!(a.headers["allow"], "GET", "{method} {path}");
        }
    }
    for (method, path) in [
        ("GET", "/"),
        ("GET", "/v1/leases"),
        ("GET", "/v1/pool"),
        ("POST", "/v1/leases"),
        ("DELETE", "/v1/leases/1"),
        ("PUT", "/v1/pool/targets"),
        ("GET", "/metrics/"),
        ("GET", "/healthz"),
    ] {
        let a = http(method, &format!("{base}{path}"), &[], Some("{}"));
        assert_eq!(a.status, 404, "{method} {path}");
    }

    // Placement unreachable: degraded, with the reason; leases unaffected.
    let health = wait_for(
        Duration::from_secs(20),
        "health degraded by Placement",
        || {
            let a = http("GET", &format!("{base}/health"), &[], None);
            let v = json(&a);
            (a.status == 503).then_some(v)
        },
    );
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(health["reasons"][0]["reason"], "placement", "{health}");
    assert!(
        health["reasons"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("Placement unreachable"),
        "{health}"
    );
    eprintln!("health degraded after {:?}", t0.elapsed());
    let lease = d.lease("vm", 8 * MIB).unwrap();
    d.settle(16 * MIB);
    for wait in ["retry_in_s=1 ", "retry_in_s=2 "] {
        wait_for(
            Duration::from_secs(20),
            &format!("a backoff line with {wait}"),
            || {
                env.log()
                    .lines()
                    .any(|l| {
                        l.contains("Placement not updated; leases are unaffected")
                            && l.contains(wait)
                            && l.contains("Connection refused")
                    })
                    .then_some(())
            },
        );
    }

    // The real Prometheus, scraping every second, with the shipped rules.
    let dir = env.dir.join("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    let rules = prometheus_dir().join("alerts.yml");
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: hugeprep\n    static_configs:\n      - targets: [\"{addr}\"]\n",
            rules.display()
        ),
    )
    .unwrap();
    let port = free_port();
    let prom = format!("http://127.0.0.1:{port}");
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let started = std::time::Instant::now();
    let _prometheus = Guard(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    wait_for(Duration::from_secs(60), "prometheus ready", || {
        monitor_util::try_http("GET", &format!("{prom}/-/ready"), &[], None)
            .ok()
            .filter(|a| a.status == 200)
    });

    eprintln!("prometheus ready after {:?}", started.elapsed());
    // PromQL gives the pool's figures.
    let pool = d.pool();
    let kind = &pool.kinds[0];
    wait_for(Duration::from_secs(30), "a scrape with the lease", || {
        scalar(
            &prom,
            "sum(hugeprep_pool_bytes{job=\"hugeprep\",state=\"leased\"})",
        )
        .filter(|v| *v == (8 * MIB) as f64)
    });
    assert_eq!(scalar(&prom, "up{job=\"hugeprep\"}"), Some(1.0));
    assert_eq!(
        scalar(&prom, "sum(hugeprep_pool_bytes{state=\"warm\"})"),
        Some(kind.warm_bytes as f64)
    );
    assert_eq!(
        scalar(&prom, "sum(hugeprep_pool_target_bytes)"),
        Some((16 * MIB) as f64)
    );
    assert_eq!(
        scalar(
            &prom,
            "hugeprep_pool_target_met{node=\"0\",page_size=\"2M\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        scalar(&prom, "sum(hugeprep_refill_backlog_bytes)"),
        Some(0.0)
    );
    let build = query(&prom, "hugeprep_build_info");
    assert_eq!(build[0]["metric"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(scalar(&prom, "hugeprep_ready"), Some(0.0));
    assert_eq!(
        scalar(&prom, "hugeprep_degraded{reason=\"placement\"}"),
        Some(1.0)
    );
    assert_eq!(
        scalar(&prom, "hugeprep_placement_state{state=\"unreachable\"}"),
        Some(1.0)
    );
    assert!(scalar(&prom, "sum(hugeprep_leases_total)").unwrap() >= 1.0);
    assert_eq!(
        scalar(
            &prom,
            "hugeprep_calibration_verdict{verdict=\"not_calibrated\"}"
        ),
        Some(1.0)
    );

    // The rules loaded and evaluate without error; the degraded ones are pending.
    let rules = wait_for(Duration::from_secs(20), "rules evaluated", || {
        let v = json(&http("GET", &format!("{prom}/api/v1/rules"), &[], None));
        let group = v["data"]["groups"][0].clone();
        let rules = group["rules"].as_array().cloned().unwrap_or_default();
        (rules.len() == 10
            && rules
                .iter()
                .all(|r| r["lastEvaluation"] != "0001-01-01T00:00:00Z"))
        .then_some(rules)
    });
    eprintln!("rules evaluated after {:?}", started.elapsed());
    for r in &rules {
        assert_eq!(r["health"], "ok", "{r}");
    }
    let alerts = wait_for(Duration::from_secs(20), "pending alerts", || {
        let v = json(&http("GET", &format!("{prom}/api/v1/alerts"), &[], None));
        let names: BTreeSet<String> = v["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["labels"]["alertname"].as_str().unwrap().to_string())
            .collect();
        (names.contains("HugeprepDegraded") && names.contains("HugeprepPlacementNotUpdated"))
            .then_some(names)
    });
    assert!(
        !alerts.contains("HugeprepDown") && !alerts.contains("HugeprepWarmPoolBelowTarget"),
        "{alerts:?}"
    );

    // Dashboard and rules: only metrics the daemon exports, every query accepted.
    let text = String::from_utf8(
        http("GET", &format!("{base}/metrics"), &[], None)
            .body
            .to_vec(),
    )
    .unwrap();
    let exported = exported_names(&text);
    for expr in dashboard_exprs().iter().chain(rule_exprs().iter()) {
        let names = referenced(expr);
        assert!(
            !names.is_empty() || expr.starts_with("up{"),
            "{expr} names no metric of the daemon"
        );
        for n in &names {
            assert!(
                exported.contains(n),
                "{n} (in {expr}) is not exported: {exported:?}"
            );
        }
        let q = expr.replace("$instance", ".*");
        query(&prom, &q);
    }
    d.release(lease.id).unwrap();
}
