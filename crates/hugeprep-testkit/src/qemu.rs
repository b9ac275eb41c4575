//! Launching a real QEMU on a memory-backend file and knowing when its memory is ready.
//!
//! Used by `hugeprep bench prefault` (QEMU's own `prealloc=on,prealloc-threads=N` against
//! hugeprep) and by the tests that hand a prepared file to QEMU. The VM is started paused
//! (`-S`) with no devices; it is ready when QMP answers `query-status`, which QEMU only does
//! from its main loop, after every memory backend has been created and preallocated.
//!
//! ```text
//! qemu-system-x86_64 -S -nodefaults -nographic -machine q35,accel=kvm
//!   -cpu host,-arch-capabilities -qmp unix:SOCK,server=on,wait=off -m 4096M
//!   -object memory-backend-file,id=mem0,size=4294967296,mem-path=FILE,share=on,
//!           prealloc=on,prealloc-threads=2 -machine memory-backend=mem0
//! ```
//!
//! Each VM is started in its own process group, so a Ctrl-C at the terminal reaches only
//! hugeprep, which then quits the VM through QMP (or kills it by pid) and removes its files;
//! with [`QemuVm::spawn_args_in`] also in a cgroup of its own, as a host's QEMU runs (its
//! released lease can then be proven unreachable and scrubbed in place).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cgroup::VmmCgroup;

/// The QEMU binary name looked up in `PATH`.
pub const QEMU_BINARY: &str = "qemu-system-x86_64";

/// Errors starting or talking to QEMU.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// The binary could not be started.
    #[error("starting {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The OS's answer.
        source: io::Error,
    },
    /// QEMU exited before it was ready.
    #[error("qemu exited with {status} before it was ready: {stderr}")]
    Exited {
        /// Exit status.
        status: std::process::ExitStatus,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// QMP did not answer in time.
    #[error("qemu (pid {pid}) did not answer QMP on {socket} within {timeout:?}")]
    Timeout {
        /// QEMU's pid.
        pid: u32,
        /// The QMP socket.
        socket: PathBuf,
        /// How long we waited.
        timeout: Duration,
    },
    /// A QMP exchange failed.
    #[error("QMP on {socket}: {reason}")]
    Qmp {
        /// The QMP socket.
        socket: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// How to start one VM.
#[derive(Debug, Clone)]
pub struct QemuConfig {
    /// The `qemu-system-x86_64` binary.
    pub binary: PathBuf,
    /// Guest memory in bytes (`-m` and the backend's `size`).
    pub size: u64,
    /// The backend's `mem-path`: a file (QEMU creates it when missing and never truncates or
    /// unlinks it) on hugetlbfs.
    pub mem_path: PathBuf,
    /// `share=on`: stores reach the file's pages (what a hugeprep handoff needs).
    pub share: bool,
    /// `prealloc=on`: QEMU faults every page before it is ready.
    pub prealloc: bool,
    /// `prealloc-threads`.
    pub prealloc_threads: usize,
    /// The QMP unix socket to create.
    pub qmp_socket: PathBuf,
}

impl QemuConfig {
    /// The command-line arguments (without the binary).
    pub fn args(&self) -> Vec<String> {
        let on_off = |b: bool| if b { "on" } else { "off" };
        let mut backend = format!(
            "memory-backend-file,id=mem0,size={},mem-path={},share={},prealloc={}",
            self.size,
            self.mem_path.display(),
            on_off(self.share),
            on_off(self.prealloc)
        );
        if self.prealloc {
            backend.push_str(&format!(
                ",prealloc-threads={}",
                self.prealloc_threads.max(1)
            ));
        }
        let mut args = vm_args(&self.qmp_socket);
        args.extend(
            [
                "-m",
                &format!("{}M", self.size >> 20),
                "-object",
                &backend,
                "-machine",
                "memory-backend=mem0",
            ]
            .map(String::from),
        );
        args
    }
}

/// Everything but the memory: a paused KVM machine with no devices and a QMP socket. QEMU
/// merges repeated `-machine` options, so memory arguments may add `-machine memory-backend=`.
pub fn vm_args(qmp_socket: &Path) -> Vec<String> {
    [
        "-S",
        "-nodefaults",
        "-nographic",
        "-machine",
        "q35,accel=kvm",
        "-cpu",
        "host,-arch-capabilities",
        "-qmp",
        &format!("unix:{},server=on,wait=off", qmp_socket.display()),
    ]
    .map(String::from)
    .to_vec()
}

/// The QEMU binary in `PATH`, if installed.
pub fn find_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(QEMU_BINARY))
        .find(|p| p.is_file())
}

