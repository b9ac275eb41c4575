//! A storm of QEMUs alone: N started at once, each ready when QMP answers.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::super::Result;
use super::world::StormWorld;
use super::StormCase;
use hugeprep::client::Client;
use hugeprep::vmm::{qemu as handoff, GuestMemoryFile};
use hugeprep_testkit::cgroup::VmmCgroup;
use hugeprep_testkit::qemu::{self as launcher, QemuConfig, QemuVm};

/// How long one QEMU of a storm may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

impl StormWorld {
    /// N QEMUs at once.
    pub(super) fn storm_qemu(&self, case: StormCase, tag: usize) -> Result<Vec<f64>> {
        // Made before the storm, as a host makes a VM's cgroup before it starts the VM.
        let cgroups = (0..self.count)
            .map(|i| super::super::vmm_cgroup(self.cgroups.as_ref(), &format!("storm-{i}")))
            .collect::<Result<Vec<_>>>()?;
        let barrier = Arc::new(Barrier::new(self.count));
        let started = Instant::now();
        let outcomes: Vec<Result<(f64, QemuVm, Option<u64>)>> = std::thread::scope(|s| {
            let handles: Vec<_> = cgroups
                .into_iter()
                .enumerate()
                .map(|(i, cgroup)| {
                    let barrier = Arc::clone(&barrier);
                    s.spawn(move || {
                        barrier.wait();
                        self.one(case, tag, i, started, cgroup)
                    })
                })
                .collect();
            handles.into_iter().map(super::joined).collect()
        });
        let client = Client::new(self.daemon.socket());
        let mut seconds = Vec::with_capacity(self.count);
        let mut first_error = None;
        for outcome in outcomes {
            match outcome {
                Ok((secs, vm, lease)) => {
                    seconds.push(secs);
                    vm.quit(Duration::from_secs(10));
                    if let Some(id) = lease {
                        client.blocking(client.release(id))?;
                    }
                }
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        for i in 0..self.count {
            let _ = std::fs::remove_file(self.scratch.join(format!("storm-{tag}-{i}")));
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(seconds),
        }
    }

    /// VM `i` of a storm: its memory prepared for `case`, QEMU started (in `cgroup`, when
    /// given) and ready.
    fn one(
        &self,
        case: StormCase,
        tag: usize,
        i: usize,
        started: Instant,
        cgroup: Option<VmmCgroup>,
    ) -> Result<(f64, QemuVm, Option<u64>)> {
        let qmp = self.tmp.join(format!("qmp-{i}.sock"));
        match case {
            StormCase::Immediate | StormCase::Floor => {
                let config = QemuConfig {
                    binary: self.qemu.clone(),
                    size: self.size,
                    mem_path: self.scratch.join(format!("storm-{tag}-{i}")),
                    share: true,
                    prealloc: case == StormCase::Immediate,
                    prealloc_threads: self.threads,
                    qmp_socket: qmp,
                };
                let mut vm = QemuVm::spawn_in(&config, cgroup)?;
                vm.wait_ready(READY_TIMEOUT)?;
                Ok((started.elapsed().as_secs_f64(), vm, None))
            }
            StormCase::Warm | StormCase::HalfWarm => {
                let client = Client::new(self.daemon.socket());
                let lease = client.blocking(client.lease(&hugeprep::pool::LeaseRequest {
                    name: format!("storm-{tag}-{i}"),
                    size: self.size,
                    page_size: Some(self.ps),
                    ..Default::default()
                }))?;
                let mut args = launcher::vm_args(&qmp);
                args.extend(handoff::machine_args(&GuestMemoryFile {
                    id: "mem0",
                    path: &lease.path,
                    size: lease.size,
                    node: Some(lease.node),
                }));
                let ready =
                    QemuVm::spawn_args_in(&self.qemu, &args, &qmp, cgroup).and_then(|mut vm| {
                        vm.wait_ready(READY_TIMEOUT)?;
                        Ok(vm)
                    });
                match ready {
                    Ok(vm) => Ok((started.elapsed().as_secs_f64(), vm, Some(lease.id))),
                    Err(e) => {
                        let _ = client.blocking(client.release(lease.id));
                        Err(e.into())
                    }
                }
            }
        }
    }
}
