//! The hook while the daemon is busy or restarting, with real libvirtd, QEMU and the real
//! daemon: a 503 (admission full, then shutting down) is retried after its `Retry-After`, a
//! refused connection while the daemon is away is retried, and the start completes on the
//! restarted daemon's leases; past `daemon_retry_s`, `on_daemon_down` decides.
//!
//! The daemon is kept busy and kept in its shutdown the way a real client can: lease
//! requests whose body has not arrived yet each hold one of its admission slots (a request
//! in flight, which a stopping daemon waits for).

mod daemon_util;
mod libvirt_util;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use daemon_util::MIB;
use hugeprep::vmm::libvirt::Fallback;
use libvirt_util::{domain_xml, hook_running, inode, tools_present, wait_until, Lab};

/// Lease requests sent up to the first byte of their body: each holds an admission slot
/// until dropped.
fn hold_every_slot(socket: &Path) -> Vec<UnixStream> {
    let slots = hugeprep::api::admission::Admission::for_host().slots_total;
    (0..slots)
        .map(|_| {
            let mut s = UnixStream::connect(socket).unwrap();
            s.write_all(
                b"POST /v1/leases HTTP/1.1\r\nhost: localhost\r\n\
                  content-type: application/json\r\ncontent-length: 64\r\n\r\n{",
            )
            .unwrap();
            s
        })
        .collect()
}

/// Whether the daemon's log, past its first `from` bytes, holds `needle`.
fn logged_since(lab: &Lab, from: usize, needle: &str) -> bool {
    lab.env
        .log()
        .get(from..)
        .is_some_and(|l| l.contains(needle))
}

const BUSY: &str = "lease refused for back-pressure";
const STOPPING: &str = "answered 503 with retry-after 1 s: shutting down";

#[test]
fn a_start_waits_out_a_busy_then_restarting_daemon() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("libvirt-restart", 256 * MIB, 128 * MIB);
    lab.configure(|c| c.daemon_retry_s = 120);
    let uuid = lab.uuid();
    let xml = domain_xml("through-restart", &uuid, 0, true, "");
    let from = lab.env.log().len();
    let held = hold_every_slot(&lab.env.socket);
    let file = lab.env.dir.join("through-restart.xml");
    std::fs::write(&file, &xml).unwrap();
    let uri = lab.sandbox.uri().to_string();
    let create = std::thread::spawn(move || {
        std::process::Command::new("virsh")
            .args(["-q", "-c", &uri, "create", "--paused"])
            .arg(&file)
            .output()
            .unwrap()
    });
    // Admission full: the hook's lease waits for a slot, gets 503 with Retry-After, and
    // keeps trying.
    assert!(wait_until(
        "a 503 for back-pressure",
        Duration::from_secs(60),
        || { logged_since(&lab, from, BUSY) }
    ));
    assert!(hook_running("through-restart", "start"));
    // The daemon stops (a restart): while the held requests are in flight it answers new
    // connections 503 with Retry-After.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(lab.daemon.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_until(
        "a 503 while stopping",
        Duration::from_secs(60),
        || { logged_since(&lab, from, STOPPING) }
    ));
    drop(held);
    let status = lab.daemon.child.wait().unwrap();
    assert!(status.success(), "daemon exited with {status}");
    // Gone: the socket refuses, and the hook is still at it.
    assert!(!lab.env.socket.exists());
    assert!(hook_running("through-restart", "start"));
    lab.respawn_daemon();
    let created = create.join().unwrap();
    assert!(created.status.success(), "{created:?}");
    let leases = lab.leases_of(&uuid);
    assert_eq!(leases.len(), 1);
    assert_eq!(
        lab.qemu_backing_maps(&uuid),
        vec![("pc.ram".to_string(), inode(&leases[0].path))]
    );
    lab.destroy(&uuid);
    lab.assert_clean();
}

#[test]
fn past_daemon_retry_s_on_daemon_down_decides() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("libvirt-busy", 256 * MIB, 128 * MIB);
    lab.configure(|c| c.daemon_retry_s = 2);
    let held = hold_every_slot(&lab.env.socket);

    // Still busy after the retries: "fail" aborts the start, saying so.
    let uuid = lab.uuid();
    let out = lab.create(&domain_xml("busy-fail", &uuid, 0, true, ""));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hugeprep daemon unavailable")
            && err.contains("retried for 2 s")
            && err.contains("503"),
        "{err}"
    );
    assert!(lab.sandbox.qemu_pid(&uuid).is_none());
    assert!(lab.leases_of(&uuid).is_empty());

    // "cold": QEMU starts on memory of its own.
    lab.configure(|c| c.on_daemon_down = Fallback::Cold);
    let uuid = lab.uuid();
    lab.start(&domain_xml("busy-cold", &uuid, 0, true, ""));
    assert!(lab.leases_of(&uuid).is_empty());
    let maps = lab.qemu_backing_maps(&uuid);
    assert_eq!(maps.len(), 1);
    assert_eq!(maps[0].0, "pc.ram");
    lab.destroy(&uuid);
    drop(held);
    lab.assert_clean();
}
