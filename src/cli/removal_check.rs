//! `hugeprep removal-check`: what would keep domains from starting, or lose something, once
//! the package is removed. The package's `prerm` (and the RPM's `%preun`) runs it on removal
//! and refuses while it finds anything (`HUGEPREP_REMOVE_FORCE=1` removes anyway); an
//! operator runs it before removing. Each finding names what to do first.
//!
//! What it looks for:
//! - domains `libvirt-adopt` converted (their original definitions are kept in the state
//!   directory, which a purge deletes, and only `libvirt-adopt --revert` defines them again);
//! - live leases (their pages would stay on hugetlbfs, out of everyone's reach, until
//!   reboot);
//! - libvirt's `memory_backing_dir` still set to the hook's directory (without hugeprep,
//!   file-backed domains then take their memory from the kernel's hugepage pool, which
//!   nothing fills any more: "Cannot allocate memory");
//! - a libvirt hook that runs `/usr/bin/hugeprep` without first checking it is there (a hook
//!   wrapper installed before the wrapper had that check): after removal it would fail
//!   every domain start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hugeprep::client::Client;
use hugeprep::journal::Journal;
use hugeprep::pool::{FileRecord, FileState};

/// The line of the shipped hook wrapper (`integration/libvirt/hook`) that makes it do
/// nothing once `/usr/bin/hugeprep` is gone.
pub const HOOK_GUARD: &str = "[ -x /usr/bin/hugeprep ] || exit 0";

/// Check whether removing hugeprep would leave a domain unable to start or lose state.
#[derive(Debug, clap::Args)]
pub struct RemovalCheckArgs {
    /// The daemon's configuration (for `state_dir`).
    #[arg(long, default_value = "/etc/hugeprep/hugeprep.toml")]
    pub config: PathBuf,
    /// The hook's settings (for `memory_backing_dir`).
    #[arg(long, default_value = "/etc/hugeprep/libvirt-hook.toml")]
    pub hook_config: PathBuf,
    /// libvirt's QEMU driver configuration.
    #[arg(long, default_value = "/etc/libvirt/qemu.conf")]
    pub qemu_conf: PathBuf,
    /// libvirt's hook directory (`qemu` and `qemu.d/*` in it are read).
    #[arg(long, default_value = "/etc/libvirt/hooks")]
    pub libvirt_hooks: PathBuf,
    /// Daemon socket (asked for its leases; the journal is read when nothing answers).
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print JSON (`{"blocked": bool, "blockers": [{"what", "remedy"}]}`); the exit status
    /// is the same as without.
    #[arg(long)]
    pub json: bool,
}

/// One thing that blocks removal, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Blocker {
    /// What was found.
    pub what: String,
    /// What to do before removing.
    pub remedy: String,
}

