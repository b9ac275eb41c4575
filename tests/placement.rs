//! Warm capacity in the real OpenStack Placement (PyPI openstack-placement in a venv,
//! `scripts/placement-venv`; sqlite, noauth2), with two compute-node providers, each with its
//! own daemon, one warm and one not:
//! - the scheduler's question (`GET /allocation_candidates`) finds only the warm host;
//! - an allocation like Nova's, made before the VM's lease, leaves no warm memory to offer
//!   twice (the back-to-back window); the lease that follows keeps the usage exact, through
//!   a generation conflict (409) the allocation caused;
//! - after the release and the scrub, the host is a candidate again;
//! - a wrong token and a compute node Placement does not know each get a clear log line and a
//!   backoff while leases go on (an unreachable Placement: tests/prometheus.rs).

mod daemon_util;
#[path = "monitor_util/mod.rs"]
mod monitor_util;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use daemon_util::{Daemon, Env, MIB};
use monitor_util::{http, json, wait_for, Guard};
use serde_json::{json, Value};

const CLASS: &str = "CUSTOM_HUGEPREP_WARM_2M";

/// A Placement service on a loopback port, stopped on drop.
struct Placement {
    url: String,
    _server: Guard,
}

impl Placement {
    fn start(dir: &Path) -> Option<Placement> {
        let venv = match std::env::var_os("HUGEPREP_PLACEMENT_VENV") {
            Some(v) => PathBuf::from(v),
            None => {
                let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/placement-venv");
                let out = Command::new(script).output().unwrap();
                if !out.status.success() {
                    hugeprep::testing::missing_tool(&format!(
                        "the OpenStack Placement venv (scripts/placement-venv): {}",
                        String::from_utf8_lossy(&out.stderr)
                    ));
                    return None;
                }
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
        };
        std::fs::create_dir_all(dir).unwrap();
        let log = std::fs::File::create(dir.join("placement.log")).unwrap();
        let server = Guard(
            Command::new(venv.join("bin/python"))
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/placement/serve.py"))
                .arg(dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let port = wait_for(Duration::from_secs(60), "Placement's port", || {
            std::fs::read_to_string(dir.join("port")).ok()
        });
        Some(Placement {
            url: format!("http://127.0.0.1:{}", port.trim()),
            _server: server,
        })
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|b| b.to_string());
        let a = http(
            method,
            &format!("{}{path}", self.url),
            &[
                ("x-auth-token", "admin"),
                ("openstack-api-version", "placement 1.39"),
                ("content-type", "application/json"),
            ],
            body.as_deref(),
        );
        let v = if a.body.is_empty() {
            Value::Null
        } else {
            json(&a)
        };
        (a.status.as_u16(), v)
    }

    /// A compute node's provider as Nova makes it, with its memory and CPUs.
    fn compute_node(&self, name: &str) -> String {
        let (s, v) = self.call("POST", "/resource_providers", Some(json!({ "name": name })));
        assert_eq!(s, 200, "{v}");
        let uuid = v["uuid"].as_str().unwrap().to_string();
        let (s, v) = self.call(
            "PUT",
            &format!("/resource_providers/{uuid}/inventories"),
            Some(json!({"resource_provider_generation": 0, "inventories": {
                "VCPU": {"total": 8}, "MEMORY_MB": {"total": 65536}}})),
        );
        assert_eq!(s, 200, "{v}");
        uuid
    }

    fn provider(&self, name: &str) -> Option<Value> {
        let (s, v) = self.call("GET", &format!("/resource_providers?name={name}"), None);
        assert_eq!(s, 200, "{v}");
        v["resource_providers"].as_array()?.first().cloned()
    }

    /// `(total, reserved)` of the class on provider `uuid`, and its usage.
    fn warm(&self, uuid: &str) -> (u64, u64, u64) {
        let (_, inv) = self.call(
            "GET",
            &format!("/resource_providers/{uuid}/inventories"),
            None,
        );
        let (_, usage) = self.call("GET", &format!("/resource_providers/{uuid}/usages"), None);
        let i = &inv["inventories"][CLASS];
        (
            i["total"].as_u64().unwrap_or(0),
            i["reserved"].as_u64().unwrap_or(0),
            usage["usages"][CLASS].as_u64().unwrap_or(0),
        )
    }

    /// The root providers (compute nodes) Placement offers for `resources`, as Nova's
    /// scheduler asks.
    fn candidates(&self, resources: &str) -> BTreeSet<String> {
        let (s, v) = self.call(
            "GET",
            &format!("/allocation_candidates?resources={resources}"),
            None,
        );
        assert_eq!(s, 200, "{v}");
        let summaries = &v["provider_summaries"];
        v["allocation_requests"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["allocations"].as_object().unwrap().keys().cloned())
            .map(|rp| {
                summaries[&rp]["root_provider_uuid"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }
}

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
    wait_for(Duration::from_secs(30), what, || {
        env.log()
            .lines()
            .any(|l| needles.iter().all(|n| l.contains(n)))
            .then_some(())
    });
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
    drop(db);

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
