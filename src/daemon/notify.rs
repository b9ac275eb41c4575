//! systemd notification: READY once the socket listens, STOPPING on shutdown, WATCHDOG
//! pings at half the watchdog interval. Without `$NOTIFY_SOCKET` these do nothing.

use std::time::Duration;

use sd_notify::NotifyState;

/// Tells systemd the daemon is ready, with a status line.
pub fn ready(status: &str) {
    if let Err(err) = sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Status(status)]) {
        tracing::warn!(%err, "sd_notify READY failed");
    }
}

/// Tells systemd the daemon is stopping.
pub fn stopping() {
    let _ = sd_notify::notify(false, &[NotifyState::Stopping]);
}

/// Starts the watchdog pings when systemd asked for them (`WATCHDOG_USEC`).
pub fn spawn_watchdog() {
    let mut usec = 0;
    if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
        return;
    }
    let period = Duration::from_micros(usec / 2);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            let _ = sd_notify::notify(false, &[NotifyState::Watchdog]);
        }
    });
}
