//! `hugeprep bench vm-start --concurrent N` runs end to end (a smoke test: N VMs at once,
//! QEMU alone and through a private libvirtd, for every case; the figures are the
//! benchmark's business, not a test's).

mod daemon_util;

use std::process::Command;

#[test]
fn bench_vm_start_storm_reports_every_case_and_rejects_bad_counts() {
    if !daemon_util::qemu_and_libvirt_present() {
        return;
    }
    // Storms start QEMU alone and through libvirt (cloud-hypervisor is in the default list).
    let report = daemon_util::vm_start_report(&[
        "--concurrent",
        "2",
        "--sizes",
        "32M",
        "--vmms",
        "qemu,libvirt",
        "--reps",
        "1",
        "--headroom",
        "0",
        "--json",
    ]);
    let storms = report["storms"].as_array().unwrap();
    let vmms: Vec<&str> = storms.iter().map(|s| s["vmm"].as_str().unwrap()).collect();
    assert_eq!(vmms, ["qemu", "libvirt"], "{report:#}");
    for storm in storms {
        assert_eq!(storm["count"], 2, "{report:#}");
        assert_eq!(storm["total_bytes"], 64 << 20);
        let cases: Vec<&str> = storm["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["case"].as_str().unwrap())
            .collect();
        assert_eq!(
            cases,
            ["immediate", "floor", "warm", "half-warm"],
            "{report:#}"
        );
        for c in storm["cases"].as_array().unwrap() {
            assert_eq!(c["all_ready_samples"].as_array().unwrap().len(), 1, "{c:#}");
            assert!(c["per_vm_p99"].as_f64().unwrap() >= c["per_vm_p50"].as_f64().unwrap());
        }
    }
    assert!(
        report["not_measured"].as_array().unwrap().is_empty(),
        "{report:#}"
    );

    let bad = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["bench", "vm-start", "--concurrent", "0", "--sizes", "32M"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(stderr.contains("--concurrent"), "{stderr}");
    // --storm-refill belongs to a storm.
    let bad = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["bench", "vm-start", "--storm-refill", "--sizes", "32M"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--concurrent"),
        "{bad:?}"
    );
}
