//! Remote access against the real daemon: the TCP listener serves only TLS, every request
//! needs a bearer token of a high enough role (401/403 otherwise, the token never logged),
//! a configured CA makes client certificates mandatory, and unix socket peers get their
//! role by uid and group.

mod daemon_util;
mod remote_util;

use std::process::Command;

use daemon_util::{Env, MIB};
use remote_util::{block_on, tls_addr, Conn, Pki, ADMIN, LEASE, READ};

#[test]
fn tls_with_tokens_enforces_roles_and_never_logs_a_token() {
    let env = Env::new("remote-tls", 16 * MIB);
    let pki = Pki::new(&env.dir.join("pki"));
    let flags = pki.serve_flags(false);
    let d = env.spawn(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let addr = tls_addr(|| env.log());
    let connector = pki.connector(None);
    block_on(async {
        let mut admin = Conn::tls(addr, &connector, Some(ADMIN)).await.unwrap();
        let a = admin.request("GET", "/v1/pool", b"").await.unwrap();
        assert_eq!(a.status, 200, "{:?}", a.body);

        // A lease token takes and releases a lease, over one kept-alive connection.
        let mut lease = Conn::tls(addr, &connector, Some(LEASE)).await.unwrap();
        let body = br#"{"name": "remote-a", "size": 4194304}"#;
        let a = lease.request("POST", "/v1/leases", body).await.unwrap();
        assert_eq!(a.status, 201, "{:?}", a.body);
        let id = a.json()["id"].as_u64().unwrap();
        let a = lease
            .request("DELETE", &format!("/v1/leases/{id}"), b"")
            .await
            .unwrap();
        assert_eq!(a.status, 200, "{:?}", a.body);
        // ...but may not drain: 403 naming the role it lacks.
        let a = lease.request("POST", "/v1/pool/drain", b"").await.unwrap();
        assert_eq!(a.status, 403);
        assert!(a.json()["error"]
            .as_str()
            .unwrap()
            .contains("needs role admin"));

        // A read token reads, and gets 403 on POST.
        let mut read = Conn::tls(addr, &connector, Some(READ)).await.unwrap();
        assert_eq!(
            read.request("GET", "/v1/leases", b"").await.unwrap().status,
            200
        );
        let a = read.request("POST", "/v1/leases", body).await.unwrap();
        assert_eq!(a.status, 403, "{:?}", a.body);
        assert!(a.json()["error"]
            .as_str()
            .unwrap()
            .contains("token:monitor has role read"));

        // Wrong and missing tokens: 401 with a Bearer challenge.
        let mut wrong = Conn::tls(addr, &connector, Some("not-a-token-0123456789"))
            .await
            .unwrap();
        let a = wrong.request("GET", "/v1/pool", b"").await.unwrap();
        assert_eq!(a.status, 401);
        assert!(a.json()["error"]
            .as_str()
            .unwrap()
            .contains("unknown bearer token"));
        let mut none = Conn::tls(addr, &connector, None).await.unwrap();
        let a = none.request("GET", "/v1/pool", b"").await.unwrap();
        assert_eq!(a.status, 401);
        assert!(a.json()["error"]
            .as_str()
            .unwrap()
            .contains("missing bearer token"));
    });
    // Plain HTTP on the TLS port gets no answer.
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let _ = s.write_all(b"GET /v1/pool HTTP/1.1\r\nhost: x\r\n\r\n");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        assert!(!String::from_utf8_lossy(&buf).contains("HTTP/1.1 200"));
    }
    // The unix socket keeps working for root, without a token.
    assert!(d.leases().is_empty());
    let log = env.log();
    assert!(log.contains("request refused"), "{log}");
    for secret in [ADMIN, LEASE, READ, "not-a-token-0123456789"] {
        assert!(!log.contains(secret), "the log shows a token:\n{log}");
    }
}

