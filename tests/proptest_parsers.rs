//! Property tests of every parser that takes outside input, without a daemon: the API bodies
//! (lease request, targets, drain, resume), the configuration file, the pool policy, the
//! clearing policy, byte sizes, lease names and idempotency keys. Each property starts from a
//! valid input, changes one field to a value drawn from valid, invalid and hostile ones (or
//! adds an unknown field), and requires that the input parses or that the error names that
//! field. A bounded number of cases keeps the suite fast; `tests/daemon_proptest.rs` sends such
//! bodies to the real daemon and checks that a refused request changed nothing.

mod prop_util;

use std::collections::BTreeSet;

use hugeprep::api::{decode_json, parse_lease_body, parse_targets_body, ApiError, ResumeRequest};
use hugeprep::daemon::config::ConfigFile;
use hugeprep::policy::pool::PoolPolicy;
use hugeprep::policy::ClearingPolicy;
use hugeprep::pool::targets::validate_targets;
use hugeprep::pool::{check_name, DrainRequest};
use hugeprep::topology::Topology;
use hugeprep::PageSize;
use prop_util::word;
use proptest::prelude::*;
use serde_json::{json, Value};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: prop_util::cases(cases),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Any JSON value a client might put in a field.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (0u64..4096).prop_map(|n| Value::from(n << 20)),
        (-1e12f64..1e12).prop_map(Value::from),
        word().prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A field of `known`, or a field no parser knows.
fn key(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(known).prop_map(str::to_string),
        1 => prop::sample::select(&["colour", "Size", "name ", "size\u{0}", ""][..]).prop_map(str::to_string),
    ]
}

fn field_of(err: &ApiError) -> Option<String> {
    match err {
        ApiError::BadRequest { field, .. } => field.clone(),
        other => panic!("a parser answered {other:?}"),
    }
}

