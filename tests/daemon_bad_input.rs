//! Bad requests: a 4xx JSON error naming the field, and nothing allocated or changed.

mod daemon_util;

use daemon_util::{Env, MIB};

#[test]
fn bad_requests_name_the_field_and_change_nothing() {
    let env = Env::new("badinput", 16 * MIB);
    let d = env.spawn(&["--warm", "4M"]);
    d.settle(4 * MIB);
    let taken = d.lease("taken", 2 * MIB).unwrap();
    d.settle(4 * MIB);
    let snapshot = || {
        let p = d.pool();
        (
            d.leases(),
            p.kinds[0].warm_bytes,
            p.kinds[0].leased_bytes,
            env.mount_used(),
            Env::names(&env.pool_dir()),
            Env::names(&env.lease_dir()),
        )
    };
    let before = snapshot();
    let long = "x".repeat(65);
    let cases: Vec<(String, u16, Option<&str>)> = vec![
        (r#"{"name":"a","size":0}"#.into(), 400, Some("size")),
        (r#"{"name":"a","size":3145728}"#.into(), 400, Some("size")),
        (r#"{"name":"a","size":"1T"}"#.into(), 422, Some("size")),
        (
            r#"{"name":"a","size":"2M","node":99}"#.into(),
            400,
            Some("node"),
        ),
        (
            r#"{"name":"a","size":"2M","page_size":"1G"}"#.into(),
            400,
            Some("page_size"),
        ),
        (
            r#"{"name":"a","size":"2M","page_size":"4K"}"#.into(),
            400,
            Some("page_size"),
        ),
        (r#"{"name":"a/b","size":"2M"}"#.into(), 400, Some("name")),
        (r#"{"name":"..","size":"2M"}"#.into(), 400, Some("name")),
        (
            r#"{"name":"a\u0000b","size":"2M"}"#.into(),
            400,
            Some("name"),
        ),
        (
            format!(r#"{{"name":"{long}","size":"2M"}}"#),
            400,
            Some("name"),
        ),
        (r#"{"name":"","size":"2M"}"#.into(), 400, Some("name")),
        (r#"{"name":"taken","size":"2M"}"#.into(), 409, Some("name")),
        (
            r#"{"name":"a","size":"2M","owner":"no-such-user-xyz"}"#.into(),
            400,
            Some("owner"),
        ),
        (
            r#"{"name":"a","size":"2M","pid":4000000}"#.into(),
            400,
            Some("pid"),
        ),
        (
            r#"{"name":"a","size":"2M","colour":"red"}"#.into(),
            400,
            Some("colour"),
        ),
        (r#"{"name":"a","size":"#.into(), 400, None),
        ("[]".into(), 400, None),
    ];
    for (body, status, field) in &cases {
        let (got, json) = d.raw("POST", "/v1/leases", body.as_bytes());
        assert_eq!(got, *status, "{body}: {json}");
        assert!(json["error"].is_string(), "{body}: {json}");
        assert_eq!(json["field"].as_str(), *field, "{body}: {json}");
    }
    assert_eq!(d.raw("DELETE", "/v1/leases/12345", b"").0, 404);
    assert_eq!(d.raw("DELETE", "/v1/leases/abc", b"").0, 400);
    assert_eq!(d.raw("GET", "/v1/nothing", b"").0, 404);
    assert_eq!(snapshot(), before);
    d.release(taken.id).unwrap();
}
