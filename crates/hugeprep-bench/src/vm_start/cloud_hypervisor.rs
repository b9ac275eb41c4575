//! The cloud-hypervisor cases: exec to the tiny PVH guest's first serial report
//! (`vmm::pvh_guest` with no samples), so the VM was created, its memory prepared, and it
//! booted and ran. cloud-hypervisor prepares its own memory as its users usually ask:
//! `--memory size=N,hugepages=on,hugepage_size=P,shared=on` (a hugetlb memfd), with
//! `prefault=on` (its parallel prefault) or without (the floor); hugeprep's case maps a warm
//! lease with exactly what `hugeprep ch-args` prints.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Case, Result, Starter, VmStartBenchError, Vmm, World};
use hugeprep::client::Client;
use hugeprep::vmm::{cloud_hypervisor as handoff, pvh_guest, GuestMemoryFile};
use hugeprep_testkit::cgroup::VmmCgroup;

/// How long a start may take (a liveness bound; a first touch since boot is ~25x slower).
const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// The cases cloud-hypervisor runs: it has no preallocation of a file it is handed.
pub(super) const CASES: [Case; 3] = [Case::Immediate, Case::Floor, Case::Hugeprep];

/// Starts cloud-hypervisor for each case.
pub(crate) struct ChStarter {
    binary: PathBuf,
}

impl ChStarter {
    pub fn new(binary: &Path) -> ChStarter {
        ChStarter {
            binary: binary.to_path_buf(),
        }
    }

    /// Execs cloud-hypervisor with `memory` and waits for the guest's report; returns the
    /// seconds from exec, then stops it.
    fn run(&self, world: &World, memory: &[String]) -> Result<f64> {
        let kernel = world.tmp.join("ch-guest.elf");
        if !kernel.exists() {
            let image = pvh_guest::image(&[], 0).map_err(|e| VmStartBenchError::Io {
                op: "build the cloud-hypervisor guest",
                source: std::io::Error::other(e.to_string()),
            })?;
            std::fs::write(&kernel, image).map_err(|source| VmStartBenchError::Io {
                op: "write the cloud-hypervisor guest",
                source,
            })?;
        }
        let serial = world.tmp.join("ch-serial.out");
        let _ = std::fs::remove_file(&serial);
        let cgroup = world.vmm_cgroup("ch")?;
        let mut command = Command::new(&self.binary);
        command
            .args(["--cpus", "boot=1", "--kernel"])
            .arg(&kernel)
            .args(memory)
            .arg("--serial")
            .arg(format!("file={}", serial.display()))
            .args(["--console", "off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(cgroup) = &cgroup {
            cgroup.enter_on_spawn(&mut command);
        }
        let start = Instant::now();
        let child = command.spawn().map_err(|source| VmStartBenchError::Io {
            op: "start cloud-hypervisor",
            source,
        })?;
        let mut vm = Running {
            child,
            _cgroup: cgroup,
        };
        loop {
            let text = std::fs::read(&serial).unwrap_or_default();
            if text.ends_with(b"\n") {
                let seconds = start.elapsed().as_secs_f64();
                if text != format!("{}\n", pvh_guest::REPORT_OK).as_bytes() {
                    return Err(failed(format!(
                        "the guest reported {:?}",
                        String::from_utf8_lossy(&text)
                    )));
                }
                vm.stop();
                return Ok(seconds);
            }
            if let Ok(Some(status)) = vm.child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut e) = vm.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
                }
                return Err(failed(format!(
                    "exited ({status}) before the guest reported: {}",
                    stderr.trim()
                )));
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(failed(format!(
                    "no guest report within {} s",
                    READY_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// cloud-hypervisor's own hugetlb memory, with or without its prefault.
    fn own_memory(&self, world: &World, prefault: bool) -> Result<f64> {
        let memory = format!(
            "size={},hugepages=on,hugepage_size={},shared=on,prefault={}",
            world.size,
            world.page_size.bytes(),
            if prefault { "on" } else { "off" }
        );
        self.run(world, &["--memory".into(), memory])
    }

    /// A lease from the warm pool, timed from the request to the guest's report; released
    /// after cloud-hypervisor has exited.
    fn leased(&self, world: &World, tag: &str) -> Result<f64> {
        let client = Client::new(world.daemon.socket());
        let start = Instant::now();
        let lease = client.blocking(client.lease(&world.lease_request(format!("ch-{tag}"))))?;
        let lease_seconds = start.elapsed().as_secs_f64();
        let memory = handoff::memory_args(&GuestMemoryFile {
            id: "mem0",
            path: &lease.path,
            size: lease.size,
            node: Some(lease.node),
        });
        let result = self.run(world, &memory).map(|s| lease_seconds + s);
        client.blocking(client.release(lease.id))?;
        result
    }
}

fn failed(what: String) -> VmStartBenchError {
    VmStartBenchError::Io {
        op: "cloud-hypervisor start",
        source: std::io::Error::other(what),
    }
}

/// A started cloud-hypervisor and its cgroup; SIGTERM and reaped on drop, so no error path
/// leaves it holding pages, then its cgroup removed.
struct Running {
    child: Child,
    /// Removed when dropped, after `drop` below reaped cloud-hypervisor.
    _cgroup: Option<VmmCgroup>,
}

impl Running {
    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Starter for ChStarter {
    fn vmm(&self) -> Vmm {
        Vmm::CloudHypervisor
    }

    fn cases(&self) -> &'static [Case] {
        &CASES
    }

    fn start(&mut self, world: &World, case: Case, tag: &str) -> Result<f64> {
        match case {
            Case::Immediate => self.own_memory(world, true),
            Case::Floor => self.own_memory(world, false),
            Case::Hugeprep => self.leased(world, tag),
            Case::ImmediateOnLease | Case::HugeprepDiscard | Case::Present => {
                Err(VmStartBenchError::Invalid {
                    field: "vmms",
                    reason: format!("cloud-hypervisor has no case {case:?}"),
                })
            }
        }
    }
}