const LEASE_KEYS: &[&str] = &[
    "name",
    "size",
    "page_size",
    "node",
    "owner",
    "pid",
    "pin",
    "idempotency_key",
];
const TARGET_KEYS: &[&str] = &["page_size", "node", "warm", "sizes", "flavors"];
const DRAIN_KEYS: &[&str] = &["node", "page_size", "release_pools"];

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn lease_body_parses_or_names_the_field(k in key(LEASE_KEYS), v in json_value()) {
        let mut body = json!({"name": "vm1", "size": "4M"});
        body[&k] = v.clone();
        match parse_lease_body(body.to_string().as_bytes()) {
            Ok((req, key)) => {
                prop_assert!(req.size > 0 || k == "size");
                prop_assert!(key.is_none() || k == "idempotency_key");
            }
            Err(e) => prop_assert_eq!(field_of(&e), Some(k.clone()), "{} = {}: {}", k, v, e),
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_name_a_field_of_the_body(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Err(e) = parse_lease_body(&bytes) {
            if let Some(field) = field_of(&e) {
                let text = String::from_utf8_lossy(&bytes);
                prop_assert!(text.contains(&field) || ["name", "size"].contains(&field.as_str()), "{}", e);
            }
        }
        let _ = parse_targets_body(&bytes);
        let _ = decode_json::<DrainRequest>(&bytes);
    }

    #[test]
    fn targets_body_parses_and_validates_or_names_the_field(k in key(TARGET_KEYS), v in json_value()) {
        let mut target = json!({"page_size": "2M", "warm": "8M"});
        target[&k] = v.clone();
        let body = json!({"targets": [target]});
        let prefix = format!("targets[0].{k}");
        match parse_targets_body(body.to_string().as_bytes()) {
            Err(e) => {
                let field = field_of(&e).unwrap_or_default();
                prop_assert!(field.starts_with(&prefix), "{} = {}: {} ({})", k, v, e, field);
            }
            Ok(specs) => {
                let sizes: BTreeSet<PageSize> = [PageSize::Size2M].into();
                let topo = Topology::detect().unwrap();
                if let Err(e) = validate_targets(&specs, &sizes, &topo) {
                    let text = e.to_string();
                    // Flavors beyond `warm` are refused at `warm`, the field to change.
                    let named = text.contains(&prefix)
                        || (k == "flavors" && text.contains("targets[0].warm"));
                    prop_assert!(named, "{} = {}: {}", k, v, text);
                }
            }
        }
    }

    #[test]
    fn drain_and_resume_bodies_parse_or_name_the_field(k in key(DRAIN_KEYS), v in json_value()) {
        let mut body = json!({});
        body[&k] = v.clone();
        let bytes = body.to_string();
        if let Err(e) = decode_json::<DrainRequest>(bytes.as_bytes()) {
            prop_assert_eq!(field_of(&e), Some(k.clone()), "{} = {}: {}", k, v, e);
        }
        if let Err(e) = decode_json::<ResumeRequest>(bytes.as_bytes()) {
            prop_assert_eq!(field_of(&e), Some(k.clone()), "{} = {}: {}", k, v, e);
        }
    }

    #[test]
    fn names_and_keys_are_accepted_or_refused_by_field(s in "\\PC{0,80}|[ -~]{0,140}") {
        if let Err(e) = check_name(&s) {
            prop_assert_eq!(e.field(), Some("name"));
        }
        if let Err(e) = hugeprep::pool::idempotency::check_key(&s) {
            prop_assert_eq!(e.field(), Some("idempotency_key"));
        }
        if let Ok(n) = hugeprep::units::parse_bytes(&s) {
            prop_assert!(s.trim().starts_with(|c: char| c.is_ascii_digit()), "{} -> {}", s, n);
        }
    }
}

/// A TOML value: valid and invalid sizes, words, numbers, booleans, arrays, tables.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        word().prop_map(|w| toml::Value::String(w).to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        (0i64..4096).prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        (-1e9f64..1e9).prop_map(|f| format!("{f:?}")),
        prop::collection::vec(word(), 0..3).prop_map(|v| toml::Value::from(v).to_string()),
        prop::collection::vec(0i64..300, 0..3).prop_map(|v| toml::Value::from(v).to_string()),
        Just("{ size = \"4M\", count = 2 }".to_string()),
        Just("[{ size = \"4M\", count = 0 }]".to_string()),
        Just("[{ size = \"3M\", count = 1 }]".to_string()),
        Just("[{ size = \"4M\", count = 2, colour = 1 }]".to_string()),
    ]
}

/// A TOML document of `(table header, [(key, value)])`, with `key` (in `table`) set to `value`
/// in place of the line that had it, or added.
fn toml_doc(tables: &[(&str, &[(&str, &str)])], table: usize, key: &str, value: &str) -> String {
    let mut out = String::new();
    for (i, (header, lines)) in tables.iter().enumerate() {
        if !header.is_empty() {
            out.push_str(&format!("{header}\n"));
        }
        let mut set = false;
        for (k, v) in lines.iter() {
            if i == table && *k == key {
                out.push_str(&format!("{k} = {value}\n"));
                set = true;
            } else {
                out.push_str(&format!("{k} = {v}\n"));
            }
        }
        if i == table && !set {
            out.push_str(&format!("{key} = {value}\n"));
        }
    }
    out
}

