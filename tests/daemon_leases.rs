//! Lease and release round trips through the real daemon, every `source` path.

mod daemon_util;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use daemon_util::{lease_is_zero, write_pattern, Env, MIB};
use hugeprep::pool::LeaseSource;

#[test]
fn lease_and_release_through_every_source() {
    let env = Env::new("leases", 64 * MIB);
    let d = env.spawn(&["--warm", "16M", "--sizes", "8M", "--verify", "full"]);
    d.settle(16 * MIB);
    assert_eq!(env.mount_used(), 16 * MIB);

    let a = d.lease("a", 8 * MIB).unwrap();
    assert_eq!(a.source, LeaseSource::WarmExact);
    let b = d.lease("b", 4 * MIB).unwrap();
    assert_eq!(b.source, LeaseSource::WarmShrunk);
    for l in [&a, &b] {
        let meta = std::fs::metadata(&l.path).unwrap();
        assert_eq!(meta.len(), l.size);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(lease_is_zero(l));
        write_pattern(l, 1);
    }
    d.settle(16 * MIB);
    let c = d.lease("c", 12 * MIB).unwrap();
    assert_eq!(c.source, LeaseSource::WarmGrown);
    assert!(lease_is_zero(&c));
    let got = d.client.blocking(d.client.get_lease(c.id)).unwrap();
    assert_eq!(got, c);
    assert_eq!(d.leases().len(), 3);

    // Releasing: back to warm up to the target, the rest deleted; nothing left over.
    for l in [&a, &b, &c] {
        d.release(l.id).unwrap();
        assert!(!l.path.exists());
    }
    assert_eq!(d.raw("GET", &format!("/v1/leases/{}", a.id), b"").0, 404);
    let p = d.settle(16 * MIB);
    assert_eq!(p.kinds[0].leased_bytes, 0);
    assert_eq!(env.mount_used(), 16 * MIB);
    assert!(Env::names(&env.lease_dir()).is_empty());
    drop(d);

    // Without a warm target every lease is cold.
    let d = env.spawn(&[]);
    d.settle(0);
    let cold = d.lease("cold", 6 * MIB).unwrap();
    assert_eq!(cold.source, LeaseSource::Cold);
    assert!(lease_is_zero(&cold));
    d.release(cold.id).unwrap();
    d.settle(0);
    assert_eq!(env.mount_used(), 0);
}

#[test]
fn deleting_the_lease_path_frees_nothing_and_owner_gets_the_file() {
    let env = Env::new("owner", 16 * MIB);
    let d = env.spawn(&[]);
    let nobody = hugeprep::hugetlb::Owner::lookup("nobody").unwrap();
    let lease = d
        .lease_req(&hugeprep::pool::LeaseRequest {
            name: "vm".into(),
            size: 4 * MIB,
            page_size: Some(hugeprep::PageSize::Size2M),
            node: Some(0),
            owner: Some("nobody".into()),
            pid: None,
            pin: false,
            recycle: None,
        })
        .unwrap();
    let meta = std::fs::metadata(&lease.path).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (nobody.uid, 0o600));
    std::fs::remove_file(&lease.path).unwrap();
    assert_eq!(env.mount_used(), 4 * MIB);
    d.release(lease.id).unwrap();
    d.settle(0);
    assert_eq!(env.mount_used(), 0);
}

