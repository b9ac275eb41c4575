//! Warm capacity in the real OpenStack Placement (PyPI openstack-placement in a venv,
//! `scripts/placement-venv`; sqlite, noauth2), with two compute-node providers, each with its
//! own daemon, one warm and one not:
//! - the scheduler's question (`GET /allocation_candidates`) finds only the warm host;
//! - an allocation like Nova's, made before the VM's lease, leaves no warm memory to offer
//!   twice (the back-to-back window); the lease that follows keeps the usage exact, through
//!   a generation conflict (409) the allocation caused;
//! - after the release and the scrub, the host is a candidate again;
//! - a wrong token and a compute node Placement does not know each get a clear log line and a
//!   backoff while leases go on (an unreachable Placement: tests/prometheus.rs);
//! - every request carries `User-Agent: hugeprep/VERSION`, its own `X-Openstack-Request-Id`
//!   and the lowest microversion its call needs (Placement's request log, `serve.py`);
//! - `max_unit` is the node's warm memory, one page when the node has none warm;
//! - a rotated `token_file` is read again when Placement refuses the token;
//! - `placement.inventory.inuse` is reported, not retried as a generation conflict;
//! - https through the system's CA store (`SSL_CERT_FILE`, as `rustls-native-certs` reads it)
//!   and through `cafile`, and a clear TLS error without either;
//! - a Placement whose version document stops at 1.17 (as Queens'; `serve.py` rewrites only
//!   that document) gets no call it cannot serve: a clear error names the call and 1.20.
//!
//! The adaptive targets' known demand from Placement: tests/placement_adaptive.rs.

mod daemon_util;
#[path = "monitor_util/mod.rs"]
mod monitor_util;
#[path = "placement/util.rs"]
mod placement_util;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use daemon_util::{Daemon, Env, MIB};
use monitor_util::wait_for;
use placement_util::{Placement, CLASS};
use serde_json::{json, Value};

fn config(dir: &Path, name: &str, placement: &str, compute_node: &str, token: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[placement]\nendpoint = \"{placement}\"\ntoken = \"{token}\"\n\
             compute_node = \"{compute_node}\"\nmin_interval_ms = 100\n"
        ),
    )
    .unwrap();
    path
}

fn wait_log(env: &Env, what: &str, needles: &[&str]) {
    wait_log_after(env, 0, what, needles);
}

/// As [`wait_log`], in the log past its first `from` bytes (this daemon's lines).
fn wait_log_after(env: &Env, from: usize, what: &str, needles: &[&str]) {
    wait_for(Duration::from_secs(30), what, || {
        env.log()
            .get(from..)?
            .lines()
            .any(|l| needles.iter().all(|n| l.contains(n)))
            .then_some(())
    });
}

/// Every request `serve.py` recorded from a daemon (its `User-Agent`), checked: the agent,
/// a fresh `req-<uuid>` each, and the microversion each call needs.
fn check_daemon_requests(dir: &Path) {
    let text = std::fs::read_to_string(dir.join("requests.log")).unwrap();
    let agent = concat!("hugeprep/", env!("CARGO_PKG_VERSION"));
    let mut ids = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        if !r["user_agent"]
            .as_str()
            .is_some_and(|a| a.starts_with("hugeprep/"))
        {
            continue;
        }
        assert_eq!(r["user_agent"], agent, "{r}");
        let id = r["request_id"].as_str().unwrap_or_default();
        let uuid = id.strip_prefix("req-").unwrap_or_default();
        assert!(
            uuid.len() == 36 && uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-'),
            "{r}"
        );
        assert!(ids.insert(id.to_string()), "request id used twice: {r}");
        let method = r["method"].as_str().unwrap();
        let path = r["path"].as_str().unwrap();
        let call = match (method, path) {
            ("GET", "/") => "version document",
            ("GET", "/resource_providers") => "find provider",
            ("POST", "/resource_providers") => "create provider",
            ("PUT", p) if p.starts_with("/resource_classes/") => "ensure class",
            ("GET", p) if p.ends_with("/usages") => "usages",
            ("GET", p) if p.ends_with("/allocations") => "allocations",
            ("PUT", p) if p.ends_with("/inventories") => "inventories",
            _ => panic!("an unexpected request: {r}"),
        };
        let want = match call {
            "version document" => None,
            "find provider" => Some("placement 1.14"),
            "create provider" => Some("placement 1.20"),
            "ensure class" => Some("placement 1.7"),
            "usages" | "allocations" => Some("placement 1.0"),
            _ => Some("placement 1.26"),
        };
        assert_eq!(r["version"].as_str(), want, "{call}: {r}");
        seen.insert(call);
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
}

fn lease_and_release(d: &Daemon) {
    let l = d
        .lease("meanwhile", 2 * MIB)
        .expect("a lease while Placement refuses");
    d.release(l.id).unwrap();
}

