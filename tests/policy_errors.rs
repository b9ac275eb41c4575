//! Malformed clearing policy files fail with an error naming the file, the line and the
//! field; valid custom policies load from a file and resolve.

use std::path::{Path, PathBuf};

use hugeprep::clear::Method;
use hugeprep::cpu::{CpuInfo, CpuidTable};
use hugeprep::policy::{
    CalibrationMode, ClearingPolicy, NtMinExtent, PolicyError, Threads, BUILTIN_FALLBACK_RULE,
};

const GOOD_RULE: &str = r#"
[[rule]]
name = "catch-all"
method = "rep-stosb"
source = "every x86-64"
"#;

struct Case {
    what: &'static str,
    text: String,
    line: usize,
    field: &'static str,
    message: &'static str,
}

fn case(
    what: &'static str,
    text: &str,
    line: usize,
    field: &'static str,
    message: &'static str,
) -> Case {
    Case {
        what,
        text: text.to_string(),
        line,
        field,
        message,
    }
}

fn cases() -> Vec<Case> {
    vec![
        case(
            "misspelt field",
            "[[rule]]\nname = \"a\"\nmethd = \"clzero\"\nmethod = \"clzero\"\nsource = \"s\"\n",
            3,
            "rule[1].methd",
            "unknown field `methd`",
        ),
        case(
            "missing method in the second rule",
            &format!("{GOOD_RULE}\n[[rule]]\nname = \"b\"\nsource = \"s\"\n"),
            7,
            "rule[2].method",
            "missing field `method`",
        ),
        case(
            "family of the wrong type",
            "[[rule]]\nname = \"a\"\nfamily = \"six\"\nmethod = \"clzero\"\nsource = \"s\"\n",
            3,
            "rule[1].family",
            "invalid type",
        ),
        case(
            "unknown method name",
            "[[rule]]\nname = \"a\"\nmethod = \"avx512\"\nsource = \"s\"\n",
            3,
            "rule[1].method",
            "unknown clearing method \"avx512\"",
        ),
        case(
            "reversed model range",
            "[[rule]]\nname = \"a\"\nvendor = \"amd\"\nfamily = 0x19\nmodel_ranges = [[0x10, 0x1f],\n  [0x7f, 0x60]]\nmethod = \"clzero\"\nsource = \"s\"\n",
            6,
            "rule[1].model_ranges",
            "reversed",
        ),
        case(
            "negative model inside a multi-line list",
            "[[rule]]\nname = \"a\"\nfamily = 6\nmodels = [\n  0x55,\n  -3,\n]\nmethod = \"clzero\"\nsource = \"s\"\n",
            6,
            "rule[1].models",
            "-3",
        ),
        case(
            "model above 0xff",
            "[[rule]]\nname = \"a\"\nfamily = 6\nmodels = [0x155]\nmethod = \"clzero\"\nsource = \"s\"\n",
            4,
            "rule[1].models",
            "above the largest",
        ),
        case(
            "models without a family",
            "[[rule]]\nname = \"a\"\nmodels = [0x55]\nmethod = \"clzero\"\nsource = \"s\"\n",
            3,
            "rule[1].models",
            "set `family`",
        ),
        case(
            "fence_interval of zero",
            "[[rule]]\nname = \"a\"\nmethod = \"movnti\"\nfence_interval = 0\nsource = \"s\"\n",
            4,
            "rule[1].fence_interval",
            "cache line",
        ),
        case(
            "fence_interval not a size, in [defaults]",
            &format!("[defaults]\nfence_interval = \"lots\"\n{GOOD_RULE}"),
            2,
            "defaults.fence_interval",
            "\"lots\" is not a size",
        ),
        case(
            "nt_min_extent neither llc nor a size",
            "[[rule]]\nname = \"a\"\nmethod = \"movnti\"\nnt_min_extent = \"l3\"\nsource = \"s\"\n",
            4,
            "rule[1].nt_min_extent",
            "\"llc\" or a size",
        ),
        case(
            "zero threads",
            "[[rule]]\nname = \"a\"\nmethod = \"movnti\"\nthreads = 0\nsource = \"s\"\n",
            4,
            "rule[1].threads",
            ">= 1",
        ),
        case(
            "unknown feature",
            "[[rule]]\nname = \"a\"\nrequires = [\"erms\", \"avx512\"]\nmethod = \"movnti\"\nsource = \"s\"\n",
            3,
            "rule[1].requires",
            "unknown CPU feature \"avx512\"",
        ),
        case(
            "unknown calibration mode",
            &format!("calibration = \"always\"\n{GOOD_RULE}"),
            1,
            "calibration",
            "expected off, report, override or auto",
        ),
        case(
            "unknown confidence",
            "[[rule]]\nname = \"a\"\nmethod = \"movnti\"\nsource = \"s\"\nconfidence = \"sure\"\n",
            5,
            "rule[1].confidence",
            "expected measured, published or guess",
        ),
        case(
            "duplicate rule name",
            &format!("{GOOD_RULE}{GOOD_RULE}"),
            8,
            "rule[2].name",
            "already used by the rule on line 3",
        ),
        case(
            "empty source",
            "[[rule]]\nname = \"a\"\nmethod = \"movnti\"\nsource = \"  \"\n",
            4,
            "rule[1].source",
            "where the rule's choice comes from",
        ),
        case(
            "unterminated string",
            "[[rule]]\nname = \"a\nmethod = \"movnti\"\nsource = \"s\"\n",
            2,
            "rule[1].name",
            "",
        ),
        case(
            "unknown top-level table",
            &format!("{GOOD_RULE}\n[pool]\ntarget = 3\n"),
            7,
            "pool",
            "unknown field `pool`",
        ),
    ]
}

