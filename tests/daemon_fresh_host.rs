//! The README's quick start on a fresh host: no free hugepages, `hugeprep serve --warm 4G`,
//! then `hugeprep status` shows 4 GiB warm and `hugeprep lease vm1 4G` returns a warm lease;
//! `hugeprep drain --release-pools` gives back exactly the pages the daemon added. And the
//! same host with `reserve = false`: the shortfall and its remedy in the log, `status` and
//! `doctor`. And `hugeprep reserve` (the boot-time unit) sharing the daemon's ledger. And
//! the packaged defaults (nothing warm) on such a host: the first lease is served cold, the
//! daemon raising the kernel's pool for it within `reserve_limit`.

mod daemon_util;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use daemon_util::{succeeded as stdout, Env};
use hugeprep::hugetlb::pool::{self, Scope};
use hugeprep::hugetlb::BackingFile;
use hugeprep::topology::Topology;
use hugeprep::PageSize;

const GIB: u64 = 1 << 30;

fn hugeprep(env: &Env, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(args)
        .env("HUGEPREP_SOCKET", &env.socket)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// `nr_hugepages` of 2 MiB pages on every node.
fn node_pools() -> Vec<u64> {
    Topology::detect()
        .unwrap()
        .node_ids()
        .into_iter()
        .map(|n| pool::read(Scope::Node(n), PageSize::Size2M).unwrap().total)
        .collect()
}

/// Takes every free 2 MiB page other users left in the pools, so the daemon starts from
/// none; the pages go back when the memfds are dropped.
fn occupy_free_pages() -> Vec<BackingFile> {
    let held = hugeprep::testing::occupy_free_pages().unwrap();
    assert_eq!(pool::available(None, PageSize::Size2M).unwrap(), 0);
    held
}

/// Polls `hugeprep status --json` until `done` holds (a liveness bound, not a speed check).
fn wait_status(
    env: &Env,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&stdout(&hugeprep(env, &["status", "--json"]))).unwrap();
        if done(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {status:#}\n{}",
            env.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Writes a config file whose `[pool]` table is `pool` and starts the daemon with it.
fn spawn_with_pool(env: &Env, name: &str, pool: &str) -> (daemon_util::Daemon, String) {
    let config = env.dir.join(name);
    std::fs::write(&config, format!("[pool]\n{pool}")).unwrap();
    let config = config.to_str().unwrap().to_string();
    (env.spawn(&["--config", &config]), config)
}

/// Waits for the first kind's `reason` and returns it.
fn wait_reason(env: &Env) -> (serde_json::Value, String) {
    let status = wait_status(env, "a reason", |s| {
        s["pool"]["kinds"][0]["reason"].is_string()
    });
    let reason = status["pool"]["kinds"][0]["reason"]
        .as_str()
        .unwrap()
        .to_string();
    (status, reason)
}

/// `hugeprep doctor` without the 1 GiB probe, against an empty libvirt directory.
fn doctor(env: &Env, extra: &[&str]) -> Output {
    let libvirt = env.dir.join("libvirt");
    std::fs::create_dir_all(&libvirt).unwrap();
    let mut args = vec![
        "doctor",
        "--no-probe",
        "--libvirt-dir",
        libvirt.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    hugeprep(env, &args)
}

#[test]
fn quick_start_on_a_host_with_no_free_hugepages() {
    let env = Env::fresh("fresh-host");
    let before = node_pools();
    let occupied = occupy_free_pages();
    let mut d = env.spawn(&["--warm", "4G"]);

    let status = wait_status(&env, "4 GiB warm", |s| {
        s["pool"]["kinds"][0]["warm_bytes"] == 4 * GIB
    });
    let kind = &status["pool"]["kinds"][0];
    assert_eq!(kind["reserved_pages"], 2048, "{kind:#}");
    assert!(kind["reason"].is_null(), "{kind:#}");
    let text = stdout(&hugeprep(&env, &["status"]));
    assert!(text.contains("4 GiB"), "{text}");
    assert!(text.contains("the daemon added 2048 pages"), "{text}");

    // A fresh host with the daemon at its target is healthy.
    let out = doctor(&env, &["--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for f in report["findings"].as_array().unwrap() {
        if f["check"] == "hugepages" || f["check"] == "daemon" || f["check"] == "kernel" {
            assert!(f["severity"] == "ok" || f["severity"] == "info", "{f:#}");
        }
    }
    assert_ne!(report["status"], "blocking", "{report:#}");
    if !std::path::Path::new("/run/libvirt/libvirt-sock").exists() {
        // Nothing here is degraded either (a running libvirtd without hugeprep's hook would be).
        assert_eq!(out.status.code(), Some(0), "{report:#}");
    }

    let lease: serde_json::Value =
        serde_json::from_str(&stdout(&hugeprep(&env, &["lease", "vm1", "4G", "--json"]))).unwrap();
    assert_eq!(lease["source"], "warm-exact", "{lease:#}");
    assert_eq!(lease["size"], 4 * GIB);
    stdout(&hugeprep(&env, &["release", "vm1"]));

    // Give everything back: warm files deleted, nr_hugepages lowered by what was added.
    let report: serde_json::Value = serde_json::from_str(&stdout(&hugeprep(
        &env,
        &["drain", "--release-pools", "--json"],
    )))
    .unwrap();
    let released: u64 = report["released"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["released"].as_u64().unwrap())
        .sum();
    assert!(released >= 2048, "{report:#}");
    assert_eq!(report["released"][0]["kept"], 0, "{report:#}");
    d.stop();
    drop(occupied);
    assert_eq!(node_pools(), before, "{}", env.log());
    assert!(
        env.log().contains("raised the kernel's hugepage pool"),
        "{}",
        env.log()
    );
    // The ledger is empty: a restart gives back nothing more.
    assert_eq!(
        std::fs::read_dir(env.state.join("reservations/records"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn nothing_warm_on_a_host_with_no_free_hugepages_serves_the_first_lease_cold() {
    let env = Env::fresh("first-lease");
    let before = node_pools();
    let occupied = occupy_free_pages();
    // The packaged defaults keep nothing warm; the limit leaves room for 32 MiB.
    let (mut d, _) = spawn_with_pool(&env, "first.toml", "reserve_limit = \"32M\"\n");
    let lease: serde_json::Value =
        serde_json::from_str(&stdout(&hugeprep(&env, &["lease", "t1", "16M", "--json"]))).unwrap();
    assert_eq!(lease["source"], "cold", "{lease:#}");
    let status = wait_status(&env, "the raise", |_| true);
    assert_eq!(
        status["pool"]["kinds"][0]["reserved_pages"], 8,
        "{status:#}"
    );
    assert!(env
        .log()
        .contains("raised the kernel's hugepage pool for a lease"));
    // A host served cold is healthy: neither /health nor doctor warns about it.
    let (code, health) = d.raw("GET", "/health", b"");
    assert_eq!(code, 200, "{health:#}");
    let out = doctor(&env, &["--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for f in report["findings"].as_array().unwrap() {
        if f["check"] == "hugepages" || f["check"] == "daemon" {
            assert!(f["severity"] == "ok" || f["severity"] == "info", "{f:#}");
        }
        if let Some(remedy) = f["remedy"].as_str() {
            assert!(!remedy.contains("hugeprep serve"), "{f:#}");
        }
    }
    // Beyond reserve_limit: refused as over a limit (429), naming it, what hugeprep added to
    // the node and the principal, and in the log; no page added for it.
    let out = hugeprep(&env, &["lease", "t2", "64M"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("reserve_limit (node 0): 16777216 in use") && err.contains("uid:0"),
        "{err}"
    );
    assert!(
        env.log().contains("reserve_limit of 32 MiB reached"),
        "{}",
        env.log()
    );
    // Right after a refused lease: /health is degraded and doctor warns, each saying why,
    // with a remedy for the packaged service.
    let (code, health) = d.raw("GET", "/health", b"");
    assert_eq!(code, 503, "{health:#}");
    let refused = health["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["reason"] == "lease_refused")
        .unwrap_or_else(|| panic!("{health:#}"));
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("a lease of 64 MiB of 2M pages on node 0 was refused")
            && detail.contains("reserve_limit of 32 MiB reached"),
        "{detail}"
    );
    let out = doctor(&env, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.contains("WARN     daemon    leases: a lease of 64 MiB"),
        "{text}"
    );
    assert!(text.contains("systemctl reload hugeprep"), "{text}");
    assert!(text.contains("degraded: VMs start"), "{text}");
    let status = wait_status(&env, "no raise", |_| true);
    assert_eq!(
        status["pool"]["kinds"][0]["reserved_pages"], 8,
        "{status:#}"
    );
    // Released: its pages stay in the kernel's pool for the next start, recorded as added.
    stdout(&hugeprep(&env, &["release", "t1"]));
    let lease: serde_json::Value =
        serde_json::from_str(&stdout(&hugeprep(&env, &["lease", "t3", "16M", "--json"]))).unwrap();
    stdout(&hugeprep(&env, &["release", "t3"]));
    assert_ne!(lease["id"], serde_json::Value::Null);
    stdout(&hugeprep(&env, &["drain", "--release-pools"]));
    d.stop();
    drop(occupied);
    assert_eq!(node_pools(), before, "{}", env.log());
    assert_eq!(env.mount_used(), 0);
}

#[test]
fn reserve_false_explains_the_shortfall_in_log_status_and_doctor() {
    let env = Env::fresh("no-reserve");
    let before = node_pools();
    let occupied = occupy_free_pages();
    let (d, config) = spawn_with_pool(
        &env,
        "no-reserve.toml",
        "reserve = false\n[[pool.target]]\npage_size = \"2M\"\nwarm = \"64M\"\n",
    );
    let (_, reason) = wait_reason(&env);
    assert!(
        reason.starts_with("kernel pool short by 32 2M pages on node 0; reserve disabled"),
        "{reason}"
    );
    assert!(reason.contains("hugeprep pool --set"), "{reason}");
    let text = stdout(&hugeprep(&env, &["status"]));
    assert!(text.contains(&reason), "{text}");
    // Logged once, not at every refill attempt.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        env.log().matches("warm target not met").count(),
        1,
        "{}",
        env.log()
    );

    // Hugepages unavailable, reserve off: doctor says a VM start is blocked, and what to do.
    let out = doctor(&env, &["--config", &config]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(text.contains("BLOCKING"), "{text}");
    assert!(text.contains("reserve is disabled"), "{text}");
    assert!(
        text.contains("-> hugeprep pool --set N --node 0 --page-size 2M"),
        "{text}"
    );
    assert!(text.contains(&reason), "{text}");
    drop(d);
    drop(occupied);
    assert_eq!(node_pools(), before);
    assert_eq!(env.mount_used(), 0);
}

#[test]
fn a_bounded_reserve_fills_what_it_got_and_says_why() {
    let env = Env::fresh("reserve-bounds");
    let before = node_pools();
    let occupied = occupy_free_pages();
    // The limit lets the daemon add 16 of the 32 pages the target needs: it fills 32 MiB.
    let (mut d, _) = spawn_with_pool(
        &env,
        "capped.toml",
        "reserve_limit = \"32M\"\n[[pool.target]]\npage_size = \"2M\"\nwarm = \"64M\"\nsizes = [\"8M\"]\n",
    );
    let status = wait_status(&env, "32 MiB warm and a reason", |s| {
        s["pool"]["kinds"][0]["warm_bytes"] == 32 << 20
            && s["pool"]["kinds"][0]["reason"].is_string()
    });
    let kind = &status["pool"]["kinds"][0];
    assert_eq!(kind["reserved_pages"], 16, "{kind:#}");
    let reason = kind["reason"].as_str().unwrap();
    assert!(
        reason.contains("reserve_limit of 32 MiB reached"),
        "{reason}"
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&hugeprep(
        &env,
        &["drain", "--release-pools", "--json"],
    )))
    .unwrap();
    assert_eq!(report["released"][0]["released"], 16, "{report:#}");
    d.stop();
    assert_eq!(node_pools(), before);

    // A margin larger than the node: nothing is raised, and the reason says how much there is.
    let (d, _) = spawn_with_pool(
        &env,
        "margin.toml",
        "reserve_margin = \"100T\"\n[[pool.target]]\npage_size = \"2M\"\nwarm = \"64M\"\n",
    );
    let (_, reason) = wait_reason(&env);
    assert!(reason.contains("node 0 has "), "{reason}");
    assert!(reason.contains("available and keeps 100 TiB"), "{reason}");
    drop(d);
    drop(occupied);
    assert_eq!(node_pools(), before);
}

#[test]
fn release_on_stop_gives_the_pages_back_at_a_clean_stop() {
    let env = Env::fresh("release-on-stop");
    let before = node_pools();
    let occupied = occupy_free_pages();
    let (mut d, _) = spawn_with_pool(
        &env,
        "release.toml",
        "release_on_stop = true\n[[pool.target]]\npage_size = \"2M\"\nwarm = \"32M\"\n",
    );
    wait_status(&env, "32 MiB warm", |s| {
        s["pool"]["kinds"][0]["warm_bytes"] == 32 << 20
    });
    assert_eq!(
        node_pools(),
        before.iter().map(|p| p + 16).collect::<Vec<_>>()
    );
    d.stop();
    assert_eq!(node_pools(), before, "{}", env.log());
    assert!(Env::names(&env.pool_dir()).is_empty());
    drop(occupied);
}

/// `hugeprep reserve` (what `hugeprep-reserve.service` runs at boot) raises the pools to the
/// targets before the daemon starts; the daemon fills from those pages without raising more,
/// and `drain --release-pools` gives back exactly what the reserve added (one ledger).
#[test]
fn boot_reserve_raises_the_pools_and_drain_gives_them_back() {
    let env = Env::fresh("boot-reserve");
    let before = node_pools();
    let occupied = occupy_free_pages();
    let config = env.dir.join("reserve.toml");
    std::fs::write(
        &config,
        "[pool]\n[[pool.target]]\npage_size = \"2M\"\nwarm = \"16M\"\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let state = env.state.to_str().unwrap();
    let out = stdout(&hugeprep(
        &env,
        &[
            "reserve",
            "--strict",
            "--config",
            config,
            "--state-dir",
            state,
        ],
    ));
    assert!(
        out.contains("node 0 2M: 16 MiB target, added 8 pages"),
        "{out}"
    );
    let raised: Vec<u64> = before.iter().map(|p| p + 8).collect();
    assert_eq!(node_pools(), raised, "{out}");
    // Again, as JSON: the target is covered by the pages added, nothing more is added.
    let again: serde_json::Value = serde_json::from_str(&stdout(&hugeprep(
        &env,
        &[
            "reserve",
            "--json",
            "--config",
            config,
            "--state-dir",
            state,
        ],
    )))
    .unwrap();
    assert_eq!(again["enabled"], true, "{again:#}");
    let pool0 = &again["pools"][0];
    assert_eq!(pool0["node"], 0, "{again:#}");
    assert_eq!(pool0["page_size"], "2M", "{again:#}");
    assert_eq!(pool0["target_bytes"], 16 << 20, "{again:#}");
    assert_eq!(pool0["added"], 0, "{again:#}");
    assert_eq!(pool0["short"], 0, "{again:#}");
    assert_eq!(node_pools(), raised, "{again:#}");

    let mut d = env.spawn(&["--config", config]);
    wait_status(&env, "16 MiB warm", |s| {
        s["pool"]["kinds"][0]["warm_bytes"] == 16 << 20
    });
    assert_eq!(
        node_pools(),
        raised,
        "the daemon raised more\n{}",
        env.log()
    );
    let report = stdout(&hugeprep(&env, &["drain", "--release-pools", "--json"]));
    d.stop();
    drop(occupied);
    assert_eq!(node_pools(), before, "{report}\n{}", env.log());
}

#[test]
fn an_unreachable_daemon_is_reported_with_its_cause_once() {
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["status", "--socket", "/nonexistent/hugeprep.sock"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    assert!(err.contains("is the daemon running?"), "{err}");
}

/// The first start on a fresh host times the clearing methods on hugepages: the daemon raises
/// the part of its pool the calibration buffer needs before it times, records that in the
/// stored calibration (`memory`), and the ledger still ends at what the target needs. A
/// calibration stored earlier on ordinary memory (`hugeprep cpu --state-dir` with no free
/// hugepages) is measured again, and a restart reuses the hugepage one.
#[test]
fn first_start_calibrates_on_the_hugepages_it_raised() {
    let env = Env::fresh("calibrate-fresh");
    let before = node_pools();
    let occupied = occupy_free_pages();
    let state = env.state.to_str().unwrap().to_string();

    // Nothing free: `hugeprep cpu` can only time ordinary memory, and stores that.
    let cpu: serde_json::Value = serde_json::from_str(&stdout(&hugeprep(
        &env,
        &[
            "cpu",
            "--json",
            "--calibration",
            "auto",
            "--state-dir",
            &state,
        ],
    )))
    .unwrap();
    let measured = &cpu["calibration"]["measured"];
    assert_eq!(measured["hugepage_backed"], false, "{cpu:#}");
    assert_eq!(measured["memory"], "ordinary", "{cpu:#}");

    let mut d = env.spawn(&["--warm", "4G", "--calibration", "auto"]);
    let status = wait_status(&env, "4 GiB warm", |s| {
        s["pool"]["kinds"][0]["warm_bytes"] == 4 * GIB
    });
    let calibration = &status["cpu"]["calibration"];
    assert_eq!(
        calibration["measured"]["memory"],
        "daemon-hugepages",
        "{calibration:#}\n{}",
        env.log()
    );
    assert_eq!(calibration["measured"]["hugepage_backed"], true);
    assert_eq!(calibration["origin"]["kind"], "measured");
    assert!(
        calibration["origin"]["why"]
            .as_str()
            .unwrap()
            .contains("timed on ordinary memory"),
        "{calibration:#}"
    );
    // The calibration's pages were part of the raise, not on top of it.
    assert_eq!(status["pool"]["kinds"][0]["reserved_pages"], 2048);
    let text = stdout(&hugeprep(&env, &["status"]));
    assert!(
        text.contains("calibrated on 2M hugepages (added by the daemon for its warm target)"),
        "{text}"
    );
    let record =
        std::fs::read_to_string(env.state.join("calibration/records/clearing.json")).unwrap();
    assert!(record.contains("\"daemon-hugepages\""), "{record}");
    d.stop();

    // A restart reuses the stored hugepage calibration and `hugeprep cpu` shows its memory.
    let mut d = env.spawn(&["--warm", "4G", "--calibration", "auto"]);
    let status = wait_status(&env, "4 GiB warm again", |s| {
        s["pool"]["kinds"][0]["warm_bytes"] == 4 * GIB
    });
    assert_eq!(status["cpu"]["calibration"]["origin"]["kind"], "stored");
    let text = stdout(&hugeprep(
        &env,
        &["cpu", "--calibration", "auto", "--state-dir", &state],
    ));
    assert!(
        text.contains("of 2M hugepages (added by the daemon for its warm target)"),
        "{text}"
    );
    stdout(&hugeprep(&env, &["drain", "--release-pools", "--json"]));
    d.stop();
    drop(occupied);
    assert_eq!(node_pools(), before, "{}", env.log());
}

/// A daemon without an open watch (no CAP_SYS_ADMIN, so no fanotify) proves no release:
/// every one takes the kernel's path. /health says degraded with that reason, and doctor
/// warns with a remedy for the packaged service; leases are still served.
#[test]
fn a_release_proof_that_falls_back_is_degraded_with_its_reason() {
    let env = Env::new("proof-fallback", 8 << 20);
    let d = env.spawn_wrapped(
        &[
            "setpriv",
            "--bounding-set=-sys_admin",
            "--inh-caps=-sys_admin",
            "--",
        ],
        &[],
    );
    let lease = d.lease("fallback-vm", 2 << 20).unwrap();
    d.release(lease.id).unwrap();
    let (code, health) = d.raw("GET", "/health", b"");
    assert_eq!(code, 503, "{health:#}");
    let reason = health["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["reason"] == "proof_fallback")
        .unwrap_or_else(|| panic!("{health:#}"));
    assert!(
        reason["detail"].as_str().unwrap().contains("no open watch"),
        "{health:#}"
    );
    let out = doctor(&env, &["--json"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let found = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["subject"] == "release proof")
        .unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(found["severity"], "warning", "{found:#}");
    assert!(
        found["message"]
            .as_str()
            .unwrap()
            .starts_with("degraded: no open watch"),
        "{found:#}"
    );
    assert!(
        found["remedy"].as_str().unwrap().contains("systemctl"),
        "{found:#}"
    );
}