/// `hugeprep serve` on `env` with `flags`, expected to refuse to start; returns its stderr.
fn refused_start(env: &Env, flags: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["serve", "--calibration", "off", "--socket"])
        .arg(&env.socket)
        .arg("--state-dir")
        .arg(&env.state)
        .arg("--mount")
        .arg(&env.mount)
        .args(flags)
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn tcp_without_tls_is_refused_at_start_naming_the_field() {
    let env = Env::new("remote-notls", 4 * MIB);
    let pki = Pki::new(&env.dir.join("pki"));
    let err = refused_start(
        &env,
        &[
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--tokens".into(),
            pki.tokens.display().to_string(),
        ],
    );
    assert!(err.contains("access.tls_cert"), "{err}");
    assert!(err.contains("never serves TCP without TLS"), "{err}");
    assert!(!env.socket.exists(), "a refused start left its socket");

    // A tokens file other users can read is refused too.
    let loose = env.dir.join("loose.toml");
    std::fs::copy(&pki.tokens, &loose).unwrap();
    std::fs::set_permissions(&loose, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let mut flags = pki.serve_flags(false);
    let i = flags.iter().position(|f| f == "--tokens").unwrap();
    flags[i + 1] = loose.display().to_string();
    let err = refused_start(&env, &flags);
    assert!(
        err.contains("access.tokens") && err.contains("chmod 0600"),
        "{err}"
    );
}

#[test]
fn a_configured_ca_makes_client_certificates_mandatory() {
    let env = Env::new("remote-mtls", 4 * MIB);
    let pki = Pki::new(&env.dir.join("pki"));
    let flags = pki.serve_flags(true);
    let _d = env.spawn(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let addr = tls_addr(|| env.log());
    block_on(async {
        // With the CA's client certificate and a token: served.
        let good = pki.connector(Some((&pki.client_cert, &pki.client_key)));
        let mut c = Conn::tls(addr, &good, Some(READ)).await.unwrap();
        assert_eq!(c.request("GET", "/v1/pool", b"").await.unwrap().status, 200);
        // A certificate is not a token: still 401 without one.
        let mut c = Conn::tls(addr, &good, None).await.unwrap();
        assert_eq!(c.request("GET", "/v1/pool", b"").await.unwrap().status, 401);
        // No certificate, or one from another CA: the handshake fails, nothing is served.
        for connector in [
            pki.connector(None),
            pki.connector(Some((&pki.rogue_cert, &pki.rogue_key))),
        ] {
            let answered = match Conn::tls(addr, &connector, Some(ADMIN)).await {
                Err(_) => false,
                Ok(mut c) => c.request("GET", "/v1/pool", b"").await.is_ok(),
            };
            assert!(!answered, "served a client without a valid certificate");
        }
    });
    assert!(env.log().contains("tls handshake refused"));
}

/// `hugeprep ARGS --socket S` as uid and gid 65534 (nobody/nogroup) without supplementary
/// groups; returns (success, stderr).
fn as_nobody(env: &Env, args: &[&str]) -> (bool, String) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_hugeprep"))
        .args(args)
        .arg("--socket")
        .arg(&env.socket)
        .output()
        .expect("setpriv (util-linux)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn unix_socket_peers_get_roles_by_uid_and_group() {
    let env = Env::new("remote-unix", 8 * MIB);
    // Let uid 65534 reach the socket inside the test's private directory.
    std::fs::set_permissions(
        &env.dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    // Default: the socket's group may lease, not administer (on a libvirt host it is the
    // group of every QEMU).
    let mut d = env.spawn(&["--socket-group", "nogroup"]);
    let (ok, err) = as_nobody(&env, &["lease", "peer-0", "2M"]);
    assert!(ok, "the socket group should lease by default: {err}");
    let (ok, err) = as_nobody(&env, &["resume"]);
    assert!(!ok, "the socket group is admin");
    assert!(
        err.contains("403") && err.contains("uid:65534 has role lease"),
        "{err}"
    );
    let (ok, err) = as_nobody(&env, &["release", "peer-0"]);
    assert!(ok, "{err}");
    d.stop();

    // Configured: uid 65534 may read and lease, not administer; the group alone gives
    // nothing once rules are given.
    let config = env.dir.join("hugeprep.toml");
    std::fs::write(
        &config,
        "[access]\n[[access.unix_peer]]\nuser = \"nobody\"\nrole = \"lease\"\n",
    )
    .unwrap();
    let config_flag = config.display().to_string();
    let mut d = env.spawn(&["--socket-group", "nogroup", "--config", &config_flag]);
    let (ok, err) = as_nobody(&env, &["status"]);
    assert!(ok, "{err}");
    let (ok, err) = as_nobody(&env, &["lease", "peer-a", "2M"]);
    assert!(ok, "{err}");
    let (ok, err) = as_nobody(&env, &["resume"]);
    assert!(!ok);
    assert!(err.contains("403") && err.contains("uid:65534"), "{err}");
    // Root stays admin whatever the rules say.
    assert_eq!(d.raw("POST", "/v1/pool/resume", b"").0, 200);
    let id = d.leases()[0].id;
    d.release(id).unwrap();
    d.stop();

    std::fs::write(
        &config,
        "[access]\n[[access.unix_peer]]\ngroup = \"nogroup\"\nrole = \"read\"\n",
    )
    .unwrap();
    let _d = env.spawn(&["--socket-group", "nogroup", "--config", &config_flag]);
    let (ok, err) = as_nobody(&env, &["status"]);
    assert!(ok, "{err}");
    let (ok, err) = as_nobody(&env, &["lease", "peer-b", "2M"]);
    assert!(!ok);
    assert!(
        err.contains("403") && err.contains("needs role lease"),
        "{err}"
    );
}

/// Under mutual TLS the principal is `token:NAME cert:SUBJECT`: a `token:NAME` table applies
/// to it, and a `cert:SUBJECT` table wins over the token's (docs/security.md, "Limits per
/// principal").
#[test]
fn limits_of_a_token_and_of_a_certificate_apply_under_mutual_tls() {
    let env = Env::new("remote-mtls-limits", 16 * MIB);
    let pki = Pki::new(&env.dir.join("pki"));
    let mut flags = pki.serve_flags(true);
    let write_config = |text: &str| {
        let path = env.dir.join("limits.toml");
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    flags.push("--config".into());
    flags.push(write_config(
        "[pool.limits.principal.\"token:control-plane\"]\nleases = 1\n",
    ));
    let lease = |n: u32| format!(r#"{{"name":"m{n}","size":"2M"}}"#).into_bytes();
    let client = pki.connector(Some((&pki.client_cert, &pki.client_key)));
    let mut d = env.spawn(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    let addr = tls_addr(|| env.log());
    let principal = block_on(async {
        let mut c = Conn::tls(addr, &client, Some(LEASE)).await.unwrap();
        let a = c.request("POST", "/v1/leases", &lease(1)).await.unwrap();
        assert_eq!(a.status, 201, "{}", a.json());
        let a = c.request("POST", "/v1/leases", &lease(2)).await.unwrap();
        let body = a.json();
        assert_eq!(a.status, 429, "the token's table applies: {body}");
        assert_eq!(body["limit"]["name"], "leases", "{body}");
        assert_eq!(body["limit"]["limit"], 1, "{body}");
        body["limit"]["principal"].as_str().unwrap().to_string()
    });
    let subject = principal
        .strip_prefix("token:control-plane cert:")
        .unwrap_or_else(|| panic!("{principal}"));
    // The certificate's own table wins over the token's.
    d.stop();
    let cfg = write_config(&format!(
        "[pool.limits.principal.\"token:control-plane\"]\nleases = 1\n\
         [pool.limits.principal.\"cert:{subject}\"]\nleases = 2\n"
    ));
    *flags.last_mut().unwrap() = cfg;
    let before = env.log().len();
    let _d = env.spawn(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    // The second run's address: the log holds both runs.
    let addr = tls_addr(|| env.log().get(before..).unwrap_or_default().to_string());
    block_on(async {
        let mut c = Conn::tls(addr, &client, Some(LEASE)).await.unwrap();
        let a = c.request("POST", "/v1/leases", &lease(2)).await.unwrap();
        assert_eq!(a.status, 201, "{}", a.json());
        let a = c.request("POST", "/v1/leases", &lease(3)).await.unwrap();
        let body = a.json();
        assert_eq!(a.status, 429, "{body}");
        assert_eq!(body["limit"]["limit"], 2, "{body}");
        assert_eq!(body["limit"]["in_use"], 2, "{body}");
    });
}
