//! `hugeprep bench trace-csv`: an operator's VM trace from what the host recorded.

use std::path::PathBuf;

use anyhow::Context;
use hugeprep::PageSize;
use hugeprep_bench::trace::operator::{self, convert};

/// Writes an operator's VM trace (docs/pool.md, "An operator's trace") from libvirt's
/// lifecycle events or from the daemon's log of the libvirt hook's leases.
#[derive(Debug, clap::Args)]
pub struct BenchTraceCsvArgs {
    /// What `virsh event --all --loop --timestamp` printed.
    #[arg(long, value_name = "FILE", required_unless_present = "daemon_log")]
    pub virsh_events: Option<PathBuf>,
    /// With `--virsh-events`: domain XML files (`virsh dumpxml`), or directories of them
    /// (/etc/libvirt/qemu), for the domains' memory and page size.
    #[arg(long, value_name = "PATH")]
    pub domain_xml: Vec<PathBuf>,
    /// The daemon's log (its stderr, `journalctl -o short-iso-precise` or `-o json`): its
    /// `leased` and `released` lines.
    #[arg(long, value_name = "FILE", conflicts_with = "virsh_events")]
    pub daemon_log: Option<PathBuf>,
    /// The page size of a domain whose XML names none (or of log lines without one).
    #[arg(long, default_value = "2M")]
    pub page_size: PageSize,
    /// Write the CSV here instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

fn domains(paths: &[PathBuf]) -> anyhow::Result<Vec<convert::DomainMemory>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let rd =
                std::fs::read_dir(p).with_context(|| format!("--domain-xml {}", p.display()))?;
            for e in rd.flatten() {
                if e.path().extension().is_some_and(|x| x == "xml") {
                    files.push(e.path());
                }
            }
        } else {
            files.push(p.clone());
        }
    }
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("--domain-xml {}", f.display()))?;
            convert::domain_memory(&text)
                .map_err(|e| anyhow::anyhow!("--domain-xml {}: {e}", f.display()))
        })
        .collect()
}

/// Runs `hugeprep bench trace-csv`.
pub fn run(args: BenchTraceCsvArgs) -> anyhow::Result<()> {
    let read = |flag: &str, p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("{flag} {}", p.display()))
    };
    let events = match (&args.virsh_events, &args.daemon_log) {
        (Some(p), _) => {
            let known = domains(&args.domain_xml)?;
            convert::from_virsh_events(&read("--virsh-events", p)?, &known, args.page_size)
                .with_context(|| format!("--virsh-events {}", p.display()))?
        }
        (None, Some(p)) => convert::from_daemon_log(&read("--daemon-log", p)?, args.page_size)
            .with_context(|| format!("--daemon-log {}", p.display()))?,
        (None, None) => anyhow::bail!("give --virsh-events or --daemon-log"),
    };
    let csv = operator::to_csv(&events);
    match &args.output {
        Some(p) => std::fs::write(p, csv).with_context(|| format!("--output {}", p.display()))?,
        None => print!("{csv}"),
    }
    Ok(())
}