const POLICY_TOP: &[(&str, &str)] = &[
    ("verify", "\"sample\""),
    ("scrub_bandwidth", "\"8G\""),
    ("threads", "0"),
    ("shape", "\"demand\""),
    ("reserve", "true"),
    ("reserve_limit", "\"64G\""),
    ("reserve_margin", "\"1G\""),
    ("release_on_stop", "false"),
];
const POLICY_TARGET: &[(&str, &str)] = &[
    ("page_size", "\"2M\""),
    ("node", "0"),
    ("warm", "\"64M\""),
    ("sizes", "[\"16M\"]"),
    ("flavors", "[{ size = \"8M\", count = 2 }]"),
];
const CONFIG_TOP: &[(&str, &str)] = &[
    ("socket", "\"/run/hugeprep/hugeprep.sock\""),
    ("socket_group", "\"kvm\""),
    ("state_dir", "\"/var/lib/hugeprep\""),
    ("run_dir", "\"/run/hugeprep\""),
    ("mounts", "[\"/dev/hugepages\"]"),
    ("recalibrate", "false"),
];
const CLEARING_TOP: &[(&str, &str)] = &[("calibration", "\"auto\"")];
const CLEARING_DEFAULTS: &[(&str, &str)] = &[
    ("nt_min_extent", "\"llc\""),
    ("fence_interval", "\"2M\""),
    ("threads", "\"all\""),
];
const CLEARING_RULE: &[(&str, &str)] = &[
    ("name", "\"zen\""),
    ("vendor", "\"amd\""),
    ("family", "0x19"),
    ("models", "[0x11]"),
    ("requires", "[\"avx512f\"]"),
    ("method", "\"avx512-nt\""),
    ("fence_interval", "\"2M\""),
    ("threads", "2"),
    ("source", "\"measured here\""),
    ("confidence", "\"measured\""),
];

fn pool_key() -> impl Strategy<Value = (usize, String)> {
    let top: Vec<&str> = POLICY_TOP.iter().map(|p| p.0).chain(["colour"]).collect();
    let target: Vec<&str> = POLICY_TARGET
        .iter()
        .map(|p| p.0)
        .chain(["colour"])
        .collect();
    prop_oneof![
        prop::sample::select(top).prop_map(|k| (0, k.to_string())),
        prop::sample::select(target).prop_map(|k| (1, k.to_string())),
    ]
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn pool_policy_parses_or_names_the_field((table, k) in pool_key(), v in toml_value()) {
        let doc = toml_doc(&[("", POLICY_TOP), ("[[target]]", POLICY_TARGET)], table, &k, &v);
        if let Err(e) = PoolPolicy::from_toml(&doc) {
            let text = e.to_string();
            // Flavors beyond `warm` are refused at `warm`, the field to change.
            let named = text.contains(k.as_str()) || (k == "flavors" && text.contains("warm"));
            prop_assert!(named, "{}\n---\n{}", text, doc);
        }
    }

    #[test]
    fn config_file_parses_or_names_the_field((table, k) in pool_key(), top in prop::sample::select(CONFIG_TOP.iter().map(|p| p.0).chain(["colour"]).collect::<Vec<_>>()), on_top in any::<bool>(), v in toml_value()) {
        let (table, k) = if on_top { (0, top.to_string()) } else { (table + 1, k) };
        let doc = toml_doc(
            &[("", CONFIG_TOP), ("[pool]", POLICY_TOP), ("[[pool.target]]", POLICY_TARGET)],
            table,
            &k,
            &v,
        );
        let parsed = toml::from_str::<ConfigFile>(&doc).map_err(|e| e.to_string()).and_then(|c| {
            c.pool.map_or(Ok(()), |p| p.validate().map(|_| ()).map_err(|e| e.to_string()))
        });
        if let Err(text) = parsed {
            let named = text.contains(k.as_str()) || (k == "flavors" && text.contains("warm"));
            prop_assert!(named, "{}\n---\n{}", text, doc);
        }
    }

    #[test]
    fn clearing_policy_parses_or_names_the_field(table in 0usize..3, pick in any::<prop::sample::Index>(), unknown in any::<bool>(), v in toml_value()) {
        let tables: [(&str, &[(&str, &str)]); 3] =
            [("", CLEARING_TOP), ("[defaults]", CLEARING_DEFAULTS), ("[[rule]]", CLEARING_RULE)];
        let k = if unknown { "colour" } else { pick.get(tables[table].1).0 };
        let doc = toml_doc(&tables, table, k, &v);
        if let Err(e) = ClearingPolicy::parse(&doc, std::path::Path::new("prop.toml")) {
            let field = e.field().unwrap_or_default().to_string();
            prop_assert!(field.contains(k) || e.to_string().contains(k), "{} (field {:?})\n---\n{}", e, field, doc);
        }
    }
}