#[test]
fn lease_is_released_when_its_process_exits() {
    let env = Env::new("pidexit", 16 * MIB);
    let d = env.spawn(&[]);
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let lease = d
        .lease_req(&hugeprep::pool::LeaseRequest {
            name: "vm".into(),
            size: 4 * MIB,
            page_size: None,
            node: None,
            owner: None,
            pid: Some(child.id()),
            pin: false,
            recycle: None,
        })
        .unwrap();
    assert_eq!(lease.pid, Some(child.id()));
    assert_eq!(d.leases().len(), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !d.leases().is_empty() {
        assert!(std::time::Instant::now() < deadline, "lease not released");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    d.settle(0);
    assert_eq!(env.mount_used(), 0);
    assert!(Env::names(&env.lease_dir()).is_empty());
}

#[test]
fn pool_command_shows_the_running_daemons_pool() {
    let env = Env::new("pool-cli", 32 * MIB);
    let d = env.spawn(&["--warm", "8M", "--sizes", "8M"]);
    d.settle(8 * MIB);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["pool", "--json", "--socket"])
        .arg(&env.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds = all["daemon"]["kinds"]
        .as_array()
        .expect("the daemon's pool");
    assert!(kinds.iter().any(|k| k["warm_bytes"] == 8 * MIB), "{all}");
    assert!(!all["kernel"].as_array().unwrap().is_empty(), "{all}");
}

/// Regression: the refill only made files from the size mix, so a deficit smaller than every
/// size (here 2 MiB, with sizes of 8 MiB) left the pool below its target for good; after a
/// crash loop, leases coming back at their own sizes made that common.
#[test]
fn refill_fills_a_deficit_smaller_than_every_size() {
    let env = Env::new("deficit", 32 * MIB);
    let d = env.spawn(&["--warm", "10M", "--sizes", "8M"]);
    let status = d.settle(10 * MIB);
    assert_eq!(status.kinds[0].warm_files, 2, "{:?}", status.kinds[0]);
    assert_eq!(env.mount_used(), 10 * MIB);
}

/// "Trust but verify": with `calibration = report` the daemon times the methods at start and
/// `/v1/cpu` says which rule chose the method, why, who decided, and what was measured.
#[test]
fn cpu_route_reports_rule_source_and_calibration() {
    let env = Env::new("cpu", 8 * MIB);
    let d = env.spawn(&["--calibration", "report"]);
    let cpu = d.client.blocking(d.client.cpu()).unwrap();
    assert!(!cpu.rule.is_empty() && !cpu.source.is_empty(), "{cpu:?}");
    assert_eq!(cpu.decided_by, hugeprep::policy::DecidedBy::Rule, "{cpu:?}");
    let calibration = cpu.calibration.expect("calibration ran at start");
    assert_eq!(calibration["outcome"]["mode"], "report", "{calibration}");
    assert!(
        calibration["measured"]["methods"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "{calibration}"
    );
}

/// The default calibration (`auto`) runs at the first start, is stored in the state
/// directory, and a restart on the same CPU, kernel and policy reuses it unless told to redo.
#[test]
fn calibration_is_stored_and_reused_across_restarts() {
    let env = Env::new("calstore", 8 * MIB);
    let origin = |d: &daemon_util::Daemon| {
        let cpu = d.client.blocking(d.client.cpu()).unwrap();
        assert!(!cpu.reason.is_empty(), "{cpu:?}");
        let c = cpu.calibration.expect("calibration ran or was reused");
        assert_eq!(c["outcome"]["mode"], "auto", "{c}");
        (
            c["origin"]["kind"].as_str().unwrap().to_string(),
            c["measured"].clone(),
        )
    };
    let mut d = env.spawn(&["--calibration", "auto"]);
    let (first, measured) = origin(&d);
    d.stop();
    let mut d = env.spawn(&["--calibration", "auto"]);
    let (second, reused) = origin(&d);
    d.stop();
    let d = env.spawn(&["--calibration", "auto", "--recalibrate"]);
    let (third, _) = origin(&d);
    assert_eq!(
        (first.as_str(), second.as_str(), third.as_str()),
        ("measured", "stored", "measured")
    );
    assert_eq!(measured, reused);
    assert!(env.state.join("calibration/records/clearing.json").exists());
}

/// Socket activation through systemd's own tool: `systemd-socket-activate` listens, starts
/// the daemon on the first connection with the socket as fd 3, and that first request is
/// answered on the inherited socket.
#[test]
fn serves_a_socket_passed_by_socket_activation() {
    use std::process::{Command, Stdio};
    if Command::new("systemd-socket-activate")
        .arg("--version")
        .output()
        .is_err()
    {
        hugeprep::testing::missing_tool(
            "systemd-socket-activate is not installed (package systemd)",
        );
        return;
    }
    let env = Env::new("activation", 8 * MIB);
    let socket = env.dir.join("activated.sock");
    let mut activator = Command::new("systemd-socket-activate")
        .arg("--listen")
        .arg(&socket)
        .arg(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["serve", "--calibration", "off", "--state-dir"])
        .arg(&env.state)
        .arg("--mount")
        .arg(&env.mount)
        .arg("--socket")
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The activator binds before it is ready to accept: wait for the path.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !socket.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let client = hugeprep::client::Client::new(&socket);
    let pool = client.blocking(client.pool());
    // systemd-socket-activate execs the daemon in its own process: this pid is the daemon.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(activator.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = activator.wait();
    let pool = pool.expect("the daemon answered on the inherited socket");
    assert_eq!(pool.kinds.len(), 1, "{pool:?}");
}
