//! Load against the real daemon: 64 concurrent clients take and release leases of mixed
//! sizes from a small pool, over the unix socket and over TCP+TLS. Nothing may fail except
//! documented back-pressure (503 with `Retry-After`, then retried), nothing may leak, and the
//! pool's accounting must match the mount exactly at the end. p50/p99 are printed, never
//! asserted (speed belongs in benchmarks).
//!
//! Two shapes of load, each on a quiet host and with a busy-looping process on every CPU:
//! - closed: every client starts its next cycle as soon as the last ends (throughput; the
//!   latency is then the queue, by Little's law: 64 clients / cycles per second);
//! - paced: each client waits a random time between cycles so that together they offer 200
//!   cycles a second (the run reports fewer: it lasts until its slowest client ends), a control
//!   plane's burst far above the VM starts a host sees; this shows the lease path's own latency.

mod daemon_util;
mod remote_util;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daemon_util::{Daemon, Env, MIB};
use hugeprep_testkit::hog::CpuHog;
use remote_util::{block_on, tls_addr, Conn, Pki, LEASE};

const CLIENTS: usize = 64;
const SIZES_MIB: [u64; 4] = [2, 4, 6, 8];

/// Cycles a second the paced phases offer, all clients together.
const PACED_RATE: f64 = 200.0;

#[derive(Default)]
struct Tally {
    lease_ms: Vec<f64>,
    /// The daemon's own time for each lease (`ready_ms`: after admission, until the answer).
    ready_ms: Vec<f64>,
    release_ms: Vec<f64>,
    backpressure: usize,
    errors: Vec<String>,
}

