//! `hugeprep mount`: mount a hugetlbfs of one page size (for `prepare --mount`, libvirt's
//! `memory_backing_dir` or the daemon's `mounts`), list them, or unmount one.

use std::fs::DirBuilder;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use anyhow::Context;
use hugeprep::hugetlb::{mount, MountOptions, Owner};
use hugeprep::PageSize;

/// Mount hugetlbfs at DIR (created if missing), or list the hugetlbfs mounts.
#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// Where to mount; without it, list the hugetlbfs mounts and their page sizes.
    pub dir: Option<PathBuf>,
    /// Page size of the files on the mount.
    #[arg(long, default_value = "2M")]
    pub page_size: PageSize,
    /// Mode of the mount's root directory, in octal.
    #[arg(long, default_value = "0700", value_parser = parse_mode)]
    pub mode: u32,
    /// User (and its primary group) owning the mount's root directory, e.g. the VMM's user.
    #[arg(long)]
    pub owner: Option<String>,
    /// Unmount DIR instead (it must be a hugetlbfs mount).
    #[arg(long, requires = "dir", conflicts_with_all = ["owner"])]
    pub unmount: bool,
    /// Print JSON: the list of mounts (`[{"page_size", "path"}]`), the mount made, or the one
    /// unmounted.
    #[arg(long)]
    pub json: bool,
}

fn mount_json(page_size: PageSize, path: &std::path::Path) -> serde_json::Value {
    serde_json::json!({ "page_size": page_size, "path": path })
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{s:?} is not an octal mode (0000 to 7777)"))
}

/// Runs `hugeprep mount`.
pub fn run(args: MountArgs) -> anyhow::Result<()> {
    let Some(dir) = args.dir else {
        let mounts = mount::mounts().context("reading /proc/self/mountinfo")?;
        if args.json {
            let list: Vec<_> = mounts
                .iter()
                .map(|m| mount_json(m.page_size, &m.path))
                .collect();
            println!("{}", serde_json::to_string_pretty(&list)?);
            return Ok(());
        }
        for m in mounts {
            println!("{:<4} {}", m.page_size, m.path.display());
        }
        return Ok(());
    };
    if args.unmount {
        let is_hugetlbfs = mount::mounts()
            .context("reading /proc/self/mountinfo")?
            .iter()
            .any(|m| m.path == dir);
        anyhow::ensure!(
            is_hugetlbfs,
            "{}: not a hugetlbfs mount point",
            dir.display()
        );
        mount::unmount(&dir)?;
        if args.json {
            println!("{}", serde_json::json!({ "unmounted": dir }));
        }
        return Ok(());
    }
    let mut options = MountOptions::new(args.page_size);
    options.mode = args.mode;
    if let Some(user) = &args.owner {
        let owner = Owner::lookup(user).with_context(|| format!("--owner {user}"))?;
        options.uid = Some(owner.uid);
        options.gid = Some(owner.gid);
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let mounted = mount::mount(&dir, &options)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&mount_json(mounted.page_size, &mounted.path))?
        );
    } else {
        println!("{} {}", mounted.page_size, mounted.path.display());
    }
    Ok(())
}
