//! `hugeprep targets`: show, set or clear the daemon's warm targets over the API
//! (`GET`/`PUT`/`DELETE /v1/pool/targets`). Targets set here are persisted by the daemon and
//! win over its configuration file until cleared.

use std::path::PathBuf;

use anyhow::Context;
use hugeprep::client::Client;
use hugeprep::policy::pool::{FlavorSpec, Percent, TargetSpec};
use hugeprep::pool::{TargetsReport, TargetsSource};
use hugeprep::units::format_bytes;
use hugeprep::PageSize;

/// Show the warm targets in force, set one (replacing all), or return to the configuration's.
#[derive(Debug, clap::Args)]
pub struct TargetsArgs {
    /// Set one target of this page size (replaces every target in force).
    #[arg(long, value_name = "2M|1G")]
    pub page_size: Option<PageSize>,
    /// The target's node (default: every node).
    #[arg(long, requires = "page_size")]
    pub node: Option<u32>,
    /// Bytes to keep warm, e.g. 8G (default with flavors: their sum).
    #[arg(long, requires = "page_size")]
    pub warm: Option<String>,
    /// An adaptive target's warm-start goal, percent (50 to 100), with --ceiling in place of
    /// --warm: the daemon sizes the target itself.
    #[arg(long, requires_all = ["page_size", "ceiling"], conflicts_with = "warm")]
    pub goal: Option<f64>,
    /// An adaptive target's ceiling, e.g. 64G.
    #[arg(long, requires_all = ["page_size", "goal"])]
    pub ceiling: Option<String>,
    /// A file size to keep, e.g. 1G (repeat for a mix).
    #[arg(long = "size", value_name = "SIZE", requires = "page_size")]
    pub sizes: Vec<String>,
    /// A flavor SIZE:COUNT, e.g. 4G:4 (repeat for more).
    #[arg(long = "flavor", value_name = "SIZE:COUNT", requires = "page_size")]
    pub flavors: Vec<String>,
    /// Set the targets of a JSON file (the body of `PUT /v1/pool/targets`).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["page_size", "clear"])]
    pub from: Option<PathBuf>,
    /// Forget the targets set over the API: the configuration's apply again.
    #[arg(long, conflicts_with = "page_size")]
    pub clear: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

fn flavor(text: &str) -> anyhow::Result<FlavorSpec> {
    let (size, count) = text
        .split_once(':')
        .with_context(|| format!("--flavor {text:?}: expected SIZE:COUNT, e.g. 4G:4"))?;
    let count = count
        .parse()
        .with_context(|| format!("--flavor {text:?}: COUNT must be an integer 1 to 4096"))?;
    Ok(FlavorSpec {
        size: size.to_string(),
        count,
    })
}

/// The targets as a table.
pub fn render(report: &TargetsReport) -> String {
    let source = match report.source {
        TargetsSource::Api => {
            "set over the API (hugeprep targets --clear returns to the configuration's)"
        }
        TargetsSource::Config => "from the configuration",
    };
    let mut out = format!("targets {source}\n");
    if report.targets.is_empty() {
        out.push_str("no warm targets\n");
    }
    for t in &report.targets {
        let node = t
            .node
            .map_or("every node".to_string(), |n| format!("node {n}"));
        let shape = if let Some(a) = t.adaptive {
            format!(
                "adaptive: goal {}% of starts warm, ceiling {} (GET /v1/pool/adaptive)",
                a.percent(),
                format_bytes(a.ceiling)
            )
        } else if t.flavors.is_empty() {
            let sizes: Vec<String> = t.sizes.iter().map(|s| format_bytes(*s)).collect();
            format!("files of {}", sizes.join(", "))
        } else {
            let flavors: Vec<String> = t
                .flavors
                .iter()
                .map(|f| format!("{} x {}", f.count, format_bytes(f.size)))
                .collect();
            format!("flavors {}", flavors.join(", "))
        };
        out.push_str(&format!(
            "{:>4} {:<11} {:>10}  {shape}\n",
            t.page_size,
            node,
            format_bytes(t.warm)
        ));
    }
    out
}

/// Runs `hugeprep targets`.
pub fn run(args: TargetsArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.socket);
    let report = if args.clear {
        client.blocking(client.clear_targets())?
    } else if let Some(path) = &args.from {
        let text = std::fs::read(path).with_context(|| format!("--from {}", path.display()))?;
        let specs = hugeprep::api::parse_targets_body(&text)
            .with_context(|| format!("--from {}", path.display()))?;
        client.blocking(client.set_targets(&specs))?
    } else if let Some(page_size) = args.page_size {
        let spec = TargetSpec {
            page_size,
            node: args.node,
            warm: args.warm.clone().unwrap_or_default(),
            sizes: args.sizes.clone(),
            flavors: args
                .flavors
                .iter()
                .map(|f| flavor(f))
                .collect::<Result<_, _>>()?,
            goal: args.goal.map(Percent),
            ceiling: args.ceiling.clone(),
        };
        client.blocking(client.set_targets(&[spec]))?
    } else {
        client.blocking(client.targets())?
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}