/// Runs `hugeprep removal-check`: prints the blockers and exits 1, or says nothing blocks.
pub fn run(args: RemovalCheckArgs) -> anyhow::Result<()> {
    let blockers = check(&args);
    if args.json {
        let report = serde_json::json!({
            "blocked": !blockers.is_empty(),
            "blockers": blockers,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        if blockers.is_empty() {
            return Ok(());
        }
        std::process::exit(1);
    }
    if blockers.is_empty() {
        println!("hugeprep removal-check: nothing blocks removing hugeprep");
        return Ok(());
    }
    println!(
        "hugeprep removal-check: {} thing(s) must be done before hugeprep is removed:",
        blockers.len()
    );
    for b in &blockers {
        println!("- {}\n  -> {}", b.what, b.remedy);
    }
    std::process::exit(1);
}

fn check(args: &RemovalCheckArgs) -> Vec<Blocker> {
    let state_dir = hugeprep::daemon::config::ConfigFile::load(&args.config)
        .ok()
        .and_then(|c| c.state_dir)
        .unwrap_or_else(|| hugeprep::daemon::DEFAULT_STATE_DIR.into());
    let mut out = adopted(&state_dir.join("libvirt-adopt"));
    out.extend(leases(&args.socket, &state_dir));
    let hook_dir =
        hook_backing_dir(&std::fs::read_to_string(&args.hook_config).unwrap_or_default());
    let qemu_conf = std::fs::read_to_string(&args.qemu_conf).unwrap_or_default();
    out.extend(backing_dir(&args.qemu_conf, &qemu_conf, &hook_dir));
    out.extend(unguarded_hooks(&args.libvirt_hooks));
    out
}

/// Domains with an original kept by `libvirt-adopt` (`<uuid>.xml` beside `<uuid>.adopted.xml`).
fn adopted(kept_dir: &Path) -> Vec<Blocker> {
    let Ok(entries) = std::fs::read_dir(kept_dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            let uuid = file.strip_suffix(".xml")?;
            if uuid.ends_with(".adopted") || file.starts_with('.') {
                return None;
            }
            let xml = std::fs::read_to_string(e.path()).unwrap_or_default();
            Some(domain_name(&xml).map_or(uuid.to_string(), |n| format!("{n} ({uuid})")))
        })
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| Blocker {
            what: format!(
                "domain {name} was converted by `hugeprep libvirt-adopt`: its original definition is kept only in {} (a purge deletes it), and only hugeprep defines it again",
                kept_dir.display()
            ),
            remedy: format!(
                "hugeprep libvirt-adopt --revert {}",
                name.split(' ').next().unwrap_or(&name)
            ),
        })
        .collect()
}

/// `<name>` of a domain definition.
fn domain_name(xml: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    doc.root_element()
        .children()
        .find(|n| n.has_tag_name("name"))
        .and_then(|n| n.text())
        .map(str::to_string)
}

/// Live leases: the daemon's answer, or its journal when it does not answer.
fn leases(socket: &Path, state_dir: &Path) -> Vec<Blocker> {
    let client = Client::new(socket).with_timeout(Duration::from_secs(10));
    let names: Vec<String> = match client.blocking(client.leases()) {
        Ok(leases) => leases.into_iter().map(|l| l.name).collect(),
        Err(_) => match Journal::peek_boot_records::<FileRecord>(state_dir) {
            Ok(records) => records
                .into_iter()
                .filter_map(|(_, r)| match r.state {
                    FileState::Leased(l) => Some(l.name),
                    _ => None,
                })
                .collect(),
            Err(err) => {
                return vec![Blocker {
                    what: format!(
                        "the daemon does not answer and its journal cannot be read: {err}"
                    ),
                    remedy: "start the daemon (systemctl start hugeprep) and check again".into(),
                }]
            }
        },
    };
    if names.is_empty() {
        return Vec::new();
    }
    let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
    vec![Blocker {
        what: format!(
            "{} live lease(s) ({}{}): after removal nothing releases their pages, which stay on hugetlbfs until reboot",
            names.len(),
            shown.join(", "),
            if names.len() > shown.len() { ", ..." } else { "" }
        ),
        remedy: "stop the VMs that use them (their hook releases them), or `hugeprep release NAME`".into(),
    }]
}

/// `memory_backing_dir` of the hook's settings (the packaged default when unset).
fn hook_backing_dir(hook_toml: &str) -> PathBuf {
    toml::from_str::<toml::Value>(hook_toml)
        .ok()
        .and_then(|v| v.get("memory_backing_dir")?.as_str().map(PathBuf::from))
        .unwrap_or_else(|| "/dev/hugepages/libvirt-backing".into())
}

/// libvirt's `memory_backing_dir` still the hook's.
fn backing_dir(qemu_conf_path: &Path, qemu_conf: &str, hook_dir: &Path) -> Option<Blocker> {
    let dir = hugeprep::vmm::libvirt::qemu_conf::QemuConf::parse(qemu_conf).memory_backing_dir?;
    (dir == hook_dir).then(|| Blocker {
        what: format!(
            "{} sets memory_backing_dir = \"{}\", hugeprep's: without hugeprep, file-backed domains take their memory from the kernel's hugepage pool there, which nothing fills any more, and fail to start (\"Cannot allocate memory\")",
            qemu_conf_path.display(),
            dir.display()
        ),
        remedy: format!(
            "remove the memory_backing_dir line from {} (or point it at memory you provide), then `systemctl restart libvirtd` (or virtqemud); running domains keep their memory",
            qemu_conf_path.display()
        ),
    })
}

