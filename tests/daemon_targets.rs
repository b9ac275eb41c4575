//! Targets over the API, idempotent leases and capacity, against the real daemon: targets set
//! with `PUT /v1/pool/targets` apply at once, survive a reload and a restart, win over the
//! configuration file until `DELETE` returns to it, and a refused request changes nothing; a
//! lease request retried with the same idempotency key gets the same lease, never a second.

mod daemon_util;

use std::process::Command;
use std::time::{Duration, Instant};

use daemon_util::{http, Daemon, Env, MIB};
use serde_json::{json, Value};

fn targets(d: &Daemon) -> Value {
    let (status, body) = d.raw("GET", "/v1/pool/targets", b"");
    assert_eq!(status, 200, "{body}");
    body
}

fn hugeprep(env: &Env, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(args)
        .arg("--socket")
        .arg(&env.socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Waits (a liveness bound) until the daemon's log holds `needle` `count` times.
fn wait_log(env: &Env, needle: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.log().matches(needle).count() < count {
        assert!(Instant::now() < deadline, "no {needle:?} in the log");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn api_targets_apply_now_survive_reload_and_restart_and_clear_back_to_the_file() {
    let env = Env::new("targets", 96 * MIB);
    let config = env.dir.join("config.toml");
    std::fs::write(
        &config,
        "[pool]\n[[pool.target]]\npage_size = \"2M\"\nwarm = \"16M\"\n",
    )
    .unwrap();
    let cfg = ["--config", config.to_str().unwrap()];
    let mut d = env.spawn(&cfg);
    d.settle(16 * MIB);
    let t = targets(&d);
    assert_eq!(t["source"], "config", "{t}");
    assert_eq!(t["targets"][0]["warm"], 16 * MIB);

    // Flavors over the API: 2 x 8 MiB + 1 x 16 MiB, in force without a restart.
    let body = json!({"targets": [{"page_size": "2M", "flavors": [
        {"size": "8M", "count": 2}, {"size": 16 * MIB, "count": 1}]}]});
    let (status, t) = d.raw("PUT", "/v1/pool/targets", body.to_string().as_bytes());
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["source"], "api", "{t}");
    assert_eq!(t["targets"][0]["warm"], 32 * MIB);
    assert_eq!(t["config_targets"][0]["warm"], 16 * MIB);
    let p = d.settle(32 * MIB);
    assert_eq!(p.kinds[0].warm_files, 3, "{:?}", p.kinds[0]);
    assert!(env.state.join("targets/records/api.json").exists());

    // Capacity: every warm byte, the largest file, and warm plus what the kernel can add.
    let (status, cap) = d.raw("GET", "/v1/capacity", b"");
    assert_eq!(status, 200, "{cap}");
    let k = &cap["kinds"][0];
    assert_eq!(k["warm_bytes"], 32 * MIB, "{cap}");
    assert_eq!(k["warm_files"], 3);
    assert_eq!(k["largest_warm_bytes"], 16 * MIB);
    let avail = k["kernel_available_bytes"].as_u64().unwrap();
    assert!(avail <= 64 * MIB, "within the mount's limit: {cap}");
    assert_eq!(k["total_bytes"].as_u64().unwrap(), 32 * MIB + avail);
    assert!(hugeprep(&env, &["capacity"]).contains("16 MiB"));

    // Refused requests name the field and change nothing.
    let before = targets(&d);
    let bad: &[(&str, Value)] = &[
        (
            "targets[0].sizes[0]",
            json!({"targets": [{"page_size": "2M", "warm": "8M", "sizes": ["3M"]}]}),
        ),
        (
            "targets[0].page_size",
            json!({"targets": [{"page_size": "1G", "warm": "1G"}]}),
        ),
        (
            "targets[0].page_size",
            json!({"targets": [{"page_size": "4K", "warm": "1G"}]}),
        ),
        (
            "targets[0].node",
            json!({"targets": [{"page_size": "2M", "node": 4096, "warm": "8M"}]}),
        ),
        (
            "targets[0].node",
            json!({"targets": [{"page_size": "2M", "node": -1, "warm": "8M"}]}),
        ),
        (
            "targets[0].colour",
            json!({"targets": [{"page_size": "2M", "warm": "8M", "colour": 1}]}),
        ),
        (
            "targets[0].flavors[0].count",
            json!({"targets": [{"page_size": "2M", "flavors": [{"size": "8M", "count": 0}]}]}),
        ),
        (
            "targets[0].warm",
            json!({"targets": [{"page_size": "2M", "warm": "64T"}]}),
        ),
        (
            "targets[0].warm",
            json!({"targets": [{"page_size": "2M", "warm": "lots"}]}),
        ),
        ("targets[0].warm", json!({"targets": [{"page_size": "2M"}]})),
        (
            "targets[1].node",
            json!({"targets": [{"page_size": "2M", "warm": "8M"}, {"page_size": "2M", "warm": "4M"}]}),
        ),
        ("targets", json!({})),
        ("targets", json!({"targets": 3})),
    ];
    for (field, body) in bad {
        let (status, err) = d.raw("PUT", "/v1/pool/targets", body.to_string().as_bytes());
        assert_eq!(status, 400, "{body}: {err}");
        assert_eq!(err["field"], *field, "{body}: {err}");
        assert!(err["error"].as_str().unwrap().contains(field), "{err}");
    }
    let (status, err) = d.raw("PUT", "/v1/pool/targets", b"{\"targets\": [");
    assert_eq!(status, 400, "{err}");
    assert_eq!(targets(&d), before);
    assert_eq!(d.pool().kinds[0].target_bytes, 32 * MIB);

    // A reload re-reads the file, and the API targets stay in force.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    wait_log(&env, "reloaded: new pool policy in force", 1);
    assert_eq!(targets(&d)["source"], "api");
    assert_eq!(d.pool().kinds[0].target_bytes, 32 * MIB);

    // And a restart. The boot-time reserve reads the persisted targets too (the kernel has the
    // pages free here, so it adds none).
    d.stop();
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args([
            "reserve",
            "--config",
            config.to_str().unwrap(),
            "--state-dir",
        ])
        .arg(&env.state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("set over the API"), "{text}");
    assert!(text.contains("32 MiB target, added 0 pages"), "{text}");
    let mut d = env.spawn(&cfg);
    let t = targets(&d);
    assert_eq!(t["source"], "api", "{t}");
    assert_eq!(t["targets"][0]["flavors"][1]["size"], 16 * MIB);
    d.settle(32 * MIB);

    // The CLI sets one target; DELETE (the CLI's --clear) returns to the file's.
    let shown = hugeprep(&env, &["targets", "--page-size", "2M", "--flavor", "8M:3"]);
    assert!(shown.contains("set over the API"), "{shown}");
    d.settle(24 * MIB);
    let shown = hugeprep(&env, &["targets", "--clear"]);
    assert!(shown.contains("from the configuration"), "{shown}");
    assert_eq!(targets(&d)["source"], "config");
    d.settle(16 * MIB);
    assert!(!env.state.join("targets/records/api.json").exists());
    d.stop();
    let d = env.spawn(&cfg);
    assert_eq!(targets(&d)["source"], "config");
    d.settle(16 * MIB);
}

#[test]
fn a_retried_lease_with_the_same_idempotency_key_gets_the_same_lease() {
    let env = Env::new("idempotent", 64 * MIB);
    let mut d = env.spawn(&[]);
    let body = json!({"name": "vm1", "size": "4M"}).to_string();
    let key = [("Idempotency-Key", "req-1")];
    let (status, _, first) = http(&env.socket, "POST", "/v1/leases", &key, &body);
    assert_eq!(status, 201, "{first}");
    let (status, head, again) = http(&env.socket, "POST", "/v1/leases", &key, &body);
    assert_eq!(status, 200, "{again}");
    assert!(head.contains("idempotent-replayed: true"), "{head}");
    assert_eq!(again, first);
    // The key in the body is the same key.
    let in_body = json!({"name": "vm1", "size": "4M", "idempotency_key": "req-1"}).to_string();
    let (status, _, again) = http(&env.socket, "POST", "/v1/leases", &[], &in_body);
    assert_eq!((status, &again), (200, &first));
    assert_eq!(d.leases().len(), 1);

    // The same key with another request, or a header and a body that disagree: refused.
    let other = json!({"name": "vm1", "size": "8M"}).to_string();
    let (status, _, err) = http(&env.socket, "POST", "/v1/leases", &key, &other);
    assert_eq!(status, 422, "{err}");
    assert_eq!(err["field"], "idempotency_key");
    let (status, _, err) = http(
        &env.socket,
        "POST",
        "/v1/leases",
        &[("Idempotency-Key", "req-2")],
        &in_body,
    );
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["field"], "idempotency_key");
    let (status, _, err) = http(
        &env.socket,
        "POST",
        "/v1/leases",
        &[("Idempotency-Key", "has space")],
        &body,
    );
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["field"], "idempotency_key");
    assert_eq!(d.leases().len(), 1);

    // Eight clients retrying at once: one lease.
    let socket = env.socket.clone();
    let body2 = json!({"name": "vm2", "size": "8M"}).to_string();
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    let (st, _, b) = http(
                        &socket,
                        "POST",
                        "/v1/leases",
                        &[("Idempotency-Key", "req-3")],
                        &body2,
                    );
                    (st, b)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        answers.iter().filter(|a| a.0 == 201).count(),
        1,
        "{answers:?}"
    );
    assert!(answers.iter().all(|a| a.1 == answers[0].1), "{answers:?}");
    assert_eq!(d.leases().len(), 2);

    // After a restart the key still names its lease.
    d.stop();
    let d = env.spawn(&[]);
    let (status, _, again) = http(&env.socket, "POST", "/v1/leases", &key, &body);
    assert_eq!((status, &again), (200, &first), "{again}");
    for l in d.leases() {
        d.release(l.id).unwrap();
    }
    assert!(d.leases().is_empty());
}
