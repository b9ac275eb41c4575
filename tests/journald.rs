//! The daemon's logs in a real journald (systemd booted in namespaces, tests/systemd/
//! container.sh): run as a service whose stderr is the journal, its lines carry priorities
//! (`journalctl -p warning` shows the warnings, not the lease lines) and each event's fields
//! as journal fields (`journalctl NAME=vm-j`), with the key=value text kept in the message.

#[path = "systemd_util/mod.rs"]
mod systemd_util;

use std::time::Duration;

use hugeprep::testing::HugepageReservation;
use hugeprep::PageSize;
use systemd_util::Container;

const UNIT: &str = "hugeprep-jt";

fn entries(c: &Container, args: &str) -> Vec<serde_json::Value> {
    c.ok(&[
        "/bin/sh",
        "-c",
        &format!("journalctl --no-pager -u {UNIT} -o json {args}"),
    ])
    .lines()
    .filter(|l| !l.trim().is_empty())
    .map(|l| serde_json::from_str(l).unwrap())
    .collect()
}

#[test]
fn logs_carry_priorities_and_fields_in_the_journal() {
    let _pages = HugepageReservation::ensure_free(PageSize::Size2M, 4)
        .expect("reserving hugepages (run as root)")
        .expect("the kernel cannot supply 4 2 MiB pages");
    let c = Container::boot("journald");
    // The container has its own /tmp (and could have any other directory over the host's):
    // a checkout under /tmp has no binary there. Copy it in, as the service tests install
    // their package.
    let bin = "/usr/local/bin/hugeprep-jt";
    c.copy_in(std::path::Path::new(env!("CARGO_BIN_EXE_hugeprep")), bin);
    // A Placement nobody listens on: a warning every retry.
    c.write(
        "/etc/hugeprep-jt.toml",
        "[placement]\nendpoint = \"http://127.0.0.1:9\"\ntoken = \"admin\"\ncompute_node = \"jt\"\n",
    );
    c.write(
        &format!("/etc/systemd/system/{UNIT}.service"),
        &format!(
            "[Service]\nType=notify\nExecStart={bin} serve --socket /run/{UNIT}/s.sock \
             --state-dir /var/lib/{UNIT} --run-dir /run/{UNIT} --calibration off --no-reserve \
             --lessee-grace-ms 0 --config /etc/hugeprep-jt.toml\n"
        ),
    );
    c.ok(&["systemctl", "daemon-reload"]);
    c.ok(&["systemctl", "start", UNIT]);
    let lease = c.ok(&[
        "env",
        &format!("HUGEPREP_SOCKET=/run/{UNIT}/s.sock"),
        bin,
        "lease",
        "vm-j",
        "2M",
        "--json",
    ]);
    let lease: serde_json::Value = serde_json::from_str(&lease).unwrap();
    let id = lease["id"].as_u64().unwrap().to_string();
    c.wait_for(
        &format!("journalctl -u {UNIT} -p warning -o cat | grep -q 'Placement not updated'"),
        Duration::from_secs(20),
        "a warning in the journal",
    );

    // -p warning: the Placement warnings, never the lease line.
    let warnings = c.ok(&[
        "journalctl",
        "--no-pager",
        "-u",
        UNIT,
        "-p",
        "warning",
        "-o",
        "cat",
    ]);
    assert!(warnings.contains("Placement not updated"), "{warnings}");
    assert!(!warnings.contains("leased"), "{warnings}");
    let warn = entries(&c, "-p warning")
        .into_iter()
        .find(|e| {
            e["MESSAGE"]
                .as_str()
                .unwrap_or("")
                .contains("Placement not updated")
        })
        .unwrap();
    assert_eq!(warn["PRIORITY"], "4", "{warn}");
    assert_eq!(warn["STATE"], "unreachable", "{warn}");
    assert!(warn["RETRY_IN_S"].as_str().is_some(), "{warn}");

    // The lease line: priority info, its fields as journal fields, key=value in the message.
    let leased = entries(&c, "NAME=vm-j");
    assert_eq!(leased.len(), 1, "{leased:?}");
    let e = &leased[0];
    assert_eq!(e["PRIORITY"], "6", "{e}");
    assert_eq!(e["ID"], id.as_str(), "{e}");
    assert_eq!(e["SIZE"], "2097152", "{e}");
    assert_eq!(e["SYSLOG_IDENTIFIER"], "hugeprep", "{e}");
    assert_eq!(e["TARGET"], "hugeprep::api::routes", "{e}");
    assert!(e["CODE_FILE"].as_str().is_some(), "{e}");
    let message = e["MESSAGE"].as_str().unwrap();
    assert!(
        message.starts_with("leased ")
            && message.contains("name=vm-j")
            && message.contains(&format!("id={id}")),
        "{message}"
    );
    // `journalctl -g name=vm-j` (the short view's text) finds it too.
    let grep = c.ok(&[
        "journalctl",
        "--no-pager",
        "-u",
        UNIT,
        "-g",
        "name=vm-j",
        "-o",
        "cat",
    ]);
    assert!(grep.contains("leased"), "{grep}");

    c.ok(&[
        "env",
        &format!("HUGEPREP_SOCKET=/run/{UNIT}/s.sock"),
        bin,
        "release",
        &id,
    ]);
    c.ok(&["systemctl", "stop", UNIT]);
}
