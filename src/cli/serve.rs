//! `hugeprep serve`: run the daemon.

use std::path::PathBuf;

use anyhow::Context;
use hugeprep::api::CpuReport;
use hugeprep::cpu::CpuInfo;
use hugeprep::daemon::calibration::{decide_stored, StoredDecision};
use hugeprep::daemon::calibration_pages::PagesFrom;
use hugeprep::daemon::config::ConfigFile;
use hugeprep::daemon::{self, DaemonConfig};
use hugeprep::policy::pool::Verification;
use hugeprep::policy::CalibrationMode;
use hugeprep::policy::{ClearingPolicy, Threads};
use hugeprep::pool::PoolPolicy;
use hugeprep::units::parse_bytes;
use hugeprep::PageSize;

/// Run the daemon: keep warm pools, serve leases on a unix socket.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Configuration file (TOML; flags override it).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// API socket.
    #[arg(long, env = "HUGEPREP_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Group allowed to use the socket (mode 0660).
    #[arg(long)]
    pub socket_group: Option<String>,
    /// Journal directory.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Runtime directory (own hugetlbfs mounts).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// hugetlbfs mount to use (repeat for several page sizes); default: find or mount.
    #[arg(long = "mount")]
    pub mounts: Vec<PathBuf>,
    /// Keep this much memory warm (e.g. 4G), on every node.
    #[arg(long, value_parser = parse_bytes)]
    pub warm: Option<u64>,
    /// Page size of the --warm target.
    #[arg(long, default_value = "2M")]
    pub page_size: PageSize,
    /// File sizes to keep warm, comma-separated (e.g. 1G,2G); default: min(warm, 16G).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
    pub sizes: Vec<u64>,
    /// Leave the kernel's hugepage pools to the operator: never raise `nr_hugepages` for the
    /// warm target (the config file's `reserve = false`).
    #[arg(long)]
    pub no_reserve: bool,
    /// Verification of scrubbed memory: sample or full.
    #[arg(long, value_parser = parse_verify)]
    pub verify: Option<Verification>,
    /// Background scrub cap in bytes per second (0 = none).
    #[arg(long, value_parser = parse_bytes)]
    pub scrub_bandwidth: Option<u64>,
    /// Worker threads per node (0 = every CPU of the node).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Milliseconds after a lease or a release before the pool refills or scrubs in the
    /// background (the VMM's start has the host first); 0 = none; at most 60000.
    #[arg(long, value_name = "MS")]
    pub lessee_grace_ms: Option<u64>,
    /// Clearing policy file replacing the embedded `policies/clearing.toml`.
    #[arg(long, value_name = "FILE")]
    pub clearing_policy: Option<PathBuf>,
    /// Calibration at startup: off, report, override or auto (default: the policy file's
    /// setting).
    #[arg(long, value_name = "MODE")]
    pub calibration: Option<CalibrationMode>,
    /// Measure the clearing methods at start even when the state directory holds a
    /// calibration for this CPU, kernel and policy.
    #[arg(long)]
    pub recalibrate: bool,
    /// Also serve the API on this TCP address, with TLS only (e.g. 0.0.0.0:7443; the config
    /// file's `access.listen`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Server certificate chain (PEM) of the TCP listener (`access.tls_cert`).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// Server key (PEM) of the TCP listener (`access.tls_key`).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Require TCP clients to present a certificate signed by this CA (PEM;
    /// `access.tls_client_ca`).
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Bearer tokens file (TOML, mode 0600; `access.tokens`).
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// Serve GET /metrics and GET /health, read-only, over plain HTTP on this address (e.g.
    /// 127.0.0.1:9733; the config file's `metrics.listen`). Off by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
}

