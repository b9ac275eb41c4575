//! `hugeprep reserve`: raise the kernel's per-node hugepage pools to what the configuration's
//! warm targets need, once, early in boot (`hugeprep-reserve.service`), before memory
//! fragments and before the daemon and libvirtd start. Pages it adds are recorded in the
//! daemon's ledger, so `hugeprep drain --release-pools` gives back exactly those.

use std::path::PathBuf;

use anyhow::Context;
use hugeprep::daemon::config::ConfigFile;
use hugeprep::hugetlb::pool::{self as kpool, Scope};
use hugeprep::pool::reserve::{self, Raise, Reservations};
use hugeprep::pool::targets::stored_targets;
use hugeprep::pool::PoolPolicy;
use hugeprep::topology::{self, Topology};
use hugeprep::units::format_bytes;
use hugeprep::PageSize;

use super::progress::{Progress, Unit};

/// Writes a pool's raise is split into at most, so a terminal sees the pages arrive (the
/// kernel takes seconds for hundreds of GiB, more when it must compact for 1 GiB pages).
const RAISE_STEPS: u64 = 32;

/// Raise the per-node hugepage pools to the configured warm targets; report what the kernel
/// could not supply.
#[derive(Debug, clap::Args)]
pub struct ReserveArgs {
    /// Configuration file (the daemon's).
    #[arg(long, default_value = "/etc/hugeprep/hugeprep.toml")]
    pub config: PathBuf,
    /// Journal directory holding the ledger of added pages (default: the config's state_dir).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Exit with status 1 when a pool could not be raised to its target.
    #[arg(long)]
    pub strict: bool,
    /// Print JSON (`{"enabled", "api_targets", "pools": [{"node", "page_size",
    /// "target_bytes", "added", "short", "reason", ...}]}`) instead of lines; no progress bar.
    #[arg(long)]
    pub json: bool,
}

/// One pool's outcome, for `--json`.
#[derive(Debug, serde::Serialize)]
struct PoolOutcome {
    node: u32,
    page_size: PageSize,
    target_bytes: u64,
    /// Pages the pool lacked for the target (beyond its free pages).
    needed: u64,
    /// Pages the kernel added.
    added: u64,
    /// Pages still missing.
    short: u64,
    /// Why, when `short` > 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// 2M pages a gigantic-page raise pulled in and gave back, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pulled_in: Option<(u64, u64)>,
}

