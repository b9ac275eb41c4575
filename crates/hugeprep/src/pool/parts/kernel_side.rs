//! The kernel side: the pages the daemon added to the kernel's pools, the gate that orders
//! raises against drains, and the leases refused for want of memory.

use std::sync::Mutex;

use crate::pool::{reserve, shortfall};

/// The pool's dealings with the kernel's hugepage pools (see the module).
#[derive(Debug)]
pub(in crate::pool) struct KernelSide {
    /// The ledger of pages the daemon added to the kernel's pools.
    pub(in crate::pool) reservations: reserve::Reservations,
    /// Held while a pool is raised and while a drain gives pages back, so that a raise
    /// decided before a drain never lands after it.
    reserve_gate: Mutex<()>,
    /// Leases refused for want of memory: the last one and why (see `shortfall`).
    pub(in crate::pool) refusals: shortfall::Refusals,
}

impl KernelSide {
    pub(super) fn new(reservations: reserve::Reservations) -> KernelSide {
        KernelSide {
            reservations,
            reserve_gate: Mutex::new(()),
            refusals: shortfall::Refusals::default(),
        }
    }

    /// Takes the raise/drain gate (a poisoned gate guards nothing but order).
    pub(in crate::pool) fn gate(&self) -> std::sync::MutexGuard<'_, ()> {
        self.reserve_gate.lock().unwrap_or_else(|e| e.into_inner())
    }
}
