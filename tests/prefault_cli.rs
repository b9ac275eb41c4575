//! `hugeprep prepare` and `hugeprep pool` through the real binary.

mod hugetlb_support;

use std::process::{Command, Output};

use hugeprep::PageSize;
use hugetlb_support::HugeEnv;

fn hugeprep(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(args)
        .output()
        .expect("running hugeprep")
}

#[test]
fn prepare_creates_a_filled_file_and_reports_it() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 33) else {
        return;
    };
    let free0 = env.free();
    let path = env.dir().join("guest");
    let path_s = path.to_str().unwrap();
    let out = hugeprep(&[
        "prepare",
        "--size",
        "64M",
        "--node",
        "0",
        "--path",
        path_s,
        "--threads",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["path"], path_s);
    assert_eq!(json["size"], 64 << 20);
    assert_eq!(json["node"], 0);
    assert_eq!(json["page_size"], "2M");
    assert!(json["gbps"].as_f64().unwrap() > 0.0);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 << 20);
    assert_eq!(
        env.free(),
        free0 - 32,
        "the file keeps its pages after the command"
    );

    // Text output names the same things.
    let out = hugeprep(&[
        "prepare",
        "--size",
        "2M",
        "--mount",
        env.dir().to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for key in ["path", "size", "node", "threads", "seconds", "GB/s"] {
        assert!(text.contains(key), "{key} missing from {text}");
    }
    for f in env.files() {
        std::fs::remove_file(env.dir().join(f)).unwrap();
    }
    assert_eq!(env.free(), free0);
}

#[test]
fn bad_arguments_name_the_flag_and_leave_nothing_behind() {
    let Some(env) = HugeEnv::new(PageSize::Size2M, 2) else {
        return;
    };
    let free0 = env.free();
    let dir = env.dir().to_str().unwrap().to_string();
    let outside = std::env::temp_dir().join("hugeprep-cli-outside");
    let cases: [(&[&str], &str); 7] = [
        (&["--size", "0", "--mount", &dir], "--size"),
        (&["--size", "3M", "--mount", &dir], "--size"),
        (&["--size", "lots", "--mount", &dir], "--size"),
        (
            &["--size", "4M", "--page-size", "4K", "--mount", &dir],
            "--page-size",
        ),
        (&["--size", "4M", "--node", "99", "--mount", &dir], "--node"),
        (
            &["--size", "4M", "--path", outside.to_str().unwrap()],
            "--path",
        ),
        (&["--size", "4M", "--mount", "/tmp"], "--mount"),
    ];
    for (args, flag) in cases {
        let mut all = vec!["prepare"];
        all.extend_from_slice(args);
        let out = hugeprep(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(env.files().is_empty(), "{args:?} left {:?}", env.files());
        assert_eq!(env.free(), free0, "{args:?}");
    }
    assert!(!outside.exists());
}

#[test]
fn pool_prints_every_node_and_page_size() {
    // No daemon listens on this socket: only the kernel's pools, and `daemon` is null.
    let no_daemon = "/nonexistent/hugeprep.sock";
    let out = hugeprep(&["pool", "--json", "--socket", no_daemon]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(all["daemon"].is_null(), "{all}");
    let json = all["kernel"].as_array().unwrap();
    assert!(json
        .iter()
        .any(|p| p["scope"] == "system" && p["page_size"] == "2M"));
    assert!(json
        .iter()
        .any(|p| p["scope"]["node"] == 0 && p["reserved"].is_null()));
    let out = hugeprep(&["pool", "--socket", no_daemon]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("node 0") && text.contains("system"), "{text}");
}

#[test]
fn mount_command_mounts_lists_and_unmounts_with_owner_and_mode() {
    let Some(_reservation) =
        hugeprep::testing::HugepageReservation::ensure_free(PageSize::Size2M, 2).unwrap()
    else {
        panic!("the kernel cannot supply 2 free 2M hugepages");
    };
    let dir = std::env::temp_dir().join(format!("hugeprep-mount-cli-{}", std::process::id()));
    let dir_s = dir.to_str().unwrap();
    let out = hugeprep(&[
        "mount",
        dir_s,
        "--page-size",
        "2M",
        "--owner",
        "nobody",
        "--mode",
        "0750",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta = std::fs::metadata(&dir).unwrap();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    assert_eq!(meta.uid(), nobody.uid.as_raw());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o750);
    let listed = String::from_utf8_lossy(&hugeprep(&["mount"]).stdout).into_owned();
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("2M") && l.ends_with(dir_s)),
        "{listed}"
    );
    // A file prepared on it, then the mount goes away with it.
    let file = dir.join("guest");
    let out = hugeprep(&["prepare", "--size", "4M", "--path", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = hugeprep(&["mount", dir_s, "--unmount"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&hugeprep(&["mount"]).stdout).contains(dir_s));
    std::fs::remove_dir(&dir).unwrap();
    // Not a hugetlbfs mount: refused, naming it.
    let out = hugeprep(&["mount", "/tmp", "--unmount"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a hugetlbfs mount"));
}
