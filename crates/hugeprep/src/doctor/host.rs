//! The CPU and its clearing method, the daemon, and systemd.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{DoctorOptions, Finding, Severity};
use crate::api::CpuReport;
use crate::client::{Client, ClientError};
use crate::cpu::CpuInfo;
use crate::policy::ClearingPolicy;
use crate::pool::PoolStatus;

/// What the daemon answered.
pub struct DaemonView {
    /// Whether it answered at all.
    pub reachable: bool,
    /// Its pool.
    pub pool: Option<PoolStatus>,
    /// Its clearing method.
    pub cpu: Option<CpuReport>,
    /// Findings about it.
    pub findings: Vec<Finding>,
}

/// Asks the daemon for its version, pool and clearing method (5 s per request).
pub fn daemon(opts: &DoctorOptions) -> DaemonView {
    let client = Client::new(&opts.socket).with_timeout(Duration::from_secs(5));
    let subject = opts.socket.display().to_string();
    let version =
        match client.blocking(client.version()) {
            Ok(v) => v.version,
            Err(e) => {
                let (severity, remedy) = match e {
                ClientError::Connect { .. } => (
                    Severity::Warning,
                    "start it: systemctl start hugeprep.socket hugeprep.service (leases need it)",
                ),
                _ => (Severity::Warning, "see the daemon's log (journalctl -u hugeprep)"),
            };
                let finding =
                    Finding::new("daemon", subject, severity, format!("not reachable: {e}"))
                        .remedy(remedy);
                return DaemonView {
                    reachable: false,
                    pool: None,
                    cpu: None,
                    findings: vec![finding],
                };
            }
        };
    let mine = env!("CARGO_PKG_VERSION");
    let mut findings = vec![if version == mine {
        Finding::ok(
            "daemon",
            subject.clone(),
            format!("running, version {version}"),
        )
    } else {
        Finding::new(
            "daemon",
            subject.clone(),
            Severity::Warning,
            format!("running version {version}, this command is {mine}"),
        )
        .remedy("restart the daemon after an upgrade: systemctl restart hugeprep")
    }];
    findings.push(socket_group(&opts.socket));
    let pool = client.blocking(client.pool());
    let cpu = client.blocking(client.cpu());
    match &pool {
        Ok(p) => findings.extend(pool_health(p)),
        Err(e) => findings.push(Finding::new(
            "daemon",
            subject,
            Severity::Warning,
            format!("GET /v1/pool: {e}"),
        )),
    }
    DaemonView {
        reachable: true,
        pool: pool.ok(),
        cpu: cpu.ok(),
        findings,
    }
}

/// What the daemon's pool says of the leases and releases it served: a lease refused for
/// want of memory in the last 15 minutes (a VM did not start), and a release proof that
/// sends every release down the kernel's path. Leases served cold are no finding: the
/// packaged defaults keep nothing warm and serve every lease so.
pub fn pool_health(pool: &PoolStatus) -> Vec<Finding> {
    let mut out = Vec::new();
    match &pool.last_refused_lease {
        Some(r) if r.is_recent() => out.push(
            Finding::new("daemon", "leases", Severity::Warning, r.describe()).remedy(format!(
                "free memory on node {} (or lower reserve_margin / raise reserve_limit in [pool] \
                 of /etc/hugeprep/hugeprep.toml), or keep memory warm so starts do not depend on \
                 the kernel: add [[pool.target]] page_size = \"{}\" warm = \"...\" to \
                 /etc/hugeprep/hugeprep.toml, then systemctl reload hugeprep",
                r.node, r.page_size
            )),
        ),
        Some(r) => out.push(Finding::new(
            "daemon",
            "leases",
            Severity::Info,
            format!(
                "none refused in the last 15 minutes (the last: {})",
                r.describe()
            ),
        )),
        None => out.push(Finding::ok(
            "daemon",
            "leases",
            "none refused since the daemon started",
        )),
    }
    if let Some(why) = &pool.proof_fallback {
        out.push(
            Finding::new(
                "daemon",
                "release proof",
                Severity::Warning,
                format!("degraded: {why}"),
            )
            .remedy(
                "report it with `uname -r` and the journal (journalctl -u hugeprep -p err); to \
                 prove by walking /proc instead: systemctl edit hugeprep, add [Service] \
                 Environment=HUGEPREP_REACH=walk, then systemctl restart hugeprep",
            ),
        );
    }
    out
}

