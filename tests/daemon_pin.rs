//! `pin: true` leases against the real daemon: every page long-term pinned (io_uring buffer
//! registration, VFIO's FOLL_LONGTERM path) before the lease is returned, the pin dropped at
//! release before the scrub, and a pin the memlock limit refuses failing the lease cleanly.

mod daemon_util;

use daemon_util::{Env, MIB};
use hugeprep::client::ClientError;
use hugeprep::pool::LeaseRequest;

/// Bytes the process has long-term pinned (`VmPin` in /proc/PID/status).
fn pinned_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmPin:"))
        .expect("VmPin in /proc/PID/status");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

fn pinned_request(name: &str, size: u64) -> LeaseRequest {
    LeaseRequest {
        name: name.into(),
        size,
        pin: true,
        ..LeaseRequest::default()
    }
}

#[test]
fn pinned_lease_holds_every_page_until_release() {
    let env = Env::new("pin-hold", 32 * MIB);
    let d = env.spawn(&["--warm", "16M", "--sizes", "8M"]);
    d.settle(16 * MIB);
    assert_eq!(pinned_bytes(d.pid()), 0);
    // Warm, cold-grown and cold sources all pin.
    let a = d.lease_req(&pinned_request("a", 8 * MIB)).unwrap();
    assert!(a.pinned, "{a:?}");
    assert_eq!(pinned_bytes(d.pid()), 8 * MIB);
    let b = d.lease_req(&pinned_request("b", 12 * MIB)).unwrap();
    assert!(b.pinned);
    assert_eq!(pinned_bytes(d.pid()), 20 * MIB);
    let plain = d.lease("plain", 2 * MIB).unwrap();
    assert!(!plain.pinned);
    let listed = d.leases();
    let pinned: Vec<&str> = listed
        .iter()
        .filter(|l| l.pinned)
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(pinned, ["a", "b"]);
    assert!(daemon_util::lease_is_zero(&a));
    daemon_util::write_pattern(&a, 0x11);
    d.release(a.id).unwrap();
    assert_eq!(pinned_bytes(d.pid()), 12 * MIB);
    d.release(b.id).unwrap();
    d.release(plain.id).unwrap();
    assert_eq!(pinned_bytes(d.pid()), 0);
    // The released files were scrubbed back into the pool.
    d.settle(16 * MIB);
    let again = d.lease_req(&pinned_request("again", 8 * MIB)).unwrap();
    assert!(daemon_util::lease_is_zero(&again));
}

#[test]
fn pins_are_dropped_when_the_daemon_stops() {
    let env = Env::new("pin-stop", 16 * MIB);
    let mut d = env.spawn(&[]);
    d.lease_req(&pinned_request("vm", 8 * MIB)).unwrap();
    assert_eq!(pinned_bytes(d.pid()), 8 * MIB);
    d.stop();
    // A restart (no pin state in the journal) keeps the lease, unpinned.
    let d = env.spawn(&[]);
    let leases = d.leases();
    assert_eq!(leases.len(), 1);
    assert!(!leases[0].pinned);
    assert_eq!(pinned_bytes(d.pid()), 0);
}

/// The daemon runs without CAP_IPC_LOCK (dropped from the bounding set before exec) and with
/// RLIMIT_MEMLOCK at 4 MiB, so the kernel refuses to pin 8 MiB: the lease fails naming the
/// limit and leaves no lease, link or lost pool memory behind.
#[test]
fn pin_above_memlock_limit_fails_and_leaks_nothing() {
    let env = Env::new("pin-memlock", 32 * MIB);
    let limit = (4 * MIB).to_string();
    let memlock = format!("--memlock={limit}:{limit}");
    let d = env.spawn_wrapped(
        &[
            "setpriv",
            "--bounding-set",
            "-ipc_lock",
            "--inh-caps",
            "-ipc_lock",
            "prlimit",
            &memlock,
        ],
        &["--warm", "8M", "--sizes", "8M"],
    );
    d.settle(8 * MIB);
    let err = d.lease_req(&pinned_request("big", 8 * MIB)).unwrap_err();
    let ClientError::Api { status, body } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(*status, 422, "{err}");
    assert!(
        body.error.contains("RLIMIT_MEMLOCK (4194304 bytes)"),
        "{err}"
    );
    assert_eq!(body.field.as_deref(), Some("pin"), "{err}");
    assert!(d.leases().is_empty());
    assert!(Env::names(&env.lease_dir()).is_empty());
    assert_eq!(pinned_bytes(d.pid()), 0);
    // The warm file it came from is scrubbed and back in the pool; a small pin still works.
    d.settle(8 * MIB);
    let small = d.lease_req(&pinned_request("small", 2 * MIB)).unwrap();
    assert!(small.pinned);
    d.release(small.id).unwrap();
    d.settle(8 * MIB);
}