/// Runs `hugeprep reserve`.
pub fn run(args: ReserveArgs) -> anyhow::Result<()> {
    let file = if args.config.exists() {
        ConfigFile::load(&args.config)?
    } else {
        ConfigFile::default()
    };
    let mut policy = match &file.pool {
        Some(spec) => spec
            .validate()
            .with_context(|| args.config.display().to_string())?,
        None => PoolPolicy::embedded(),
    };
    if !policy.reserve.enabled {
        if args.json {
            println!(
                "{}",
                serde_json::json!({ "enabled": false, "api_targets": false, "pools": [] })
            );
        } else {
            println!(
                "reserve = false in {}: pools left as they are",
                args.config.display()
            );
        }
        return Ok(());
    }
    let state_dir = args
        .state_dir
        .or(file.state_dir)
        .unwrap_or_else(|| hugeprep::daemon::DEFAULT_STATE_DIR.into());
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("mkdir {}", state_dir.display()))?;
    let ledger = Reservations::open(&state_dir)?;
    let topo = Topology::detect()?;
    // Targets set over the API win over the file's in the daemon: reserve for those.
    let page_sizes = kpool::page_sizes().into_iter().collect();
    let api_targets = stored_targets(&state_dir, &page_sizes, &topo)?;
    let from_api = api_targets.is_some();
    if let Some(targets) = api_targets {
        if !args.json {
            println!(
                "warm targets set over the API (persisted in {}) apply",
                state_dir.display()
            );
        }
        policy.targets = targets;
    }
    let say = |line: String| {
        if !args.json {
            println!("{line}");
        }
    };
    let mut outcomes = Vec::new();
    let mut short_any = false;
    let progress = Progress::bar(args.json, Unit::Count("pages"), 0);
    progress.set_message("reading the pools");
    for page_size in kpool::page_sizes() {
        for node in topo.node_ids() {
            let want = policy
                .target_bytes(node, page_size)
                .div_ceil(page_size.bytes());
            if want == 0 {
                continue;
            }
            let free = kpool::read(Scope::Node(node), page_size)?.free;
            let need = want.saturating_sub(free);
            let available = topology::node_available_bytes(node).unwrap_or(0);
            let (pages, limit) = reserve::plan(
                need,
                page_size,
                &policy.reserve,
                ledger.added_bytes_on(node),
                available,
            );
            let pull_in = reserve::pull_in_bytes(&policy.reserve, available);
            let raise = if pages > 0 {
                progress.restart(pages, format!("node {node} {page_size}: raising the pool"));
                Some(raise_in_steps(
                    &ledger,
                    node,
                    page_size,
                    pages,
                    pull_in,
                    |added| progress.set_position(added),
                )?)
            } else {
                None
            };
            let added = raise.map_or(0, |r| r.added);
            let pulled_in = raise.and_then(|r| r.pulled_in);
            if let Some(pulled) = pulled_in {
                progress.suspend(|| {
                    say(format!(
                        "node {node} {page_size}: the kernel gave fewer pages than asked; pulled \
                         lazily initialised memory in (the 2M pool took {} pages and gave {} \
                         back) and asked again",
                        pulled.added, pulled.returned
                    ))
                });
            }
            let short = need.saturating_sub(added);
            let target = format_bytes(want * page_size.bytes());
            let mut outcome = PoolOutcome {
                node,
                page_size,
                target_bytes: want * page_size.bytes(),
                needed: need,
                added,
                short,
                reason: None,
                pulled_in: pulled_in.map(|p| (p.added, p.returned)),
            };
            if short == 0 {
                progress.suspend(|| {
                    say(format!(
                        "node {node} {page_size}: {target} target, added {added} pages"
                    ))
                });
                outcomes.push(outcome);
                continue;
            }
            short_any = true;
            let why = match limit {
                Some(l) if added == pages => l.explain(node, page_size, short),
                _ => format!(
                    "the kernel added {added} of the {pages} pages asked (memory short or \
                     fragmented: reserve {page_size} pages on the kernel command line, \
                     docs/operations.md)"
                ),
            };
            progress.suspend(|| {
                say(format!(
                    "node {node} {page_size}: {target} target, short by {short} pages: {why}"
                ))
            });
            outcome.reason = Some(why);
            outcomes.push(outcome);
        }
    }
    drop(progress);
    if args.json {
        let report = serde_json::json!({
            "enabled": true,
            "api_targets": from_api,
            "pools": outcomes,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    anyhow::ensure!(
        !(short_any && args.strict),
        "--strict: some pools are short of their targets"
    );
    Ok(())
}

/// Raises `node`'s pool by `pages` in up to [`RAISE_STEPS`] writes, each recorded in the
/// ledger as it lands; `added` hears the running total. A gigantic-page step the kernel falls
/// short of pulls lazily initialised memory in (up to `pull_in` bytes, once per node:
/// [`Reservations::raise`]) and asks again; a step still short ends the raise: memory is short
/// or fragmented, and the next step would fall short too.
fn raise_in_steps(
    ledger: &Reservations,
    node: u32,
    page_size: PageSize,
    pages: u64,
    pull_in: u64,
    added: impl Fn(u64),
) -> anyhow::Result<Raise> {
    let step = pages.div_ceil(RAISE_STEPS).max(1);
    let mut total = Raise {
        asked: pages,
        added: 0,
        pulled_in: None,
        compactions: 0,
    };
    while total.added < pages {
        let ask = step.min(pages - total.added);
        let got = ledger.raise(node, page_size, ask, pull_in)?;
        total.added += got.added;
        total.pulled_in = total.pulled_in.or(got.pulled_in);
        added(total.added);
        if got.added < ask {
            break;
        }
    }
    Ok(total)
}
