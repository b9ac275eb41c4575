//! Every QEMU of a packaged host is a tenant (issue 34), tried against the real daemon on a
//! real hugetlbfs, with two unprivileged principals (uids 65534 and 65533 in the socket's
//! group, as `setpriv` + `curl`) and root as the libvirt hook:
//!
//! - limits per principal: over one, `429` naming the limit, what is in use and the
//!   principal, and nothing changed; the limits hold across a restart (counted from the
//!   journal);
//! - names and idempotency keys are each principal's own: the same name or key from
//!   another principal is another lease, a hook's name is the hook's alone;
//! - a release whose file another uid keeps open waits aside (the worker serves the honest
//!   release meanwhile), counts against its lessee's `held_bytes`, and past that takes the
//!   kernel's path at once;
//! - the owner policy matches the lease's uid, also when the hook names its owner by number;
//! - a lessee that grows its file (`fallocate --keep-size`, `truncate`) is counted by the
//!   pages and length it took, not the size it asked;
//! - pages a read lease keeps past the release are charged to the lessee (429 at its limit,
//!   across a restart too) until it lets go, or the kernel takes the lease away;
//! - pages it pins past the release (an io_uring fixed buffer, a `vmsplice`d pipe) stay in
//!   their kept file, charged to it, until the pin goes; the others go back at once.

mod daemon_util;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use daemon_util::users::curl_json_as as curl_as;
use daemon_util::{Env, MIB};

const A: u32 = 65534;
const B: u32 = 65533;

fn lease_as(uid: u32, env: &Env, body: &str) -> (u16, serde_json::Value) {
    curl_as(uid, env, "POST", "/v1/leases", body)
}

/// A config file of `text`.
fn config(env: &Env, text: &str) -> String {
    let path = env.dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// Every name below the lease directory, a tenant's directories included.
fn lease_entries(env: &Env) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(env.lease_dir()).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_dir() {
            for f in std::fs::read_dir(e.path()).unwrap().flatten() {
                out.push(format!("{name}/{}", f.file_name().to_string_lossy()));
            }
        } else {
            out.push(name);
        }
    }
    out.sort();
    out
}

