//! Who may do what on the unix socket, against the real daemon, with real peers: processes
//! started under other uids and groups by `setpriv` (curl and python3 as the clients).
//!
//! - a lease belongs to the principal that made it: a second principal can neither see nor
//!   release it (404, as for no lease), the maker and root can;
//! - the socket's group (`kvm` on a libvirt host) may lease, not administer;
//! - a peer's groups are those it had when it connected: a process that reuses the pid of a
//!   peer that has exited gains the connection nothing.

mod daemon_util;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use daemon_util::users::{curl_as, kvm_gid};
use daemon_util::{Env, MIB};

#[test]
fn a_second_principal_cannot_see_or_release_a_lease_and_the_socket_group_is_not_admin() {
    let env = Env::new("access-owner", 32 * MIB);
    let kvm = kvm_gid();
    let d = env.spawn(&["--socket-group", "kvm"]);
    let (a, b) = (65534, 65533);

    // The socket group may lease: A makes a lease, journaled as A's.
    let (code, body) = curl_as(
        a,
        kvm,
        &env,
        "POST",
        "/v1/leases",
        r#"{"name":"a-vm","size":"2M"}"#,
    );
    assert_eq!(code, 201, "{body}");
    let lease: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = lease["id"].as_u64().unwrap();
    assert_eq!(lease["principal"], "uid:65534", "{body}");

    // B, in the same group, sees no lease, and its GET and DELETE find none.
    let (code, body) = curl_as(b, kvm, &env, "GET", "/v1/leases", "");
    assert_eq!((code, body.trim()), (200, "[]"));
    for method in ["GET", "DELETE"] {
        let (code, body) = curl_as(b, kvm, &env, method, &format!("/v1/leases/{id}"), "");
        assert_eq!(code, 404, "{method}: {body}");
        assert!(
            !body.contains("a-vm") && !body.contains("/leases/"),
            "{body}"
        );
    }
    assert_eq!(d.leases().len(), 1, "B's DELETE released A's lease");
    assert!(
        env.log().contains("lease of another principal"),
        "{}",
        env.log()
    );

    // Nor may B administer: the socket group is not admin.
    for (method, path, body) in [
        ("POST", "/v1/pool/drain", ""),
        (
            "PUT",
            "/v1/pool/targets",
            r#"{"targets":[{"page_size":"2M","warm":"4M"}]}"#,
        ),
        ("POST", "/v1/pool/resume", ""),
    ] {
        let (code, text) = curl_as(b, kvm, &env, method, path, body);
        assert_eq!(code, 403, "{method} {path}: {text}");
        assert!(
            text.contains("has role lease") && text.contains("needs role admin"),
            "{text}"
        );
    }

    // The maker releases its own; root (admin) may release anyone's.
    let (code, body) = curl_as(a, kvm, &env, "DELETE", &format!("/v1/leases/{id}"), "");
    assert_eq!(code, 200, "{body}");
    let (code, body) = curl_as(
        a,
        kvm,
        &env,
        "POST",
        "/v1/leases",
        r#"{"name":"a-vm2","size":"2M"}"#,
    );
    assert_eq!(code, 201, "{body}");
    let id2 = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
        .as_u64()
        .unwrap();
    assert_eq!(d.leases()[0].principal.as_deref(), Some("uid:65534"));
    d.release(id2).unwrap();
    assert!(d.leases().is_empty());
}

/// A python3 peer as uid 65534, group `gid`, no other group: it connects, forks a child
/// that keeps the connection, prints its own pid and exits. The child, on a line on
/// stdin, sends `POST /v1/pool/drain` on the inherited connection and prints the status.
const HOLDER: &str = r#"
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
if os.fork() > 0:
    print(os.getpid(), flush=True)
    os._exit(0)
