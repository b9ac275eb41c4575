//! The hook's actions: `start begin` takes one lease per memory backend and links it where
//! QEMU will open it; `stopped end` and `release end` give the domain's leases back; every
//! call that reaches the daemon also releases leases whose domain is gone (reconciliation).
//!
//! `start begin` is where libvirt says resources are labelled: by then it has made the
//! per-domain directory `<memory_backing_dir>/libvirt/qemu/<id>-<name>` (0700) and given it
//! to the user and group QEMU will run as (`qemuProcessBuildDestroyMemoryPaths`, the DAC
//! driver's `SetPathLabel`; an SELinux host labels it with the domain's MCS pair), and the
//! XML carries that user and group as `<seclabel model='dac'><label>`. The hook links the
//! leases into libvirt's directory and has the daemon hand the files to that user, so the
//! domain's QEMU opens them whatever user libvirt runs it as.
//!
//! The hook talks only to the hugeprep daemon, never to libvirt (a hook that calls libvirt
//! deadlocks it), and writes nothing on stdout.

use std::collections::HashSet;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::config::{Fallback, HookConfig};
use super::domain::Domain;
use super::error::{HookError, Result};
use super::plan::{self, NotOptedIn, Plan};
use super::qemu_conf::{QemuConf, QemuUser};
use crate::client::{Client, ClientError};
use crate::hugetlb::dir::DirHandle;
use crate::pool::{LeaseInfo, LeaseRequest};

/// What a hook call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The operation is not one the hook acts on.
    Ignored,
    /// The domain does not opt in; nothing was done.
    Untouched(NotOptedIn),
    /// Leases were linked at these paths.
    Linked(Vec<PathBuf>),
    /// The domain starts without hugeprep's memory, as configured; the reason.
    Cold(String),
    /// This many leases were released.
    Released(usize),
}

/// The hook, configured.
#[derive(Debug, Clone)]
pub struct Hook {
    config: HookConfig,
    client: Client,
}

impl Hook {
    /// A hook with `config`.
    pub fn new(config: HookConfig) -> Hook {
        let client = Client::new(&config.socket)
            .with_timeout(Duration::from_secs(config.timeout_s))
            .with_retry(Duration::from_secs(config.daemon_retry_s));
        Hook { config, client }
    }

    /// Handles `OP SUBOP` for domain `d` (parsed from what libvirt passes on stdin).
    pub fn run(&self, op: &str, subop: &str, d: &Domain) -> Result<Outcome> {
        if !acts_on(op, subop) {
            return Ok(Outcome::Ignored);
        }
        if let Err(why) = plan::opts_in(d) {
            return Ok(Outcome::Untouched(why));
        }
        if op == "start" {
            self.start(d)
        } else {
            self.release(d).map(Outcome::Released)
        }
    }

    fn blocking<T>(
        &self,
        fut: impl std::future::Future<Output = crate::client::Result<T>>,
    ) -> crate::client::Result<T> {
        self.client.blocking(fut)
    }

    fn leases(&self, d: &Domain) -> Result<Vec<LeaseInfo>> {
        self.blocking(self.client.leases())
            .map_err(|source| self.classify(d, "the lease list", None, source))
    }

    fn classify(&self, d: &Domain, what: &str, alias: Option<&str>, e: ClientError) -> HookError {
        if HookError::is_unreachable(&e) {
            return HookError::DaemonDown {
                domain: d.name.clone(),
                retried_s: self.config.daemon_retry_s,
                source: e,
            };
        }
        match (alias, &e) {
            (Some(alias), ClientError::Api { status: 422, .. }) => HookError::Shortage {
                domain: d.name.clone(),
                alias: alias.to_string(),
                source: e,
            },
            _ => HookError::Daemon {
                what: what.to_string(),
                domain: d.name.clone(),
                source: e,
            },
        }
    }

    /// Applies the configured fallback to an error of `start`.
    fn fallback(&self, e: HookError) -> Result<Outcome> {
        let choice = match &e {
            HookError::Shortage { .. } => self.config.on_shortage,
            HookError::DaemonDown { .. } => self.config.on_daemon_down,
            _ => Fallback::Fail,
        };
        match choice {
            Fallback::Fail => Err(e),
            Fallback::Cold => Ok(Outcome::Cold(e.to_string())),
        }
    }

