//! `POST /v1/pool/drain` and `/v1/pool/resume`: warm files go, leases stay, a drained kind
//! stays empty until resumed, and bad selectors are refused by field.

mod daemon_util;

use daemon_util::{lease_is_zero, Env, MIB};

#[test]
fn drain_empties_the_pool_keeps_leases_and_resume_refills() {
    let env = Env::new("drain", 32 * MIB);
    let d = env.spawn(&["--warm", "8M", "--sizes", "4M"]);
    d.settle(8 * MIB);
    let lease = d.lease("vm", 4 * MIB).unwrap();
    d.settle(8 * MIB);

    for (body, field) in [
        (r#"{"node":99}"#, None),
        (r#"{"page_size":"1G"}"#, Some("page_size")),
        (r#"{"colour":1}"#, None),
    ] {
        let (status, err) = d.raw("POST", "/v1/pool/drain", body.as_bytes());
        assert_eq!(status, 400, "{body}: {err}");
        if let Some(f) = field {
            assert_eq!(err["field"], f, "{body}: {err}");
        }
    }
    let (status, err) = d.raw("POST", "/v1/pool/drain", br#"{"node":99}"#);
    assert!(
        err["error"].as_str().unwrap().contains("node 99"),
        "{status} {err}"
    );

    let (status, report) = d.raw("POST", "/v1/pool/drain", b"");
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["kinds"][0]["deleted_bytes"], 8 * MIB, "{report}");
    assert_eq!(report["kinds"][0]["leased_bytes"], 4 * MIB, "{report}");
    assert_eq!(report["incomplete"], false);
    // Held empty: the worker does not refill a drained kind.
    std::thread::sleep(std::time::Duration::from_millis(600));
    let p = d.pool();
    assert!(p.kinds[0].drained);
    assert_eq!(p.kinds[0].warm_bytes, 0);
    assert_eq!(env.mount_used(), 4 * MIB);
    assert!(lease_is_zero(&lease));
    assert_eq!(d.leases().len(), 1);

    let (status, pool) = d.raw("POST", "/v1/pool/resume", b"{}");
    assert_eq!(status, 200, "{pool}");
    assert_eq!(pool["kinds"][0]["drained"], false);
    d.settle(8 * MIB);
    d.release(lease.id).unwrap();
    d.settle(8 * MIB);
}
