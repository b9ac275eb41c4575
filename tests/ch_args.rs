//! `hugeprep ch-args` against the real daemon: the command line for cloud-hypervisor, and the
//! `vm.create` `memory` and `numa` members checked against the types cloud-hypervisor's
//! published OpenAPI spec generates (crate `cloud-hypervisor-client`, api-spec 0.3.0): a round
//! trip through `MemoryConfig` and `NumaConfig` must keep every field, so a misnamed or
//! mistyped field fails. `tests/ch_real.rs` boots both in a real cloud-hypervisor.

mod daemon_util;

use std::process::Command;

use cloud_hypervisor_client::models::{MemoryConfig, NumaConfig};
use daemon_util::{Env, MIB};

fn ch_args(env: &Env, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .arg("ch-args")
        .arg("--socket")
        .arg(&env.socket)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn ch_args_for_two_leases_match_cloud_hypervisors_schema() {
    let env = Env::new("ch-args", 8 * MIB);
    let d = env.spawn(&[]);
    let a = d.lease("vm-a", 2 * MIB).unwrap();
    let b = d.lease("vm-b", 4 * MIB).unwrap();
    let out = ch_args(&env, &["vm-a", &b.id.to_string()]);
    assert!(out.status.success(), "{out:?}");
    let line = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        line.trim(),
        format!(
            "--memory size=0 --memory-zone id=mem0,size=2097152,file={},shared=on id=mem1,size=4194304,file={},shared=on",
            a.path.display(),
            b.path.display()
        )
    );
    // One guest NUMA node per lease.
    let out = ch_args(&env, &["--numa", "vm-a", "vm-b"]);
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .ends_with(" --numa guest_numa_id=0,memory_zones=mem0 guest_numa_id=1,memory_zones=mem1"));
    let out = ch_args(&env, &["--json", "--numa", "vm-a", "vm-b"]);
    assert!(out.status.success(), "{out:?}");
    let members: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let numa = members["numa"].clone();
    let typed: Vec<NumaConfig> = serde_json::from_value(numa.clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap(), numa);
    assert_eq!(
        typed[1].memory_zones.as_deref(),
        Some(&["mem1".to_string()][..])
    );
    let ours = members["memory"].clone();
    let typed: MemoryConfig = serde_json::from_value(ours.clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap(), ours);
    let zones = typed.zones.unwrap();
    assert_eq!(typed.size, 0);
    assert_eq!(zones.len(), 2);
    assert_eq!(zones[1].file.as_deref(), b.path.to_str());
    assert_eq!(zones[1].shared, Some(true));
    // A name that is no lease is an error naming it.
    let out = ch_args(&env, &["nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"nope\""));
}
