//! A log entry larger than one datagram reaches the real journald whole (systemd booted in
//! namespaces, tests/systemd/container.sh): the layer sends it as a sealed memfd, as
//! `sd_journal_sendv` does. The test binary copies itself into the container and runs there
//! as the logging child (`HUGEPREP_JOURNALD_LARGE_CHILD`), so nothing depends on where the
//! checkout lies.

#[path = "systemd_util/mod.rs"]
mod systemd_util;

use std::time::Duration;

use systemd_util::Container;
use tracing_subscriber::layer::SubscriberExt;

const CHILD: &str = "HUGEPREP_JOURNALD_LARGE_CHILD";
const TEST: &str = "an_entry_larger_than_a_datagram_reaches_the_journal_whole";
const BIG: usize = 1 << 20;

#[test]
fn an_entry_larger_than_a_datagram_reaches_the_journal_whole() {
    if let Ok(probe) = std::env::var(CHILD) {
        // The child, inside the container: one event with a 1 MiB field, through the layer.
        let layer = hugeprep::journald::JournaldLayer::new().expect("journald's socket");
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(probe = %probe, big = %"x".repeat(BIG), "a large entry");
        });
        return;
    }
    let c = Container::boot("journald-large");
    let exe = std::env::current_exe().unwrap();
    c.copy_in(&exe, "/usr/local/bin/hugeprep-journald-large");
    let probe = format!("large{}", std::process::id());
    c.ok(&[
        "env",
        &format!("{CHILD}={probe}"),
        "/usr/local/bin/hugeprep-journald-large",
        "--exact",
        TEST,
        "--test-threads=1",
    ]);
    let query = format!("journalctl --no-pager -o json --all PROBE={probe}");
    let out = c.wait_for(
        &format!("{query} | grep -q . && {query}"),
        Duration::from_secs(20),
        "the large entry in the journal",
    );
    let entries: Vec<serde_json::Value> = out
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(entries.len(), 1, "one entry");
    let e = &entries[0];
    assert_eq!(e["PRIORITY"], "4");
    assert_eq!(e["SYSLOG_IDENTIFIER"], "hugeprep");
    assert_eq!(
        e["BIG"].as_str().map(str::len),
        Some(BIG),
        "the 1 MiB field arrived whole"
    );
    let message = e["MESSAGE"].as_str().unwrap();
    assert!(
        message.starts_with("a large entry") && message.len() > BIG,
        "{}",
        &message[..80.min(message.len())]
    );
}
