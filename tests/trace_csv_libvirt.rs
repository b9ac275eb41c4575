//! `hugeprep bench trace-csv` on what a real libvirtd and the real daemon record: a domain
//! (opted in to hugeprep's hook, QEMU/KVM as the package runs it) is started and destroyed
//! twice while `virsh event --all --loop --timestamp` listens; the converter turns that
//! output (sizes from the domain's XML) and the daemon's log of the hook's leases into
//! operator traces, each with the domain's two lives, which `hugeprep bench trace --csv`
//! then replays.

mod daemon_util;
mod libvirt_util;

use std::process::{Command, Stdio};
use std::time::Duration;

use daemon_util::MIB;
use hugeprep::PageSize;
use hugeprep_bench::trace::operator::{self, Event};
use libvirt_util::{domain_xml, tools_present, wait_until, Lab};

fn hugeprep(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hugeprep {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Two starts and two stops of one VM of `bytes`, in order, each stop after its start.
fn assert_two_lives(events: &[Event], vm: &str, bytes: u64) {
    let mine: Vec<&Event> = events.iter().filter(|e| e.vm == vm).collect();
    let kinds: Vec<bool> = mine.iter().map(|e| e.start).collect();
    assert_eq!(kinds, [true, false, true, false], "{events:?}");
    for e in &mine {
        assert_eq!(e.page_size, PageSize::Size2M, "{e:?}");
        if e.start {
            assert_eq!(e.bytes, Some(bytes), "{e:?}");
        }
    }
    assert!(mine.windows(2).all(|w| w[0].at_s <= w[1].at_s), "{mine:?}");
    let (lives, orphans) = operator::lives(events);
    assert_eq!((lives.len(), orphans), (2, 0), "{lives:?}");
}

#[test]
fn virsh_events_and_the_daemon_log_of_a_real_libvirtd_become_a_trace() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("trace-csv", 128 * MIB, 64 * MIB);
    let dir = lab.env.dir.clone();
    let events_path = dir.join("virsh-events.txt");
    let mut listener = Command::new("virsh")
        .args([
            "-c",
            lab.sandbox.uri(),
            "event",
            "--all",
            "--loop",
            "--timestamp",
        ])
        .stdout(std::fs::File::create(&events_path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = |needle: &str| {
        std::fs::read_to_string(&events_path)
            .unwrap_or_default()
            .contains(needle)
    };
    // virsh listens once a defined domain's event reaches it (a liveness bound only).
    let probe_uuid = lab.uuid();
    let probe = dir.join("probe.xml");
    std::fs::write(&probe, domain_xml("probe", &probe_uuid, 0, false, "")).unwrap();
    let listening = wait_until("virsh event listening", Duration::from_secs(60), || {
        let _ = lab.sandbox.virsh(&["define", probe.to_str().unwrap()]);
        let _ = lab.sandbox.virsh(&["undefine", "probe"]);
        std::thread::sleep(Duration::from_millis(200));
        seen("'probe'")
    });
    assert!(listening);

    let uuid = lab.uuid();
    let xml = domain_xml("tracevm", &uuid, 0, true, "");
    for _ in 0..2 {
        lab.start(&xml);
        assert_eq!(lab.leases_of(&uuid).len(), 1);
        lab.destroy(&uuid);
    }
    let stopped = wait_until(
        "both stops in virsh's output",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&events_path)
                .unwrap_or_default()
                .matches("'tracevm': Stopped")
                .count()
                == 2
        },
    );
    let _ = listener.kill();
    let _ = listener.wait();
    assert!(stopped);
    let text = std::fs::read_to_string(&events_path).unwrap();
    eprintln!("virsh event printed:\n{text}");

    // libvirt's events, with the domain's memory from its XML.
    let xml_path = dir.join("tracevm.xml");
    std::fs::write(&xml_path, &xml).unwrap();
    let from_virsh = dir.join("from-virsh.csv");
    hugeprep(&[
        "bench",
        "trace-csv",
        "--virsh-events",
        events_path.to_str().unwrap(),
        "--domain-xml",
        xml_path.to_str().unwrap(),
        "--output",
        from_virsh.to_str().unwrap(),
    ]);
    let csv = std::fs::read_to_string(&from_virsh).unwrap();
    let events = operator::parse(&from_virsh, &csv).unwrap();
    assert_two_lives(&events, "tracevm", 32 * MIB);

    // The daemon's log of the hook's leases: the VM is the domain's UUID.
    let log_path = dir.join("daemon-log.txt");
    std::fs::write(&log_path, lab.env.log()).unwrap();
    let csv = hugeprep(&[
        "bench",
        "trace-csv",
        "--daemon-log",
        log_path.to_str().unwrap(),
    ]);
    let events = operator::parse(&log_path, &csv).unwrap();
    assert_two_lives(&events, &uuid, 32 * MIB);

    // Either trace replays through the driver in simulated time.
    let report: serde_json::Value = serde_json::from_str(&hugeprep(&[
        "bench",
        "trace",
        "--csv",
        from_virsh.to_str().unwrap(),
        "--json",
    ]))
    .unwrap();
    assert_eq!(report["starts"], 2, "{report}");
    assert_eq!(
        report["page_sizes"][0]["none"]["warm_starts"], 0,
        "{report}"
    );
    lab.assert_clean();
}