    /// The user and group the domain's QEMU runs as: libvirt's DAC label in the XML, else
    /// the hook's `owner`, else qemu.conf's (or libvirt's built-in) user and group; with
    /// the supplementary groups libvirt gives every QEMU.
    pub fn qemu_user(&self, d: &Domain) -> Result<QemuUser> {
        let conf = QemuConf::read(&self.config.qemu_conf).map_err(|source| HookError::Io {
            op: "read",
            path: self.config.qemu_conf.clone(),
            source,
        })?;
        let user = if let Some(label) = &d.dac_label {
            QemuUser::from_label(label).map_err(|message| HookError::Xml {
                field: "seclabel model='dac' label".into(),
                message,
            })?
        } else if let Some(owner) = &self.config.owner {
            QemuUser::from_user(owner)
                .map_err(|message| HookError::Plan(format!("owner: {message}")))?
        } else {
            conf.qemu_user().map_err(|message| {
                HookError::Plan(format!(
                    "QEMU's user from {}: {message}",
                    self.config.qemu_conf.display()
                ))
            })?
        };
        Ok(user.with_groups_of(&conf))
    }

    /// The page size of the hugetlbfs that `memory_backing_dir` lies on.
    fn backing_page_size(&self) -> Result<crate::page_size::PageSize> {
        let mbd = &self.config.memory_backing_dir;
        crate::hugetlb::hugetlbfs_page_size(mbd)
            .map_err(|source| HookError::Io {
                op: "statfs",
                path: mbd.clone(),
                source,
            })?
            .ok_or_else(|| {
                HookError::Plan(format!(
                    "memory_backing_dir {} is not on a hugetlbfs mount",
                    mbd.display()
                ))
            })
    }

    fn start(&self, d: &Domain) -> Result<Outcome> {
        let id = d.id.ok_or_else(|| HookError::Xml {
            field: "domain id".into(),
            message: "missing at start begin".into(),
        })?;
        let page_size = self.backing_page_size()?;
        let plan = plan::plan(d, page_size)?;
        let qemu = self.qemu_user(d)?;
        let existing = match self.leases(d) {
            Ok(l) => l,
            Err(e) => return self.fallback(e),
        };
        // Leases of an earlier start of this domain that were never released: libvirt runs
        // no start hook for a running domain, so they are stale.
        let prefix = plan::lease_prefix(&d.uuid);
        for l in existing.iter().filter(|l| l.name.starts_with(&prefix)) {
            self.blocking(self.client.release(l.id))
                .map_err(|e| self.classify(d, &format!("release of {}", l.name), None, e))?;
        }
        // Best effort: the domain's own leases are what this start needs.
        let _ = self.reconcile_from(&existing, Some(&d.uuid));
        let short = plan::short_name(id, &d.name, self.utf8_locale());
        let dir = plan::domain_dir(&self.config.memory_backing_dir, &short);
        let mut taken = Taken::default();
        match self.take(d, &plan, &qemu, &dir, &mut taken) {
            Ok(()) => Ok(Outcome::Linked(taken.links)),
            Err(e) => {
                self.undo(taken);
                self.fallback(e)
            }
        }
    }

    /// Leases `size` bytes for a memory device that `virsh attach-device --live` will add
    /// to the running domain `d` (its live XML, `virsh dumpxml`) with the user alias
    /// `alias` (`ua-...`), and links it where libvirt will point QEMU's backend for it:
    /// `<memory_backing_dir>/libvirt/qemu/<id>-<name>/<alias>`. No hook runs for
    /// `attach-device`, so this runs before it, out of band. The lease is named like the
    /// hook's (`libvirt-<uuid>-<alias>`): `release end` gives it back with the domain's
    /// others. Returns the link.
    pub fn attach(&self, d: &Domain, alias: &str, size: u64, node: Option<u32>) -> Result<PathBuf> {
        let bad = |message: String| HookError::Xml {
            field: "alias".into(),
            message,
        };
        if !alias.starts_with("ua-")
            || alias.len() > 40
            || !alias[3..]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
            || alias.len() == 3
        {
            return Err(bad(format!(
                "{alias:?}: a libvirt user alias is `ua-` and then 1 to 37 letters, digits, `-` or `_`"
            )));
        }
        if let Err(why) = plan::opts_in(d) {
            return Err(HookError::Plan(format!(
                "domain {} does not take its memory from hugeprep ({why:?}): its memory devices cannot either",
                d.name
            )));
        }
        let id = d.id.ok_or_else(|| HookError::Xml {
            field: "domain id".into(),
            message: "missing: give the running domain's XML (virsh dumpxml)".into(),
        })?;
        let page_size = self.backing_page_size()?;
        if size == 0 || size % page_size.bytes() != 0 {
            return Err(HookError::Plan(format!(
                "size: {size} is not a whole number of {page_size} pages"
            )));
        }
        let name = plan::lease_name(&d.uuid, alias);
        let existing = self.leases(d)?;
        if existing.iter().any(|l| l.name == name) {
            return Err(bad(format!(
                "{alias:?}: domain {} has a lease {name} already",
                d.name
            )));
        }
        let qemu = self.qemu_user(d)?;
        let short = plan::short_name(id, &d.name, self.utf8_locale());
        let dir = plan::domain_dir(&self.config.memory_backing_dir, &short);
        if !dir.is_dir() {
            return Err(HookError::Plan(format!(
                "{}: no such directory: is domain {} running (id {id}) with memory_backing_dir {}?",
                dir.display(),
                d.name,
                self.config.memory_backing_dir.display()
            )));
        }
        let one = Plan {
            page_size,
            backends: vec![plan::Backend {
                alias: alias.to_string(),
                cell: None,
                size,
                node,
            }],
        };
        let mut taken = Taken::default();
        match self.take(d, &one, &qemu, &dir, &mut taken) {
            Ok(()) => Ok(dir.join(alias)),
            Err(e) => {
                self.undo(taken);
                Err(e)
            }
        }
    }

