//! The adaptive warm targets' known demand from a real OpenStack Placement (as
//! tests/placement.rs runs it): with an adaptive target, a VM's allocation not yet leased
//! raises the target before the lease (read per consumer, `GET .../allocations`); a
//! tenant's ordinary lease does not hide it, a second VM's allocation adds its size, and
//! the libvirt hook's lease for the first VM's UUID (by root, an admin) ends its demand.
//! Nova's resize of the stopped first VM and its revert move its allocation to the
//! migration's UUID and back, as Nova does (`POST /allocations`): neither is a VM about to
//! start, so the VMs scheduled after them count alone.

mod daemon_util;
#[path = "monitor_util/mod.rs"]
mod monitor_util;
#[path = "placement/util.rs"]
mod placement_util;

use std::path::Path;
use std::time::Duration;

use daemon_util::users::curl_json_as;
use daemon_util::{Daemon, Env, MIB};
use monitor_util::wait_for;
use placement_util::{Placement, CLASS};
use serde_json::{json, Value};

/// The adaptive target's report (`GET /v1/pool/adaptive`), its first target.
fn adaptive_target(d: &Daemon) -> Value {
    let (status, body) = d.raw("GET", "/v1/pool/adaptive", b"");
    assert_eq!(status, 200, "{body}");
    body["targets"][0].clone()
}

/// Waits (a liveness bound) until the adaptive target is `bytes` with `pending` known
/// demand in its why, and in force in the pool's policy.
fn wait_adaptive(d: &Daemon, what: &str, bytes: u64, pending: u64) -> Value {
    wait_for(Duration::from_secs(60), what, || {
        let t = adaptive_target(d);
        let ok = t["target_bytes"] == bytes
            && t["why"]["pending"] == pending
            && d.pool().kinds[0].target_bytes == bytes;
        ok.then_some(t)
    })
}

#[test]
fn an_allocation_not_yet_leased_raises_the_adaptive_target_before_the_lease() {
    let env = Env::new("placement-adaptive", 32 * MIB);
    let Some(placement) = Placement::start(&env.dir.join("placement")) else {
        return;
    };
    let host = placement.compute_node("host-c");
    let path = env.dir.join("adaptive.toml");
    std::fs::write(
        &path,
        format!(
            "[placement]\nendpoint = \"{}\"\ntoken = \"admin\"\ncompute_node = \"host-c\"\n\
             min_interval_ms = 100\n\n[pool]\n[[pool.target]]\npage_size = \"2M\"\n\
             goal = 99.0\nceiling = \"24M\"\n",
            placement.url
        ),
    )
    .unwrap();
    let d = env.spawn(&["--socket-group", "kvm", "--config", path.to_str().unwrap()]);
    let child = wait_for(Duration::from_secs(30), "the warm-memory provider", || {
        let p = placement.provider("host-c:hugeprep")?;
        Some(p["uuid"].as_str()?.to_string())
    });

    // One VM started and stopped: the target keeps its need (the day's peak) warm, and
    // Placement offers it.
    let first = d.lease("vm0", 4 * MIB).unwrap();
    d.release(first.id).unwrap();
    let t = wait_adaptive(&d, "the target after one start", 4 * MIB, 0);
    assert_eq!(t["starts"], 1, "{t}");
    d.settle(4 * MIB);
    wait_for(Duration::from_secs(30), "4 MiB warm offered", || {
        (placement.warm(&child) == (4, 0, 0)).then_some(())
    });

    // Nova schedules a VM of 4 MiB here: before its lease, the target rises by it (known
    // demand, shown in why) and the pool fills to it.
    let consumer = "5b1e7c2a-4444-4d6f-9a8b-1c2d3e4f5a6b";
    allocate(&placement, consumer, &host, &child, 4);
    let t = wait_adaptive(&d, "the target with the allocation", 8 * MIB, 4 * MIB);
    assert_eq!(t["starts"], 1, "no lease yet: {t}");
    d.settle(8 * MIB);

    // A tenant (uid 65534, a lease-role principal) leases as much: no VM's allocation is
    // its, so the demand stays. Then Nova schedules a second VM, of 2 MiB: the look that
    // sees it (after the tenant's lease) counts both.
    let body = r#"{"name":"tenant-vm","size":"4M"}"#;
    let (code, tenant) = curl_json_as(TENANT, &env, "POST", "/v1/leases", body);
    assert_eq!(code, 201, "{tenant}");
    let second = "7c3d5e7f-5555-4a1b-8c2d-3e4f5a6b7c8d";
    allocate(&placement, second, &host, &child, 2);
    let t = wait_pending(&d, "both VMs due despite the tenant's lease", 6 * MIB);
    assert_eq!(t["starts"], 2, "the tenant's lease is a start: {t}");

    // The first VM starts: the libvirt hook (root, an admin) leases its memory under the
    // name it derives from the domain's UUID (Nova's instance UUID, Placement's consumer;
    // spelt in capitals here: UUIDs match without case). Its demand is gone; the second's
    // stays.
    let name = format!("libvirt-{}-ua-ram", consumer.to_ascii_uppercase());
    let vm = d.lease(&name, 4 * MIB).unwrap();
    let t = wait_pending(&d, "the first VM served by its hook lease", 2 * MIB);
    assert_eq!(t["starts"], 3, "{t}");
    assert!(t["target_bytes"].as_u64().unwrap() >= 4 * MIB, "{t}");

    // The first VM stops (its lease released, its allocation kept), and its owner resizes
    // it: Nova moves its allocation here to the migration's UUID. A reading sees that, then
    // a third VM of 2 MiB is scheduled: the look it wakes counts the second and the third,
    // not the moved allocation (a new UUID with the amounts of one that just left).
    d.release(vm.id).unwrap();
    let requests = env.dir.join("placement");
    let migration = "9e0f1a2b-6666-4c3d-8e4f-5a6b7c8d9e0f";
    move_allocation(
        &placement,
        consumer,
        (migration, "MIGRATION"),
        4,
        &host,
        &child,
    );
    wait_read(&requests);
    let third = "1a2b3c4d-7777-4e5f-9a0b-1c2d3e4f5a6b";
    allocate(&placement, third, &host, &child, 2);
    wait_pending(&d, "the third VM due, the moved allocation not", 4 * MIB);
    // The owner reverts: the allocation moves back to the instance's UUID, a UUID that
    // left this hour. A fourth VM's look counts the three VMs scheduled, still not it.
    move_allocation(
        &placement,
        migration,
        (consumer, "INSTANCE"),
        4,
        &host,
        &child,
    );
    wait_read(&requests);
    let fourth = "2b3c4d5e-8888-4f6a-8b1c-2d3e4f5a6b7c";
    allocate(&placement, fourth, &host, &child, 2);
    wait_pending(
        &d,
        "the fourth VM due, the reverted allocation not",
        6 * MIB,
    );

    for c in [consumer, second, third, fourth] {
        let (s, v) = placement.call("DELETE", &format!("/allocations/{c}"), None);
        assert_eq!(s, 204, "{v}");
    }
    let id = tenant["id"].as_u64().unwrap();
    let (code, body) = curl_json_as(TENANT, &env, "DELETE", &format!("/v1/leases/{id}"), "");
    assert_eq!(code, 200, "{body}");
}