/// The `[access]` table with the flags applied, validated, and the TLS configuration built
/// from its files.
fn access(
    args: &ServeArgs,
    file: &ConfigFile,
) -> anyhow::Result<(
    hugeprep::api::access::AccessConfig,
    Option<std::sync::Arc<rustls::ServerConfig>>,
)> {
    let mut spec = file.access.clone().unwrap_or_default();
    if args.listen.is_some() {
        spec.listen.clone_from(&args.listen);
    }
    for (flag, value) in [
        (&args.tls_cert, &mut spec.tls_cert),
        (&args.tls_key, &mut spec.tls_key),
        (&args.tls_client_ca, &mut spec.tls_client_ca),
        (&args.tokens, &mut spec.tokens),
    ] {
        if flag.is_some() {
            value.clone_from(flag);
        }
    }
    let config = spec.validate()?;
    let tls = match &config.listen {
        Some((_, files)) => Some(hugeprep::api::tls::server_config(
            &files.cert,
            &files.key,
            files.client_ca.as_deref(),
        )?),
        None => None,
    };
    Ok((config, tls))
}

fn parse_verify(s: &str) -> Result<Verification, String> {
    match s {
        "sample" => Ok(Verification::Sample),
        "full" => Ok(Verification::Full),
        _ => Err(format!("{s:?}: expected sample or full")),
    }
}

/// The pool policy from the config file's `[pool]` (or the embedded one) and the flags.
fn pool_policy(args: &ServeArgs, file: &ConfigFile) -> anyhow::Result<PoolPolicy> {
    let mut policy = match &file.pool {
        Some(spec) => spec.validate().with_context(|| match &args.config {
            Some(p) => format!("config file {}: [pool]", p.display()),
            None => "[pool]".to_string(),
        })?,
        None => PoolPolicy::embedded(),
    };
    if let Some(warm) = args.warm {
        for &s in &args.sizes {
            anyhow::ensure!(
                s > 0 && s % args.page_size.bytes() == 0,
                "--sizes: {s} is not a positive multiple of the {} page size",
                args.page_size
            );
        }
        policy.set_warm(args.page_size, warm, args.sizes.clone());
    }
    if args.no_reserve {
        policy.reserve.enabled = false;
    }
    if let Some(v) = args.verify {
        policy.verify = v;
    }
    if let Some(bw) = args.scrub_bandwidth {
        policy.scrub_bandwidth = (bw > 0).then_some(bw);
    }
    if let Some(t) = args.threads {
        policy.threads = t;
    }
    if let Some(ms) = args.lessee_grace_ms {
        anyhow::ensure!(
            ms <= hugeprep::policy::pool::MAX_LESSEE_GRACE_MS,
            "--lessee-grace-ms: {ms}: at most {}",
            hugeprep::policy::pool::MAX_LESSEE_GRACE_MS
        );
        policy.lessee_grace = std::time::Duration::from_millis(ms);
    }
    Ok(policy)
}

/// What `systemctl reload` (SIGHUP) does: read the config file and the clearing policy file
/// again, validate both, and return the new pool policy. The clearing method chosen at start
/// stays (a restart applies a new one).
fn reload(args: &ServeArgs) -> Result<hugeprep::pool::PoolPolicy, String> {
    let attempt = || -> anyhow::Result<PoolPolicy> {
        let file = match &args.config {
            Some(p) => ConfigFile::load(p)?,
            None => ConfigFile::default(),
        };
        let clearing_path = args
            .clearing_policy
            .clone()
            .or(file.clearing_policy.clone());
        ClearingPolicy::load(clearing_path.as_deref())?;
        pool_policy(args, &file)
    };
    // One journal line: toml's message spans several (a caret under the field).
    attempt().map_err(|e| {
        let text = super::render_error(&e);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        lines.join(" ")
    })
}

