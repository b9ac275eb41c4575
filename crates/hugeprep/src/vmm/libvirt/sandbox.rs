//! A private libvirtd and virtlogd for tests and benchmarks: `integration/libvirt/sandbox.sh`
//! (embedded here, so the installed binary's benchmarks need no source tree) run from Rust.
//!
//! The daemons run in their own mount namespace with libvirt's directories bind-mounted from
//! a temp dir: the host's `/etc/libvirt` and `/run/libvirt` are never touched, and dropping
//! the [`Sandbox`] destroys its domains, stops both daemons and removes the dir.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The script behind the sandbox, as in `integration/libvirt/sandbox.sh`.
pub const SCRIPT: &str = include_str!("../../../../../integration/libvirt/sandbox.sh");

/// Starting, driving or stopping the sandbox failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A command could not run at all.
    #[error("cannot run {command}: {source}")]
    Spawn {
        /// The command.
        command: String,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        /// The command.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
}

/// Result of sandbox actions.
pub type Result<T> = std::result::Result<T, SandboxError>;

/// Who the sandbox's libvirt runs QEMU as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum QemuAs {
    /// As the distribution's package configures it (qemu.conf's `user` and `group` as
    /// shipped: `libvirt-qemu` on Debian).
    #[default]
    Packaged,
    /// As root (`user = "root"`, `group = "root"`), which stays supported.
    Root,
    /// As another user and group (another distribution's `qemu:qemu`).
    User {
        /// qemu.conf's `user`.
        user: String,
        /// qemu.conf's `group`.
        group: String,
    },
}

impl QemuAs {
    fn env(&self) -> Vec<(&'static str, String)> {
        let (user, group) = match self {
            QemuAs::Packaged => return Vec::new(),
            QemuAs::Root => ("root", "root"),
            QemuAs::User { user, group } => (user.as_str(), group.as_str()),
        };
        vec![
            ("HUGEPREP_SANDBOX_QEMU_USER", user.to_string()),
            ("HUGEPREP_SANDBOX_QEMU_GROUP", group.to_string()),
        ]
    }
}

/// A running libvirtd + virtlogd pair; stopped and removed on drop.
#[derive(Debug)]
pub struct Sandbox {
    dir: PathBuf,
    uri: String,
    up: bool,
}

/// The hook command line for [`Sandbox::up`]: `hugeprep libvirt-hook --config CONFIG`, with
/// the `hugeprep` binary at `hugeprep` (tests: `env!("CARGO_BIN_EXE_hugeprep")`; benchmarks:
/// `std::env::current_exe()`). Paths must not contain spaces or quotes.
pub fn hook_command(hugeprep: &Path, config: &Path) -> String {
    format!(
        "{} libvirt-hook --config {}",
        hugeprep.display(),
        config.display()
    )
}

fn script(args: &[&std::ffi::OsStr]) -> Result<Output> {
    script_with(args, &[])
}

