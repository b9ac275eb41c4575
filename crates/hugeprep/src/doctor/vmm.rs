//! QEMU and libvirt, when installed: versions, libvirt's `memory_backing_dir` on hugetlbfs
//! and the hugeprep hook.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{DoctorOptions, Finding, Severity};
use crate::perm::{self, Access};
use crate::vmm::libvirt::qemu_conf::QemuConf;
use crate::vmm::libvirt::{HookConfig, RECOMMENDED_MEMORY_BACKING_DIR};

fn first_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().map(|l| l.trim().to_string())
}

/// QEMU's version, when it is installed.
pub fn qemu() -> Vec<Finding> {
    match first_line("qemu-system-x86_64", &["--version"]) {
        Some(v) => vec![Finding::ok("qemu", "qemu-system-x86_64", v)],
        None => vec![Finding::new(
            "qemu",
            "qemu-system-x86_64",
            Severity::Info,
            "not installed",
        )],
    }
}

/// The hugetlbfs page size of `path`, or of its nearest existing ancestor (libvirt creates
/// the directory when it first needs it).
fn hugetlbfs_of(path: &Path) -> Option<crate::PageSize> {
    path.ancestors()
        .find(|p| p.exists())
        .and_then(|p| crate::hugetlb::hugetlbfs_page_size(p).ok().flatten())
}

/// The pid of a running process whose name (`/proc/PID/comm`) is one of `names`, in this
/// process's mount namespace (a libvirtd in another one serves another /etc/libvirt).
fn running(names: &[&str]) -> Option<(u32, String)> {
    let ns = |dir: &Path| std::fs::read_link(dir.join("ns/mnt")).ok();
    let mine = ns(Path::new("/proc/self"))?;
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        let comm = comm.trim();
        (names.contains(&comm) && ns(&e.path()).as_ref() == Some(&mine))
            .then(|| (pid, comm.to_string()))
    })
}

/// The program a hook wrapper runs (`exec PROGRAM ...`), and whether the wrapper lets
/// domains pass when it is missing (a guard such as `[ -x PROGRAM ] || exit 0`).
fn hook_program(script: &str) -> Option<(PathBuf, bool)> {
    let program = script.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next()? == "exec").then(|| words.next().map(PathBuf::from))?
    })?;
    let guarded = script.contains("exit 0");
    Some((program, guarded))
}