/// Merges the config file, the embedded policy and the flags.
pub fn config(args: ServeArgs) -> anyhow::Result<DaemonConfig> {
    let file = match &args.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    let mut policy = pool_policy(&args, &file)?;
    let (access, tls) = access(&args, &file)?;
    let metrics_listen = match (
        &args.metrics_listen,
        file.metrics.as_ref().and_then(|m| m.listen.as_ref()),
    ) {
        (Some(a), _) => Some(
            hugeprep::daemon::config::parse_listen("--metrics-listen", a)
                .map_err(anyhow::Error::msg)?,
        ),
        (None, Some(a)) => Some(
            hugeprep::daemon::config::parse_listen("[metrics] listen", a)
                .map_err(anyhow::Error::msg)?,
        ),
        (None, None) => None,
    };
    let placement = file
        .placement
        .as_ref()
        .map(|p| p.validate())
        .transpose()
        .with_context(|| match &args.config {
            Some(p) => format!("config file {}", p.display()),
            None => "config".to_string(),
        })?;
    let reload_args = args.clone();
    let clearing_path = args
        .clearing_policy
        .clone()
        .or(file.clearing_policy.clone());
    let clearing = ClearingPolicy::load(clearing_path.as_deref())?;
    let mode = args.calibration.unwrap_or(clearing.calibration());
    let state_dir: PathBuf = args
        .state_dir
        .clone()
        .or(file.state_dir.clone())
        .unwrap_or_else(|| daemon::DEFAULT_STATE_DIR.into());
    let redo = args.recalibrate || file.recalibrate;
    // Trust the rule, but verify it on this host: a failed calibration keeps the rule.
    let decision = match decide_stored(
        &clearing,
        CpuInfo::host(),
        mode,
        &state_dir,
        redo,
        PagesFrom::Daemon {
            policy: &policy,
            page_size: calibration_page_size(if args.mounts.is_empty() {
                &file.mounts
            } else {
                &args.mounts
            }),
        },
    ) {
        Ok(decision) => decision,
        Err(err) => {
            tracing::warn!(%err, "calibration failed; clearing with the policy rule's method");
            StoredDecision {
                resolution: clearing.resolve(CpuInfo::host()),
                measured: None,
                origin: None,
            }
        }
    };
    let resolution = decision.resolution;
    let reason = resolution.calibration.as_ref().map_or_else(
        || {
            format!(
                "rule {} ({}), not calibrated",
                resolution.rule, resolution.confidence
            )
        },
        |c| c.reason.clone(),
    );
    tracing::info!(
        method = %resolution.method(),
        rule = %resolution.rule,
        decided_by = ?resolution.decided_by,
        origin = ?decision.origin,
        %reason,
        "clearing method"
    );
    let plan = resolution.plan;
    if policy.threads == 0 {
        if let Threads::Count(n) = resolution.threads {
            policy.threads = n.get();
        }
    }
    Ok(DaemonConfig {
        socket: args
            .socket
            .or(file.socket)
            .unwrap_or_else(|| daemon::DEFAULT_SOCKET.into()),
        socket_group: args.socket_group.or(file.socket_group),
        state_dir,
        run_dir: args
            .run_dir
            .or(file.run_dir)
            .unwrap_or_else(|| daemon::DEFAULT_RUN_DIR.into()),
        mounts: if args.mounts.is_empty() {
            file.mounts
        } else {
            args.mounts
        },
        policy,
        plan,
        access,
        tls,
        metrics_listen,
        placement,
        reload: Some(daemon::Reload(std::sync::Arc::new(move || {
            reload(&reload_args)
        }))),
        cpu: CpuReport {
            method: plan.method,
            plan,
            rule: resolution.rule.clone(),
            source: resolution.source.clone(),
            decided_by: resolution.decided_by,
            confidence: resolution.confidence,
            reason,
            calibration: resolution.calibration.as_ref().map(|outcome| {
                serde_json::json!({
                    "outcome": outcome,
                    "measured": decision.measured,
                    "origin": decision.origin,
                })
            }),
        },
    })
}

/// The page size the daemon scrubs, to calibrate on: 1G when every mount it is given serves
/// 1G pages, else 2M (with no mounts given it finds or mounts one of each size).
fn calibration_page_size(mounts: &[PathBuf]) -> PageSize {
    let sizes: Vec<Option<PageSize>> = mounts
        .iter()
        .map(|m| hugeprep::hugetlb::hugetlbfs_page_size(m).ok().flatten())
        .collect();
    if !sizes.is_empty() && sizes.iter().all(|s| *s == Some(PageSize::Size1G)) {
        PageSize::Size1G
    } else {
        PageSize::Size2M
    }
}

/// Runs `hugeprep serve`.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = config(args)?;
    daemon::run(config).context("hugeprep serve")
}
