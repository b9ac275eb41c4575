//! `hugeprep bench vm-start --migrate` and `--hotplug` run end to end against real QEMU/KVM,
//! briefly (a smoke test: the numbers are the benchmark's business, not a test's): every
//! destination case of an incoming migration and every plug case reports, and bad input is
//! refused naming the flag.

mod daemon_util;

use std::path::Path;
use std::process::Command;

fn qemu_present() -> bool {
    for tool in ["/usr/bin/qemu-system-x86_64", "/dev/kvm"] {
        if !Path::new(tool).exists() {
            hugeprep::testing::missing_tool(&format!("{tool} missing (install qemu-system-x86)"));
            return false;
        }
    }
    true
}

fn cases(result: &serde_json::Value) -> Vec<String> {
    result["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["case"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn migrate_reports_every_destination_case() {
    if !qemu_present() {
        return;
    }
    let report = daemon_util::vm_start_report(&[
        "--migrate",
        "--sizes",
        "64M",
        "--page-size",
        "2M",
        "--reps",
        "1",
        "--headroom",
        "0",
        "--json",
    ]);
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{report}");
    assert_eq!(results[0]["page_size"], "2M");
    assert_eq!(
        cases(&results[0]),
        ["hugeprep", "prealloc", "floor"],
        "{report}"
    );
    for c in results[0]["cases"].as_array().unwrap() {
        for key in ["ready", "total", "downtime", "loaded"] {
            assert!(c[key]["median"].as_f64().unwrap() >= 0.0, "{key}: {report}");
        }
        assert_eq!(c["samples"].as_array().unwrap().len(), 1);
    }
    assert!(
        results[0]["ready_above_floor"]["median"].is_f64(),
        "{report}"
    );
    assert!(
        results[0]["total_over_floor"]["median"].is_f64(),
        "{report}"
    );
}

#[test]
fn hotplug_reports_every_plug_case() {
    if !qemu_present() {
        return;
    }
    let report = daemon_util::vm_start_report(&[
        "--hotplug",
        "--sizes",
        "64M",
        "--page-size",
        "2M",
        "--reps",
        "1",
        "--headroom",
        "0",
        "--json",
    ]);
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{report}");
    assert_eq!(
        cases(&results[0]),
        ["hugeprep", "prealloc", "floor", "hugeprep-virtio-mem"],
        "{report}"
    );
    assert!(
        results[0]["hugeprep_over_prealloc"]["median"].is_f64(),
        "{report}"
    );
}

#[test]
fn migrate_refuses_bad_input() {
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args([
            "bench",
            "vm-start",
            "--migrate",
            "--sizes",
            "3M",
            "--reps",
            "1",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--sizes: 3145728 is not a positive multiple"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["bench", "vm-start", "--migrate", "--hotplug"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be used with"),
        "{out:?}"
    );
}
