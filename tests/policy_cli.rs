//! `hugeprep cpu`: the host's identity and the clearing decision, as text and as JSON.

use std::process::Command;

fn hugeprep(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(args)
        .output()
        .expect("run hugeprep")
}

#[test]
fn cpu_json_has_identity_and_decision() {
    let out = hugeprep(&["cpu", "--json", "--rules", "--no-calibrate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "vendor",
        "family",
        "model",
        "stepping",
        "features",
        "llc_bytes",
        "method",
        "rule",
        "decided_by",
        "confidence",
        "reason",
        "source",
        "plan",
        "threads",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["decided_by"], "rule");
    assert!(v.get("calibration").is_none(), "{v}");
    let method: hugeprep::clear::Method = v["method"].as_str().unwrap().parse().unwrap();
    assert_eq!(v["plan"]["method"], method.name());
    let rules = v["rules"].as_array().unwrap();
    let first_match = rules.iter().find(|r| r["mismatch"].is_null()).unwrap();
    assert_eq!(first_match["name"], v["rule"]);
}

#[test]
fn cpu_text_names_method_rule_and_source() {
    let out = hugeprep(&["cpu"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for label in ["cpu", "features", "llc", "method", "rule", "source"] {
        assert!(
            text.lines().any(|l| l.starts_with(label)),
            "no {label} line in:\n{text}"
        );
    }
}

#[test]
fn cpu_with_a_malformed_policy_fails_naming_file_line_and_field() {
    let path =
        std::env::temp_dir().join(format!("hugeprep-cli-policy-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "calibration = \"report\"\n[[rule]]\nname = \"a\"\nmethod = \"clzero\"\nfence_interval = 0\nsource = \"s\"\n",
    )
    .unwrap();
    let out = hugeprep(&["cpu", "--policy", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:5:", path.display()))
            && stderr.contains("rule[1].fence_interval"),
        "{stderr}"
    );
}

#[test]
fn cpu_calibrate_records_the_outcome() {
    // Calibration maps 2M hugepages when free ones exist: serialise with other hugepage users.
    let _lock = hugeprep::testing::lock().unwrap();
    let out = hugeprep(&["cpu", "--json", "--calibrate", "--calibration", "override"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["calibration"];
    assert_eq!(c["mode"], "override", "{v}");
    assert!(
        c["measured"]["methods"].as_array().unwrap().len() >= 2,
        "{v}"
    );
    let within = c["within_tolerance"].as_bool().unwrap();
    let overridden = c["overridden"].as_bool().unwrap();
    assert_eq!(overridden, !within, "{v}");
    if overridden {
        assert_eq!(
            (&v["decided_by"], &v["method"]),
            (&"calibration".into(), &c["fastest"])
        );
    } else {
        assert_eq!(
            (&v["decided_by"], &v["method"]),
            (&"rule".into(), &c["rule_method"])
        );
    }
}

/// By default `hugeprep cpu` calibrates as the daemon does (`auto`), says which happened and
/// why; with `--state-dir` a second run reuses the stored result and `--recalibrate` redoes it.
#[test]
fn cpu_calibrates_by_default_and_reuses_a_stored_calibration() {
    let _lock = hugeprep::testing::lock().unwrap();
    let dir = std::env::temp_dir().join(format!("hugeprep-cli-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = |extra: &[&str]| {
        let mut args = vec!["cpu", "--json", "--state-dir", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = hugeprep(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let first = run(&[]);
    let c = &first["calibration"];
    assert_eq!(first["calibration_mode"], "auto", "{first}");
    assert_eq!(c["mode"], "auto", "{first}");
    assert_eq!(c["origin"]["kind"], "measured", "{first}");
    assert_eq!(c["origin"]["why"], "no stored calibration", "{first}");
    assert!(
        c["reason"].as_str().unwrap().starts_with("rule is "),
        "{first}"
    );
    assert_eq!(first["reason"], c["reason"]);
    assert_eq!(first["method"], c["chosen"]);
    let rounds = c["measured"]["methods"][0]["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), hugeprep::clear::CALIBRATION_ROUNDS, "{first}");
    assert!(
        c["measured"]["hugepage_backed"].as_bool().unwrap()
            || c["measured"]["backing_note"].is_string(),
        "{first}"
    );

    let second = run(&[]);
    assert_eq!(
        second["calibration"]["origin"]["kind"], "stored",
        "{second}"
    );
    assert_eq!(second["method"], first["method"]);
    assert_eq!(second["calibration"]["measured"], c["measured"]);

    let third = run(&["--recalibrate"]);
    assert_eq!(
        third["calibration"]["origin"]["why"], "asked to recalibrate",
        "{third}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
