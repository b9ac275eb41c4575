//! Bounded connections against the real daemon, run under the default `LimitNOFILE` (1024):
//! more idle and half-open connections than the limits, on the unix socket (five other uids
//! in the socket's group, by python3 under `setpriv`) and over TLS (half-open handshakes
//! from other loopback addresses), while root's leases, a TLS client and the libvirt hook
//! keep working. Before the fix every such connection was held for as long as its client
//! liked, and 1,100 of them starved `accept` at the descriptor limit.
//!
//! The limits for 1024 descriptors (`Limits::for_fd_budget`): 192 unix connections, 48 per
//! uid, 24 kept for root; 57 TLS handshakes in flight, 14 per address. Every loop below is
//! bounded in count, every wait in time; everything is on loopback or the unix socket.

mod daemon_util;
mod libvirt_util;
mod remote_util;

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use daemon_util::{Env, MIB};
use hugeprep::api::limits::Limits;
use hugeprep::vmm::libvirt::HookConfig;
use remote_util::{block_on, tls_addr, Conn, Pki, LEASE};

/// Opens N connections to the socket, sends half a request header on every other one, waits
/// a second, prints `held refused closed` (refused: answered 503) and holds them until its
/// stdin closes.
const FLOODER: &str = r#"
import select, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
socks = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    if i % 2 == 0:
        try:
            s.sendall(b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Le")
        except OSError:
            pass  # refused and closed already
    socks.append(s)
time.sleep(1.0)
ready, _, _ = select.select(socks, [], [], 0)
def answer(s):
    try:
        return s.recv(64)
    except OSError:
        return b""
refused = sum(1 for s in ready if answer(s).startswith(b"HTTP/1.1 503"))
print(n - len(ready), refused, len(ready) - refused, flush=True)
sys.stdin.readline()
"#;

struct Flooder {
    child: Child,
    stdin: ChildStdin,
    held: usize,
    refused: usize,
}

fn flood_unix(env: &Env, uid: u32, gid: u32, n: usize) -> Flooder {
    let mut child = Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            "--clear-groups",
            "--",
            "/usr/bin/python3",
            "-c",
            FLOODER,
        ])
        .arg(&env.socket)
        .arg(n.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let n: Vec<usize> = line
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(n.len(), 3, "flooder said {line:?}");
    Flooder {
        child,
        stdin,
        held: n[0],
        refused: n[1],
    }
}

