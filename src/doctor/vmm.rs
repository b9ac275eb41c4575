//! QEMU and libvirt, when installed: versions, libvirt's `memory_backing_dir` on hugetlbfs
//! and the hugeprep hook.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{DoctorOptions, Finding, Severity};

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

/// `memory_backing_dir = "/path"` from qemu.conf, ignoring comments.
pub fn memory_backing_dir(qemu_conf: &str) -> Option<PathBuf> {
    qemu_conf.lines().find_map(|l| {
        let l = l.trim();
        let rest = l
            .strip_prefix("memory_backing_dir")?
            .trim_start()
            .strip_prefix('=')?;
        Some(PathBuf::from(rest.trim().trim_matches('"')))
    })
}

/// The hugetlbfs page size of `path`, or of its nearest existing ancestor (libvirt creates
/// the directory when it first needs it).
fn hugetlbfs_of(path: &Path) -> Option<crate::PageSize> {
    path.ancestors()
        .find(|p| p.exists())
        .and_then(|p| crate::hugetlb::hugetlbfs_page_size(p).ok().flatten())
}

/// libvirt's version, `memory_backing_dir` and hook. Problems are warnings while libvirtd
/// runs (its VMs get no leases), information otherwise.
pub fn libvirt(opts: &DoctorOptions, daemon_reachable: bool) -> Vec<Finding> {
    let Some(version) = first_line("libvirtd", &["--version"]) else {
        return vec![Finding::new(
            "libvirt",
            "libvirtd",
            Severity::Info,
            "not installed",
        )];
    };
    let running = Path::new("/run/libvirt/libvirt-sock").exists()
        || Path::new("/run/libvirt/virtqemud-sock").exists();
    let unmet = if running {
        Severity::Warning
    } else {
        Severity::Info
    };
    let state = if running { "running" } else { "not running" };
    let mut out = vec![Finding::ok(
        "libvirt",
        "libvirtd",
        format!("{version}, {state}"),
    )];
    let conf_path = opts.libvirt_dir.join("qemu.conf");
    let conf = std::fs::read_to_string(&conf_path).unwrap_or_default();
    out.push(match memory_backing_dir(&conf) {
        None => Finding::new(
            "libvirt",
            "memory_backing_dir",
            unmet,
            format!(
                "not set in {}: QEMU's file-backed memory is not on hugetlbfs",
                conf_path.display()
            ),
        )
        .remedy(
            "set memory_backing_dir = \"/dev/hugepages/libvirt\" (a hugetlbfs mount) in qemu.conf",
        ),
        Some(dir) => match hugetlbfs_of(&dir) {
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
            .remedy("mount hugetlbfs at or above it: hugeprep mount --page-size 2M DIR"),
        },
    });
    let hooks = opts.libvirt_dir.join("hooks");
    let candidates = [hooks.join("qemu.d/hugeprep"), hooks.join("qemu")];
    let hook = candidates.iter().find(|p| p.exists());
    out.push(match hook {
        None => Finding::new(
            "libvirt",
            "hook",
            unmet,
            format!(
                "no hook at {} or {}",
                candidates[0].display(),
                candidates[1].display()
            ),
        )
        .remedy(
            "install integration/libvirt's hook as /etc/libvirt/hooks/qemu.d/hugeprep (mode 0755)",
        ),
        Some(p) => {
            let mode = std::fs::metadata(p)
                .map(|m| m.permissions().mode())
                .unwrap_or(0);
            if mode & 0o111 == 0 {
                Finding::new(
                    "libvirt",
                    "hook",
                    Severity::Blocking,
                    format!(
                        "{} is not executable: libvirt fails every VM start",
                        p.display()
                    ),
                )
                .remedy(format!("chmod 0755 {}", p.display()))
            } else if !daemon_reachable && running {
                Finding::new(
                    "libvirt",
                    "hook",
                    Severity::Blocking,
                    format!(
                        "{} is installed but the daemon is not reachable: the hook fails VM starts",
                        p.display()
                    ),
                )
                .remedy("start the daemon (systemctl start hugeprep)")
            } else {
                Finding::ok(
                    "libvirt",
                    "hook",
                    format!("{} installed and executable", p.display()),
                )
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_backing_dir_is_read_from_qemu_conf() {
        let conf = "# memory_backing_dir = \"/var/lib/libvirt/qemu/ram\"\n\
                    memory_backing_dir = \"/dev/hugepages/libvirt\"\n";
        assert_eq!(
            memory_backing_dir(conf),
            Some(PathBuf::from("/dev/hugepages/libvirt"))
        );
        assert_eq!(memory_backing_dir("user = \"root\"\n"), None);
    }
}
