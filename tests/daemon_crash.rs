//! SIGKILL the daemon at random moments (during recovery scrubs, refills, leases and
//! releases), 50 times; after each restart no lease is handed out with a non-zero byte, the
//! mount's hugepage usage matches the journal, and no file is orphaned.

mod daemon_util;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use daemon_util::{lease_is_zero, write_pattern, Daemon, Env, MIB};
use hugeprep::pool::LeaseInfo;

const ITERATIONS: usize = 50;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Waits until no work is in flight, then checks that the mount's usage, the pool files,
/// the lease paths and the journal records all agree.
fn check_accounting(env: &Env, d: &Daemon) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let p1 = d.pool();
        let used = env.mount_used();
        let files = Env::names(&env.pool_dir());
        let links = Env::names(&env.lease_dir());
        let records = Env::names(&env.state.join("records"));
        let p2 = d.pool();
        let (k1, k2) = (&p1.kinds[0], &p2.kinds[0]);
        let quiet = k1.dirty_bytes == 0
            && k1.scrubbing_bytes == 0
            && k1.filling_bytes == 0
            && (k1.warm_bytes, k1.leased_bytes, k1.warm_files, k1.leases)
                == (k2.warm_bytes, k2.leased_bytes, k2.warm_files, k2.leases)
            && k2.dirty_bytes == 0
            && k2.scrubbing_bytes == 0
            && k2.filling_bytes == 0;
        if quiet {
            let journal_bytes = k1.warm_bytes + k1.leased_bytes;
            // A file listed a moment ago may be gone by now (the worker gives back a size
            // nobody asks for between two status reads): that snapshot does not count.
            let file_bytes: u64 = files
                .iter()
                .map(|f| {
                    std::fs::metadata(env.pool_dir().join(f)).map_or(u64::MAX / 64, |m| m.len())
                })
                .sum();
            let consistent = used == journal_bytes
                && file_bytes == journal_bytes
                && files.len() == k1.warm_files + k1.leases
                && records.len() == files.len()
                && links.len() == k1.leases;
            if consistent {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "accounting: mount uses {used}, journal says {journal_bytes}, files {file_bytes} \
                 ({files:?}), records {records:?}, lease paths {links:?}, pool {k1:?}"
            );
        }
        assert!(std::time::Instant::now() < deadline, "never quiet: {k1:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Random leases and releases until a request fails (the daemon was killed).
fn churn(
    d_client: hugeprep::client::Client,
    live: Arc<Mutex<Vec<LeaseInfo>>>,
    seed: u64,
    names: u64,
) {
    let mut rng = Rng(seed | 1);
    for n in 0..20 {
        let count = live.lock().unwrap().len();
        if count < 3 && rng.below(3) != 0 {
            let req = hugeprep::pool::LeaseRequest {
                name: format!("vm{names}-{n}"),
                size: (1 + rng.below(6)) * 2 * MIB,
                ..Default::default()
            };
            let Ok(lease) = d_client.blocking(d_client.lease(&req)) else {
                return;
            };
            assert!(
                lease_is_zero(&lease),
                "lease {lease:?} handed out with a non-zero byte"
            );
            write_pattern(&lease, n as u8);
            live.lock().unwrap().push(lease);
        } else if count > 0 {
            let i = rng.below(count as u64) as usize;
            let lease = live.lock().unwrap().remove(i);
            if d_client.blocking(d_client.release(lease.id)).is_err() {
                return;
            }
        }
    }
}

#[test]
fn sigkill_at_random_moments_never_hands_out_dirty_memory() {
    let env = Env::new("crash", 64 * MIB);
    // A failing run prints its seed; HUGEPREP_CRASH_SEED=<seed> replays the same kills.
    let seed = std::env::var("HUGEPREP_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("crash test seed {seed} (replay with HUGEPREP_CRASH_SEED={seed})");
    let mut rng = Rng(seed | 1);
    let args = [
        "--warm",
        "24M",
        "--sizes",
        "8M,4M",
        "--scrub-bandwidth",
        "512M",
        "--verify",
        "sample",
    ];
    for iter in 0..ITERATIONS {
        let mut d = env.spawn(&args);
        if iter % 3 == 0 {
            // Kill during recovery: the unclean start re-scrubs every warm file and refills.
            std::thread::sleep(Duration::from_millis(rng.below(40)));
            d.kill();
            continue;
        }
        check_accounting(&env, &d);
        let live = Arc::new(Mutex::new(d.leases()));
        let worker = {
            let (client, live) = (d.client.clone(), Arc::clone(&live));
            let seed = rng.next();
            std::thread::spawn(move || churn(client, live, seed, iter as u64))
        };
        std::thread::sleep(Duration::from_millis(rng.below(60)));
        d.kill();
        worker
            .join()
            .expect("a lease was handed out with a non-zero byte");
    }
    let log = env.log();
    let recoveries: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("pool recovered"))
        .collect();
    let unproven = recoveries
        .iter()
        .filter(|l| !l.contains("dirty\u{1b}[0m\u{1b}[2m=\u{1b}[0m0 ") && !l.contains("dirty=0 "))
        .count();
    let deleted = recoveries
        .iter()
        .filter(|l| !l.contains("deleted\u{1b}[0m\u{1b}[2m=\u{1b}[0m0") && !l.contains("deleted=0"))
        .count();
    eprintln!(
        "{} restarts: {unproven} found files to scrub again, {deleted} deleted unfinished files",
        recoveries.len()
    );
    // A clean stop at the end: the next start trusts the warm files.
    let mut d = env.spawn(&args);
    check_accounting(&env, &d);
    for lease in d.leases() {
        d.release(lease.id).unwrap();
    }
    d.settle(24 * MIB);
    d.stop();
    let d = env.spawn(&args);
    assert!(d.pool().clean_start);
    check_accounting(&env, &d);
}
