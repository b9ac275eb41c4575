//! `hugeprep libvirt-adopt DOMAIN...`: rewrite defined domains that ask for
//! `<memoryBacking><hugepages>` into file-backed shared memory the hook serves, with
//! `virsh dumpxml --inactive --security-info` and `virsh define` (never from inside the hook:
//! libvirt would deadlock on a call back into itself). The original XML is kept in the
//! daemon's state directory (`<state_dir>/libvirt-adopt/<uuid>.xml`) for `--revert`.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context};
use hugeprep::client::Client;
use hugeprep::vmm::libvirt::adopt::{adopt, Adoption};
use hugeprep::vmm::libvirt::{HookConfig, DEFAULT_CONFIG};
use hugeprep::PageSize;

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
    /// Define the original XML kept at adoption again.
    #[arg(long)]
    pub revert: bool,
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

/// `virsh define` of `xml`, through a file next to the kept originals.
fn define(args: &LibvirtAdoptArgs, dir: &Path, uuid: &str, xml: &str) -> anyhow::Result<()> {
    let file = dir.join(format!(".{uuid}.define.xml"));
    std::fs::write(&file, xml).with_context(|| format!("writing {}", file.display()))?;
    let defined = virsh(args, &["define", &file.to_string_lossy()]);
    let _ = std::fs::remove_file(&file);
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

fn diff(name: &str, old: &str, new: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("{name} (defined)"), &format!("{name} (adopted)"))
        .to_string()
}

fn adopt_one(args: &LibvirtAdoptArgs, dir: &Path, domain: &str) -> anyhow::Result<String> {
    let config = HookConfig::load(&args.config)?;
    let uuid = virsh(args, &["domuuid", domain])?.trim().to_string();
    let original = virsh(args, &["dumpxml", "--inactive", "--security-info", domain])?;
    let mbd = &config.memory_backing_dir;
    let page_size = backing_page_size(args, mbd)?;
    let xml = match adopt(
        &original,
        page_size,
        default_page_size(),
        &mbd.to_string_lossy(),
    )? {
        Adoption::AlreadyFileBacked => {
            return Ok(format!(
                "{domain}: already file-backed shared memory, nothing to change"
            ))
        }
        Adoption::Rewritten { xml, .. } => xml,
    };
    if args.dry_run {
        return Ok(diff(domain, &original, &xml));
    }
    let kept = dir.join(format!("{uuid}.xml"));
    if kept.exists() {
        bail!(
            "{}: an original is kept already in {} (revert first, or remove it if the domain was redefined since)",
            domain,
            kept.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_durably(&kept, &original)?;
    if let Err(err) = define(args, dir, &uuid, &xml) {
        let _ = std::fs::remove_file(&kept);
        return Err(err);
    }
    Ok(format!(
        "{domain}: adopted ({page_size} pages, file-backed shared memory from hugeprep's hook) at its next start; original kept in {}",
        kept.display()
    ))
}

fn revert_one(args: &LibvirtAdoptArgs, dir: &Path, domain: &str) -> anyhow::Result<String> {
    let uuid = virsh(args, &["domuuid", domain])?.trim().to_string();
    let kept = dir.join(format!("{uuid}.xml"));
    let original = std::fs::read_to_string(&kept).with_context(|| {
        format!(
            "{domain}: no original kept in {} (was it adopted with this --state-dir?)",
            kept.display()
        )
    })?;
    if args.dry_run {
        let current = virsh(args, &["dumpxml", "--inactive", "--security-info", domain])?;
        return Ok(diff(domain, &current, &original));
    }
    define(args, dir, &uuid, &original)?;
    std::fs::remove_file(&kept).with_context(|| format!("removing {}", kept.display()))?;
    Ok(format!(
        "{domain}: original definition restored at its next start"
    ))
}

/// Writes `text` to `path` by a temporary file, `fsync` and `rename`: a crash leaves the old
/// state or the whole original, never half of one.
fn write_durably(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("xml.tmp");
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Runs `hugeprep libvirt-adopt`.
pub fn run(args: LibvirtAdoptArgs) -> anyhow::Result<()> {
    let dir = args.state_dir.join(ADOPT_DIR);
    let mut failed = Vec::new();
    for domain in &args.domains {
        let done = if args.revert {
            revert_one(&args, &dir, domain)
        } else {
            adopt_one(&args, &dir, domain)
        };
        match done {
            Ok(text) => print!(
                "{}",
                if text.ends_with('\n') {
                    text
                } else {
                    text + "\n"
                }
            ),
            Err(err) => {
                eprintln!(
                    "hugeprep libvirt-adopt: {domain}: {}",
                    super::render_error(&err)
                );
                failed.push(domain.as_str());
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("not changed: {}", failed.join(", "))
    }
}