#[test]
fn malformed_policies_name_line_and_field() {
    let origin = Path::new("/etc/hugeprep/clearing.toml");
    for c in cases() {
        let err = ClearingPolicy::parse(&c.text, origin).expect_err(c.what);
        let shown = err.to_string();
        let PolicyError::Invalid {
            path,
            line,
            field,
            message,
            ..
        } = &err
        else {
            panic!("{}: {err:?}", c.what);
        };
        assert_eq!(path, origin, "{}", c.what);
        assert_eq!(*line, c.line, "{}: {shown}", c.what);
        assert_eq!(field.as_deref(), Some(c.field), "{}: {shown}", c.what);
        assert!(message.contains(c.message), "{}: {shown}", c.what);
        let prefix = format!("/etc/hugeprep/clearing.toml:{}:", c.line);
        assert!(shown.starts_with(&prefix), "{}: {shown}", c.what);
        assert!(
            shown.contains(&format!("field `{}`", c.field)),
            "{}: {shown}",
            c.what
        );
    }
}

#[test]
fn a_policy_without_rules_is_refused() {
    let err = ClearingPolicy::parse("calibration = \"off\"\n", Path::new("p.toml")).unwrap_err();
    assert_eq!(err.field(), Some("rule"));
    assert!(err.to_string().contains("no [[rule]]"), "{err}");
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hugeprep-policy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn errors_from_a_file_name_that_file() {
    let path = temp_file(
        "bad.toml",
        "[[rule]]\nname = \"a\"\nmethod = \"fast\"\nsource = \"s\"\n",
    );
    let err = ClearingPolicy::from_file(&path).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("{}:3:", path.display())),
        "{err}"
    );
    std::fs::remove_file(&path).unwrap();

    let missing = path.with_file_name("missing.toml");
    let err = ClearingPolicy::from_file(&missing).unwrap_err();
    assert!(matches!(err, PolicyError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains("missing.toml"), "{err}");
}

#[test]
fn a_custom_policy_file_overrides_the_embedded_one() {
    let path = temp_file(
        "custom.toml",
        r#"
calibration = "override"
[defaults]
fence_interval = "256K"
threads = 4

[[rule]]
name = "everything-clzero"
requires = ["clzero"]
method = "clzero"
nt_min_extent = "8M"
source = "test"

[[rule]]
name = "intel-steppings"
vendor = "GenuineIntel"
family = 6
models = [0x55]
stepping_ranges = [[5, 7]]
method = "movnti"
fence_interval = 1048576
threads = "all"
source = "test"
"#,
    );
    let policy = ClearingPolicy::from_file(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(!policy.is_embedded());
    assert_eq!(policy.origin(), path);
    assert_eq!(policy.calibration(), CalibrationMode::Override);
    let [clzero, intel] = policy.rules() else {
        panic!("{:?}", policy.rules());
    };
    assert_eq!(clzero.nt_min_extent, NtMinExtent::Bytes(8 << 20));
    assert_eq!(clzero.fence_interval, 256 << 10);
    assert_eq!(clzero.threads.count(16), 4);
    assert_eq!(intel.threads, Threads::All);
    assert_eq!(intel.fence_interval, 1 << 20);
    assert_eq!(intel.line, 15);

    let cascade_lake = CpuInfo::from_cpuid(
        CpuidTable::new()
            .leaf(
                0,
                0,
                [
                    0x16,
                    u32::from_le_bytes(*b"Genu"),
                    u32::from_le_bytes(*b"ntel"),
                    u32::from_le_bytes(*b"ineI"),
                ],
            )
            .leaf(1, 0, [0x0005_0657, 0, 0, 0]),
    );
    let r = policy.resolve(&cascade_lake);
    assert_eq!(
        (r.rule.as_str(), r.plan.method),
        ("intel-steppings", Method::Movnti)
    );

    let skylake = CpuInfo {
        stepping: 4,
        ..cascade_lake
    };
    // No rule matches stepping 4: the built-in fallback, which every x86-64 can run.
    let r = policy.resolve(&skylake);
    assert_eq!(
        (r.rule.as_str(), r.plan.method),
        (BUILTIN_FALLBACK_RULE, Method::RepStosb)
    );
    assert_eq!(r.plan.fence_interval, 256 << 10);
    assert!(r.source.contains("custom.toml"), "{}", r.source);
}