/// libvirt's version, whether libvirtd runs, `memory_backing_dir` (on hugetlbfs, the same as
/// the hook's, reachable by QEMU's user) and the hook (installed, executable, its program
/// present). Problems block VM starts while libvirtd runs, and are information otherwise.
pub fn libvirt(opts: &DoctorOptions, daemon_reachable: bool) -> Vec<Finding> {
    let Some(version) = first_line("libvirtd", &["--version"]) else {
        return vec![Finding::new(
            "libvirt",
            "libvirtd",
            Severity::Info,
            "not installed",
        )];
    };
    let process = running(&["libvirtd", "virtqemud"]);
    let socket = ["/run/libvirt/libvirt-sock", "/run/libvirt/virtqemud-sock"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let (state, live) = match (&process, socket) {
        (Some((pid, name)), _) => (format!("{name} running (pid {pid})"), true),
        (None, Some(sock)) => (
            format!("not running; its socket {sock} listens (it starts on the first connection)"),
            true,
        ),
        (None, None) => ("not running".to_string(), false),
    };
    // Without hugeprep's memory a domain still starts (warning); with a path QEMU cannot
    // open, or a hook that cannot run, it does not (blocking). Neither matters while libvirt
    // is not running.
    let (unmet, blocked) = if live {
        (Severity::Warning, Severity::Blocking)
    } else {
        (Severity::Info, Severity::Info)
    };
    let mut out = vec![Finding::ok(
        "libvirt",
        "libvirtd",
        format!("{version}, {state}"),
    )];
    let conf_path = opts.libvirt_dir.join("qemu.conf");
    let conf = QemuConf::read(&conf_path).unwrap_or_default();
    let hook_config = HookConfig::load(&opts.hook_config).ok();
    out.push(backing_dir(
        &conf,
        &conf_path,
        hook_config.as_ref(),
        opts,
        unmet,
    ));
    if let Some(dir) = &conf.memory_backing_dir {
        out.push(qemu_reaches(&conf, &conf_path, dir, blocked));
    }
    out.push(hook(opts, daemon_reachable && live, live, unmet));
    out
}

fn backing_dir(
    conf: &QemuConf,
    conf_path: &Path,
    hook_config: Option<&HookConfig>,
    opts: &DoctorOptions,
    unmet: Severity,
) -> Finding {
    let snippet = "/usr/share/hugeprep/libvirt/qemu.conf.snippet";
    let Some(dir) = &conf.memory_backing_dir else {
        return Finding::new(
            "libvirt",
            "memory_backing_dir",
            unmet,
            format!(
                "not set in {}: QEMU's file-backed memory is not on hugetlbfs",
                conf_path.display()
            ),
        )
        .remedy(format!(
            "add memory_backing_dir = \"{RECOMMENDED_MEMORY_BACKING_DIR}\" to {} ({snippet}), \
             then restart libvirtd",
            conf_path.display()
        ));
    };
    if let Some(hook) = hook_config.filter(|h| &h.memory_backing_dir != dir) {
        return Finding::new(
            "libvirt",
            "memory_backing_dir",
            unmet,
            format!(
                "{} says {}, {} says {}: the hook links leases where QEMU does not look",
                conf_path.display(),
                dir.display(),
                opts.hook_config.display(),
                hook.memory_backing_dir.display()
            ),
        )
        .remedy(format!(
            "set the same directory in both (recommended: {RECOMMENDED_MEMORY_BACKING_DIR})"
        ));
    }
    match hugetlbfs_of(dir) {
        Some(ps) => Finding::ok(
            "libvirt",
            "memory_backing_dir",
            format!("{} is on hugetlbfs ({ps} pages)", dir.display()),
        ),
        None => Finding::new(
            "libvirt",
            "memory_backing_dir",
            unmet,
            format!(
                "{} is not on a hugetlbfs mount: leases cannot be linked there",
                dir.display()
            ),
        )
        .remedy("mount hugetlbfs at or above it: hugeprep mount --page-size 2M /dev/hugepages"),
    }
}

/// Whether QEMU's user, as libvirt's configuration names it, can search its way to the
/// per-domain directories libvirt makes below `dir` (libvirt makes
/// `<dir>/libvirt/qemu` QEMU's own when it starts).
fn qemu_reaches(conf: &QemuConf, conf_path: &Path, dir: &Path, unmet: Severity) -> Finding {
    let subject = "QEMU's user";
    let qemu = match conf.qemu_user() {
        Ok(q) => q,
        Err(e) => {
            return Finding::new(
                "libvirt",
                subject,
                unmet,
                format!("{}: user {e}", conf_path.display()),
            )
            .remedy(format!(
                "set user and group in {} to users that exist",
                conf_path.display()
            ))
        }
    };
    if qemu.is_root() {
        return Finding::ok(
            "libvirt",
            subject,
            "QEMU runs as root: it reaches every path",
        );
    }
    let deepest = [
        dir.join("libvirt/qemu"),
        dir.join("libvirt"),
        dir.to_path_buf(),
    ]
    .into_iter()
    .find(|p| p.exists());
    let Some(deepest) = deepest else {
        return Finding::new(
            "libvirt",
            subject,
            unmet,
            format!("{} does not exist", dir.display()),
        )
        .remedy(format!("mkdir -p {}", dir.display()));
    };
    match perm::check(&deepest, &qemu.creds, Access::SEARCH) {
        Ok(()) => Finding::ok(
            "libvirt",
            subject,
            format!(
                "{qemu} (from {}) can reach its lease files under {}",
                conf_path.display(),
                dir.display()
            ),
        ),
        Err(e) => Finding::new(
            "libvirt",
            subject,
            unmet,
            format!(
                "{qemu} (from {}) cannot open a lease under {}: {e}",
                conf_path.display(),
                dir.display()
            ),
        )
        .remedy(
            "let QEMU's user search every directory down to memory_backing_dir (chmod o+x), \
             or move memory_backing_dir (qemu.conf and /etc/hugeprep/libvirt-hook.toml)",
        ),
    }
}

fn hook(opts: &DoctorOptions, needs_daemon: bool, live: bool, unmet: Severity) -> Finding {
    let hooks = opts.libvirt_dir.join("hooks");
    let candidates = [hooks.join("qemu.d/hugeprep"), hooks.join("qemu")];
    let Some(p) = candidates.iter().find(|p| p.exists()) else {
        return Finding::new(
            "libvirt",
            "hook",
            unmet,
            format!(
                "no hook at {} or {}: domains start without hugeprep's memory",
                candidates[0].display(),
                candidates[1].display()
            ),
        )
        .remedy(format!(
            "install -m 0755 /usr/share/hugeprep/libvirt/hook {}, then restart libvirtd",
            candidates[0].display()
        ));
    };
    let mode = std::fs::metadata(p)
        .map(|m| m.permissions().mode())
        .unwrap_or(0);
    if mode & 0o111 == 0 {
        return Finding::new(
            "libvirt",
            "hook",
            Severity::Blocking,
            format!(
                "{} is not executable: libvirt fails every VM start",
                p.display()
            ),
        )
        .remedy(format!("chmod 0755 {}", p.display()));
    }
    let script = std::fs::read_to_string(p).unwrap_or_default();
    if let Some((program, guarded)) = hook_program(&script) {
        let present = std::fs::metadata(&program)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false);
        if !present && program.is_absolute() {
            let (severity, effect) = if guarded {
                (Severity::Warning, "domains start without hugeprep's memory")
            } else {
                (Severity::Blocking, "libvirt fails every domain start")
            };
            return Finding::new(
                "libvirt",
                "hook",
                severity,
                format!(
                    "{} runs {}, which is missing: {effect}",
                    p.display(),
                    program.display()
                ),
            )
            .remedy(format!(
                "reinstall hugeprep, or remove {} and restart libvirtd",
                p.display()
            ));
        }
    }
    if needs_daemon || !live {
        return Finding::ok(
            "libvirt",
            "hook",
            format!("{} installed and executable", p.display()),
        );
    }
    Finding::new(
        "libvirt",
        "hook",
        Severity::Blocking,
        format!(
            "{} is installed but the daemon is not reachable: the hook fails VM starts",
            p.display()
        ),
    )
    .remedy("start the daemon: systemctl start hugeprep.socket hugeprep.service")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_wrappers_program_is_found() {
        let shipped = include_str!("../../../../integration/libvirt/hook");
        let (program, _) = hook_program(shipped).unwrap();
        assert_eq!(program, PathBuf::from("/usr/bin/hugeprep"));
        let guarded = "#!/bin/sh\n[ -x /usr/bin/hugeprep ] || exit 0\nexec /usr/bin/hugeprep x\n";
        assert_eq!(
            hook_program(guarded),
            Some((PathBuf::from("/usr/bin/hugeprep"), true))
        );
        assert_eq!(hook_program("#!/bin/sh\ntrue\n"), None);
    }
}
