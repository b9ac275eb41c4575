//! The worker takes released files by turns of principals, then in release order
//! (`pool::core::order`, docs/security.md "Order of fresh releases"), tried against the real
//! daemon on a real hugetlbfs with two unprivileged principals (uids 65534 and 65533 in the
//! socket's group, as `setpriv` + `curl`): one leases and releases many files, the other one
//! file, leased last (so its file has the highest id) and released last. The worker must
//! take the other's file within two jobs, where by file id it came last.
//!
//! A lessee grace holds the worker back while the releases queue up (the pool has no
//! target, so nothing is missing and every released file is given back: a deletion goes
//! through the same choice as a scrub); the order of its jobs is read from its log.

mod daemon_util;

use std::time::{Duration, Instant};

use daemon_util::users::curl_json_as as curl_as;
use daemon_util::{Env, MIB};

/// The tenant that cycles many leases.
const A: u32 = 65534;
/// The honest one.
const B: u32 = 65533;
/// The tenant's leases.
const MANY: usize = 12;

/// Leases 2 MiB as `uid`: the lease id.
fn lease_as(uid: u32, env: &Env, name: &str) -> u64 {
    let (code, l) = curl_as(
        uid,
        env,
        "POST",
        "/v1/leases",
        &format!(r#"{{"name":"{name}","size":"2M"}}"#),
    );
    assert_eq!(code, 201, "{l}");
    l["id"].as_u64().unwrap()
}

fn release_as(uid: u32, env: &Env, id: u64) {
    let (code, body) = curl_as(uid, env, "DELETE", &format!("/v1/leases/{id}"), "");
    assert_eq!(code, 200, "{body}");
}

/// The number after `key` in `line` (`key` ends with `=` or `(`).
fn number_after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[test]
fn a_tenant_s_many_releases_keep_no_other_principal_s_release_waiting() {
    let env = Env::new("release-order", (MANY as u64 + 4) * 2 * MIB);
    // No target (nothing missing), so the lessee grace holds every job back until the
    // releases below are all queued.
    let d = env.spawn(&["--socket-group", "kvm", "--lessee-grace-ms", "3000"]);
    let many: Vec<u64> = (0..MANY)
        .map(|i| lease_as(A, &env, &format!("cycle-{i}")))
        .collect();
    let honest = lease_as(B, &env, "honest");
    for id in &many {
        release_as(A, &env, *id);
    }
    release_as(B, &env, honest);
    // Every file given back (a liveness bound, not a speed assertion).
    let deadline = Instant::now() + Duration::from_secs(60);
    while d.pool().kinds[0].dirty_bytes > 0 || env.mount_used() > 0 {
        assert!(Instant::now() < deadline, "{:?}", d.pool());
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = env.log();
    let file = log
        .lines()
        .filter(|l| l.contains(" released ") && l.contains("name=honest"))
        .find_map(|l| number_after(l, "file="))
        .unwrap_or_else(|| panic!("no release of the honest lease in the log:\n{log}"));
    let jobs: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("pool worker"))
        .filter_map(|l| number_after(l, "job=Delete(").or_else(|| number_after(l, "job=Scrub(")))
        .collect();
    assert_eq!(jobs.len(), MANY + 1, "{jobs:?}\n{log}");
    let at = jobs.iter().position(|&j| j == file).unwrap();
    assert!(
        at <= 1,
        "the honest release (file {file}) was the worker's job {} of {}: {jobs:?}",
        at + 1,
        jobs.len()
    );
    // By file id it would have come last: its file is the newest.
    assert_eq!(jobs.iter().max(), Some(&file), "{jobs:?}");
}