/// Hooks that run hugeprep's hook without [`HOOK_GUARD`].
fn unguarded_hooks(hooks: &Path) -> Vec<Blocker> {
    let mut files = vec![hooks.join("qemu")];
    if let Ok(entries) = std::fs::read_dir(hooks.join("qemu.d")) {
        files.extend(entries.flatten().map(|e| e.path()));
    }
    files.sort();
    files
        .into_iter()
        .filter(|f| {
            std::fs::read_to_string(f).is_ok_and(|t| hook_needs_guard(&t))
        })
        .map(|f| Blocker {
            what: format!(
                "the libvirt hook {} runs hugeprep without checking that it is installed: after removal every domain start fails (exit 127)",
                f.display()
            ),
            remedy: format!(
                "install -m 0755 /usr/share/hugeprep/libvirt/hook {} (it does nothing once hugeprep is gone), or remove it and `systemctl reload libvirtd`",
                f.display()
            ),
        })
        .collect()
}

/// A hook text that calls `hugeprep libvirt-hook` and lacks [`HOOK_GUARD`].
fn hook_needs_guard(text: &str) -> bool {
    let runs = text
        .lines()
        .map(str::trim)
        .any(|l| !l.starts_with('#') && l.contains("hugeprep") && l.contains("libvirt-hook"));
    runs && !text.lines().any(|l| l.trim() == HOOK_GUARD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_hook_is_guarded_and_the_first_one_was_not() {
        let shipped = include_str!("../../integration/libvirt/hook");
        assert!(!hook_needs_guard(shipped));
        let first = "#!/bin/sh\n# comment\nexec /usr/bin/hugeprep libvirt-hook --config /etc/hugeprep/libvirt-hook.toml \"$@\"\n";
        assert!(hook_needs_guard(first));
        assert!(!hook_needs_guard(
            "#!/bin/sh\n# hugeprep libvirt-hook\nexit 0\n"
        ));
    }

    #[test]
    fn memory_backing_dir_blocks_only_when_it_is_the_hooks() {
        let hook = hook_backing_dir(include_str!("../../integration/libvirt/libvirt-hook.toml"));
        assert_eq!(hook, PathBuf::from("/dev/hugepages/libvirt-backing"));
        let conf = include_str!("../../integration/libvirt/qemu.conf.snippet");
        let b = backing_dir(Path::new("/etc/libvirt/qemu.conf"), conf, &hook).unwrap();
        assert!(b.what.contains("Cannot allocate memory"), "{b:?}");
        assert!(b.remedy.contains("systemctl restart libvirtd"), "{b:?}");
        let other = "memory_backing_dir = \"/var/lib/libvirt/qemu/ram\"\n";
        assert!(backing_dir(Path::new("q"), other, &hook).is_none());
        assert!(backing_dir(Path::new("q"), "# memory_backing_dir = \"/x\"\n", &hook).is_none());
    }

    #[test]
    fn adopted_domains_are_named_with_the_revert_command() {
        let dir = std::env::temp_dir().join(format!("hugeprep-rmcheck-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let uuid = "4dea22b3-1d52-d8f3-2516-782e98ab3fa0";
        std::fs::write(
            dir.join(format!("{uuid}.xml")),
            "<domain><name>vm1</name></domain>",
        )
        .unwrap();
        std::fs::write(dir.join(format!("{uuid}.adopted.xml")), "<domain/>").unwrap();
        let found = adopted(&dir);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].what.contains(&format!("vm1 ({uuid})")),
            "{found:?}"
        );
        assert_eq!(found[0].remedy, "hugeprep libvirt-adopt --revert vm1");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(adopted(&dir).is_empty());
    }
}
