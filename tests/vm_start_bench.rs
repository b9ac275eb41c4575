//! `hugeprep bench vm-start` runs end to end, QEMU alone and through a private libvirtd (a smoke test: the numbers are the benchmark's
//! business, not a test's).

use std::process::Command;

#[test]
fn bench_vm_start_reports_every_qemu_case_and_rejects_bad_sizes() {
    for tool in [
        "/usr/bin/qemu-system-x86_64",
        "/dev/kvm",
        "/usr/sbin/libvirtd",
        "/usr/sbin/virtlogd",
        "/usr/bin/virsh",
    ] {
        if !std::path::Path::new(tool).exists() {
            hugeprep::testing::missing_tool(&format!("{tool} missing"));
            return;
        }
    }
    let dir = std::env::temp_dir().join(format!("hugeprep-vm-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("vm-start.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args([
            "bench", "vm-start", "--sizes", "64M", "--reps", "1", "--json",
        ])
        // cloud-hypervisor's cases: tests/ch_vm_start_bench.rs.
        .args(["--vmms", "qemu,libvirt"])
        .args(["--headroom", "0", "--svg"])
        .arg(&svg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Each VMM runs in a cgroup of its own (the bench's for QEMU alone, libvirt's machine
    // cgroup), so every release is proven and scrubbed: none takes the kernel's path, as
    // each did while the bench's QEMUs shared its never-emptying cgroups.
    assert!(
        !stderr.contains("takes the kernel's path"),
        "a release took the kernel's path: {stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = report["sizes"][0]["results"].as_array().unwrap();
    for vmm in ["qemu", "libvirt"] {
        let cases: Vec<&str> = results
            .iter()
            .filter(|r| r["vmm"] == vmm)
            .map(|r| r["case"].as_str().unwrap())
            .collect();
        assert_eq!(
            cases,
            if vmm == "qemu" {
                &[
                    "immediate",
                    "floor",
                    "present",
                    "hugeprep",
                    "immediate-on-lease",
                    "hugeprep-discard",
                ][..]
            } else {
                &[
                    "immediate",
                    "floor",
                    "hugeprep",
                    "immediate-on-lease",
                    "hugeprep-discard",
                ][..]
            },
            "{vmm}: {report}"
        );
    }
    assert_eq!(report["sizes"][0]["savings"].as_array().unwrap().len(), 6);
    // The warm start's breakdown, QEMU alone: floor, present file, lease call, the rest.
    let breakdown = report["sizes"][0]["breakdown"].as_array().unwrap();
    assert_eq!(breakdown.len(), 1, "{report}");
    assert_eq!(breakdown[0]["page_size"], "2M");
    assert!(breakdown[0]["lease_call"]["median"].as_f64().unwrap() > 0.0);
    // 64 MiB is no whole number of 1G pages: left out of the default 2M-and-1G run, saying so.
    if std::path::Path::new("/sys/kernel/mm/hugepages/hugepages-1048576kB").exists() {
        let skipped = report["skipped"].to_string();
        assert!(
            skipped.contains("on 1G pages: not a whole number of pages"),
            "{report}"
        );
    }
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    std::fs::remove_dir_all(&dir).unwrap();

    let bad = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["bench", "vm-start", "--sizes", "3M", "--reps", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(
        stderr.contains("--sizes: 3145728 is not a positive multiple"),
        "{stderr}"
    );
}
