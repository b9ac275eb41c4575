//! The storm's cases: how the memory of its VMs is prepared, and their row labels.

use serde::Serialize;

use super::super::{Case, Vmm};

/// How the memory of a storm's VMs is prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StormCase {
    /// QEMU `prealloc=on` on fresh files.
    Immediate,
    /// Fresh files, no preallocation.
    Floor,
    /// Leases from a pool warm for every VM.
    Warm,
    /// Leases from a pool warm for half of them; the rest cold.
    HalfWarm,
}

impl StormCase {
    /// Every case, in table order.
    pub const ALL: [StormCase; 4] = [
        StormCase::Immediate,
        StormCase::Floor,
        StormCase::Warm,
        StormCase::HalfWarm,
    ];

    /// The row label for `vmm`.
    pub fn label(self, vmm: Vmm, threads: usize) -> String {
        match (vmm, self) {
            (Vmm::Qemu, StormCase::Immediate) => format!("prealloc=on, prealloc-threads={threads}"),
            (Vmm::Qemu, StormCase::Floor) => "file, prealloc=off (floor)".into(),
            (Vmm::Qemu, StormCase::Warm) => "hugeprep, pool warm for all".into(),
            (Vmm::Qemu, StormCase::HalfWarm) => "hugeprep, pool warm for half".into(),
            (Vmm::Libvirt, StormCase::Immediate) => {
                format!("<hugepages/> + immediate, threads={threads}")
            }
            (Vmm::Libvirt, StormCase::Floor) => "file-backed, hook cold (floor)".into(),
            (Vmm::Libvirt, StormCase::Warm) => "hugeprep hook, pool warm for all".into(),
            (Vmm::Libvirt, StormCase::HalfWarm) => "hugeprep hook, pool warm for half".into(),
            // Storms start QEMU alone or through libvirt; `run` leaves the others out.
            (Vmm::CloudHypervisor | Vmm::LibvirtRoot, case) => {
                format!("{} ({case:?}, not stormed)", vmm.name())
            }
        }
    }

    /// The one-at-a-time run's case with the same domain (libvirt storms reuse its XML).
    pub(super) fn domain_case(self) -> Case {
        match self {
            StormCase::Immediate => Case::Immediate,
            StormCase::Floor => Case::Floor,
            StormCase::Warm | StormCase::HalfWarm => Case::Hugeprep,
        }
    }

    pub(super) fn warm_vms(self, count: usize) -> usize {
        match self {
            StormCase::Warm => count,
            StormCase::HalfWarm => count / 2,
            _ => 0,
        }
    }
}

/// Whether the pool may refill behind the leases while a storm is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Refill {
    /// Every free page the storm does not need is held back: no refill can run.
    HeldBack,
    /// The pool is free to refill; its start gate holds the refill while the VMs start.
    Free,
    /// The pool is free to refill and its start gate is off (as before the gate).
    FreeUngated,
}

/// The row label, marked when the pool was free to refill during the storm.
pub(super) fn label_of(case: StormCase, vmm: Vmm, threads: usize, refill: Refill) -> String {
    let label = case.label(vmm, threads);
    match refill {
        Refill::HeldBack => label,
        Refill::Free => format!("{label}, refill free"),
        Refill::FreeUngated => format!("{label}, refill free, no gate"),
    }
}