/// `qemu-system-x86_64 --version`'s first line.
pub fn version(binary: &Path) -> Option<String> {
    let out = Command::new(binary).arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_string)
}

/// A running QEMU; killed (by its pid) and reaped on drop if not quit before.
#[derive(Debug)]
pub struct QemuVm {
    child: Child,
    socket: PathBuf,
    qmp: Option<(BufReader<UnixStream>, UnixStream)>,
    reaped: bool,
    /// Removed (by its drop, after `drop` below reaped QEMU) once QEMU is gone.
    _cgroup: Option<VmmCgroup>,
}

impl QemuVm {
    /// Starts QEMU with `config` in its own process group.
    pub fn spawn(config: &QemuConfig) -> Result<QemuVm, QemuError> {
        QemuVm::spawn_in(config, None)
    }

    /// Starts QEMU with `config` in its own process group and, when given, in `cgroup`
    /// (removed after QEMU has exited).
    pub fn spawn_in(config: &QemuConfig, cgroup: Option<VmmCgroup>) -> Result<QemuVm, QemuError> {
        QemuVm::spawn_args_in(&config.binary, &config.args(), &config.qmp_socket, cgroup)
    }

    /// Starts `binary` with `args` (which must open QMP on `qmp_socket`, as [`vm_args`]
    /// does) in its own process group.
    pub fn spawn_args(
        binary: &Path,
        args: &[String],
        qmp_socket: &Path,
    ) -> Result<QemuVm, QemuError> {
        QemuVm::spawn_args_in(binary, args, qmp_socket, None)
    }

    /// [`QemuVm::spawn_args`], and when given in `cgroup`, which QEMU joins before it execs
    /// (so before it opens its memory) and which is removed after QEMU has exited.
    pub fn spawn_args_in(
        binary: &Path,
        args: &[String],
        qmp_socket: &Path,
        cgroup: Option<VmmCgroup>,
    ) -> Result<QemuVm, QemuError> {
        let _ = std::fs::remove_file(qmp_socket);
        let mut command = Command::new(binary);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(cgroup) = &cgroup {
            cgroup.enter_on_spawn(&mut command);
        }
        let child = command.spawn().map_err(|source| QemuError::Spawn {
            binary: binary.to_path_buf(),
            source,
        })?;
        Ok(QemuVm {
            child,
            socket: qmp_socket.to_path_buf(),
            qmp: None,
            reaped: false,
            _cgroup: cgroup,
        })
    }

