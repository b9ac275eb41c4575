//! `hugeprep libvirt-adopt DOMAIN...`: rewrite defined domains that ask for
//! `<memoryBacking><hugepages>` into file-backed shared memory the hook serves, with
//! `virsh dumpxml --inactive --security-info` and `virsh define` (never from inside the hook:
//! libvirt would deadlock on a call back into itself). The original XML is kept in the
//! daemon's state directory (`<state_dir>/libvirt-adopt/<uuid>.xml`) for `--revert`, with
//! libvirt's rendering of the adopted definition beside it (`kept`), so that a revert never
//! throws away a definition made after the adoption unless told to (`--force`), and an
//! adoption never replaces a kept original.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context};
use hugeprep::client::Client;
use hugeprep::vmm::libvirt::adopt::{adopt, Adoption};
use hugeprep::vmm::libvirt::{HookConfig, DEFAULT_CONFIG};
use hugeprep::PageSize;

mod kept;
use kept::{Kept, Standing};

/// The state directory's subdirectory holding the originals of adopted domains.
const ADOPT_DIR: &str = "libvirt-adopt";

/// Rewrite `<hugepages>` domains into file-backed shared memory the hook serves.
#[derive(Debug, clap::Args)]
pub struct LibvirtAdoptArgs {
    /// Domains (name, UUID or id), as virsh takes them.
    #[arg(required = true)]
    pub domains: Vec<String>,
    /// Print the change as a unified diff and define nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Define the original XML kept at adoption again (refused when the domain was
    /// redefined since the adoption, unless `--force`).
    #[arg(long)]
    pub revert: bool,
    /// With `--revert`: define the original even when the domain was redefined since the
    /// adoption, losing that later change.
    #[arg(long, requires = "revert")]
    pub force: bool,
    /// libvirt connection URI (virsh `--connect`).
    #[arg(long, short = 'c', env = "LIBVIRT_DEFAULT_URI")]
    pub connect: Option<String>,
    /// The hook's configuration file (its `memory_backing_dir` is libvirt's).
    #[arg(long, env = "HUGEPREP_LIBVIRT_HOOK_CONFIG", default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// The daemon's state directory, where the originals are kept.
    #[arg(long, default_value = hugeprep::daemon::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Daemon socket (to check that `memory_backing_dir` is on a mount it serves).
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print JSON: one object per domain with what was done (`message`, the diff with
    /// `--dry-run`) or why not (`error`); the exit status is the same as without.
    #[arg(long)]
    pub json: bool,
}

/// One domain's outcome, for `--json`.
#[derive(Debug, serde::Serialize)]
struct DomainOutcome<'a> {
    domain: &'a str,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn virsh(args: &LibvirtAdoptArgs, what: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new("virsh");
    cmd.arg("-q");
    if let Some(uri) = &args.connect {
        cmd.args(["-c", uri]);
    }
    let out = cmd
        .args(what)
        .output()
        .context("running virsh (install libvirt-clients)")?;
    if !out.status.success() {
        bail!(
            "virsh {}: {}",
            what.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `virsh define` of `xml`, through a file next to the kept originals (mode 0600, as they:
/// `--security-info` put the domain's passwords in).
fn define(args: &LibvirtAdoptArgs, dir: &Path, uuid: &str, xml: &str) -> anyhow::Result<()> {
    let file = dir.join(format!(".{uuid}.define.xml"));
    kept::write_durably(&file, xml)?;
    let defined = virsh(args, &["define", &file.to_string_lossy()]);
    if let Err(err) = std::fs::remove_file(&file) {
        tracing::warn!(file = %file.display(), %err, "cannot remove the temporary definition");
    }
    defined.map(|_| ())
}

/// The nearest existing directory at or above `path` (libvirt creates `memory_backing_dir`'s
/// subdirectories at a start).
fn existing_ancestor(path: &Path) -> Option<&Path> {
    path.ancestors().find(|p| p.exists())
}

/// The page size of `memory_backing_dir`'s mount, checked to be a mount the daemon serves.
fn backing_page_size(args: &LibvirtAdoptArgs, dir: &Path) -> anyhow::Result<PageSize> {
    let at = existing_ancestor(dir).ok_or_else(|| anyhow!("{} does not exist", dir.display()))?;
    let page_size = hugeprep::hugetlb::hugetlbfs_page_size(at)
        .with_context(|| format!("statfs {}", at.display()))?
        .ok_or_else(|| {
            anyhow!(
                "memory_backing_dir {} is not on a hugetlbfs mount: QEMU would allocate its own memory there",
                dir.display()
            )
        })?;
    let dev = std::fs::metadata(at)?.dev();
    let client = Client::new(&args.socket);
    let pool = client
        .blocking(client.pool())
        .context("asking the daemon which mounts it serves")?;
    let served: Vec<&hugeprep::pool::KindStatus> = pool
        .kinds
        .iter()
        .filter(|k| k.page_size == page_size)
        .collect();
    if !served
        .iter()
        .any(|k| std::fs::metadata(&k.mount).is_ok_and(|m| m.dev() == dev))
    {
        let mounts: Vec<String> = pool
            .kinds
            .iter()
            .map(|k| format!("{} ({})", k.mount.display(), k.page_size))
            .collect();
        bail!(
            "memory_backing_dir {} is off the daemon's mounts ({}): the hook can only link leases into a directory on the mount they live on",
            dir.display(),
            mounts.join(", ")
        );
    }
    Ok(page_size)
}

/// The host's default hugepage size, which libvirt uses for `<hugepages/>` without `<page>`.
fn default_page_size() -> PageSize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("Hugepagesize:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .and_then(|kib| PageSize::from_bytes(kib << 10))
        .unwrap_or(PageSize::Size2M)
}

fn diff(name: &str, old_label: &str, old: &str, new_label: &str, new: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(
            &format!("{name} ({old_label})"),
            &format!("{name} ({new_label})"),
        )
        .to_string()
}

fn dumpxml(args: &LibvirtAdoptArgs, domain: &str) -> anyhow::Result<String> {
    virsh(args, &["dumpxml", "--inactive", "--security-info", domain])
}

fn adopt_one(args: &LibvirtAdoptArgs, dir: &Path, domain: &str) -> anyhow::Result<String> {
    let config = HookConfig::load(&args.config)?;
    let uuid = virsh(args, &["domuuid", domain])?.trim().to_string();
    let original = dumpxml(args, domain)?;
    let kept = Kept::new(dir, &uuid);
    let record = kept.load()?;
    if let Some(record) = &record {
        if record.standing(&original) == Standing::AsAdopted {
            return Ok(format!(
                "{domain}: adopted already (original kept in {}), nothing to change",
                kept.original_path().display()
            ));
        }
    }
    let mbd = &config.memory_backing_dir;
    let page_size = backing_page_size(args, mbd)?;
    let xml = match adopt(
        &original,
        page_size,
        default_page_size(),
        &mbd.to_string_lossy(),
    )? {
        Adoption::AlreadyFileBacked if record.is_some() => {
            return Ok(format!(
                "{domain}: already file-backed shared memory, nothing to change (the original kept from its adoption stays in {}; the domain is no longer the definition adopt made, so `--revert` needs `--force`)",
                kept.original_path().display()
            ))
        }
        Adoption::AlreadyFileBacked => {
            return Ok(format!(
                "{domain}: already file-backed shared memory, nothing to change"
            ))
        }
        Adoption::Rewritten { xml, .. } => xml,
    };
    // The domain asks for <hugepages> again. The original kept from its adoption may be the
    // only copy of what it was before: never replace it unasked, unless it is this very
    // definition (an adoption interrupted before its define, or a revert made by hand).
    if record.as_ref().is_some_and(|r| r.original != original) {
        bail!(
            "domain {domain} was adopted before and defined again since with <hugepages>; the original kept in {} is not replaced: `--revert --force {domain}` defines that original, or remove {} and {} to adopt the definition as it is now",
            kept.original_path().display(),
            kept.original_path().display(),
            kept.adopted_path().display(),
        );
    }
    if args.dry_run {
        return Ok(diff(domain, "defined", &original, "adopted", &xml));
    }
    kept.save_original(&original)?;
    if let Err(err) = define(args, dir, &uuid, &xml) {
        // The definition failed: that error is the one to report.
        if let Err(forget) = kept.forget() {
            tracing::warn!(%forget, "cannot forget the kept original definition");
        }
        return Err(err);
    }
    // libvirt's own rendering of what was just defined, which a revert compares with.
    if let Err(err) = dumpxml(args, domain).and_then(|x| Ok(kept.record_adopted(&x)?)) {
        let undone = define(args, dir, &uuid, &original).and_then(|()| Ok(kept.forget()?));
        return Err(match undone {
            Ok(()) => err.context(format!(
                "{domain}: recording the adopted definition; the original is defined again"
            )),
            Err(undo) => err.context(format!(
                "{domain}: recording the adopted definition, and defining the original again failed too ({}); it is kept in {}",
                super::render_error(&undo),
                kept.original_path().display()
            )),
        });
    }
    Ok(format!(
        "{domain}: adopted ({page_size} pages, file-backed shared memory from hugeprep's hook) at its next start; original kept in {}",
        kept.original_path().display()
    ))
}

fn revert_one(args: &LibvirtAdoptArgs, dir: &Path, domain: &str) -> anyhow::Result<String> {
    let uuid = virsh(args, &["domuuid", domain])?.trim().to_string();
    let kept = Kept::new(dir, &uuid);
    let record = kept.load()?.ok_or_else(|| {
        anyhow!(
            "{domain}: no original kept in {} (was it adopted with this --state-dir?)",
            kept.original_path().display()
        )
    })?;
    let current = dumpxml(args, domain)?;
    let standing = record.standing(&current);
    if args.dry_run {
        if standing != Standing::AsAdopted {
            eprintln!("hugeprep libvirt-adopt: {domain}: {}: this diff also undoes that change, and `--revert` needs `--force` to define it", why_not_as_adopted(domain, standing, &kept));
        }
        return Ok(diff(
            domain,
            "defined",
            &current,
            "original",
            &record.original,
        ));
    }
    if standing != Standing::AsAdopted && !args.force {
        bail!(
            "{}: reverting would throw that change away, so nothing was changed. `hugeprep libvirt-adopt --revert --dry-run {domain}` shows the difference to the original; `--revert --force {domain}` defines the original anyway, losing the later change",
            why_not_as_adopted(domain, standing, &kept)
        );
    }
    define(args, dir, &uuid, &record.original)?;
    kept.forget()?;
    Ok(format!(
        "{domain}: original definition restored at its next start"
    ))
}

/// Why a domain's definition is not the one adopt made, for a refused revert.
fn why_not_as_adopted(domain: &str, standing: Standing, kept: &Kept) -> String {
    match standing {
        Standing::Unrecorded => format!(
            "domain {domain} may have been redefined after libvirt-adopt: the definition adopt made was not recorded ({} is missing)",
            kept.adopted_path().display()
        ),
        Standing::Redefined | Standing::AsAdopted => format!(
            "domain {domain} was redefined after libvirt-adopt: its inactive definition is no longer the one adopt made (recorded in {})",
            kept.adopted_path().display()
        ),
    }
}

/// Runs `hugeprep libvirt-adopt`.
pub fn run(args: LibvirtAdoptArgs) -> anyhow::Result<()> {
    let dir = args.state_dir.join(ADOPT_DIR);
    let mut failed = Vec::new();
    // One domain's result line is its progress.
    let n = args.domains.len() as u64;
    let progress = super::progress::Progress::bar(
        n < 2 || args.json,
        super::progress::Unit::Count("domains"),
        n,
    );
    let mut outcomes = Vec::new();
    for domain in &args.domains {
        progress.set_message(domain.clone());
        let done = if args.revert {
            revert_one(&args, &dir, domain)
        } else {
            adopt_one(&args, &dir, domain)
        };
        progress.inc(1);
        if args.json {
            let (message, error) = match done {
                Ok(text) => (Some(text), None),
                Err(err) => {
                    failed.push(domain.as_str());
                    (None, Some(super::render_error(&err)))
                }
            };
            outcomes.push(DomainOutcome {
                domain,
                ok: error.is_none(),
                message,
                error,
            });
            continue;
        }
        match done {
            Ok(text) => progress.suspend(|| {
                print!(
                    "{}",
                    if text.ends_with('\n') {
                        text
                    } else {
                        text + "\n"
                    }
                )
            }),
            Err(err) => {
                progress.suspend(|| {
                    eprintln!(
                        "hugeprep libvirt-adopt: {domain}: {}",
                        super::render_error(&err)
                    )
                });
                failed.push(domain.as_str());
            }
        }
    }
    if args.json {
        let report = serde_json::json!({
            "action": if args.revert { "revert" } else { "adopt" },
            "dry_run": args.dry_run,
            "domains": outcomes,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("not changed: {}", failed.join(", "))
    }
}
