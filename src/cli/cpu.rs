//! `hugeprep cpu`: what this CPU is and how hugeprep will clear memory on it.

use std::path::PathBuf;

use anyhow::Context;
use serde::Serialize;

use hugeprep::clear::{Calibration, CALIBRATION_ROUNDS};
use hugeprep::cpu::{CpuInfo, LlcSource};
use hugeprep::daemon::calibration::{decide_stored, CalibrationOrigin, StoredDecision};
use hugeprep::daemon::calibration_pages::PagesFrom;
use hugeprep::policy::{CalibrationMode, ClearingPolicy, Resolution};
use hugeprep::sys::affinity::allowed_cpus;
use hugeprep::units::format_bytes;

/// Show the CPU, its clearing features and LLC, and the clearing method the policy picks.
#[derive(Debug, clap::Args)]
pub struct CpuArgs {
    /// Clearing policy file to use instead of the embedded `policies/clearing.toml`.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Calibrate even when the policy's `calibration` is `off` (as `report`). By default
    /// `hugeprep cpu` calibrates as the daemon does, with the policy's setting (`auto`).
    #[arg(long, conflicts_with = "no_calibrate")]
    pub calibrate: bool,
    /// Show the rule's choice only: do not time the methods (about 300 ms).
    #[arg(long)]
    pub no_calibrate: bool,
    /// The calibration mode, instead of the policy's setting: off, report, override, auto.
    #[arg(long, value_name = "MODE")]
    pub calibration: Option<CalibrationMode>,
    /// Reuse and store the calibration in this state directory, as the daemon does with
    /// its journal directory (pass the daemon's to see what it decided).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// With --state-dir: measure again even when a stored calibration matches.
    #[arg(long, requires = "state_dir")]
    pub recalibrate: bool,
    /// List every rule and why it does or does not match.
    #[arg(long)]
    pub rules: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `--json` output: the CPU's fields, then the decision.
#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    cpu: &'a CpuInfo,
    method: &'a str,
    rule: &'a str,
    decided_by: hugeprep::policy::DecidedBy,
    confidence: hugeprep::policy::Confidence,
    reason: String,
    source: &'a str,
    plan: &'a hugeprep::ClearPlan,
    threads: hugeprep::policy::Threads,
    policy: String,
    calibration_mode: CalibrationMode,
    #[serde(skip_serializing_if = "Option::is_none")]
    calibration: Option<CalibrationReport<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rules: Option<Vec<RuleReport<'a>>>,
}

#[derive(Serialize)]
struct CalibrationReport<'a> {
    #[serde(flatten)]
    outcome: &'a hugeprep::policy::CalibrationOutcome,
    measured: &'a Calibration,
    #[serde(skip_serializing_if = "Option::is_none")]
    origin: Option<&'a CalibrationOrigin>,
}

#[derive(Serialize)]
struct RuleReport<'a> {
    name: &'a str,
    line: usize,
    method: &'a str,
    mismatch: Option<String>,
}