/// Whether a member of the socket's group, not root and not its owner, can connect: search
/// on every directory down to it and write on the socket, as the kernel will decide for the
/// lease role's processes (a 0660 socket in a 0750 root directory is root's alone).
pub fn socket_group(socket: &Path) -> Finding {
    use std::os::unix::fs::MetadataExt;
    let subject = format!("{} group access", socket.display());
    let meta = match std::fs::metadata(socket) {
        Ok(m) => m,
        Err(e) => return Finding::new("daemon", subject, Severity::Warning, e.to_string()),
    };
    if meta.gid() == 0 {
        return Finding::new(
            "daemon",
            subject,
            Severity::Info,
            "the socket's group is root: only root connects (socket_group in \
             /etc/hugeprep/hugeprep.toml gives a group the lease role)",
        );
    }
    let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(meta.gid()))
        .ok()
        .flatten()
        .map_or_else(|| meta.gid().to_string(), |g| g.name);
    // An id that owns nothing: what the group grants, not what an owner would get.
    let member = crate::perm::Credentials {
        uid: u32::MAX - 1,
        gid: u32::MAX - 1,
        groups: vec![meta.gid()],
    };
    match crate::perm::check(socket, &member, crate::perm::Access::WRITE) {
        Ok(()) => Finding::ok(
            "daemon",
            subject,
            format!(
                "members of group {group} can connect (every directory on the way is searchable)"
            ),
        ),
        Err(e) => Finding::new(
            "daemon",
            subject,
            Severity::Warning,
            format!("members of group {group} cannot connect: {e}"),
        )
        .remedy(format!(
            "give the group search permission on that directory (chmod 0755, or chgrp {group} \
             and chmod 0750); for /run/hugeprep set RuntimeDirectoryMode= in \
             /etc/systemd/system/hugeprep.service.d/ and the mode in /etc/tmpfiles.d/hugeprep.conf"
        )),
    }
}

/// The CPU, the clearing method its policy rule picks and who decided (the daemon's
/// decision, calibration included, when it runs).
pub fn cpu(opts: &DoctorOptions, daemon: Option<&CpuReport>) -> Vec<Finding> {
    let cpu = CpuInfo::host();
    let identity = format!(
        "{} family {:#x} model {:#x} ({})",
        cpu.vendor_id, cpu.family, cpu.model, cpu.brand
    );
    let mut out = vec![Finding::ok("cpu", "identity", identity)];
    if let Some(d) = daemon {
        out.push(Finding::ok(
            "cpu",
            "clearing",
            format!(
                "the daemon clears with {} (rule {}, decided by {})",
                d.method,
                d.rule,
                format!("{:?}", d.decided_by).to_lowercase()
            ),
        ));
        return out;
    }
    match ClearingPolicy::load(opts.clearing_policy.as_deref()) {
        Ok(policy) => {
            let r = policy.resolve(cpu);
            let calibration = format!("{:?}", policy.calibration()).to_lowercase();
            out.push(Finding::ok(
                "cpu",
                "clearing",
                format!(
                    "{} by policy rule {} (decided by the rule; the daemon's start-up \
                     calibration is {calibration}: hugeprep cpu --rules says why)",
                    r.method(),
                    r.rule
                ),
            ));
        }
        Err(e) => out.push(
            Finding::new("cpu", "clearing policy", Severity::Blocking, e.to_string())
                .remedy("fix the policy file, or drop clearing_policy to use the embedded one"),
        ),
    }
    out
}

fn systemctl(args: &[&str]) -> Option<String> {
    let out = Command::new("systemctl").args(args).output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The units, when systemd is the init system (`/run/systemd/system` exists).
pub fn systemd() -> Vec<Finding> {
    if !Path::new("/run/systemd/system").is_dir() {
        return vec![Finding::new(
            "systemd",
            "init",
            Severity::Info,
            "systemd is not running here: units not checked",
        )];
    }
    ["hugeprep.socket", "hugeprep.service"]
        .iter()
        .map(|unit| {
            let enabled = systemctl(&["is-enabled", unit]).unwrap_or_default();
            let active = systemctl(&["is-active", unit]).unwrap_or_default();
            let message = format!("{enabled}, {active}");
            if enabled == "enabled" || active == "active" {
                Finding::ok("systemd", *unit, message)
            } else {
                Finding::new("systemd", *unit, Severity::Info, message)
                    .remedy(format!("systemctl enable --now {unit}"))
            }
        })
        .collect()
}
