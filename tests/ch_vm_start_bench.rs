//! `hugeprep bench vm-start --vmms cloud-hypervisor` runs end to end against the real
//! cloud-hypervisor (a smoke test: the numbers are the benchmark's business, not a test's).

mod ch_util;

use std::process::Command;

#[test]
fn bench_vm_start_reports_every_cloud_hypervisor_case() {
    let Some((ch, _remote)) = ch_util::binaries() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("hugeprep-ch-vm-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("vm-start.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args([
            "bench", "vm-start", "--sizes", "64M", "--reps", "1", "--json",
        ])
        .args(["--vmms", "cloud-hypervisor", "--headroom", "0", "--svg"])
        .arg(&svg)
        .arg("--cloud-hypervisor")
        .arg(&ch)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = report["sizes"][0]["results"].as_array().unwrap();
    let cases: Vec<&str> = results
        .iter()
        .filter(|r| r["vmm"] == "cloud-hypervisor")
        .map(|r| r["case"].as_str().unwrap())
        .collect();
    assert_eq!(cases, ["immediate", "floor", "hugeprep"], "{report}");
    let savings = report["sizes"][0]["savings"].as_array().unwrap();
    assert_eq!(savings.len(), 1, "{report}");
    assert_eq!(savings[0]["case"], "hugeprep");
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    std::fs::remove_dir_all(&dir).unwrap();
}