fn script_with(args: &[&std::ffi::OsStr], env: &[(&str, String)]) -> Result<Output> {
    let command = format!(
        "sandbox.sh {}",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(SCRIPT)
        .arg("sandbox.sh")
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .map_err(|source| SandboxError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(SandboxError::Failed {
            command,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

impl Sandbox {
    /// Starts the daemons with their state in `dir` (created; removed again by `down`),
    /// `memory_backing_dir` (on a hugetlbfs mount) in qemu.conf, and `hook`, a shell command
    /// line, installed as `/etc/libvirt/hooks/qemu.d/hugeprep` (libvirt appends
    /// `NAME OP SUBOP EXTRA`). QEMU runs as the package configures it. Takes about 10 s:
    /// libvirt probes QEMU's capabilities into a fresh cache.
    pub fn up(dir: &Path, memory_backing_dir: &Path, hook: Option<&str>) -> Result<Sandbox> {
        Sandbox::up_as(dir, memory_backing_dir, hook, &QemuAs::Packaged)
    }

    /// As [`Sandbox::up`], with QEMU run as `qemu` says.
    pub fn up_as(
        dir: &Path,
        memory_backing_dir: &Path,
        hook: Option<&str>,
        qemu: &QemuAs,
    ) -> Result<Sandbox> {
        let mut args = vec![
            "up".as_ref(),
            dir.as_os_str(),
            memory_backing_dir.as_os_str(),
        ];
        if let Some(hook) = hook {
            args.push(hook.as_ref());
        }
        let sandbox = Sandbox {
            dir: dir.to_path_buf(),
            uri: format!("qemu:///system?socket={}/run/libvirt-sock", dir.display()),
            up: true,
        };
        // On failure the drop of `sandbox` stops whatever did start.
        script_with(&args, &qemu.env())?;
        Ok(sandbox)
    }

    /// The URI for `virsh -c`.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The sandbox's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `virsh -c URI args...` and returns its output, whatever its exit status.
    pub fn virsh(&self, args: &[&str]) -> Result<Output> {
        Command::new("virsh")
            .arg("-q")
            .arg("-c")
            .arg(&self.uri)
            .args(args)
            .output()
            .map_err(|source| SandboxError::Spawn {
                command: format!("virsh {}", args.join(" ")),
                source,
            })
    }

    /// Runs virsh and fails unless it succeeds; returns its stdout.
    pub fn virsh_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.virsh(args)?;
        if !out.status.success() {
            return Err(SandboxError::Failed {
                command: format!("virsh {}", args.join(" ")),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The pid of the running QEMU of the domain with `uuid`: of the pid files libvirt
    /// wrote, the one whose process runs with `-uuid UUID` (libvirt names the files after
    /// domain names, which it may escape).
    pub fn qemu_pid(&self, uuid: &str) -> Option<u32> {
        let needle = format!("\0-uuid\0{uuid}\0");
        std::fs::read_dir(self.dir.join("run/qemu"))
            .ok()?
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok())
            .find(|pid: &u32| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
            })
    }

    /// A command that runs `program` inside the sandbox's mount namespace, where
    /// `/etc/libvirt` and `/run/libvirt` are the sandbox's (what libvirtd and its hooks see).
    pub fn command_inside(&self, program: impl AsRef<std::ffi::OsStr>) -> Result<Command> {
        let pid = std::fs::read_to_string(self.dir.join("virtlogd.pid")).map_err(|source| {
            SandboxError::Spawn {
                command: "read virtlogd.pid".into(),
                source,
            }
        })?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount=/proc/{}/ns/mnt", pid.trim()))
            .arg("--")
            .arg(program);
        Ok(cmd)
    }

    /// Stops libvirtd (running domains keep running) and starts it again.
    pub fn restart_libvirtd(&self) -> Result<()> {
        script(&["restart-libvirtd".as_ref(), self.dir.as_os_str()]).map(drop)
    }

    /// Stops libvirtd only; its domains keep running.
    pub fn stop_libvirtd(&self) -> Result<()> {
        script(&["stop-libvirtd".as_ref(), self.dir.as_os_str()]).map(drop)
    }

    /// Starts libvirtd again after [`Sandbox::stop_libvirtd`]; it reconnects to its domains.
    pub fn start_libvirtd(&self) -> Result<()> {
        script(&["start-libvirtd".as_ref(), self.dir.as_os_str()]).map(drop)
    }

    /// libvirtd's log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log/libvirtd.log")).unwrap_or_default()
    }

    /// Destroys every domain, stops the daemons and removes the directory.
    pub fn down(mut self) -> Result<()> {
        self.up = false;
        script(&["down".as_ref(), self.dir.as_os_str()]).map(drop)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.up {
            if let Err(e) = script(&["down".as_ref(), self.dir.as_os_str()]) {
                eprintln!("libvirt sandbox {}: {e}", self.dir.display());
            }
        }
    }
}
