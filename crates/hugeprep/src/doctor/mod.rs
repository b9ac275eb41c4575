//! `hugeprep doctor`: is this host ready for hugeprep, and if not, what to do.
//!
//! Each check reads the host through the layers below (topology, hugetlb pools and mounts,
//! kernel feature probes in `sys`, cpu and policy, the daemon's client) and turns what it
//! finds into [`Finding`]s, each with a severity and, when something is wrong, a remedy.
//! Nothing here owns host state: the one write, probing whether a 1 GiB page can still be
//! had, adds one page to a pool and takes exactly it back under the machine-wide hugepage
//! lock.
//!
//! The exit status ([`Report::exit_code`]): 0 when nothing is wrong (findings are `ok` or
//! `info`), 3 when something is degraded but VMs still start (`warning`), 4 when something
//! blocks VM starts (`blocking`). 1 stays the status of an error that kept the doctor from
//! checking (every command's), 2 that of a usage error (clap's), so a script tells a finding
//! from a failure.

mod host;
mod kernel;
mod pools;
mod vmm;

pub use host::socket_group;

use std::path::PathBuf;

use serde::Serialize;

use crate::page_size::PageSize;
use crate::policy::pool::ReservePolicy;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// As it should be.
    Ok,
    /// Worth knowing; nothing to fix.
    Info,
    /// Degraded: VMs start, but slower, or a feature is off.
    Warning,
    /// VM starts fail until this is fixed.
    Blocking,
}

impl Severity {
    /// The label printed before a finding.
    pub fn label(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Info => "info",
            Severity::Warning => "WARN",
            Severity::Blocking => "BLOCKING",
        }
    }
}

/// One thing the doctor found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The area checked: `hugepages`, `mounts`, `kernel`, `limits`, `cpu`, `daemon`,
    /// `qemu`, `libvirt`, `systemd`.
    pub check: &'static str,
    /// What in that area (`node 0 2M`, `MADV_POPULATE_WRITE`, ...).
    pub subject: String,
    /// How much it matters.
    pub severity: Severity,
    /// What was found.
    pub message: String,
    /// What to do about it, when something is to be done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remedy: Option<String>,
}

impl Finding {
    fn new(
        check: &'static str,
        subject: impl Into<String>,
        severity: Severity,
        message: impl Into<String>,
    ) -> Finding {
        Finding {
            check,
            subject: subject.into(),
            severity,
            message: message.into(),
            remedy: None,
        }
    }

    fn ok(check: &'static str, subject: impl Into<String>, message: impl Into<String>) -> Finding {
        Finding::new(check, subject, Severity::Ok, message)
    }

    fn remedy(mut self, remedy: impl Into<String>) -> Finding {
        self.remedy = Some(remedy.into());
        self
    }
}

/// Everything the doctor found, in the order checked.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The worst severity found.
    pub status: Severity,
    /// The findings.
    pub findings: Vec<Finding>,
}

/// `doctor`'s exit status when warnings are the worst it found (VMs start, degraded).
pub const EXIT_WARNINGS: u8 = 3;
/// `doctor`'s exit status when something blocks VM starts.
pub const EXIT_BLOCKED: u8 = 4;

impl Report {
    /// 0: nothing wrong; [`EXIT_WARNINGS`] (3): warnings only; [`EXIT_BLOCKED`] (4): something
    /// blocks VM starts. Neither collides with 1 (the command failed) or 2 (usage error).
    pub fn exit_code(&self) -> u8 {
        match self.status {
            Severity::Ok | Severity::Info => 0,
            Severity::Warning => EXIT_WARNINGS,
            Severity::Blocking => EXIT_BLOCKED,
        }
    }
}

