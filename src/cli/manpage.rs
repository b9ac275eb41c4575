//! The sections of a man page clap does not know: EXIT STATUS, FILES and SEE ALSO, per
//! command, as roff inserted before clap_mangen's VERSION section.

/// One `.TP` entry: a bold tag and its text.
struct Entry(&'static str, &'static str);

/// The daemon's API socket (the client commands' `--socket`).
const SOCKET: Entry = Entry(
    "/run/hugeprep/hugeprep.sock",
    "the daemon's API socket (--socket, HUGEPREP_SOCKET); made by hugeprep.socket under systemd, mode 0660, group kvm as packaged",
);
/// The daemon's configuration file.
const CONFIG: Entry = Entry(
    "/etc/hugeprep/hugeprep.toml",
    "the daemon's configuration (--config); see hugeprep.toml(5). Under systemd, edit it and run systemctl reload hugeprep",
);
const STATE: Entry = Entry(
    "/var/lib/hugeprep",
    "the daemon's state directory (state_dir): the pool's journal, the ledger of pages added to the kernel's pools (reservations/), warm targets set over the API, the originals of adopted domains (libvirt-adopt/)",
);
const RUN: Entry = Entry(
    "/run/hugeprep",
    "the daemon's run directory (run_dir): the socket, and the hugetlbfs mounts it makes when the configuration names none",
);
const POOLS: Entry = Entry(
    "/sys/devices/system/node/node*/hugepages/",
    "the kernel's hugepage pools per NUMA node and page size (/sys/kernel/mm/hugepages/ without NUMA)",
);
const HOOK_CONFIG: Entry = Entry(
    "/etc/hugeprep/libvirt-hook.toml",
    "the libvirt hook's settings (memory_backing_dir, socket); see libvirt-hook.toml(5)",
);
const HOOK: Entry = Entry(
    "/etc/libvirt/hooks/qemu.d/hugeprep",
    "the hook libvirtd runs at each domain's start and stop (installed from /usr/share/hugeprep/libvirt/hook)",
);
const QEMU_CONF: Entry = Entry(
    "/etc/libvirt/qemu.conf",
    "libvirt's QEMU driver settings: memory_backing_dir, user, group",
);
const LOCK: Entry = Entry(
    "/tmp/hugeprep-hugepage-tests.lock",
    "the machine-wide lock benchmarks and tests take while they borrow hugepages",
);
const UNITS: Entry = Entry(
    "/usr/lib/systemd/system/hugeprep.service, hugeprep.socket",
    "the packaged units (Debian: /lib/systemd/system)",
);

/// What the command's exit status means (`(status, meaning)`), then the files it reads or
/// writes, then the pages to see.
fn sections(
    name: &str,
) -> (
    Vec<(&'static str, &'static str)>,
    Vec<Entry>,
    Vec<&'static str>,
) {
    const OK: (&str, &str) = ("0", "success");
    const ERROR: (&str, &str) = (
        "1",
        "an error; the message on standard error names the field, path, limit or errno",
    );
    const USAGE: (&str, &str) = (
        "2",
        "a usage error: an unknown option or a value that does not parse",
    );
    let common = vec![OK, ERROR, USAGE];
    let sub = name.strip_prefix("hugeprep-").unwrap_or("");
    let client = || vec![SOCKET];
    let mut see = vec!["hugeprep(1)", "hugeprep.toml(5)"];
    let (status, files) = match sub {
        "" => {
            see = vec![
                "hugeprep.toml(5)",
                "libvirt-hook.toml(5)",
                "hugeprep-doctor(1)",
            ];
            (
                vec![
                    OK,
                    ERROR,
                    USAGE,
                    ("3, 4", "hugeprep doctor only: warnings, blocking findings"),
                ],
                vec![CONFIG, SOCKET, STATE, RUN, POOLS],
            )
        }
        "serve" => {
            see.extend([
                "hugeprep-reserve(1)",
                "hugeprep-status(1)",
                "systemctl(1)",
                "journalctl(1)",
            ]);
            (
                vec![
                    ("0", "stopped on SIGTERM or SIGINT after giving back what it held"),
                    ("1", "could not start (configuration, socket, mount, journal), or stopped on an error; the log says why"),
                    USAGE,
                ],
                vec![CONFIG, SOCKET, STATE, RUN, POOLS, UNITS],
            )
        }
        "doctor" => {
            see.extend(["hugeprep-status(1)", "libvirt-hook.toml(5)", "systemctl(1)"]);
            (
                vec![
                    ("0", "healthy: every finding is ok or info"),
                    ("3", "degraded: warnings, VMs start (the daemon not running, a warm target not met, a recent failed lease, releases on the kernel's path)"),
                    ("4", "blocked: a finding marked BLOCKING makes VM starts fail until it is fixed"),
                    ("1", "the check itself failed (an unreadable --config)"),
                    USAGE,
                ],
                vec![CONFIG, SOCKET, RUN, POOLS, QEMU_CONF, HOOK, HOOK_CONFIG, UNITS],
            )
        }
        "removal-check" => {
            see.extend(["hugeprep-libvirt-adopt(1)", "hugeprep-drain(1)", "dpkg(1)"]);
            (
                vec![
                    ("0", "nothing blocks removing hugeprep"),
                    ("1", "something blocks removal (each listed with what to do first), or the check failed"),
                    USAGE,
                ],
                vec![CONFIG, SOCKET, STATE, HOOK_CONFIG, QEMU_CONF, HOOK],
            )
        }
        "reserve" => {
            see.extend(["hugeprep-serve(1)", "hugeprep-drain(1)", "hugeprep-pool(1)"]);
            (
                vec![
                    OK,
                    ("1", "an error, or with --strict a pool the kernel could not raise to its target"),
                    USAGE,
                ],
                vec![CONFIG, STATE, POOLS],
            )
        }
        "pool" => {
            see.extend(["hugeprep-reserve(1)", "hugeprep-status(1)"]);
            (common, vec![POOLS, SOCKET])
        }
        "mount" => {
            see.extend(["hugeprep-prepare(1)", "mount(8)"]);
            (
                common,
                vec![Entry("/proc/self/mountinfo", "the hugetlbfs mounts listed")],
            )
        }
        "prepare" => {
            see.extend(["hugeprep-mount(1)", "hugeprep-bench-prefault(1)"]);
            (common, vec![POOLS])
        }
        "libvirt-hook" => {
            see.extend([
                "libvirt-hook.toml(5)",
                "hugeprep-libvirt-adopt(1)",
                "virsh(1)",
            ]);
            (
                vec![
                    ("0", "done, or nothing to do for this domain"),
                    (
                        "1",
                        "an error: libvirtd fails the domain's start with the message",
                    ),
                    USAGE,
                ],
                vec![HOOK_CONFIG, HOOK, SOCKET, STATE],
            )
        }
        "libvirt-adopt" => {
            see.extend([
                "libvirt-hook.toml(5)",
                "hugeprep-libvirt-hook(1)",
                "hugeprep-removal-check(1)",
                "virsh(1)",
            ]);
            (common, vec![HOOK_CONFIG, STATE, SOCKET])
        }
        "completions" | "manpages" => (common, Vec::new()),
        s if s.starts_with("bench") => {
            see.push("hugeprep-cpu(1)");
            (common, vec![LOCK, POOLS])
        }
        "lease" | "release" => {
            see.extend(["hugeprep-status(1)", "hugeprep-qemu-args(1)"]);
            (common, client())
        }
        "drain" | "resume" => {
            see.extend([
                "hugeprep-drain(1)",
                "hugeprep-resume(1)",
                "hugeprep-status(1)",
            ]);
            (common, vec![SOCKET, STATE])
        }
        "targets" => {
            see.extend(["hugeprep-capacity(1)", "hugeprep-status(1)"]);
            (common, vec![SOCKET, STATE, CONFIG])
        }
        _ => {
            see.push("hugeprep-status(1)");
            (common, client())
        }
    };
    see.retain(|p| *p != format!("{name}(1)"));
    see.push("/usr/share/doc/hugeprep/operations.md and troubleshooting.md");
    (status, files, see)
}