/// Runs `hugeprep cpu`.
pub fn run(args: CpuArgs) -> anyhow::Result<()> {
    let cpu = CpuInfo::host();
    let policy = ClearingPolicy::load(args.policy.as_deref())?;
    let mode = match (args.calibration, policy.calibration()) {
        _ if args.no_calibrate => CalibrationMode::Off,
        (Some(mode), _) => mode,
        (None, CalibrationMode::Off) if args.calibrate => CalibrationMode::Report,
        (None, mode) => mode,
    };
    let decision = match &args.state_dir {
        Some(dir) => decide_stored(&policy, cpu, mode, dir, args.recalibrate, PagesFrom::Kernel)
            .context("calibration failed")?,
        None => {
            let (resolution, measured) = policy.decide(cpu, mode).context("calibration failed")?;
            let origin = measured.as_ref().map(|_| CalibrationOrigin::Measured {
                why: "hugeprep cpu without --state-dir measures every time".into(),
            });
            StoredDecision {
                resolution,
                measured,
                origin,
            }
        }
    };
    let (resolution, measured) = (&decision.resolution, decision.measured.as_ref());
    let reason = resolution.calibration.as_ref().map_or_else(
        || {
            format!(
                "first matching rule {} ({}); calibration {}",
                resolution.rule,
                resolution.confidence,
                if mode == CalibrationMode::Off {
                    "off"
                } else {
                    "measured nothing"
                }
            )
        },
        |c| c.reason.clone(),
    );
    let policy_name = if policy.is_embedded() {
        format!("{} (embedded)", policy.origin().display())
    } else {
        policy.origin().display().to_string()
    };
    let rules: Option<Vec<RuleReport>> = args.rules.then(|| {
        policy
            .rules()
            .iter()
            .map(|r| RuleReport {
                name: &r.name,
                line: r.line,
                method: r.method.name(),
                mismatch: r.mismatch(cpu),
            })
            .collect()
    });

    if args.json {
        let report = Report {
            cpu,
            method: resolution.method().name(),
            rule: &resolution.rule,
            decided_by: resolution.decided_by,
            confidence: resolution.confidence,
            reason: reason.clone(),
            source: &resolution.source,
            plan: &resolution.plan,
            threads: resolution.threads,
            policy: policy_name,
            calibration_mode: mode,
            calibration: resolution.calibration.as_ref().zip(measured).map(
                |(outcome, measured)| CalibrationReport {
                    outcome,
                    measured,
                    origin: decision.origin.as_ref(),
                },
            ),
            rules,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }

    print_text(
        cpu,
        resolution,
        &format!("{policy_name}, calibration = {mode}"),
        measured,
        decision.origin.as_ref(),
        &reason,
    );
    if let Some(rules) = rules {
        println!("\nrules, in order (first match wins):");
        for r in rules {
            let verdict = r.mismatch.unwrap_or_else(|| "matches".to_string());
            println!(
                "  {:<24} line {:<4} {:<10} {verdict}",
                r.name, r.line, r.method
            );
        }
    }
    Ok(())
}

fn print_text(
    cpu: &CpuInfo,
    r: &Resolution,
    policy: &str,
    measured: Option<&Calibration>,
    origin: Option<&CalibrationOrigin>,
    reason: &str,
) {
    let row = |k: &str, v: &str| println!("{k:<12} {v}");
    let mut identity = format!(
        "{} family {:#04x} ({}) model {:#04x} ({}) stepping {}, signature {:#010x}",
        cpu.vendor_id, cpu.family, cpu.family, cpu.model, cpu.model, cpu.stepping, cpu.signature
    );
    if cpu.hypervisor {
        identity.push_str(", in a VM");
    }
    row("cpu", &identity);
    if !cpu.brand.is_empty() {
        row("brand", &cpu.brand);
    }
    row("features", &cpu.features.to_string());
    let llc = match (cpu.llc_bytes, cpu.llc_source) {
        (Some(b), source) => format!("{} ({})", format_bytes(b), source.describe()),
        (None, LlcSource::Unknown) | (None, _) => "unknown".to_string(),
    };
    row("llc", &llc);
    row("policy", policy);
    row("method", r.method().name());
    row("rule", &format!("{} ({})", r.rule, r.confidence));
    row("decided by", &format!("{:?}", r.decided_by).to_lowercase());
    row("why", reason);
    let plan = &r.plan;
    let available = allowed_cpus().len();
    let mut details = format!(
        "threads {} ({} here), sfence every {}",
        r.threads,
        r.threads.count(available),
        format_bytes(plan.fence_interval as u64)
    );
    if plan.method.is_non_temporal() {
        details.push_str(&format!(
            "; scrubs always stream, use-soon clears below {} use rep stosb",
            format_bytes(plan.nt_min_extent as u64)
        ));
    }
    row("plan", &details);
    row("source", &r.source);
    if let Some(cal) = measured {
        let backing = cal.describe_memory();
        let timings: Vec<String> = cal
            .methods
            .iter()
            .map(|t| format!("{} {:.1}", t.method, t.gbps))
            .collect();
        row(
            "calibration",
            &format!(
                "{} GB/s (median of {CALIBRATION_ROUNDS} rounds) over {} of {backing}, {:.0} ms",
                timings.join(", "),
                format_bytes(cal.buffer_bytes as u64),
                cal.elapsed_ms
            ),
        );
    }
    match origin {
        Some(CalibrationOrigin::Stored { path, measured_at }) => row(
            "measured",
            &format!(
                "reused from {} (measured at {measured_at} s since the epoch; --recalibrate to redo)",
                path.display()
            ),
        ),
        Some(CalibrationOrigin::Measured { why }) => row("measured", &format!("now: {why}")),
        None => {}
    }
}