#[test]
fn only_warm_hosts_are_candidates_and_allocations_never_count_twice() {
    // Host A: room for its 16 MiB warm file and nothing more, so a 16 MiB lease empties it
    // until the release. Host B: no warm target.
    let a = Env::new("placement-a", 24 * MIB);
    let b = Env::beside(&a, "placement-b", 4 * MIB);
    let Some(placement) = Placement::start(&a.dir.join("placement")) else {
        return;
    };
    let host_a = placement.compute_node("host-a");
    let host_b = placement.compute_node("host-b");
    let url = placement.url.clone();
    let da = a.spawn(&[
        "--warm",
        "16M",
        "--config",
        config(&a.dir, "a", &url, "host-a", "admin")
            .to_str()
            .unwrap(),
    ]);
    let db = b.spawn(&[
        "--no-reserve",
        "--config",
        config(&b.dir, "b", &url, "host-b", "admin")
            .to_str()
            .unwrap(),
    ]);
    da.settle(16 * MIB);

    // Each daemon made a child of its compute node's provider and published its inventory.
    let child = |name: &str, parent: &str| {
        wait_for(Duration::from_secs(30), name, || {
            let p = placement.provider(name)?;
            assert_eq!(p["parent_provider_uuid"], parent, "{p}");
            Some(p["uuid"].as_str().unwrap().to_string())
        })
    };
    let child_a = child("host-a:hugeprep", &host_a);
    let child_b = child("host-b:hugeprep", &host_b);
    wait_for(Duration::from_secs(30), "A's warm 16 MiB published", || {
        (placement.warm(&child_a) == (16, 0, 0)).then_some(())
    });
    assert_eq!(placement.max_unit(&child_a), Some(16));
    wait_for(Duration::from_secs(30), "B's empty pool published", || {
        (placement.warm(&child_b) == (2, 2, 0)).then_some(())
    });

    // The scheduler's question finds only the warm host.
    let flavor = format!("VCPU:1,MEMORY_MB:16,{CLASS}:16");
    assert_eq!(
        placement.candidates(&flavor),
        BTreeSet::from([host_a.clone()])
    );
    assert_eq!(
        placement.candidates(&format!("{CLASS}:2")),
        BTreeSet::from([host_a.clone()])
    );

    // Nova schedules a VM on A: its allocation claims the warm memory at once. Before the
    // lease (and before the daemon publishes anything) no second VM can be offered it.
    let consumer = "9d3a2b5e-1111-4c1e-8d6a-3f0c5b7e9a01";
    let (s, v) = placement.call(
        "PUT",
        &format!("/allocations/{consumer}"),
        Some(json!({
            "allocations": {
                host_a.clone(): {"resources": {"VCPU": 1, "MEMORY_MB": 16}},
                child_a.clone(): {"resources": {CLASS: 16}},
            },
            "project_id": "6e8f0a1c-2222-4b3d-9e5f-7a9b1c3d5e7f",
            "user_id": "0a1b2c3d-3333-4e5f-8a9b-0c1d2e3f4a5b",
            "consumer_generation": null,
            "consumer_type": "INSTANCE",
        })),
    );
    assert_eq!(s, 204, "{v}");
    assert!(placement.candidates(&format!("{CLASS}:2")).is_empty());
    assert!(placement.candidates(&flavor).is_empty());

    // The VM starts: its lease takes the warm file. The daemon's next update meets the
    // generation the allocation changed (409), re-reads, and publishes: usage stays exact
    // (16 used of 16 offered), nothing is offered twice.
    let lease = da.lease("vm1", 16 * MIB).unwrap();
    assert_eq!(lease.source.name(), "warm-exact");
    wait_log(&a, "the 409 re-read", &["generation conflict"]);
    wait_for(
        Duration::from_secs(30),
        "A's inventory after the lease",
        || (placement.warm(&child_a) == (16, 0, 16)).then_some(()),
    );
    assert!(placement.candidates(&format!("{CLASS}:2")).is_empty());
    // Nothing warm on the node: no VM can get more than one page from it.
    wait_for(Duration::from_secs(30), "max_unit one page", || {
        (placement.max_unit(&child_a) == Some(2)).then_some(())
    });
    let (s, v) = placement.call(
        "GET",
        &format!("/resource_providers/{child_a}/usages"),
        None,
    );
    assert_eq!((s, v["usages"][CLASS].as_u64()), (200, Some(16)), "{v}");
    let (_, text) = da
        .client
        .blocking(da.client.request("GET".parse().unwrap(), "/metrics", None))
        .unwrap();
    let text = String::from_utf8_lossy(&text);
    let conflicts = text
        .lines()
        .find_map(|l| l.strip_prefix("hugeprep_placement_updates_total{result=\"conflict\"} "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(conflicts >= Some(1), "{text}");

    // The VM is deleted: Nova removes the allocation, the hook releases the lease; after the
    // scrub the host is a candidate again.
    let (s, v) = placement.call("DELETE", &format!("/allocations/{consumer}"), None);
    assert_eq!(s, 204, "{v}");
    da.release(lease.id).unwrap();
    da.settle(16 * MIB);
    wait_for(Duration::from_secs(30), "A a candidate again", || {
        (placement.candidates(&flavor) == BTreeSet::from([host_a.clone()])).then_some(())
    });
    assert_eq!(placement.warm(&child_a), (16, 0, 0));
    assert_eq!(placement.max_unit(&child_a), Some(16));
    drop(db);
    check_daemon_requests(&a.dir.join("placement"));

    // Bad input: each a clear line and a backoff; leases go on.
    drop(da);
    let da = a.spawn(&[
        "--warm",
        "16M",
        "--config",
        config(&a.dir, "a-token", &url, "host-a", "bogus")
            .to_str()
            .unwrap(),
    ]);
    for wait in ["retry_in_s=1 ", "retry_in_s=2 "] {
        wait_log(
            &a,
            "the wrong token's backoff",
            &[
                "Placement refused the credentials (403 Forbidden)",
                "state=\"auth\"",
                wait,
            ],
        );
    }
    da.settle(16 * MIB);
    lease_and_release(&da);
    let (status, health) = da.raw("GET", "/health", b"");
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["reasons"][0]["reason"], "placement", "{health}");
    drop(da);

    let da = a.spawn(&[
        "--warm",
        "16M",
        "--config",
        config(&a.dir, "a-missing", &url, "host-missing", "admin")
            .to_str()
            .unwrap(),
    ]);
    for wait in ["retry_in_s=1 ", "retry_in_s=2 "] {
        wait_log(
            &a,
            "the missing compute node's backoff",
            &[
                "no resource provider named \"host-missing\" in Placement",
                "state=\"no_compute_node\"",
                wait,
            ],
        );
    }
    da.settle(16 * MIB);
    lease_and_release(&da);
    // A's provider still says what the last good update wrote.
    assert_eq!(placement.warm(&child_a), (16, 0, 0));
}

/// Writes `text` to `path`, mode 0600 (as a secret file must be).
fn write_secret(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A CA and a certificate it signed for 127.0.0.1, made with openssl: `(ca.pem, cert, key)`.
fn tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=hugeprep test CA",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

#[test]
fn rotated_tokens_inventory_in_use_tls_and_an_old_version_document() {
    let env = Env::new("placement-corners", 4 * MIB);
    let Some(placement) = Placement::start(&env.dir.join("placement")) else {
        return;
    };
    let url = placement.url.clone();

    // A token_file that Placement refuses, rotated while the daemon runs: read again at the
    // next refusal, no restart.
    let host_r = placement.compute_node("host-r");
    let token = env.dir.join("token");
    write_secret(&token, "bogus\n");
    let cfg = env.dir.join("rotate.toml");
    std::fs::write(
        &cfg,
        format!(
            "[placement]\nendpoint = \"{url}\"\ntoken_file = \"{}\"\ncompute_node = \"host-r\"\nmin_interval_ms = 100\n",
            token.display()
        ),
    )
    .unwrap();
    let d = env.spawn(&["--config", cfg.to_str().unwrap()]);
    wait_log(
        &env,
        "the refused token's backoff",
        &[
            "Placement refused the credentials (403 Forbidden)",
            "(request req-",
            "retry_in_s=1 ",
        ],
    );
    write_secret(&token, "admin\n");
    wait_log(
        &env,
        "the rotated token read",
        &["read a new token from token_file"],
    );
    wait_for(
        Duration::from_secs(30),
        "published with the new token",
        || {
            let p = placement.provider("host-r:hugeprep")?;
            assert_eq!(p["parent_provider_uuid"], host_r.as_str(), "{p}");
            let uuid = p["uuid"].as_str()?.to_string();
            (placement.warm(&uuid) == (2, 2, 0)).then_some(())
        },
    );
    drop(d);

    // A class the daemon no longer serves (1 GiB pages taken out of its configuration) still
    // holds a VM's allocation: Placement answers 409 placement.inventory.inuse, reported and
    // backed off, never re-read as a generation conflict.
    let host_u = placement.compute_node("host-u");
    let (s, v) = placement.call(
        "POST",
        "/resource_providers",
        Some(json!({"name": "host-u:hugeprep", "parent_provider_uuid": host_u})),
    );
    assert_eq!(s, 200, "{v}");
    let child_u = v["uuid"].as_str().unwrap().to_string();
    let big = "CUSTOM_HUGEPREP_WARM_1G";
    let (s, v) = placement.call("PUT", &format!("/resource_classes/{big}"), None);
    assert!(s == 201 || s == 204, "{s} {v}");
    let (s, v) = placement.call(
        "PUT",
        &format!("/resource_providers/{child_u}/inventories"),
        Some(json!({"resource_provider_generation": 0,
            "inventories": {big: {"total": 2048, "min_unit": 1024, "step_size": 1024, "max_unit": 1024}}})),
    );
    assert_eq!(s, 200, "{v}");
    let (s, v) = placement.call(
        "PUT",
        "/allocations/5b1f3c2a-4444-4d5e-9f6a-7b8c9d0e1f2a",
        Some(json!({
            "allocations": {child_u.clone(): {"resources": {big: 1024}}},
            "project_id": "6e8f0a1c-2222-4b3d-9e5f-7a9b1c3d5e7f",
            "user_id": "0a1b2c3d-3333-4e5f-8a9b-0c1d2e3f4a5b",
            "consumer_generation": null,
            "consumer_type": "INSTANCE",
        })),
    );
    assert_eq!(s, 204, "{v}");
    let from = env.log().len();
    let d = env.spawn(&[
        "--config",
        config(&env.dir, "inuse", &url, "host-u", "admin")
            .to_str()
            .unwrap(),
    ]);
    for wait in ["retry_in_s=1 ", "retry_in_s=2 "] {
        wait_log_after(
            &env,
            from,
            "the in-use inventory reported",
            &["placement.inventory.inuse", "state=\"error\"", wait],
        );
    }
    assert!(
        !env.log()[from..].contains("generation conflict"),
        "{}",
        &env.log()[from..]
    );
    drop(d);
    drop(placement);

    // https: the system's CA store (SSL_CERT_FILE), then cafile, then neither.
    let (ca, cert, key) = tls_files(&env.dir.join("tls"));
    let Some(tls) = Placement::start_with(
        &env.dir.join("placement-tls"),
        &["--tls", cert.to_str().unwrap(), key.to_str().unwrap()],
        "https",
    ) else {
        return;
    };
    let answered = "no resource provider named \"host-tls\" in Placement";
    let plain = config(&env.dir, "tls", &tls.url, "host-tls", "admin");
    let with_ca = env.dir.join("tls-cafile.toml");
    std::fs::write(
        &with_ca,
        format!(
            "{}cafile = \"{}\"\n",
            std::fs::read_to_string(&plain).unwrap(),
            ca.display()
        ),
    )
    .unwrap();
    let store = format!("SSL_CERT_FILE={}", ca.display());
    let unset = ["env", "-u", "SSL_CERT_FILE", "-u", "SSL_CERT_DIR"];
    for (wrapper, cfg, needle) in [
        (vec!["env", store.as_str()], &plain, answered),
        (unset.to_vec(), &with_ca, answered),
        (unset.to_vec(), &plain, "Placement unreachable"),
    ] {
        let from = env.log().len();
        let d = env.spawn_wrapped(&wrapper, &["--config", cfg.to_str().unwrap()]);
        wait_log_after(&env, from, needle, &[needle, "retry_in_s=1 "]);
        drop(d);
    }
    // Without the CA the handshake fails and says why (or, on a host without any CA
    // bundle, the store says it is empty).
    let log = env.log();
    let last = log
        .lines()
        .rev()
        .find(|l| l.contains("Placement unreachable"))
        .unwrap();
    assert!(
        last.contains("invalid peer certificate") || last.contains("no usable certificate"),
        "{last}"
    );
    drop(tls);

    // A Placement whose version document ends at 1.17: no call above it is sent.
    let Some(old) = Placement::start_with(
        &env.dir.join("placement-old"),
        &["--cap-max-version", "1.17"],
        "http",
    ) else {
        return;
    };
    old.compute_node("host-q");
    let from = env.log().len();
    let d = env.spawn(&[
        "--config",
        config(&env.dir, "old", &old.url, "host-q", "admin")
            .to_str()
            .unwrap(),
    ]);
    wait_log_after(
        &env,
        from,
        "the too-old Placement's error",
        &[
            "serves microversions up to 1.17, and creating a provider under a parent needs 1.20",
            "state=\"error\"",
        ],
    );
    assert_eq!(old.provider("host-q:hugeprep"), None);
    drop(d);
    let text = std::fs::read_to_string(env.dir.join("placement-old/requests.log")).unwrap();
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let daemon = r["user_agent"]
            .as_str()
            .is_some_and(|a| a.starts_with("hugeprep/"));
        assert!(
            !(daemon && r["method"] == "POST"),
            "the daemon sent a call the server is too old for: {r}"
        );
    }
}