/// What the doctor checks against: the daemon's socket and the settings it would run with.
#[derive(Debug, Clone)]
pub struct DoctorOptions {
    /// The daemon's API socket.
    pub socket: PathBuf,
    /// How the daemon raises pools (from its configuration file).
    pub reserve: ReservePolicy,
    /// Page sizes VMs need (those of the configured warm targets; 2M when none).
    pub page_sizes: Vec<PageSize>,
    /// A clearing policy file replacing the embedded one.
    pub clearing_policy: Option<PathBuf>,
    /// libvirt's configuration directory (`/etc/libvirt`).
    pub libvirt_dir: PathBuf,
    /// The daemon's runtime directory (its own hugetlbfs mounts are below it).
    pub run_dir: PathBuf,
    /// The libvirt hook's configuration (its `memory_backing_dir` must be qemu.conf's).
    pub hook_config: PathBuf,
    /// Whether to probe for a 1 GiB page by adding one to the pool and taking it back.
    pub probe_1g: bool,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            socket: crate::client::DEFAULT_SOCKET.into(),
            reserve: ReservePolicy::default(),
            page_sizes: vec![PageSize::Size2M],
            clearing_policy: None,
            libvirt_dir: "/etc/libvirt".into(),
            run_dir: crate::daemon::DEFAULT_RUN_DIR.into(),
            hook_config: crate::vmm::libvirt::DEFAULT_CONFIG.into(),
            probe_1g: true,
        }
    }
}

/// Runs every check.
pub fn run(opts: &DoctorOptions) -> Report {
    let daemon = host::daemon(opts);
    let mut findings = Vec::new();
    findings.extend(pools::pools(opts, daemon.pool.as_ref()));
    findings.extend(pools::mounts(opts));
    findings.extend(kernel::features());
    findings.extend(kernel::memlock());
    findings.extend(host::cpu(opts, daemon.cpu.as_ref()));
    findings.extend(daemon.findings);
    let hook_needs_daemon = daemon.reachable;
    findings.extend(vmm::qemu());
    findings.extend(vmm::libvirt(opts, hook_needs_daemon));
    findings.extend(host::systemd());
    let status = findings
        .iter()
        .map(|f| f.severity)
        .max()
        .unwrap_or(Severity::Ok);
    Report { status, findings }
}

/// The report as text: one line per finding, its remedy indented below.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for f in &report.findings {
        out.push_str(&format!(
            "{:<8} {:<9} {}: {}\n",
            f.severity.label(),
            f.check,
            f.subject,
            f.message
        ));
        if let Some(r) = &f.remedy {
            out.push_str(&format!("{:<19}-> {r}\n", ""));
        }
    }
    let verdict = match report.status {
        Severity::Ok | Severity::Info => "healthy: nothing blocks VM starts",
        Severity::Warning => "degraded: VMs start, see the warnings",
        Severity::Blocking => "blocked: VM starts fail until the BLOCKING findings are fixed",
    };
    out.push_str(&format!("\n{verdict}\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_area_is_checked_on_this_host() {
        let dir = std::env::temp_dir().join(format!("hugeprep-doctor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let opts = DoctorOptions {
            socket: dir.join("none.sock"),
            libvirt_dir: dir.clone(),
            probe_1g: false,
            ..DoctorOptions::default()
        };
        let report = run(&opts);
        for check in [
            "hugepages",
            "mounts",
            "kernel",
            "limits",
            "cpu",
            "daemon",
            "qemu",
            "libvirt",
            "systemd",
        ] {
            assert!(
                report.findings.iter().any(|f| f.check == check),
                "{check}: {report:#?}"
            );
        }
        let daemon = report
            .findings
            .iter()
            .find(|f| f.check == "daemon")
            .unwrap();
        assert_eq!(daemon.severity, Severity::Warning);
        assert!(daemon
            .remedy
            .as_deref()
            .unwrap()
            .contains("systemctl start hugeprep"));
        // Every finding that is not ok says what to do, or is only information.
        for f in &report.findings {
            assert!(f.severity <= Severity::Info || f.remedy.is_some(), "{f:#?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn exit_code_follows_the_worst_finding() {
        let mut r = Report {
            status: Severity::Info,
            findings: vec![Finding::ok("kernel", "pidfd", "works")],
        };
        assert_eq!(r.exit_code(), 0);
        r.status = Severity::Warning;
        assert_eq!(r.exit_code(), 3);
        r.status = Severity::Blocking;
        assert_eq!(r.exit_code(), 4);
        assert!(render(&r).contains("blocked"));
    }
}