/// Roff text escaped for a text line: backslashes doubled, hyphens as `\-` (so they stay
/// ASCII hyphens), a leading `.` or `'` protected.
fn esc(text: &str) -> String {
    let t = text.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// The EXIT STATUS, FILES and SEE ALSO sections of the page `name` (`hugeprep`,
/// `hugeprep-doctor`, `hugeprep-bench-clear` ...).
pub fn extra_sections(name: &str) -> String {
    let (status, files, see) = sections(name);
    let mut out = String::from(".SH \"EXIT STATUS\"\n");
    for (code, meaning) in status {
        out += &format!(".TP\n\\fB{}\\fR\n{}\n", esc(code), esc(meaning));
    }
    if !files.is_empty() {
        out += ".SH FILES\n";
        for Entry(path, what) in files {
            out += &format!(".TP\n\\fI{}\\fR\n{}\n", esc(path), esc(what));
        }
    }
    out += ".SH \"SEE ALSO\"\n";
    out += &see
        .iter()
        .map(|p| match p.split_once('(') {
            Some((page, section)) => format!("\\fB{}\\fR({section}", esc(page)),
            None => esc(p),
        })
        .collect::<Vec<_>>()
        .join(",\n");
    out.push('\n');
    out
}

/// `page` (clap_mangen's roff) with the extra sections before its VERSION section, or at
/// its end when it has none.
pub fn with_extra_sections(page: &str, name: &str) -> String {
    let extra = extra_sections(name);
    match page.find("\n.SH VERSION") {
        Some(at) => format!("{}\n{}{}", &page[..at], extra, &page[at + 1..]),
        None => format!("{page}{extra}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doctor_documents_its_own_exit_codes() {
        let text = extra_sections("hugeprep-doctor");
        assert!(text.starts_with(".SH \"EXIT STATUS\"\n"), "{text}");
        for code in [
            "\\fB0\\fR",
            "\\fB3\\fR",
            "\\fB4\\fR",
            "\\fB1\\fR",
            "\\fB2\\fR",
        ] {
            assert!(text.contains(code), "{code}: {text}");
        }
        assert!(text.contains(".SH FILES\n"), "{text}");
        assert!(text.contains("\\fBhugeprep\\fR(1)"), "{text}");
        assert!(!text.contains("hugeprep\\-doctor\\fR(1)"), "{text}");
    }

    #[test]
    fn sections_go_before_version() {
        let page = ".TH x\n.SH NAME\nx\n.SH VERSION\nv1\n";
        let out = with_extra_sections(page, "hugeprep-lease");
        let exit = out.find("EXIT STATUS").unwrap();
        let version = out.find(".SH VERSION").unwrap();
        assert!(exit < version, "{out}");
        assert!(out.ends_with(".SH VERSION\nv1\n"), "{out}");
    }
}
