//! `hugeprep completions SHELL` and `hugeprep manpages DIR`: generated from the clap
//! definitions at package build time (no build.rs: ordinary builds stay as fast as before).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::CommandFactory;

use super::Cli;

/// Print a shell completion script on stdout.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    pub shell: clap_complete::Shell,
}

/// Write a man page per command (hugeprep.1, hugeprep-serve.1, hugeprep-bench-clear.1 ...).
#[derive(Debug, clap::Args)]
pub struct ManpagesArgs {
    /// Directory to write the pages to (created if missing).
    pub dir: PathBuf,
}

/// Runs `hugeprep completions`.
pub fn run_completions(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut cmd = Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "hugeprep", &mut std::io::stdout());
    Ok(())
}

/// Runs `hugeprep manpages`.
pub fn run_manpages(args: ManpagesArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir).with_context(|| format!("mkdir {}", args.dir.display()))?;
    let mut cmd = Cli::command();
    cmd.build();
    write_pages(&cmd, &args.dir)?;
    // Section 5: the configuration files, from the default files the packages install.
    for (name, text) in hugeprep::daemon::config_page::pages() {
        let path = args.dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

/// `build()` named every subcommand `hugeprep-serve`, `hugeprep-bench-clear` ... as its
/// display name, which clap_mangen uses as the page's title.
fn write_pages(cmd: &clap::Command, dir: &Path) -> anyhow::Result<()> {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name());
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut out)?;
    let page = super::manpage::with_extra_sections(&String::from_utf8_lossy(&out), name);
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page).with_context(|| format!("write {}", path.display()))?;
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        write_pages(sub, dir)?;
    }
    Ok(())
}