    /// QEMU's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn exited(&mut self) -> Result<(), QemuError> {
        if let Ok(Some(status)) = self.child.try_wait() {
            self.reaped = true;
            let mut stderr = String::new();
            if let Some(mut pipe) = self.child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            return Err(QemuError::Exited {
                status,
                stderr: stderr.trim().to_string(),
            });
        }
        Ok(())
    }

    fn qmp_err(&self, reason: impl Into<String>) -> QemuError {
        QemuError::Qmp {
            socket: self.socket.clone(),
            reason: reason.into(),
        }
    }

    /// Sends one command and returns its `return` value, skipping events.
    pub fn execute(&mut self, command: &str) -> Result<serde_json::Value, QemuError> {
        self.execute_with(command, serde_json::json!({}))
    }

    /// Sends one command with `arguments` and returns its `return` value, skipping events.
    pub fn execute_with(
        &mut self,
        command: &str,
        arguments: serde_json::Value,
    ) -> Result<serde_json::Value, QemuError> {
        let socket = self.socket.clone();
        let err = |reason: String| QemuError::Qmp {
            socket: socket.clone(),
            reason,
        };
        let (reader, writer) = self
            .qmp
            .as_mut()
            .ok_or_else(|| err("not connected".into()))?;
        let request = serde_json::json!({ "execute": command, "arguments": arguments });
        writeln!(writer, "{request}").map_err(|e| err(format!("sending {command}: {e}")))?;
        loop {
            let mut line = String::new();
            let n = reader
                .read_line(&mut line)
                .map_err(|e| err(format!("reading the answer to {command}: {e}")))?;
            if n == 0 {
                return Err(err(format!("connection closed before {command} answered")));
            }
            let value: serde_json::Value = serde_json::from_str(&line)
                .map_err(|e| err(format!("{command}: bad JSON {line:?}: {e}")))?;
            if let Some(ret) = value.get("return") {
                return Ok(ret.clone());
            }
            if let Some(e) = value.get("error") {
                return Err(err(format!("{command}: {e}")));
            }
        }
    }

    /// Waits until QMP answers `qmp_capabilities` and `query-status` and returns the VM's
    /// status (`prelaunch` under `-S`). Fails early with QEMU's stderr if it exits.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<String, QemuError> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            self.exited()?;
            match UnixStream::connect(&self.socket) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                Err(_) => {
                    return Err(QemuError::Timeout {
                        pid: self.pid(),
                        socket: self.socket.clone(),
                        timeout,
                    })
                }
            }
        };
        let left = deadline.saturating_duration_since(Instant::now());
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| self.qmp_err(e.to_string()))?;
        let writer = stream
            .try_clone()
            .map_err(|e| self.qmp_err(e.to_string()))?;
        let mut reader = BufReader::new(stream);
        let mut greeting = String::new();
        if let Err(e) = reader.read_line(&mut greeting) {
            // A QEMU that dies at start resets the socket: its stderr says why.
            std::thread::sleep(Duration::from_millis(50));
            self.exited()?;
            return Err(self.qmp_err(format!("reading the greeting: {e}")));
        }
        if !greeting.contains("QMP") {
            self.exited()?;
            return Err(self.qmp_err(format!("unexpected greeting {greeting:?}")));
        }
        self.qmp = Some((reader, writer));
        self.execute("qmp_capabilities")?;
        let status = self.execute("query-status")?;
        Ok(status
            .get("status")
            .and_then(|s| s.as_str())
            .unwrap_or("unknown")
            .to_string())
    }

    /// Asks QEMU to quit through QMP and waits up to `timeout` for it to exit, then kills it
    /// by pid.
    pub fn quit(mut self, timeout: Duration) {
        if self.qmp.is_some() {
            let _ = self.execute("quit");
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                self.reaped = true;
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for QemuVm {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_names_the_backend() {
        let cfg = QemuConfig {
            binary: PathBuf::from(QEMU_BINARY),
            size: 4 << 30,
            mem_path: PathBuf::from("/mnt/h/f"),
            share: true,
            prealloc: true,
            prealloc_threads: 2,
            qmp_socket: PathBuf::from("/tmp/q.sock"),
        };
        let args = cfg.args().join(" ");
        assert!(args.contains("-m 4096M"), "{args}");
        assert!(args.contains(
            "memory-backend-file,id=mem0,size=4294967296,mem-path=/mnt/h/f,share=on,prealloc=on,prealloc-threads=2"
        ), "{args}");
        assert!(
            args.contains("unix:/tmp/q.sock,server=on,wait=off"),
            "{args}"
        );
    }
}