    fn take(
        &self,
        d: &Domain,
        plan: &Plan,
        qemu: &QemuUser,
        dir: &Path,
        taken: &mut Taken,
    ) -> Result<()> {
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| HookError::Io { op, path, source }
        };
        // `<memory_backing_dir>/libvirt/qemu` belongs to QEMU's user, which every domain may
        // share: below the configured directory no link is followed, and the per-domain
        // directory must be QEMU's and writable by no one else. libvirt made it (0700) just
        // before this call; a hook run without libvirt makes it the same way.
        let short = dir.file_name().map(OsString::from).ok_or_else(|| {
            HookError::Plan(format!("{}: no per-domain directory name", dir.display()))
        })?;
        let parent = DirHandle::open(&self.config.memory_backing_dir)?
            .parent_subdir("libvirt", 0o755)?
            .parent_subdir("qemu", 0o755)?;
        let (domain, made) = parent.qemu_subdir(&short, qemu.creds.uid, qemu.creds.gid)?;
        taken.dir = Some((parent, short, domain.clone(), made));
        // Before any lease: QEMU's user must be able to reach the files (a directory on the
        // way that it cannot search fails the start here, naming it, with nothing taken).
        if let Err(e) = crate::perm::check(dir, &qemu.creds, crate::perm::Access::SEARCH) {
            return Err(match e {
                crate::perm::CheckError::Blocked(blocked) => HookError::Unreachable {
                    dir: dir.to_path_buf(),
                    qemu: qemu.to_string(),
                    blocked,
                },
                crate::perm::CheckError::Unreadable(u) => io("stat", &u.path)(u.source),
            });
        }
        let owner = (!qemu.is_root()).then(|| qemu.creds.uid.to_string());
        for b in &plan.backends {
            let req = LeaseRequest {
                recycle: None,
                name: plan::lease_name(&d.uuid, &b.alias),
                size: b.size,
                page_size: Some(plan.page_size),
                node: b.node,
                owner: owner.clone(),
                pid: None,
                pin: self.config.pin,
            };
            let lease = self
                .blocking(self.client.lease(&req))
                .map_err(|e| self.classify(d, &format!("lease {}", req.name), Some(&b.alias), e))?;
            taken.leases.push(lease);
        }
        for (b, lease) in plan.backends.iter().zip(&taken.leases) {
            let link = dir.join(&b.alias);
            domain.link_in(&lease.path, &b.alias).map_err(|source| {
                if source.raw_os_error() == Some(libc::EXDEV) {
                    HookError::Plan(format!(
                        "memory_backing_dir {} is not on the daemon's mount of {} (lease {})",
                        self.config.memory_backing_dir.display(),
                        plan.page_size,
                        lease.path.display()
                    ))
                } else {
                    io("link", &link)(source)
                }
            })?;
            taken.links.push(link);
        }
        Ok(())
    }

    /// Gives back what a failed start took, through the directory handles; every step is
    /// attempted. libvirt's own directory stays (libvirt removes it when the start fails).
    fn undo(&self, taken: Taken) {
        if let Some((parent, name, dir, made)) = &taken.dir {
            for link in &taken.links {
                if let Some(alias) = link.file_name() {
                    // Every step is attempted; the prepare's own error is the one reported.
                    let _ = dir.unlink(alias);
                }
            }
            if *made {
                // As for the links: attempted, and the prepare's own error is reported.
                let _ = parent.rmdir(name);
            }
        }
        for l in &taken.leases {
            if let Err(err) = self.blocking(self.client.release(l.id)) {
                tracing::warn!(lease = l.id, name = %l.name, %err, "cannot release a lease of a failed prepare");
            }
        }
    }

    /// Releases every lease of domain `d`, then reconciles the others; returns how many of
    /// `d`'s it released.
    pub fn release(&self, d: &Domain) -> Result<usize> {
        let prefix = plan::lease_prefix(&d.uuid);
        let (mine, others): (Vec<LeaseInfo>, Vec<LeaseInfo>) = self
            .leases(d)?
            .into_iter()
            .partition(|l| l.name.starts_with(&prefix));
        for l in &mine {
            self.blocking(self.client.release(l.id))
                .map_err(|e| self.classify(d, &format!("release of {}", l.name), None, e))?;
        }
        // Best effort: it cannot undo the release above.
        let _ = self.reconcile_from(&others, None);
        Ok(mine.len())
    }

    /// Releases hook leases of domains other than `except` that libvirt no longer uses: no
    /// file in libvirt's per-domain directories is theirs (libvirt removes a domain's
    /// directory when it stops) and they have not changed for `stale_after_s` (so a domain
    /// between its lease and its link is left alone). Returns how many.
    pub fn reconcile(&self, except: Option<&str>) -> Result<usize> {
        let leases =
            self.blocking(self.client.leases())
                .map_err(|source| HookError::DaemonDown {
                    domain: String::new(),
                    retried_s: self.config.daemon_retry_s,
                    source,
                })?;
        self.reconcile_from(&leases, except)
    }

    fn reconcile_from(&self, leases: &[LeaseInfo], except: Option<&str>) -> Result<usize> {
        let linked = self.linked_inodes();
        let mut released = 0;
        for l in leases {
            let Some(uuid) = plan::lease_uuid(&l.name) else {
                continue;
            };
            if Some(uuid) == except || !self.unused(&l.path, &linked) {
                continue;
            }
            if self.blocking(self.client.release(l.id)).is_ok() {
                released += 1;
            }
        }
        Ok(released)
    }

    /// Inodes of the files in libvirt's per-domain directories: the leases QEMU uses.
    fn linked_inodes(&self) -> HashSet<u64> {
        let root = self.config.memory_backing_dir.join("libvirt/qemu");
        let entries = |dir: &Path| {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect::<Vec<_>>()
        };
        entries(&root)
            .iter()
            .flat_map(|dir| entries(dir))
            .filter_map(|f| std::fs::metadata(f).ok().map(|m| m.ino()))
            .collect()
    }

    /// A lease is unused when no libvirt directory links its file and the file has not
    /// changed (linked, unlinked) for `stale_after_s`.
    fn unused(&self, path: &Path, linked: &HashSet<u64>) -> bool {
        let Ok(meta) = std::fs::metadata(path) else {
            return false;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        !linked.contains(&meta.ino()) && now - meta.ctime() >= self.config.stale_after_s as i64
    }

    fn utf8_locale(&self) -> bool {
        self.config
            .utf8_locale
            .unwrap_or_else(|| parent_locale_is_utf8(std::os::unix::process::parent_id()))
    }
}

