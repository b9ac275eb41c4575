//! Progress of the long commands on a real terminal (a pty `script` makes): the bar is drawn
//! on stderr when stderr is a terminal, nothing of it appears through a pipe or with
//! `--json`, and stdout is byte for byte the same either way (scripts parse it).

mod daemon_util;
mod libvirt_util;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use daemon_util::{Env, MIB};
use libvirt_util::{domain_xml, tools_present, Lab};

/// What one run left: the terminal's (or the pipe's) view of stderr, and stdout.
struct Seen {
    stderr: String,
    stdout: String,
}

fn quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

fn checked(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `hugeprep ARGS` with stderr on a terminal and stdout in a file.
fn on_terminal(dir: &Path, socket: &Path, args: &[&str]) -> Seen {
    let stdout = dir.join("stdout");
    let line = std::iter::once(env!("CARGO_BIN_EXE_hugeprep"))
        .chain(args.iter().copied())
        .map(quote)
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("script")
        .args(["--quiet", "--return", "--command"])
        .arg(format!("{line} >{}", quote(&stdout.to_string_lossy())))
        .arg("/dev/null")
        .env("HUGEPREP_SOCKET", socket)
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .expect("running script (util-linux)");
    checked(&out, &format!("{args:?} on a terminal"));
    Seen {
        stderr: String::from_utf8_lossy(&out.stdout).into_owned(),
        stdout: std::fs::read_to_string(&stdout).unwrap(),
    }
}

/// `hugeprep ARGS` with stdout and stderr on pipes.
fn piped(socket: &Path, args: &[&str]) -> Seen {
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .args(args)
        .env("HUGEPREP_SOCKET", socket)
        .env("TERM", "xterm")
        .output()
        .unwrap();
    checked(&out, &format!("{args:?} piped"));
    Seen {
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

fn assert_drawn(seen: &Seen, mark: &str) {
    assert!(
        seen.stderr.contains(mark) && seen.stderr.contains("\x1b["),
        "no bar ({mark}) on the terminal: {:?}",
        seen.stderr
    );
    assert!(
        !seen.stdout.contains(mark) && !seen.stdout.contains('\x1b'),
        "the bar reached stdout: {:?}",
        seen.stdout
    );
}

fn assert_quiet(seen: &Seen, mark: &str) {
    for (name, text) in [("stderr", &seen.stderr), ("stdout", &seen.stdout)] {
        assert!(
            !text.contains(mark) && !text.contains('\x1b'),
            "progress on {name} without a terminal to watch it: {text:?}"
        );
    }
}

#[test]
fn drain_shows_the_warm_bytes_deleted_on_a_terminal_only() {
    let env = Env::new("progress-drain", 32 * MIB);
    let d = env.spawn(&["--warm", "16M", "--sizes", "4M"]);
    d.settle(16 * MIB);
    let mark = "of warm files deleted";

    let watched = on_terminal(&env.dir, &env.socket, &["drain"]);
    assert_drawn(&watched, mark);
    assert!(
        watched.stdout.contains("deleted 16 MiB of warm files"),
        "{}",
        watched.stdout
    );

    piped(&env.socket, &["resume"]);
    d.settle(16 * MIB);
    let unwatched = piped(&env.socket, &["drain"]);
    assert_quiet(&unwatched, mark);
    assert_eq!(unwatched.stdout, watched.stdout);

    piped(&env.socket, &["resume"]);
    d.settle(16 * MIB);
    let json = on_terminal(&env.dir, &env.socket, &["drain", "--json"]);
    assert_quiet(&json, mark);
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(report["kinds"][0]["deleted_bytes"], 16 * MIB, "{report}");

    piped(&env.socket, &["resume"]);
    d.settle(16 * MIB);
}

#[test]
fn reserve_shows_its_bar_on_a_terminal_only() {
    // Free pages cover the 2 MiB target: nothing is raised, so the pools are left as found.
    let env = Env::new("progress-reserve", 16 * MIB);
    let config = env.dir.join("reserve.toml");
    std::fs::write(
        &config,
        "[pool]\n[[pool.target]]\npage_size = \"2M\"\nwarm = \"2M\"\n",
    )
    .unwrap();
    let args = [
        "reserve",
        "--config",
        config.to_str().unwrap(),
        "--state-dir",
        env.state.to_str().unwrap(),
    ];
    let mark = "reading the pools";
    let watched = on_terminal(&env.dir, &env.socket, &args);
    assert_drawn(&watched, mark);
    let unwatched = piped(&env.socket, &args);
    assert_quiet(&unwatched, mark);
    assert_eq!(unwatched.stdout, watched.stdout);
    assert!(
        watched
            .stdout
            .contains("node 0 2M: 2 MiB target, added 0 pages"),
        "{}",
        watched.stdout
    );
}

#[test]
fn libvirt_adopt_of_several_domains_counts_them_on_a_terminal_only() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("progress-adopt", 64 * MIB, 32 * MIB);
    let names = ["progress-a", "progress-b", "progress-c"];
    for name in names {
        let uuid = lab.uuid();
        let xml = domain_xml(
            name,
            &uuid,
            0,
            false,
            "<memoryBacking><hugepages/></memoryBacking>",
        );
        let file = lab.env.dir.join("define.xml");
        std::fs::write(&file, xml).unwrap();
        lab.sandbox
            .virsh_ok(&["define", file.to_str().unwrap()])
            .unwrap();
    }
    let mut args = vec![
        "libvirt-adopt",
        "--dry-run",
        "--connect",
        lab.sandbox.uri(),
        "--config",
        lab.config_path.to_str().unwrap(),
        "--state-dir",
        lab.env.state.to_str().unwrap(),
    ];
    args.extend(names);
    let mark = "/3 domains";
    let watched = on_terminal(&lab.env.dir, &lab.env.socket, &args);
    assert_drawn(&watched, mark);
    let unwatched = piped(&lab.env.socket, &args);
    assert_quiet(&unwatched, mark);
    assert_eq!(unwatched.stdout, watched.stdout);
    for name in names {
        assert!(
            watched.stdout.contains(&format!("{name} (adopted)")),
            "{}",
            watched.stdout
        );
    }

    // One domain: its result line is its progress.
    let one = on_terminal(&lab.env.dir, &lab.env.socket, &args[..args.len() - 2]);
    assert_quiet(&one, "/1 domains");

    for name in names {
        lab.sandbox.virsh_ok(&["undefine", name]).unwrap();
    }
    lab.assert_clean();
}

#[test]
fn bench_vm_start_spins_on_a_terminal_only_around_its_lines() {
    for tool in ["/usr/bin/qemu-system-x86_64", "/dev/kvm"] {
        if !Path::new(tool).exists() {
            hugeprep::testing::missing_tool(&format!("{tool} missing"));
            return;
        }
    }
    // The smallest run: one 2 MiB guest, QEMU alone, one repetition.
    let dir = std::env::temp_dir().join(format!("hugeprep-progress-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = [
        "bench",
        "vm-start",
        "--sizes",
        "2M",
        "--page-size",
        "2M",
        "--vmms",
        "qemu",
        "--reps",
        "1",
        "--headroom",
        "0",
    ];
    let socket = dir.join("unused.sock");
    let mark = "bench vm-start";
    let watched = on_terminal(&dir, &socket, &args);
    assert_drawn(&watched, mark);
    // Its lines are still there, each on a line of its own, not torn through the spinner (each
    // names its page size: one run holds 2M and 1G side by side).
    assert!(
        watched.stderr.contains("\x1b[2K2 MiB 2M rep 1/1  qemu"),
        "{:?}",
        watched.stderr
    );
    assert!(
        watched.stdout.contains("seconds to ready"),
        "{}",
        watched.stdout
    );
    let unwatched = piped(&socket, &args);
    assert_quiet(&unwatched, mark);
    assert!(
        unwatched.stderr.contains("2 MiB 2M rep 1/1  qemu"),
        "{}",
        unwatched.stderr
    );
    // Its log lines are still on the terminal (in colour), without the spinner.
    let json = on_terminal(&dir, &socket, &[&args[..], &["--json"]].concat());
    assert!(!json.stderr.contains(mark), "{:?}", json.stderr);
    assert!(!json.stdout.contains('\x1b'), "{:?}", json.stdout);
    let _: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
