//! The adaptive warm target against the real daemon on real hugetlbfs: a target with a goal
//! and a ceiling in place of `warm` (in the configuration file and over the API) is sized by
//! the daemon from the leases it sees; `GET /v1/pool/adaptive` and `/metrics` show the
//! target and why, and the pool keeps that much warm; a lease-role principal (uids 65534
//! and 65533 in the socket's group, `setpriv` + `curl`) counts its `starts_per_hour`, root
//! every start; what the forecast learnt is kept across a clean restart, and a damaged file
//! is refused by path and the daemon learns from nothing. No timing is asserted: the waits
//! are liveness bounds.

mod daemon_util;

use std::time::{Duration, Instant};

use daemon_util::{Daemon, Env, MIB};
use serde_json::{json, Value};

fn adaptive(d: &Daemon) -> Value {
    let (status, body) = d.raw("GET", "/v1/pool/adaptive", b"");
    assert_eq!(status, 200, "{body}");
    body
}

fn scrape(d: &Daemon) -> String {
    let (status, body) = d
        .client
        .blocking(d.client.request("GET".parse().unwrap(), "/metrics", None))
        .unwrap();
    assert_eq!(status, 200);
    String::from_utf8(body.to_vec()).unwrap()
}

/// Waits (a liveness bound) until the adaptive target is above 0 and in force in the pool's
/// policy; returns its report.
fn sized(d: &Daemon) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let a = adaptive(d);
        let bytes = a["targets"][0]["target_bytes"].as_u64().unwrap_or(0);
        if bytes > 0 && d.pool().kinds[0].target_bytes == bytes {
            return a;
        }
        assert!(Instant::now() < deadline, "adaptive target not sized: {a}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_goal_and_ceiling_are_sized_from_the_leases_seen_and_shown_with_why() {
    let env = Env::new("adaptive", 96 * MIB);
    let config = env.dir.join("config.toml");
    std::fs::write(
        &config,
        "[pool]\n[[pool.target]]\npage_size = \"2M\"\ngoal = 99.0\nceiling = \"32M\"\n",
    )
    .unwrap();
    let d = env.spawn(&["--config", config.to_str().unwrap()]);

    let a = adaptive(&d);
    let t = &a["targets"][0];
    assert_eq!(t["goal_percent"], 99.0, "{a}");
    assert_eq!(t["ceiling"], 32 * MIB, "{a}");
    assert_eq!(t["starts"], 0, "{a}");
    assert!(a["refill_rate"].as_f64().unwrap() > 0.0, "{a}");
    let (status, targets) = d.raw("GET", "/v1/pool/targets", b"");
    assert_eq!(status, 200);
    assert_eq!(
        targets["targets"][0]["adaptive"]["goal_bp"], 9900,
        "{targets}"
    );
    assert_eq!(
        d.pool().kinds[0].warm_bytes,
        0,
        "nothing learnt, nothing warm"
    );

    // A few VM starts: the target follows the day's peak need (nothing planned yet).
    let leases: Vec<_> = [8 * MIB, 12 * MIB, 4 * MIB]
        .iter()
        .enumerate()
        .map(|(i, &size)| d.lease(&format!("vm{i}"), size).unwrap())
        .collect();
    let a = sized(&d);
    let t = &a["targets"][0];
    assert_eq!(t["starts"], 3, "{a}");
    let bytes = t["target_bytes"].as_u64().unwrap();
    assert!((12 * MIB..=32 * MIB).contains(&bytes), "{a}");
    assert_eq!(bytes % (2 * MIB), 0, "{a}");
    let why = &t["why"];
    assert_eq!(why["recent_raised"], true, "{a}");
    assert!(why["bucket"].as_str().unwrap().contains('h'), "{a}");
    assert!(why["recent_peak"].as_u64().unwrap() >= 12 * MIB, "{a}");
    // The pool fills to it.
    d.settle(bytes);

    let text = scrape(&d);
    let line = text
        .lines()
        .find(|l| l.starts_with("hugeprep_pool_adaptive_target_bytes{"))
        .unwrap_or_else(|| panic!("no adaptive target in the metrics:\n{text}"));
    assert!(
        line.contains("node=\"all\"") && line.contains("page_size=\"2M\""),
        "{line}"
    );
    assert!(line.ends_with(&format!(" {bytes}")), "{line}");
    assert!(
        text.contains("hugeprep_pool_adaptive_planned_warm_start_ratio{"),
        "{text}"
    );
    assert!(
        text.contains("hugeprep_pool_adaptive_goal_warm_start_ratio{"),
        "{text}"
    );

    // Over the API: a bad goal names the field and changes nothing; a lower ceiling holds
    // at once and the starts seen are kept.
    let bad = json!({"targets": [{"page_size": "2M", "goal": 40, "ceiling": "16M"}]});
    let (status, body) = d.raw("PUT", "/v1/pool/targets", bad.to_string().as_bytes());
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("targets[0].goal"), "{body}");
    let both = json!({"targets": [{"page_size": "2M", "warm": "8M", "goal": 99}]});
    let (status, body) = d.raw("PUT", "/v1/pool/targets", both.to_string().as_bytes());
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("targets[0].warm"), "{body}");
    assert_eq!(adaptive(&d)["targets"][0]["goal_percent"], 99.0);
    let good = json!({"targets": [{"page_size": "2M", "goal": 95, "ceiling": "8M"}]});
    let (status, body) = d.raw("PUT", "/v1/pool/targets", good.to_string().as_bytes());
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["source"], "api", "{body}");
    let a = adaptive(&d);
    assert_eq!(a["targets"][0]["goal_percent"], 95.0, "{a}");
    assert_eq!(a["targets"][0]["starts"], 3, "{a}");
    assert!(d.pool().kinds[0].target_bytes <= 8 * MIB);
    d.settle(d.pool().kinds[0].target_bytes);

    for l in leases {
        d.release(l.id).unwrap();
    }
}

