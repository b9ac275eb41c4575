//! `hugeprep bench vm-start` runs end to end, QEMU alone and through a private libvirtd, QEMU
//! unprivileged as the package runs it and as root beside it (a smoke test: the numbers are
//! the benchmark's business, not a test's).

mod daemon_util;

use std::process::Command;

#[test]
fn bench_vm_start_reports_every_qemu_case_and_rejects_bad_sizes() {
    if !daemon_util::qemu_and_libvirt_present() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("hugeprep-vm-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("vm-start.svg");
    let svg_arg = svg.to_str().unwrap();
    // cloud-hypervisor's cases: tests/ch_vm_start_bench.rs.
    let report = daemon_util::vm_start_report(&[
        "--sizes",
        "64M",
        "--reps",
        "1",
        "--json",
        "--vmms",
        "qemu,libvirt,libvirt-root",
        "--headroom",
        "0",
        "--svg",
        svg_arg,
    ]);
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
    let root: Vec<&str> = results
        .iter()
        .filter(|r| r["vmm"] == "libvirt-root")
        .map(|r| r["case"].as_str().unwrap())
        .collect();
    assert_eq!(root, ["immediate", "floor", "hugeprep"], "{report}");
    assert_eq!(report["sizes"][0]["savings"].as_array().unwrap().len(), 7);
    let beside = report["sizes"][0]["unprivileged_vs_root"]
        .as_array()
        .unwrap();
    assert_eq!(beside.len(), 3, "{report}");
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
