//! hugetlbfs mounts: mounting our own, finding it through mountinfo (escaped paths
//! included) with the page size statfs reports, and unmounting.

use hugeprep::hugetlb::mount::{self, MountOptions};
use hugeprep::hugetlb::{hugetlbfs_page_size, pool, OwnedMount};
use hugeprep::PageSize;

#[test]
fn mounts_are_found_by_page_size_even_with_spaces_in_the_path() {
    let _lock = hugeprep::testing::lock().unwrap();
    let parent = std::env::temp_dir().join(format!("hugeprep mount test {}", std::process::id()));
    std::fs::create_dir_all(&parent).unwrap();
    for size in pool::page_sizes() {
        let mut opts = MountOptions::new(size);
        opts.mode = 0o1770;
        let m = OwnedMount::new_temp(&parent, &opts).unwrap();
        assert_eq!(hugetlbfs_page_size(m.path()).unwrap(), Some(size));
        let found = mount::mounts().unwrap();
        let ours = found
            .iter()
            .find(|f| f.path == m.path())
            .unwrap_or_else(|| panic!("{} not in {found:?}", m.path().display()));
        assert_eq!(ours.page_size, size);
        assert!(mount::find(size).unwrap().is_some());
        let meta = std::fs::metadata(m.path()).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
            0o1770
        );
        let path = m.path().to_path_buf();
        m.unmount().unwrap();
        assert!(!mount::mounts().unwrap().iter().any(|f| f.path == path));
        assert!(!path.exists());
    }
    std::fs::remove_dir(&parent).unwrap();
}

#[test]
fn mounting_on_a_missing_directory_names_it() {
    let dir = std::env::temp_dir().join("hugeprep-no-such-dir/x");
    let err = mount::mount(&dir, &MountOptions::new(PageSize::Size2M)).unwrap_err();
    assert!(err.to_string().contains("hugeprep-no-such-dir"), "{err}");
}

/// Runs `hugeprep serve` with `args` until it answers, stops it, and returns its log.
fn serve_log(base: &std::path::Path, name: &str, args: &[&str]) -> String {
    use std::time::{Duration, Instant};
    let socket = base.join(format!("{name}.sock"));
    let log = base.join(format!("{name}.log"));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(base.join(format!("{name}-state")))
        .args([
            "--calibration",
            "off",
            "--no-reserve",
            "--lessee-grace-ms",
            "0",
        ])
        .args(args)
        .env("NO_COLOR", "1")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = hugeprep::client::Client::new(&socket).with_timeout(Duration::from_secs(5));
    while client.blocking(client.version()).is_err() {
        assert!(
            Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
    std::fs::read_to_string(&log).unwrap()
}

/// "Find or mount" passes over a hugetlbfs mount under a directory every user may write
/// (an orphan under /tmp), says why in the log and in doctor, and mounts its own instead;
/// a mount the operator names is used as named.
#[test]
fn an_orphan_mount_under_tmp_is_passed_over_unless_named() {
    let _lock = hugeprep::testing::lock().unwrap();
    let base = std::env::temp_dir().join(format!("hugeprep-orphan-{}", std::process::id()));
    let orphan = base.join("mnt");
    std::fs::create_dir_all(&orphan).unwrap();
    let mut opts = MountOptions::new(PageSize::Size2M);
    opts.mode = 0o755;
    mount::mount(&orphan, &opts).unwrap();

    let run = base.join("run");
    let log = serve_log(&base, "found", &["--run-dir", run.to_str().unwrap()]);
    assert!(
        log.contains("passing over a hugetlbfs mount under /tmp (mode 1777)")
            && log.contains(&orphan.display().to_string()),
        "{log}"
    );
    let own = run.join("hugetlbfs-2M");
    assert!(log.contains(&format!("2M on {}", own.display())), "{log}");
    assert!(
        !log.contains(&format!("2M on {}", orphan.display())),
        "{log}"
    );

    let config = base.join("hugeprep.toml");
    std::fs::write(&config, format!("run_dir = \"{}\"\n", run.display())).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(["doctor", "--json", "--no-probe", "--config"])
        .arg(&config)
        .arg("--socket")
        .arg(base.join("none.sock"))
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let passed: Vec<&serde_json::Value> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            f["check"] == "mounts"
                && f["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(&format!("{} passed over", orphan.display())))
        })
        .collect();
    assert_eq!(passed.len(), 1, "{report:#}");
    assert!(passed[0]["message"]
        .as_str()
        .unwrap()
        .contains("under /tmp"));
    assert!(passed[0]["remedy"].as_str().unwrap().contains("mounts = ["));

    let log = serve_log(&base, "named", &["--mount", orphan.to_str().unwrap()]);
    assert!(
        log.contains(&format!("2M on {}", orphan.display())),
        "{log}"
    );
    assert!(!log.contains("passing over"), "{log}");

    // The daemon's own mounts (every page size it serves) and the orphan go again.
    for m in mount::mounts().unwrap() {
        if m.path.starts_with(&base) {
            mount::unmount(&m.path).unwrap();
        }
    }
    std::fs::remove_dir_all(&base).unwrap();
}