#[test]
fn what_the_forecast_learnt_is_kept_across_a_restart_and_a_damaged_file_is_refused() {
    let env = Env::new("adaptive-kept", 64 * MIB);
    let config = env.dir.join("config.toml");
    std::fs::write(
        &config,
        "[pool]\n[[pool.target]]\npage_size = \"2M\"\ngoal = 99.0\nceiling = \"32M\"\n",
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap()];
    let mut d = env.spawn(&args);
    let vm = d.lease("vm0", 10 * MIB).unwrap();
    let bytes = sized(&d)["targets"][0]["target_bytes"].as_u64().unwrap();
    assert!(bytes >= 10 * MIB, "{bytes}");
    d.release(vm.id).unwrap();
    // A clean stop writes the file; the next start reads it back: the same target before
    // any lease.
    d.stop();
    let file = env.state.join("adaptive-forecasts.json");
    assert!(file.exists(), "no {}", file.display());
    let from = env.log().len();
    let d = env.spawn(&args);
    let a = sized(&d);
    assert_eq!(a["targets"][0]["target_bytes"], bytes, "{a}");
    assert_eq!(a["targets"][0]["starts"], 0, "{a}");
    assert!(env.log()[from..].contains("adaptive forecast restored"));
    drop(d);

    // Damaged: refused with the path and why, and the daemon learns from nothing.
    std::fs::write(
        &file,
        b"{\"format\": \"hugeprep-adaptive-forecasts\", \"version\": 1, \"targ",
    )
    .unwrap();
    let from = env.log().len();
    let mut d = env.spawn(&args);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !env.log()[from..].contains("adaptive forecasts not restored") {
        assert!(
            Instant::now() < deadline,
            "no refusal logged:\n{}",
            &env.log()[from..]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let line = env.log()[from..]
        .lines()
        .find(|l| l.contains("adaptive forecasts not restored"))
        .unwrap()
        .to_string();
    assert!(line.contains(file.to_str().unwrap()), "{line}");
    assert!(line.contains("EOF"), "{line}");
    let a = adaptive(&d);
    assert_eq!(a["targets"][0]["target_bytes"], 0, "{a}");
    let vm = d.lease("vm1", 4 * MIB).unwrap();
    d.release(vm.id).unwrap();
    d.stop();
}

#[test]
fn a_lease_role_principal_counts_its_starts_per_hour_and_the_operator_all() {
    use daemon_util::users::curl_json_as;
    const A: u32 = 65534;
    const B: u32 = 65533;
    let env = Env::new("adaptive-principals", 48 * MIB);
    let config = env.dir.join("config.toml");
    std::fs::write(
        &config,
        "[pool]\n[[pool.target]]\npage_size = \"2M\"\ngoal = 99.0\nceiling = \"16M\"\n\
         [pool.limits.principal.\"65533\"]\nstarts_per_hour = \"none\"\n",
    )
    .unwrap();
    let d = env.spawn(&[
        "--socket-group",
        "kvm",
        "--config",
        config.to_str().unwrap(),
    ]);
    // A (the default, one an hour) leases three times, B (trusted: "none") twice, root once.
    for (uid, name) in [(A, "a1"), (A, "a2"), (A, "a3"), (B, "b1"), (B, "b2")] {
        let body = format!(r#"{{"name":"{name}","size":"2M"}}"#);
        let (code, body) = curl_json_as(uid, &env, "POST", "/v1/leases", &body);
        assert_eq!(code, 201, "{body}");
    }
    let root = d.lease("hook", 2 * MIB).unwrap();
    let t = &adaptive(&d)["targets"][0];
    // A clock hour may begin between A's leases: then two of them count.
    let (counted, dropped) = (t["starts"].as_u64(), t["starts_not_counted"].as_u64());
    assert!(
        (counted, dropped) == (Some(4), Some(2)) || (counted, dropped) == (Some(5), Some(1)),
        "{t}"
    );
    d.release(root.id).unwrap();
}