#[test]
fn over_a_limit_is_429_naming_it_changes_nothing_and_holds_across_a_restart() {
    let env = Env::new("tenants-limits", 32 * MIB);
    let cfg = config(
        &env,
        "[pool.limits.role.lease]\nleases = 2\nleased_bytes = { \"2M\" = \"8M\" }\ndescriptors = 1\n",
    );
    let mut d = env.spawn(&["--socket-group", "kvm", "--config", &cfg]);
    for name in ["a1", "a2"] {
        let (code, body) = lease_as(A, &env, &format!(r#"{{"name":"{name}","size":"2M"}}"#));
        assert_eq!(code, 201, "{body}");
    }
    let before = (
        d.leases().len(),
        lease_entries(&env),
        d.pool().kinds[0].clone(),
    );
    let (code, body) = lease_as(A, &env, r#"{"name":"a3","size":"2M"}"#);
    assert_eq!(code, 429, "{body}");
    let limit = &body["limit"];
    assert_eq!(limit["name"], "leases", "{body}");
    assert_eq!(
        (limit["limit"].as_u64(), limit["in_use"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(limit["principal"], "uid:65534", "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("uid:65534"),
        "{body}"
    );
    let after = (
        d.leases().len(),
        lease_entries(&env),
        d.pool().kinds[0].clone(),
    );
    assert_eq!(before.0, after.0);
    assert_eq!(before.1, after.1, "a refused lease left a lease path");
    assert_eq!(
        (
            before.2.leased_bytes,
            before.2.warm_bytes + before.2.dirty_bytes
        ),
        (
            after.2.leased_bytes,
            after.2.warm_bytes + after.2.dirty_bytes
        )
    );
    // Another tenant has a quota of its own.
    let (code, body) = lease_as(B, &env, r#"{"name":"b1","size":"2M"}"#);
    assert_eq!(code, 201, "{body}");

    // Across a restart the journal's leases count again. A tenant directory named in the
    // scheme before the keyed one (a principal's name in hex) and left empty goes at the
    // start; the directories that hold lease paths stay.
    d.stop();
    let old = env.lease_dir().join(".p-746f6b656e3a6e6f7661");
    std::fs::create_dir(&old).unwrap();
    let d = env.spawn(&["--socket-group", "kvm", "--config", &cfg]);
    assert!(!old.exists(), "{}", env.log());
    assert!(env.lease_dir().join(format!(".uid-{A}")).is_dir());
    assert!(env.lease_dir().join(format!(".uid-{B}")).is_dir());
    let (code, body) = lease_as(A, &env, r#"{"name":"a3","size":"2M"}"#);
    assert_eq!(
        (code, &body["limit"]["name"]),
        (429, &"leases".into()),
        "{body}"
    );

    // Bytes per page size: 4M leased, 6M more would pass 8M.
    let mine = |uid| -> Vec<u64> {
        let (_, list) = curl_as(uid, &env, "GET", "/v1/leases", "");
        list.as_array()
            .unwrap()
            .iter()
            .map(|l| l["id"].as_u64().unwrap())
            .collect()
    };
    let a_ids = mine(A);
    assert_eq!(a_ids.len(), 2);
    let (code, _) = curl_as(A, &env, "DELETE", &format!("/v1/leases/{}", a_ids[0]), "");
    assert_eq!(code, 200);
    let (code, body) = lease_as(A, &env, r#"{"name":"big","size":"8M"}"#);
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["limit"]["name"], "leased_bytes.2M", "{body}");
    assert_eq!(body["limit"]["in_use"].as_u64(), Some(2 * MIB), "{body}");
    assert_eq!(body["limit"]["asked"].as_u64(), Some(8 * MIB), "{body}");

    // Descriptors: a pidfd for `pid`; a second one is over 1.
    for b in mine(B) {
        curl_as(B, &env, "DELETE", &format!("/v1/leases/{b}"), "");
    }
    let (code, body) = lease_as(B, &env, r#"{"name":"p1","size":"2M","pid":1}"#);
    assert_eq!(code, 201, "{body}");
    let (code, body) = lease_as(B, &env, r#"{"name":"p2","size":"2M","pid":1}"#);
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["limit"]["name"], "descriptors", "{body}");
    // Root (admin) has no limit by default.
    for i in 0..3 {
        d.lease(&format!("root{i}"), 2 * MIB).unwrap();
    }
}

#[test]
fn names_and_idempotency_keys_belong_to_their_principal() {
    let env = Env::new("tenants-names", 32 * MIB);
    let d = env.spawn(&["--socket-group", "kvm"]);
    // The same name from two tenants: two leases, two paths.
    let (ca, a) = lease_as(A, &env, r#"{"name":"vm","size":"2M"}"#);
    let (cb, b) = lease_as(B, &env, r#"{"name":"vm","size":"2M"}"#);
    assert_eq!((ca, cb), (201, 201), "{a} {b}");
    assert_eq!((&a["name"], &b["name"]), (&"vm".into(), &"vm".into()));
    assert_ne!(a["path"], b["path"]);
    // Its own name twice is a conflict.
    let (code, body) = lease_as(A, &env, r#"{"name":"vm","size":"2M"}"#);
    assert_eq!(code, 409, "{body}");
    // Each lists only its own.
    let (_, list) = curl_as(B, &env, "GET", "/v1/leases", "");
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["id"], b["id"]);
    // A tenant's directory can be passed through, not listed.
    let dir = std::path::Path::new(a["path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o711, "{}", dir.display());
    let ls = Command::new("setpriv")
        .args([
            &format!("--reuid={B}"),
            &format!("--regid={B}"),
            "--clear-groups",
            "--",
        ])
        .arg("ls")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!ls.status.success(), "B listed A's directory");

    // The hook's names are its own: a tenant cannot take one first.
    let hook_name = "libvirt-6a8e7f0e-7c43-4b2f-9d59-0b1a2d3c4e5f-ram";
    let (code, body) = lease_as(A, &env, &format!(r#"{{"name":"{hook_name}","size":"2M"}}"#));
    assert_eq!((code, &body["field"]), (400, &"name".into()), "{body}");
    d.lease(hook_name, 2 * MIB)
        .expect("the hook (root) leases its name");

    // Keys: B's key is not A's; a retry of each finds its own lease.
    let key = "shared-key-1";
    let req = |name: &str| format!(r#"{{"name":"{name}","size":"2M","idempotency_key":"{key}"}}"#);
    let (c1, k_a) = lease_as(A, &env, &req("ka"));
    let (c2, k_b) = lease_as(B, &env, &req("kb"));
    assert_eq!((c1, c2), (201, 201), "{k_a} {k_b}");
    assert_ne!(k_a["id"], k_b["id"]);
    let (c3, again) = lease_as(B, &env, &req("kb"));
    assert_eq!((c3, &again["id"]), (200, &k_b["id"]), "{again}");
    // A different request under A's key from A is A's conflict only.
    let (c4, body) = lease_as(A, &env, &req("other"));
    assert_eq!(c4, 422, "{body}");
    assert!(!body.to_string().contains(&k_b["id"].to_string()), "{body}");
}

/// Starts `sleep` as uid `uid` with `path` open as its standard input (opened by the shell
/// that runs as that uid); waits until it is open.
fn hold(uid: u32, path: &str) -> std::process::Child {
    let child = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .args([
            "--clear-groups",
            "--",
            "sh",
            "-c",
            "exec sleep 600 < \"$0\"",
        ])
        .arg(path)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let fd = format!("/proc/{}/fd/0", child.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_link(&fd).is_ok_and(|l| l.to_string_lossy().contains("leases")) {
        assert!(Instant::now() < deadline, "the holder did not open {path}");
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

#[test]
fn held_releases_wait_aside_within_the_lessees_held_bytes() {
    let env = Env::new("tenants-held", 32 * MIB);
    let cfg = config(
        &env,
        "[pool]\nshape = \"fixed\"\n[[pool.target]]\npage_size = \"2M\"\nwarm = \"12M\"\n\
         sizes = [\"2M\"]\n[pool.limits.role.lease]\nheld_bytes = \"4M\"\n",
    );
    // A long lessee grace holds refills back after the leases below (none misses), so every
    // released file is kept and proven, none given back for being above target.
    let d = env.spawn(&[
        "--socket-group",
        "kvm",
        "--config",
        &cfg,
        "--lessee-grace-ms",
        "60000",
    ]);
    d.settle(12 * MIB);
    let mut holders = Vec::new();
    let mut ids = Vec::new();
    for i in 0..3 {
        let (code, l) = lease_as(
            A,
            &env,
            &format!(r#"{{"name":"h{i}","size":"2M","owner":"{A}"}}"#),
        );
        assert_eq!(code, 201, "{l}");
        holders.push(hold(A, l["path"].as_str().unwrap()));
        ids.push(l["id"].as_u64().unwrap());
    }
    let honest = d.lease("honest", 2 * MIB).unwrap();
    for id in &ids {
        let (code, body) = curl_as(A, &env, "DELETE", &format!("/v1/leases/{id}"), "");
        assert_eq!(code, 200, "{body}");
    }
    d.release(honest.id).unwrap();
    // Two held files wait aside (4M, A's limit); the third takes the kernel's path at once;
    // the honest release is scrubbed back meanwhile.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p = d.pool();
        if p.held_aside_files == 2 && p.counters.kernel_path_releases >= 1 {
            assert_eq!(p.held_aside_bytes, 4 * MIB);
            break;
        }
        assert!(Instant::now() < deadline, "{p:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        env.log().contains("holds its limit of released bytes"),
        "{}",
        env.log()
    );
    // The honest file comes back warm while the held ones wait (a liveness bound, not a
    // speed assertion): 4M never leased, the honest 2M.
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.pool().kinds[0].warm_bytes < 6 * MIB {
        assert!(Instant::now() < deadline, "{:?}", d.pool());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(d.pool().counters.held_aside >= 2);
    // Once the holder lets go, the files waiting aside are proven and come back warm.
    for mut h in holders {
        h.kill().unwrap();
        h.wait().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p = d.pool();
        if p.held_aside_files == 0 && p.kinds[0].warm_bytes >= 10 * MIB {
            break;
        }
        assert!(Instant::now() < deadline, "{p:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_owner_policy_matches_the_hooks_numeric_owner() {
    let env = Env::new("tenants-owner", 16 * MIB);
    // A warm target, and refills held back after a lease, so the released file is kept and
    // its recycling decided by the rule (not given back for being above target).
    let cfg = config(
        &env,
        "[pool]\nshape = \"fixed\"\n[[pool.target]]\npage_size = \"2M\"\nwarm = \"4M\"\n\
         sizes = [\"2M\"]\n[pool.recycle_owners]\nnobody = \"kernel\"\n",
    );
    let d = env.spawn(&["--config", &cfg, "--lessee-grace-ms", "60000"]);
    d.settle(4 * MIB);
    // As the libvirt hook sends it: the owner by number.
    let lease = d
        .lease_req(&hugeprep::pool::LeaseRequest {
            name: "libvirt-0d1a2b3c-0000-4000-8000-000000000001-ram".into(),
            size: 2 * MIB,
            owner: Some(A.to_string()),
            ..Default::default()
        })
        .unwrap();
    d.release(lease.id).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.pool().counters.kernel_path_releases == 0 {
        assert!(Instant::now() < deadline, "{:?}", d.pool());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(env.log().contains("reason=\"trust\""), "{}", env.log());
    // By name, the same rule.
    let lease = d
        .lease_req(&hugeprep::pool::LeaseRequest {
            name: "by-name".into(),
            size: 2 * MIB,
            owner: Some("nobody".into()),
            ..Default::default()
        })
        .unwrap();
    d.release(lease.id).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.pool().counters.kernel_path_releases < 2 {
        assert!(Instant::now() < deadline, "{:?}", d.pool());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` as `uid` (its own group, no others); panics unless it succeeds.
fn run_as(uid: u32, cmd: &[&str]) {
    let out = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .args(["--clear-groups", "--"])
        .args(cmd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} as {uid}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_lessee_that_grows_its_file_is_counted_by_the_pages_it_took() {
    let env = Env::new("tenants-grow", 32 * MIB);
    let cfg = config(
        &env,
        "[pool.limits.role.lease]\nleased_bytes = { \"2M\" = \"8M\" }\n",
    );
    let d = env.spawn(&["--socket-group", "kvm", "--config", &cfg]);
    // A request that names its owner: the lessee owns the file and may write to it.
    let (code, l) = lease_as(
        A,
        &env,
        &format!(r#"{{"name":"g","size":"2M","owner":"{A}"}}"#),
    );
    assert_eq!(code, 201, "{l}");
    let path = l["path"].as_str().unwrap();
    // Pages past its end, its size kept: 8M of pages in a file of 2M.
    run_as(A, &["fallocate", "--keep-size", "--length", "8MiB", path]);
    assert_eq!(std::fs::metadata(path).unwrap().len(), 2 * MIB);
    let (code, body) = lease_as(A, &env, r#"{"name":"g2","size":"2M"}"#);
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["limit"]["name"], "leased_bytes.2M", "{body}");
    assert_eq!(body["limit"]["in_use"].as_u64(), Some(8 * MIB), "{body}");
    assert_eq!(body["limit"]["principal"], "uid:65534", "{body}");
    // Grown by `ftruncate`: its length counts (a writable mapping would reserve it all).
    run_as(A, &["truncate", "--size", "10MiB", path]);
    let (code, body) = lease_as(A, &env, r#"{"name":"g2","size":"2M"}"#);
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["limit"]["in_use"].as_u64(), Some(10 * MIB), "{body}");
    // Another principal is not charged for it.
    let (code, body) = lease_as(B, &env, r#"{"name":"g2","size":"2M"}"#);
    assert_eq!(code, 201, "{body}");
    // The release cuts it back; the charge ends with it.
    let id = l["id"].as_u64().unwrap();
    let (code, body) = curl_as(A, &env, "DELETE", &format!("/v1/leases/{id}"), "");
    assert_eq!(code, 200, "{body}");
    let (code, body) = lease_as(A, &env, r#"{"name":"g2","size":"2M"}"#);
    assert_eq!(code, 201, "{body}");
    drop(d);
}

/// Starts a process of `uid` that opens `path` read-only, takes a read lease on it
/// (`F_SETLEASE`, `F_RDLCK`: it owns the file), ignores the lease breaks (`SIGIO`) and
/// sleeps; returns once the lease is taken. Debian's python3 (the suite installs it): root's
/// `PATH` may name a shim another user cannot run.
fn hold_read_lease(uid: u32, path: &str) -> std::process::Child {
    use std::io::BufRead;
    let mut child = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .args(["--clear-groups", "--", "/usr/bin/python3", "-c"])
        .arg(
            "import fcntl, os, signal, sys, time\n\
             signal.signal(signal.SIGIO, signal.SIG_IGN)\n\
             fd = os.open(sys.argv[1], os.O_RDONLY)\n\
             fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)\n\
             print(fd, flush=True)\n\
             while True: time.sleep(3600)\n",
        )
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.trim().parse::<u32>().is_err() {
        let out = child.wait_with_output().unwrap();
        panic!(
            "the holder took no read lease on {path}: {line:?} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    child
}

#[test]
fn pages_a_read_lease_keeps_past_the_release_are_charged_until_it_lets_go() {
    use daemon_util::lessee::Lessee;
    let env = Env::new("tenants-kept", 32 * MIB);
    let cfg = config(
        &env,
        "[pool.limits.role.lease]\nleased_bytes = { \"2M\" = \"8M\" }\n",
    );
    let mut d = env.spawn(&["--socket-group", "kvm", "--config", &cfg]);
    // Lease, hold a read lease, release: the kernel's path cannot truncate the file (its
    // open for writing would break the lease), so the pages stay with the holder. The
    // fourth holder is the attacker of docs/security.md "Pages kept past a release": it grew
    // its file to 4M first, maps all of it and pins a piece of it in a pipe.
    let mut holders = Vec::new();
    let mut attacker = None;
    for i in 0..4 {
        let (code, l) = lease_as(
            A,
            &env,
            &format!(r#"{{"name":"r{i}","size":"2M","owner":"{A}","recycle":"kernel"}}"#),
        );
        assert_eq!(code, 201, "lease {i}: {l}");
        let path = l["path"].as_str().unwrap();
        if i < 3 {
            holders.push(hold_read_lease(A, path));
        } else {
            let mut a = Lessee::spawn(
                "rdlease-grow-pin",
                std::path::Path::new(path),
                4 * MIB,
                false,
                &[],
            );
            a.ready();
            attacker = Some(a);
        }
        let id = l["id"].as_u64().unwrap();
        let (code, body) = curl_as(A, &env, "DELETE", &format!("/v1/leases/{id}"), "");
        assert_eq!(code, 200, "{body}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while d.pool().kept_files < i + 1 {
            assert!(Instant::now() < deadline, "{:?}\n{}", d.pool(), env.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Charged by what each kept file can take: the grown one by its length, which its
    // holder's mapping could fault in whole.
    assert_eq!(d.pool().kept_bytes, 10 * MIB);
    // Its releases hold 10M: the next lease is over its limit.
    let (code, body) = lease_as(A, &env, r#"{"name":"r4","size":"2M"}"#);
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["limit"]["name"], "leased_bytes.2M", "{body}");
    assert_eq!(body["limit"]["in_use"].as_u64(), Some(10 * MIB), "{body}");
    assert_eq!(body["limit"]["principal"], "uid:65534", "{body}");
    assert!(
        d.leases().is_empty(),
        "a refused lease changed nothing: {:?}",
        d.leases()
    );
    // Another principal is not charged for them.
    let (code, body) = lease_as(B, &env, r#"{"name":"r4","size":"2M"}"#);
    assert_eq!(code, 201, "{body}");
    // Across a restart the kept files are kept again, charged to the same principal.
    d.stop();
    let d = env.spawn(&["--socket-group", "kvm", "--config", &cfg]);
    assert_eq!((d.pool().kept_files, d.pool().kept_bytes), (4, 10 * MIB));
    let (code, body) = lease_as(A, &env, r#"{"name":"r4","size":"2M"}"#);
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["limit"]["in_use"].as_u64(), Some(10 * MIB), "{body}");
    // Three holders let go: their files are truncated and no longer charged, while the
    // fourth still holds its lease.
    for mut h in holders {
        h.kill().unwrap();
        h.wait().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.pool().kept_files != 1 {
        assert!(Instant::now() < deadline, "{:?}", d.pool());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(d.pool().kept_bytes, 4 * MIB);
    let (code, body) = lease_as(A, &env, r#"{"name":"r4","size":"2M"}"#);
    assert_eq!(code, 201, "{body}");
    // The fourth never lets go: the kernel takes its lease away after lease-break-time (the
    // keeper's every open breaks it again). Its file is then pinned (the pipe) and still
    // reached (its open file, its mapping): kept, its holder could fault in all 4M and hold
    // them for as long as it likes, so it is truncated under its descriptor and mapping (the
    // piece in the pipe stays with it, uncharged: "Gaps still open"), and the charge ends.
    let break_time: u64 = std::fs::read_to_string("/proc/sys/fs/lease-break-time")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(break_time + 30);
    while d.pool().kept_files != 0 {
        assert!(Instant::now() < deadline, "{:?}", d.pool());
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut attacker = attacker.unwrap();
    // What its pipe holds is its own piece: the 0x00 of the pool's zeroed page.
    assert_eq!(attacker.seen(), 0);
    attacker.exit();
    assert!(
        env.log().contains("no longer held by a lease")
            && env.log().contains("pinned and the file is still reached"),
        "{}",
        env.log()
    );
    drop(d);
}

#[test]
fn lessee_entry() {
    daemon_util::lessee::entry();
}

/// Pages a lessee pins past its release (an io_uring fixed buffer kept after it unmapped and
/// closed its file) are kept in the untruncated file, charged to it, until the pin goes; the
/// pages nobody pins go back at the release.
#[test]
fn pages_pinned_past_the_release_are_charged_until_the_pin_goes() {
    use daemon_util::lessee::{Lessee, PINNED};
    let env = Env::new("tenants-pinned", 32 * MIB);
    // held_bytes below a lease: a held release takes the kernel's path at once, no wait
    // aside.
    let cfg = config(
        &env,
        "[pool.limits.role.lease]\nleased_bytes = { \"2M\" = \"12M\" }\nheld_bytes = \"2M\"\n",
    );
    let d = env.spawn(&["--socket-group", "kvm", "--config", &cfg]);
    assert!(
        env.log().contains("method=\"kernel-counts\""),
        "{}",
        env.log()
    );
    // Lease 8M, pin pages of it, let go of the file, release; twice: the first pins its
    // first 4M as an io_uring fixed buffer, the second puts 64K of its first page in a pipe
    // (`vmsplice`; a second ring would pass uid 65534's RLIMIT_MEMLOCK) and asks for the
    // kernel's path itself, which skips the proof: the pins are still seen.
    let mut pinners = Vec::new();
    for (i, (mode, recycle)) in [("iouring", ""), ("vmsplice", r#","recycle":"kernel""#)]
        .iter()
        .enumerate()
    {
        let (code, l) = lease_as(
            A,
            &env,
            &format!(r#"{{"name":"p{i}","size":"8M","owner":"{A}"{recycle}}}"#),
        );
        assert_eq!(code, 201, "lease {i}: {l}");
        let path = std::path::PathBuf::from(l["path"].as_str().unwrap());
        let mut pinner = Lessee::spawn(mode, &path, 8 * MIB, false, &[]);
        pinner.ready();
        pinners.push(pinner);
        let id = l["id"].as_u64().unwrap();
        let (code, body) = curl_as(A, &env, "DELETE", &format!("/v1/leases/{id}"), "");
        assert_eq!(code, 200, "{body}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while d.pool().kept_files < i + 1 {
            assert!(Instant::now() < deadline, "{:?}\n{}", d.pool(), env.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Each kept file holds its pinned pages only, in the daemon's directory.
    let pinned = PINNED + 2 * MIB;
    assert_eq!(d.pool().kept_bytes, pinned);
    let kept: Vec<_> = Env::names(&env.pool_dir())
        .into_iter()
        .filter(|n| n.starts_with("kept-"))
        .collect();
    assert_eq!(kept.len(), 2, "{kept:?}");
    let mut blocks = Vec::new();
    for name in &kept {
        assert!(name.ends_with("-7569643a3635353334"), "{name}");
        blocks.push(
            std::fs::metadata(env.pool_dir().join(name))
                .unwrap()
                .blocks()
                * 512,
        );
    }
    blocks.sort_unstable();
    assert_eq!(blocks, [2 * MIB, PINNED], "{kept:?}");
    let dir = std::fs::metadata(env.pool_dir()).unwrap();
    assert_eq!((dir.uid(), dir.mode() & 0o777), (0, 0o700));
    // Its pins hold 6M of its 12M: the next 8M lease is over its limit.
    let (code, body) = lease_as(A, &env, r#"{"name":"p2","size":"8M"}"#);
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["limit"]["name"], "leased_bytes.2M", "{body}");
    assert_eq!(body["limit"]["in_use"].as_u64(), Some(pinned), "{body}");
    assert_eq!(body["limit"]["principal"], "uid:65534", "{body}");
    assert!(d.leases().is_empty(), "{:?}", d.leases());
    // Another principal is not charged for them.
    let (code, body) = lease_as(B, &env, r#"{"name":"p2","size":"8M"}"#);
    assert_eq!(code, 201, "{body}");
    let (code, body) = curl_as(
        B,
        &env,
        "DELETE",
        &format!("/v1/leases/{}", body["id"].as_u64().unwrap()),
        "",
    );
    assert_eq!(code, 200, "{body}");
    // The pinners exit: the keeper sees no pin, truncates and unlinks, and the charge ends.
    for p in pinners {
        p.exit();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.pool().kept_files != 0 {
        assert!(Instant::now() < deadline, "{:?}", d.pool());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(d.pool().kept_bytes, 0);
    assert!(Env::names(&env.pool_dir())
        .iter()
        .all(|n| !n.starts_with("kept-")));
    assert!(
        env.log().contains("no longer held by a lease or a pin"),
        "{}",
        env.log()
    );
    let (code, body) = lease_as(A, &env, r#"{"name":"p2","size":"8M"}"#);
    assert_eq!(code, 201, "{body}");
    let (code, body) = curl_as(
        A,
        &env,
        "DELETE",
        &format!("/v1/leases/{}", body["id"].as_u64().unwrap()),
        "",
    );
    assert_eq!(code, 200, "{body}");
    // No hugepage leaked: with the daemon gone and its files removed, the mount holds
    // nothing (a page a pin kept out of every file would still count until freed).
    drop(d);
    std::fs::remove_dir_all(env.mount.join("hugeprep")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.mount_used() != 0 {
        assert!(
            Instant::now() < deadline,
            "{} bytes still in use",
            env.mount_used()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
