//! The QEMU-alone cases: exec to QMP ready (VM paused, no devices), with the same QEMU
//! launcher as `bench prefault` and the arguments `hugeprep qemu-args` prints.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{Case, Result, Starter, VmStartBenchConfig, VmStartBenchError, Vmm, World};
use hugeprep::client::Client;
use hugeprep::hugetlb::BackingFile;
use hugeprep::vmm::{qemu as handoff, GuestMemoryFile};
use hugeprep_testkit::qemu::{self as launcher, QemuConfig, QemuVm};

/// How long QEMU may take to become ready (a first touch since boot is ~25x slower).
const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// Starts QEMU for each case.
pub(crate) struct QemuStarter {
    binary: PathBuf,
    /// The last start's lease call, seconds.
    lease_seconds: Option<f64>,
}

impl QemuStarter {
    pub fn new(cfg: &VmStartBenchConfig) -> QemuStarter {
        QemuStarter {
            binary: cfg.qemu.clone(),
            lease_seconds: None,
        }
    }

    /// A file on the scratch mount with every page present, faulted untimed by the bench
    /// (never leased, so no open of it is watched), handed over with `qemu-args`' options:
    /// what QEMU's start costs on present pages alone. Removed after.
    fn present(&self, world: &World, tag: &str) -> Result<f64> {
        let path = world.scratch.join(format!("present-{tag}"));
        let _ = std::fs::remove_file(&path);
        let file = BackingFile::create(&path, world.size, world.page_size, None)?;
        let node = 0;
        let cpus = hugeprep::topology::Topology::detect()
            .ok()
            .and_then(|t| t.node(node).ok().map(|n| n.cpus.clone()))
            .unwrap_or_default();
        let result = hugeprep::pool::fault::fault_range(&file, 0..world.size, node, &cpus)
            .map_err(|e| VmStartBenchError::Io {
                op: "fault the present file",
                source: std::io::Error::other(e.to_string()),
            })
            .and_then(|()| {
                self.with_qemu_args(
                    world,
                    &GuestMemoryFile {
                        id: "mem0",
                        path: &path,
                        size: world.size,
                        node: Some(node),
                    },
                    "",
                )
            });
        drop(file);
        let _ = std::fs::remove_file(&path);
        result
    }

    /// QEMU's own backend on `mem_path` (a fresh file QEMU creates, or a lease).
    fn own_backend(&self, world: &World, mem_path: &Path, prealloc: bool) -> Result<f64> {
        let config = QemuConfig {
            binary: self.binary.clone(),
            size: world.size,
            mem_path: mem_path.to_path_buf(),
            share: true,
            prealloc,
            prealloc_threads: world.threads,
            qmp_socket: qmp_socket(world),
        };
        let cgroup = world.vmm_cgroup("qemu")?;
        let start = Instant::now();
        let mut vm = QemuVm::spawn_in(&config, cgroup)?;
        vm.wait_ready(READY_TIMEOUT)?;
        let seconds = start.elapsed().as_secs_f64();
        vm.quit(Duration::from_secs(10));
        Ok(seconds)
    }

    /// A fresh file on the scratch mount, removed after.
    fn fresh(&self, world: &World, prealloc: bool, tag: &str) -> Result<f64> {
        let path = world.scratch.join(format!("qemu-{tag}"));
        let _ = std::fs::remove_file(&path);
        let result = self.own_backend(world, &path, prealloc);
        let _ = std::fs::remove_file(&path);
        result
    }

    /// A lease from the warm pool, timed from the request to QEMU ready (QEMU's exit and
    /// the release are not part of the start); released after.
    fn leased(&mut self, world: &World, handoff: Handoff, tag: &str) -> Result<f64> {
        let client = Client::new(world.daemon.socket());
        let start = Instant::now();
        let lease = client.blocking(client.lease(&world.lease_request(format!("qemu-{tag}"))))?;
        let lease_seconds = start.elapsed().as_secs_f64();
        self.lease_seconds = Some(lease_seconds);
        let memory = GuestMemoryFile {
            id: "mem0",
            path: &lease.path,
            size: lease.size,
            node: Some(lease.node),
        };
        let result = match handoff {
            Handoff::Prealloc => self.own_backend(world, &lease.path, true),
            Handoff::QemuArgs => self.with_qemu_args(world, &memory, ""),
            Handoff::Discard => self.with_qemu_args(world, &memory, ",discard-data=on"),
        }
        .map(|qemu_seconds| lease_seconds + qemu_seconds);
        client.blocking(client.release(lease.id))?;
        result
    }

    /// QEMU with exactly what `hugeprep qemu-args` prints for a lease of `memory`,
    /// `backend_extra` appended to the backend's options.
    fn with_qemu_args(
        &self,
        world: &World,
        memory: &GuestMemoryFile<'_>,
        backend_extra: &str,
    ) -> Result<f64> {
        let qmp = qmp_socket(world);
        let mut args = launcher::vm_args(&qmp);
        let mut memory = handoff::machine_args(memory);
        if let Some(backend) = memory
            .iter_mut()
            .find(|a| a.starts_with("memory-backend-file,"))
        {
            backend.push_str(backend_extra);
        }
        args.extend(memory);
        let cgroup = world.vmm_cgroup("qemu")?;
        let start = Instant::now();
        let mut vm = QemuVm::spawn_args_in(&self.binary, &args, &qmp, cgroup)?;
        vm.wait_ready(READY_TIMEOUT)?;
        let seconds = start.elapsed().as_secs_f64();
        vm.quit(Duration::from_secs(10));
        Ok(seconds)
    }
}

/// How a lease reaches QEMU.
#[derive(Debug, Clone, Copy)]
enum Handoff {
    /// `hugeprep qemu-args`.
    QemuArgs,
    /// QEMU's own `prealloc=on` over the lease.
    Prealloc,
    /// `hugeprep qemu-args` plus `discard-data=on`.
    Discard,
}

fn qmp_socket(world: &World) -> PathBuf {
    world.daemon.socket().with_file_name("qmp.sock")
}

impl Starter for QemuStarter {
    fn vmm(&self) -> Vmm {
        Vmm::Qemu
    }

    fn cases(&self) -> &'static [Case] {
        &Case::QEMU
    }

    fn start(&mut self, world: &World, case: Case, tag: &str) -> Result<f64> {
        self.lease_seconds = None;
        match case {
            Case::Immediate => self.fresh(world, true, tag),
            Case::Floor => self.fresh(world, false, tag),
            Case::Present => self.present(world, tag),
            Case::Hugeprep => self.leased(world, Handoff::QemuArgs, tag),
            Case::ImmediateOnLease => self.leased(world, Handoff::Prealloc, tag),
            Case::HugeprepDiscard => self.leased(world, Handoff::Discard, tag),
        }
    }

    fn last_lease_seconds(&self) -> Option<f64> {
        self.lease_seconds
    }
}