/// Whether the hook acts on `OP SUBOP`: `start begin`, `stopped end`, `release end`.
pub fn acts_on(op: &str, subop: &str) -> bool {
    matches!(
        (op, subop),
        ("start", "begin") | ("stopped", "end") | ("release", "end")
    )
}

/// What a start has taken so far, to undo on failure.
#[derive(Debug, Default)]
struct Taken {
    leases: Vec<LeaseInfo>,
    /// The parent's handle, the name and the handle of the per-domain directory, and
    /// whether this call made it.
    dir: Option<(DirHandle, OsString, DirHandle, bool)>,
    links: Vec<PathBuf>,
}

/// Whether process `pid` (libvirtd, the hook's parent) runs in a UTF-8 locale: its
/// `LC_ALL`, else `LC_CTYPE`, else `LANG` names UTF-8. The hook's own environment does not
/// tell: libvirt runs hooks with `LC_ALL=C`.
pub fn parent_locale_is_utf8(pid: u32) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let var = |name: &str| {
        environ.split(|b| *b == 0).find_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            let (k, v) = kv.split_once('=')?;
            (k == name && !v.is_empty()).then(|| v.to_string())
        })
    };
    let locale = var("LC_ALL")
        .or_else(|| var("LC_CTYPE"))
        .or_else(|| var("LANG"))
        .unwrap_or_default()
        .to_ascii_lowercase();
    locale.contains("utf-8") || locale.contains("utf8")
}