/// The tenant of the adaptive test: a lease-role principal in the socket's group.
const TENANT: u32 = 65534;

/// Allocates `mib` of the warm class (and a little of the compute node) to `consumer`, as
/// Nova's scheduler does.
fn allocate(placement: &Placement, consumer: &str, host: &str, child: &str, mib: u64) {
    let (s, v) = placement.call(
        "PUT",
        &format!("/allocations/{consumer}"),
        Some(json!({
            "allocations": {
                host: {"resources": {"VCPU": 1, "MEMORY_MB": mib}},
                child: {"resources": {CLASS: mib}},
            },
            "project_id": "6e8f0a1c-2222-4b3d-9e5f-7a9b1c3d5e7f",
            "user_id": "0a1b2c3d-3333-4e5f-8a9b-0c1d2e3f4a5b",
            "consumer_generation": null,
            "consumer_type": "INSTANCE",
        })),
    );
    assert_eq!(s, 204, "{v}");
}

/// Moves `mib` of the warm class (and the compute node's share) from consumer `from` to
/// `to` (its UUID and consumer type) in one request, as Nova's `move_allocations` does for
/// a resize or a migration (to the migration's UUID) and a revert (back to the instance's).
fn move_allocation(
    placement: &Placement,
    from: &str,
    (to, to_kind): (&str, &str),
    mib: u64,
    host: &str,
    child: &str,
) {
    let generation = |c: &str| {
        let (s, v) = placement.call("GET", &format!("/allocations/{c}"), None);
        assert_eq!(s, 200, "{v}");
        v["consumer_generation"].clone()
    };
    let owner = |allocations: Value, c: &str, kind: &str| {
        json!({
            "allocations": allocations,
            "project_id": "6e8f0a1c-2222-4b3d-9e5f-7a9b1c3d5e7f",
            "user_id": "0a1b2c3d-3333-4e5f-8a9b-0c1d2e3f4a5b",
            "consumer_generation": generation(c),
            "consumer_type": kind,
        })
    };
    let moved = json!({
        host: {"resources": {"VCPU": 1, "MEMORY_MB": mib}},
        child: {"resources": {CLASS: mib}},
    });
    let from_kind = if to_kind == "MIGRATION" {
        "INSTANCE"
    } else {
        "MIGRATION"
    };
    let body = json!({
        from: owner(json!({}), from, from_kind),
        to: owner(moved, to, to_kind),
    });
    let (s, v) = placement.call("POST", "/allocations", Some(body));
    assert_eq!(s, 204, "{v}");
}

/// The daemon's reads of its provider's allocations so far (`serve.py`'s requests.log).
fn reads(dir: &Path) -> usize {
    let log = std::fs::read_to_string(dir.join("requests.log")).unwrap_or_default();
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| {
            r["method"] == "GET"
                && r["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("/allocations"))
                && r["user_agent"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("hugeprep/"))
        })
        .count()
}

/// Waits (a liveness bound) until the daemon has read its allocations twice more: once
/// wholly after this call.
fn wait_read(dir: &Path) {
    let before = reads(dir);
    wait_for(
        Duration::from_secs(60),
        "two readings of the allocations",
        || (reads(dir) >= before + 2).then_some(()),
    );
}

/// Waits (a liveness bound) until the adaptive target's why shows `pending` known demand.
fn wait_pending(d: &Daemon, what: &str, pending: u64) -> Value {
    wait_for(Duration::from_secs(60), what, || {
        let t = adaptive_target(d);
        (t["why"]["pending"] == pending).then_some(t)
    })
}
