//! The daemon's directories on a hugetlbfs mount whose root another user can write: a
//! planted `hugeprep/pool` link, or a `hugeprep` directory of another user, makes the daemon
//! refuse to start with an error naming the directory, and nothing behind it is touched
//! (before the fix root chmod'ed the link's target and emptied it at recovery).

mod daemon_util;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use daemon_util::{Env, MIB};

/// Runs `hugeprep serve` on `env` and expects it to exit with an error within 30 s; its log.
fn serve_refuses(env: &Env) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .arg("serve")
        .arg("--socket")
        .arg(&env.socket)
        .arg("--state-dir")
        .arg(&env.state)
        .arg("--mount")
        .arg(&env.mount)
        .args(["--calibration", "off", "--no-reserve"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let log = String::from_utf8_lossy(&out.stderr).to_string();
            assert!(!status.success(), "the daemon started: {log}");
            return log;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the daemon neither started nor refused within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_planted_pool_link_or_a_foreign_hugeprep_directory_is_refused_and_nothing_behind_touched() {
    let env = Env::new("dirs", 8 * MIB);
    let base = env.mount.join("hugeprep");
    std::fs::create_dir(&base).unwrap();

    // What a user who can write the mount's root plants: hugeprep/pool -> a directory of
    // someone else's files, open to all. This kernel refuses symbolic links on hugetlbfs
    // (EINVAL, no page cache writes), so there the case cannot arise; `hugetlb::dir`'s unit
    // test makes the same refusal on tmpfs.
    let outside = env.dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("p1"), b"not hugeprep's").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o777)).unwrap();
    match std::os::unix::fs::symlink(&outside, base.join("pool")) {
        Ok(()) => {
            let log = serve_refuses(&env);
            let pool = base.join("pool").display().to_string();
            assert!(
                log.contains(&pool) && log.contains("symbolic link") && log.contains("refusing"),
                "{log}"
            );
            let mode = std::fs::metadata(&outside).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o777, "the link's target was chmod'ed");
            assert_eq!(
                Env::names(&outside),
                ["p1"],
                "files behind the link were removed"
            );
            std::fs::remove_file(base.join("pool")).unwrap();
        }
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
            eprintln!("symbolic links on hugetlbfs: {e} (this kernel cannot have the link)");
        }
    }

    // hugeprep/pool planted as another user's directory, holding its file: refused, the
    // file kept and the directory's mode unchanged (before: chmod 0700, file deleted as
    // "a file hugeprep did not create").
    let pool = base.join("pool");
    std::fs::create_dir(&pool).unwrap();
    std::fs::write(pool.join("precious"), b"").unwrap();
    std::os::unix::fs::chown(&pool, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&pool, std::fs::Permissions::from_mode(0o777)).unwrap();
    let log = serve_refuses(&env);
    assert!(
        log.contains(&pool.display().to_string()) && log.contains("owned by uid 65534"),
        "{log}"
    );
    assert_eq!(
        Env::names(&pool),
        ["precious"],
        "the planted directory was emptied"
    );
    assert_eq!(
        std::fs::metadata(&pool).unwrap().permissions().mode() & 0o7777,
        0o777,
        "the planted directory was chmod'ed"
    );
    std::fs::remove_dir_all(&pool).unwrap();

    // hugeprep/ itself belongs to another user: refused, naming it, nothing made in it.
    std::os::unix::fs::chown(&base, Some(65534), Some(65534)).unwrap();
    let log = serve_refuses(&env);
    assert!(
        log.contains(&base.display().to_string()) && log.contains("owned by uid 65534"),
        "{log}"
    );
    assert!(
        !base.join("pool").exists(),
        "made a directory in another user's"
    );

    // Made right, the daemon starts and owns its directories, modes set through handles.
    std::fs::remove_dir(&base).unwrap();
    let d = env.spawn(&[]);
    assert_eq!(
        std::fs::metadata(base.join("pool"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let lease = d.lease("after", 2 * MIB).unwrap();
    d.release(lease.id).unwrap();
}
