//! systemd notification: READY once recovery is done and the socket listens, STATUS= with the
//! pool's warm, leased and dirty bytes (`systemctl status`), RELOADING around a reload,
//! STOPPING on shutdown, and WATCHDOG pings at half the watchdog interval. Without
//! `$NOTIFY_SOCKET` these do nothing.
//!
//! A ping is sent only after the pool answered a status query and while the open watch's
//! reader thread keeps turning (every open of a leased file waits for it): a daemon whose
//! pool lock or reader is stuck stops pinging, and systemd kills and restarts it (result
//! `watchdog`). Tests inject such a stall with [`STALL_FILE_ENV`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;

use crate::pool::{Pool, PoolStatus};
use crate::units::format_bytes;

/// Test-only hook: while the file this variable names exists, the daemon stops its watchdog
/// pings as if its pool were stuck (docs/troubleshooting.md). Unset in production.
pub const STALL_FILE_ENV: &str = "HUGEPREP_TEST_WATCHDOG_STALL_FILE";

/// How often STATUS= is refreshed when systemd asked for no watchdog.
const STATUS_PERIOD: Duration = Duration::from_secs(5);

/// Tells systemd the daemon is ready, with a status line.
pub fn ready(status: &str) {
    if let Err(err) = sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Status(status)]) {
        tracing::warn!(%err, "sd_notify READY failed");
    }
}

/// Tells systemd a reload started.
pub fn reloading() {
    // Outside systemd (no NOTIFY_SOCKET) a no-op; a message systemd misses costs it only
    // the state shown in `systemctl status`.
    let _ = sd_notify::notify(false, &[NotifyState::Reloading]);
}

/// Tells systemd the daemon is stopping.
pub fn stopping() {
    // As `reloading`: systemd sees the stop anyway when the process exits.
    let _ = sd_notify::notify(false, &[NotifyState::Stopping]);
}

/// The STATUS= line: what `systemctl status hugeprep` shows.
pub fn status_line(status: &PoolStatus) -> String {
    let sum = |f: fn(&crate::pool::KindStatus) -> u64| status.kinds.iter().map(f).sum::<u64>();
    let leases: usize = status.kinds.iter().map(|k| k.leases).sum();
    format!(
        "warm {}, leased {} ({} leases), dirty {}, target {}",
        format_bytes(sum(|k| k.warm_bytes)),
        format_bytes(sum(|k| k.leased_bytes)),
        leases,
        format_bytes(sum(|k| k.dirty_bytes + k.scrubbing_bytes)),
        format_bytes(sum(|k| k.target_bytes)),
    )
}

/// Refreshes STATUS= and, when systemd asked for it (`WATCHDOG_USEC`), pings the watchdog,
/// each time after the pool answered.
pub fn spawn_status_and_watchdog(pool: Arc<Pool>) {
    let mut usec = 0;
    let watchdog = sd_notify::watchdog_enabled(false, &mut usec) && usec > 0;
    let period = if watchdog {
        Duration::from_micros(usec / 2).min(STATUS_PERIOD)
    } else {
        STATUS_PERIOD
    };
    let stall_file = std::env::var_os(STALL_FILE_ENV).map(PathBuf::from);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        let mut stalled = false;
        loop {
            tick.tick().await;
            if let Some(for_) = pool.reader_stalled() {
                tracing::error!(
                    stalled_s = for_.as_secs(),
                    "the open watch's reader is stalled (opens of leased files wait): no watchdog ping"
                );
                continue;
            }
            let p = Arc::clone(&pool);
            let Ok(status) = tokio::task::spawn_blocking(move || p.status()).await else {
                continue;
            };
            if stall_file.as_ref().is_some_and(|f| f.exists()) {
                if !stalled {
                    tracing::warn!(env = STALL_FILE_ENV, "test hook: watchdog pings stopped");
                    stalled = true;
                }
                continue;
            }
            let line = status_line(&status);
            let mut states = vec![NotifyState::Status(&line)];
            if watchdog {
                states.push(NotifyState::Watchdog);
            }
            // A ping systemd misses is what its watchdog is for: it restarts the daemon.
            let _ = sd_notify::notify(false, &states);
        }
    });
}