sys.stdin.readline()
s.sendall(b"POST /v1/pool/drain HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
print(s.recv(200).split(b"\r\n")[0].decode(), flush=True)
"#;

/// Starts `setpriv ... sleep 30` as uid 65534 with the supplementary group `admin_gid`
/// until its pid is `pid` (the kernel hands out the pid after `ns_last_pid`); at most 200
/// tries and 20 s, since other processes of the machine fork too.
fn reuse_pid(pid: u32, kvm: u32, admin_gid: u32) -> std::process::Child {
    let deadline = Instant::now() + Duration::from_secs(20);
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
        let mut child = Command::new("setpriv")
            .args([
                "--reuid=65534",
                &format!("--regid={kvm}"),
                &format!("--groups={admin_gid}"),
                "--",
                "sleep",
                "30",
            ])
            .spawn()
            .unwrap();
        if child.id() == pid {
            return child;
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            Instant::now() < deadline,
            "pid {pid} not reused within 20 s"
        );
    }
    panic!("pid {pid} not reused in 200 tries");
}

#[test]
fn a_pid_reused_after_connect_gains_nothing() {
    let env = Env::new("access-pid", 8 * MIB);
    let kvm = kvm_gid();
    let admin_gid = 4242;
    let config = env.dir.join("access.toml");
    std::fs::write(
        &config,
        format!(
            "[[access.unix_peer]]\ngid = {kvm}\nrole = \"read\"\n\
             [[access.unix_peer]]\ngid = {admin_gid}\nrole = \"admin\"\n"
        ),
    )
    .unwrap();
    let d = env.spawn(&[
        "--socket-group",
        "kvm",
        "--config",
        config.to_str().unwrap(),
    ]);

    let mut holder = Command::new("setpriv")
        .args([
            "--reuid=65534",
            &format!("--regid={kvm}"),
            "--clear-groups",
            "--",
            "/usr/bin/python3",
            "-c",
            HOLDER,
        ])
        .arg(&env.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    // Taken before `wait`, which would close it (the child waits on it).
    let mut stdin = holder.stdin.take().unwrap();
    let connector: u32 = lines.next().unwrap().unwrap().trim().parse().unwrap();
    // setpriv execs python: the connector is the process we started, and it has exited.
    assert_eq!(connector, holder.id());
    holder.wait().unwrap();

    // A process in the admin group now has the connector's pid.
    let mut impostor = reuse_pid(connector, kvm, admin_gid);
    // setpriv sets the groups, then execs sleep: wait (at most 10 s) until /proc shows them.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = std::fs::read_to_string(format!("/proc/{connector}/status")).unwrap();
        let in_admin = status.lines().any(|l| {
            l.starts_with("Groups:") && l.split_whitespace().any(|g| g == admin_gid.to_string())
        });
        if in_admin {
            break;
        }
        assert!(Instant::now() < deadline, "{status}");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The held connection still has the connector's role: read, not admin.
    writeln!(stdin).unwrap();
    let status = lines.next().unwrap().unwrap();
    let _ = impostor.kill();
    let _ = impostor.wait();
    assert!(status.contains(" 403"), "{status}");
    assert!(!d.pool().kinds.iter().any(|k| k.drained), "the drain ran");
}

/// The installed command run by a user outside the socket's group is told about the group
/// and how to join it, not to start a daemon that is running; a member connects.
#[test]
fn a_user_outside_the_socket_group_is_told_about_the_group() {
    let env = Env::new("access-hint", 8 * MIB);
    let kvm = kvm_gid();
    let _d = env.spawn(&["--socket-group", "kvm"]);
    let status_as = |gid: u32| {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                &format!("--regid={gid}"),
                "--clear-groups",
                "--",
                env!("CARGO_BIN_EXE_hugeprep"),
                "status",
                "--socket",
            ])
            .arg(&env.socket)
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    };
    let out = status_as(65534);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(
        err.contains("members of the socket's group kvm may connect, and you are not in kvm"),
        "{err}"
    );
    assert!(err.contains("usermod -aG kvm"), "{err}");
    assert!(!err.contains("running?"), "{err}");

    let out = status_as(kvm);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