/// A small deterministic generator (xorshift): sizes and hold times per client.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Runs `cycles` lease/release cycles spread over [`CLIENTS`] clients, each on its own
/// keep-alive connection made by `connect`; `paced`: the clients wait between cycles so
/// that together they offer [`PACED_RATE`] cycles a second.
fn run_load<F, Fut>(cycles: usize, tag: &str, paced: bool, connect: F) -> Tally
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Conn, String>> + Send,
{
    let tally = Arc::new(Mutex::new(Tally::default()));
    let connect = Arc::new(connect);
    let started = Instant::now();
    block_on(async {
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let n = cycles / CLIENTS + usize::from(c < cycles % CLIENTS);
            let tally = Arc::clone(&tally);
            let connect = Arc::clone(&connect);
            let tag = tag.to_string();
            tasks.push(tokio::spawn(async move {
                let mut conn = match connect().await {
                    Ok(c) => c,
                    Err(e) => {
                        tally.lock().unwrap().errors.push(format!("connect: {e}"));
                        return;
                    }
                };
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (c as u64 + 1);
                for i in 0..n {
                    if paced {
                        // Uniform in [0, 2 x mean): the clients' starts spread at random.
                        let mean_us = CLIENTS as f64 / PACED_RATE * 1e6;
                        let us = next(&mut rng) % (2.0 * mean_us) as u64;
                        tokio::time::sleep(Duration::from_micros(us)).await;
                    }
                    let size = SIZES_MIB[(next(&mut rng) % SIZES_MIB.len() as u64) as usize] * MIB;
                    let body = format!(r#"{{"name": "{tag}-{c}-{i}", "size": {size}}}"#);
                    let (id, ms) = loop {
                        let t = Instant::now();
                        let a = match conn.request("POST", "/v1/leases", body.as_bytes()).await {
                            Ok(a) => a,
                            Err(e) => {
                                tally.lock().unwrap().errors.push(format!("lease: {e}"));
                                return;
                            }
                        };
                        let ms = t.elapsed().as_secs_f64() * 1e3;
                        match (a.status, a.retry_after) {
                            (201, _) => {
                                let j = a.json();
                                if j["size"].as_u64() != Some(size) {
                                    tally
                                        .lock()
                                        .unwrap()
                                        .errors
                                        .push(format!("wrong size: {j}"));
                                }
                                let ready = j["ready_ms"].as_f64().unwrap_or(f64::NAN);
                                tally.lock().unwrap().ready_ms.push(ready);
                                break (j["id"].as_u64().unwrap_or(0), ms);
                            }
                            (429 | 503, Some(s)) => {
                                tally.lock().unwrap().backpressure += 1;
                                tokio::time::sleep(Duration::from_secs(s)).await;
                            }
                            (status, _) => {
                                tally.lock().unwrap().errors.push(format!(
                                    "lease {size}: {status} {}",
                                    String::from_utf8_lossy(&a.body)
                                ));
                                return;
                            }
                        }
                    };
                    tally.lock().unwrap().lease_ms.push(ms);
                    // A short hold, so leases overlap.
                    tokio::time::sleep(Duration::from_micros(next(&mut rng) % 2000)).await;
                    let t = Instant::now();
                    match conn
                        .request("DELETE", &format!("/v1/leases/{id}"), b"")
                        .await
                    {
                        Ok(a) if a.status == 200 => {
                            let ms = t.elapsed().as_secs_f64() * 1e3;
                            tally.lock().unwrap().release_ms.push(ms);
                        }
                        Ok(a) => tally.lock().unwrap().errors.push(format!(
                            "release {id}: {} {}",
                            a.status,
                            String::from_utf8_lossy(&a.body)
                        )),
                        Err(e) => tally.lock().unwrap().errors.push(format!("release: {e}")),
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let secs = started.elapsed().as_secs_f64();
    let mut t = Arc::try_unwrap(tally).ok().unwrap().into_inner().unwrap();
    let q = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let (l50, l99) = (q(&mut t.lease_ms, 0.5), q(&mut t.lease_ms, 0.99));
    let (d50, d99) = (q(&mut t.ready_ms, 0.5), q(&mut t.ready_ms, 0.99));
    let (r50, r99) = (q(&mut t.release_ms, 0.5), q(&mut t.release_ms, 0.99));
    println!(
        "{tag}: {} cycles by {CLIENTS} clients in {secs:.1} s ({:.0} cycles/s); lease p50 {l50:.2} ms p99 {l99:.2} ms (in the daemon p50 {d50:.2} p99 {d99:.2}); release p50 {r50:.2} ms p99 {r99:.2} ms; {} back-pressure answers",
        t.lease_ms.len(),
        t.lease_ms.len() as f64 / secs,
        t.backpressure
    );
    t
}

/// Every cycle of the run completed, and nothing failed but back-pressure.
fn check_run(t: &Tally, cycles: usize) {
    assert!(
        t.errors.is_empty(),
        "{} errors, e.g. {:?}",
        t.errors.len(),
        &t.errors[..t.errors.len().min(5)]
    );
    assert_eq!((t.lease_ms.len(), t.release_ms.len()), (cycles, cycles));
}

/// Waits until nothing is leased, dirty, scrubbing or filling, then checks that the pool's
/// books match the mount: used bytes are exactly the warm files, no lease file is left.
fn check_accounting(env: &Env, d: &Daemon) {
    assert!(d.leases().is_empty(), "leases left: {:?}", d.leases());
    let deadline = Instant::now() + Duration::from_secs(60);
    let k = loop {
        let p = d.pool();
        let k = p.kinds[0].clone();
        if k.dirty_bytes == 0 && k.scrubbing_bytes == 0 && k.filling_bytes == 0 {
            // Settled twice in a row: the worker is done reshaping.
            std::thread::sleep(Duration::from_millis(200));
            let again = d.pool().kinds[0].clone();
            if again.warm_bytes == k.warm_bytes && again.dirty_bytes == 0 {
                break again;
            }
        }
        assert!(Instant::now() < deadline, "pool did not settle: {k:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(k.leased_bytes, 0);
    assert_eq!(k.leases, 0);
    assert_eq!(
        env.mount_used(),
        k.warm_bytes,
        "the mount holds bytes the pool does not account for: {k:?}"
    );
    assert_eq!(Env::names(&env.pool_dir()).len(), k.warm_files);
    // Non-admin clients' leases live in their principals' directories (docs/security.md).
    assert_eq!(env.lease_links(), Vec::<String>::new());
}

#[test]
fn sixty_four_clients_on_the_unix_socket_and_over_tls_leak_nothing() {
    // Every client can hold its largest lease at once, with room for the warm pool and the
    // dirty files waiting for the worker.
    let t = Instant::now();
    let env = Env::new(
        "load",
        (CLIENTS as u64 * SIZES_MIB[SIZES_MIB.len() - 1] + 256) * MIB,
    );
    println!("hugepages reserved in {:.1} s", t.elapsed().as_secs_f64());
    let pki = Pki::new(&env.dir.join("pki"));
    let mut flags = pki.serve_flags(false);
    flags.extend(["--warm", "32M", "--sizes", "4M,8M"].map(String::from));
    let d = env.spawn(&flags.iter().map(String::as_str).collect::<Vec<_>>());

    let unix = |cycles: usize, tag: &str, paced: bool| {
        let socket = env.socket.clone();
        let t = run_load(cycles, tag, paced, move || {
            let socket = socket.clone();
            async move { Conn::unix(&socket).await }
        });
        check_run(&t, cycles);
        check_accounting(&env, &d);
    };
    // The first touch of the pool's pages costs the outer hypervisor's fault too: not measured.
    unix(256, "warm-up", false);
    unix(2000, "unix closed", false);

    let addr = tls_addr(|| env.log());
    let connector = pki.connector(None);
    let t = run_load(500, "tls closed", false, move || {
        let connector = connector.clone();
        async move { Conn::tls(addr, &connector, Some(LEASE)).await }
    });
    check_run(&t, 500);
    check_accounting(&env, &d);

    unix(512, "unix paced", true);
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let hog = CpuHog::start(cpus).unwrap();
    unix(1000, "unix closed, every CPU busy", false);
    unix(512, "unix paced, every CPU busy", true);
    drop(hog);
}
