//! `hugeprep cpu`: what this CPU is and how hugeprep will clear memory on it.

use std::path::PathBuf;

use anyhow::Context;
use serde::Serialize;

use hugeprep::clear::Calibration;
use hugeprep::cpu::{CpuInfo, LlcSource};
use hugeprep::policy::{CalibrationMode, ClearingPolicy, Resolution, CALIBRATION_TOLERANCE};
use hugeprep::sys::affinity::allowed_cpus;
use hugeprep::units::format_bytes;

/// Show the CPU, its clearing features and LLC, and the clearing method the policy picks.
#[derive(Debug, clap::Args)]
pub struct CpuArgs {
    /// Clearing policy file to use instead of the embedded `policies/clearing.toml`.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Time every available clearing method (about 200 ms) and apply the policy's
    /// `calibration` setting (`off` is treated as `report` here, since you asked).
    #[arg(long)]
    pub calibrate: bool,
    /// With --calibrate: the calibration mode, instead of the policy's setting.
    #[arg(long, value_name = "MODE", requires = "calibrate")]
    pub calibration: Option<CalibrationMode>,
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
        (Some(mode), _) => mode,
        (None, CalibrationMode::Off) => CalibrationMode::Report,
        (None, mode) => mode,
    };
    let (resolution, measured) = policy
        .decide(
            cpu,
            if args.calibrate {
                mode
            } else {
                CalibrationMode::Off
            },
        )
        .context("calibration failed")?;
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
            source: &resolution.source,
            plan: &resolution.plan,
            threads: resolution.threads,
            policy: policy_name,
            calibration_mode: if args.calibrate {
                mode
            } else {
                policy.calibration()
            },
            calibration: resolution
                .calibration
                .as_ref()
                .zip(measured.as_ref())
                .map(|(outcome, measured)| CalibrationReport { outcome, measured }),
            rules,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }

    print_text(
        cpu,
        &resolution,
        &policy_name,
        policy.calibration(),
        measured.as_ref(),
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
    policy_name: &str,
    policy_mode: CalibrationMode,
    measured: Option<&Calibration>,
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
    row(
        "policy",
        &format!("{policy_name}, calibration = {policy_mode}"),
    );
    row("method", r.method().name());
    row("rule", &r.rule);
    row("decided by", &format!("{:?}", r.decided_by).to_lowercase());
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
            ", rep stosb below {}",
            format_bytes(plan.nt_min_extent as u64)
        ));
    }
    row("plan", &details);
    row("source", &r.source);
    if let (Some(c), Some(cal)) = (&r.calibration, measured) {
        let backing = if cal.hugepage_backed {
            "2M hugepages"
        } else {
            "anonymous memory"
        };
        let timings: Vec<String> = cal
            .methods
            .iter()
            .map(|t| format!("{} {:.1}", t.method, t.gbps))
            .collect();
        row(
            "calibration",
            &format!(
                "{} GB/s over {} of {backing}",
                timings.join(", "),
                format_bytes(cal.buffer_bytes as u64)
            ),
        );
        let verdict = match (c.rule_gbps, c.within_tolerance, c.overridden) {
            (None, _, true) => format!("{} was not timed; using {}", c.rule_method, c.fastest),
            (None, _, false) => format!("{} was not timed", c.rule_method),
            (Some(_), true, _) => format!(
                "{} is within {:.0}% of the fastest ({})",
                c.rule_method,
                CALIBRATION_TOLERANCE * 100.0,
                c.fastest
            ),
            (Some(g), false, overridden) => format!(
                "{} is {:.0}% slower than {}{}",
                c.rule_method,
                (1.0 - g / c.fastest_gbps) * 100.0,
                c.fastest,
                if overridden {
                    "; calibration overrides the rule"
                } else {
                    " (calibration = report: keeping the rule)"
                }
            ),
        };
        row("verdict", &verdict);
    }
}