/// Runs the libvirt hook's `start begin` and `release end` for a domain (no libvirtd: the
/// hook is what libvirtd would run), and checks it linked and then gave back its lease.
fn hook_round(env: &Env, d: &daemon_util::Daemon, id: u32) {
    let backing = env.mount.join("libvirt-backing");
    std::fs::create_dir_all(&backing).unwrap();
    let config_path = env.dir.join("libvirt-hook.toml");
    let mut config = HookConfig::new(&backing);
    config.socket = env.socket.clone();
    config.stale_after_s = 0;
    std::fs::write(&config_path, config.to_toml()).unwrap();
    let uuid = format!("0a1b2c3d-0000-4000-8000-{id:012}");
    let xml = libvirt_util::domain_xml("flooded", &uuid, 0, true, "").replace(
        "<domain type='kvm'>",
        &format!("<domain type='kvm' id='{id}'>"),
    );
    for (op, sub) in [("start", "begin"), ("release", "end")] {
        let out = libvirt_util::run_hook(&config_path, "flooded", op, sub, &xml);
        assert!(out.status.success(), "hook {op}: {out:?}");
        if op == "start" {
            let dir = backing.join(format!("libvirt/qemu/{id}-flooded"));
            assert!(dir.join("pc.ram").exists(), "hook linked nothing");
            assert_eq!(d.leases().len(), 1);
            // libvirt removes the directory when the domain stops.
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
    assert!(d.leases().is_empty(), "the hook's lease was kept");
}

/// Half-open TLS connections (TCP connected, no ClientHello) from `ip`: (held, closed at
/// once by the daemon), and the held streams.
async fn half_open(
    addr: SocketAddr,
    ip: Ipv4Addr,
    n: usize,
) -> (Vec<tokio::net::TcpStream>, usize) {
    let mut streams = Vec::new();
    for _ in 0..n {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(SocketAddr::new(IpAddr::V4(ip), 0)).unwrap();
        streams.push(s.connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut held = Vec::new();
    let mut closed = 0;
    for s in streams {
        let mut buf = [0u8; 16];
        match tokio::time::timeout(Duration::from_millis(20), s.peek(&mut buf)).await {
            Err(_) => held.push(s),
            Ok(_) => closed += 1,
        }
    }
    (held, closed)
}

#[test]
fn more_idle_and_half_open_connections_than_the_limits_leave_leases_and_the_hook_working() {
    // The test itself holds about 500 descriptors.
    let me = std::process::id().to_string();
    let raised = Command::new("prlimit")
        .args(["--pid", &me, "--nofile=8192:8192"])
        .status()
        .unwrap();
    assert!(raised.success());
    let limits = Limits::for_fd_budget(1024);
    assert_eq!(
        (
            limits.unix_connections,
            limits.unix_per_uid,
            limits.tls_connections,
            limits.tls_per_addr,
            limits.tls_handshakes
        ),
        (192, 48, 134, 67, 57),
        "{limits:?}"
    );

    let env = Env::new("limits", 64 * MIB);
    let kvm = nix::unistd::Group::from_name("kvm")
        .unwrap()
        .unwrap()
        .gid
        .as_raw();
    let pki = Pki::new(&env.dir.join("pki"));
    let mut flags = pki.serve_flags(false);
    flags.extend(["--socket-group", "kvm", "--warm", "8M", "--sizes", "2M"].map(String::from));
    let d = env.spawn_wrapped(
        &["prlimit", "--nofile=1024:1024", "--"],
        &flags.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    d.settle(8 * MIB);

    // Five uids of the socket's group each open 60 connections, half of them stopping in
    // the middle of a header: 300 against 192, 48 per uid.
    let flooders: Vec<Flooder> = (0..5)
        .map(|i| flood_unix(&env, 65530 + i, kvm, 60))
        .collect();
    let held: usize = flooders.iter().map(|f| f.held).sum();
    for f in &flooders {
        assert!(f.held <= limits.unix_per_uid, "one uid held {}", f.held);
        assert!(f.refused > 0, "nothing refused with 503");
    }
    assert!(
        held <= limits.unix_connections - limits.unix_root_reserve,
        "{held} held"
    );

    // Root's leases and the libvirt hook still work.
    for i in 0..4 {
        let l = d.lease(&format!("root-{i}"), 2 * MIB).unwrap();
        d.release(l.id).unwrap();
    }
    hook_round(&env, &d, 71);

    // TLS: 80 half-open connections from 127.0.0.2 (67 allowed per address, 14 of them
    // handshaking); a client on 127.0.0.1 still leases. Then 40 more from each of
    // 127.0.0.3-7: 267 against 134 in all.
    let addr = tls_addr(|| env.log());
    let connector = pki.connector(None);
    block_on(async {
        let (mut holding, closed) = half_open(addr, Ipv4Addr::new(127, 0, 0, 2), 80).await;
        assert!(
            holding.len() <= limits.tls_per_addr,
            "{} held",
            holding.len()
        );
        assert!(closed >= 80 - limits.tls_per_addr, "{closed} closed");
        let mut c = Conn::tls(addr, &connector, Some(LEASE)).await.unwrap();
        let a = c
            .request("POST", "/v1/leases", br#"{"name":"tls-vm","size":"2M"}"#)
            .await
            .unwrap();
        assert_eq!(a.status, 201, "{:?}", a.body);
        let id = a.json()["id"].as_u64().unwrap();
        assert_eq!(a.json()["principal"], "token:control-plane");
        let a = c
            .request("DELETE", &format!("/v1/leases/{id}"), b"")
            .await
            .unwrap();
        assert_eq!(a.status, 200);
        for host in 3..=7 {
            let (more, _) = half_open(addr, Ipv4Addr::new(127, 0, 0, host), 40).await;
            holding.extend(more);
        }
        assert!(
            holding.len() <= limits.tls_connections,
            "{} TLS connections held",
            holding.len()
        );
    });
    let l = d.lease("root-during-tls-flood", 2 * MIB).unwrap();
    d.release(l.id).unwrap();
    hook_round(&env, &d, 72);

    // Refusals are logged once per burst, not once per connection.
    let log = env.log();
    let lines = log.matches("unix connection refused").count();
    assert!(
        (1..=3).contains(&lines),
        "{lines} log lines about refused unix connections"
    );

    for mut f in flooders {
        drop(f.stdin);
        let _ = f.child.wait();
    }
    // Everything given back: a flood's connections leave nothing behind.
    let l = d.lease("after", 2 * MIB).unwrap();
    d.release(l.id).unwrap();
}
