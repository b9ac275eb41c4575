//! Property test against the real daemon: bodies of `POST /v1/leases`, `PUT /v1/pool/targets`,
//! `POST /v1/pool/drain` and `POST /v1/pool/resume` with one field changed to a value drawn
//! from valid, invalid and hostile ones (or an unknown field added). Every answer is a success
//! or a 4xx error naming that field, and a refused request changes nothing: the leases, the
//! targets, the drained kinds and the lease directory are as before. A bounded number of cases
//! (64 per route) keeps it fast; `tests/proptest_parsers.rs` runs the parsers alone.

mod daemon_util;
mod prop_util;

use daemon_util::{Daemon, Env, MIB};
use prop_util::word;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Value};

fn json_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u64..4).prop_map(Value::from),
        (0u64..40).prop_map(|n| Value::from(n << 20)),
        (0u64..8).prop_map(|n| Value::from(1u64 << (n * 8))),
        word().prop_map(Value::from),
        prop::collection::vec(word(), 0..3).prop_map(Value::from),
        Just(json!([{"size": "4M", "count": 2}])),
        Just(json!([{"size": "4M", "count": 0}])),
        Just(json!([{"size": "3M", "count": 1}])),
        Just(json!({"size": "4M"})),
    ]
}

fn key(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(known).prop_map(str::to_string),
        1 => Just("colour".to_string()),
    ]
}

/// What a refused request must leave as it was.
#[derive(Debug, PartialEq)]
struct Snapshot {
    leases: Value,
    targets: Value,
    drained: Vec<bool>,
    lease_dir: Vec<String>,
}

fn snapshot(env: &Env, d: &Daemon) -> Snapshot {
    Snapshot {
        leases: d.raw("GET", "/v1/leases", b"").1,
        targets: d.raw("GET", "/v1/pool/targets", b"").1,
        drained: d.pool().kinds.iter().map(|k| k.drained).collect(),
        lease_dir: Env::names(&env.lease_dir()),
    }
}

/// Sends `body` and checks the answer; releases a lease it made.
fn check(
    env: &Env,
    d: &Daemon,
    method: &str,
    path: &str,
    body: &Value,
    field: &str,
) -> Result<(), TestCaseError> {
    let before = snapshot(env, d);
    let (status, answer) = d.raw(method, path, body.to_string().as_bytes());
    if (200..300).contains(&status) {
        if let Some(id) = answer["id"].as_u64().filter(|_| path == "/v1/leases") {
            d.release(id).unwrap();
        }
        return Ok(());
    }
    prop_assert!(
        (400..500).contains(&status),
        "{} {} {}: {} {}",
        method,
        path,
        body,
        status,
        answer
    );
    let named = answer["field"].as_str().unwrap_or_default();
    // A bad flavor list may be refused at `warm` (less than the flavors' sum); a request the
    // node cannot supply at `size`.
    let ok = named.ends_with(field)
        || named.starts_with(&format!("targets[0].{field}"))
        || (field == "flavors" && named == "targets[0].warm");
    prop_assert!(
        ok,
        "{} {}: {} {} names {:?}, not {:?}",
        path,
        body,
        status,
        answer,
        named,
        field
    );
    prop_assert!(answer["error"].as_str().is_some_and(|e| !e.is_empty()));
    let after = snapshot(env, d);
    prop_assert_eq!(before, after, "{} {} changed state", path, body);
    Ok(())
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: prop_util::cases(64),
        failure_persistence: None,
        ..Config::default()
    })
}

#[test]
fn refused_requests_name_the_field_and_change_nothing() {
    let env = Env::new("daemonprop", 64 * MIB);
    // No kernel pool raises: a generated target may ask for more than the test reserved.
    let d = env.spawn(&["--no-reserve"]);

    const LEASE: &[&str] = &[
        "name",
        "size",
        "page_size",
        "node",
        "owner",
        "pin",
        "idempotency_key",
    ];
    runner()
        .run(&(key(LEASE), json_value()), |(k, v)| {
            let mut body = json!({"name": "vm1", "size": "4M"});
            body[&k] = v;
            check(&env, &d, "POST", "/v1/leases", &body, &k)
        })
        .unwrap();

    const TARGET: &[&str] = &["page_size", "node", "warm", "sizes", "flavors"];
    runner()
        .run(&(key(TARGET), json_value()), |(k, v)| {
            let mut target = json!({"page_size": "2M", "warm": "8M"});
            target[&k] = v;
            check(
                &env,
                &d,
                "PUT",
                "/v1/pool/targets",
                &json!({"targets": [target]}),
                &k,
            )
        })
        .unwrap();

    const DRAIN: &[&str] = &["node", "page_size", "release_pools"];
    for path in ["/v1/pool/drain", "/v1/pool/resume"] {
        runner()
            .run(&(key(DRAIN), json_value()), |(k, v)| {
                let mut body = json!({});
                body[&k] = v;
                check(&env, &d, "POST", path, &body, &k)
            })
            .unwrap();
    }

    let (status, _) = d.raw("DELETE", "/v1/pool/targets", b"");
    assert_eq!(status, 200);
    assert!(d.leases().is_empty());
}
