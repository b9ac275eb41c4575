//! The driver of the adaptive warm targets (`goal` and `ceiling` in place of `warm`): it
//! counts each lease as a VM start of its target's forecast (a lease-role principal's up
//! to its `starts_per_hour`, by default one a clock hour, see `weigh`; an admin's and the
//! daemon's own callers' each time), looks at each target once a
//! minute (and soon after a start), and installs the target's warm bytes through the same
//! path as a reload or `PUT /v1/pool/targets` ([`Pool::set_policy`]), so the API's targets
//! stay in force and the worker fills or trims as for any target. Plans are made on copies
//! of the forecasts, outside the registry's lock (see `registry`), so a lease's commit
//! never waits on one. See docs/pool.md, "Sizing the pool itself".
//!
//! The inputs of a look ([`Inputs`]):
//! - the time: the host's clock plus the local offset from UTC (the C library's, from `TZ`
//!   or `/etc/localtime`), so the day's hours are the operator's;
//! - known demand: with Placement configured, the sizes of the VMs Nova scheduled here that
//!   have not leased yet (they start within seconds): the consumers of the page size's
//!   warm class that appeared lately and have no lease of the libvirt hook's for their
//!   UUID (see `due`), as the publisher last read them (at most [`KNOWN_DEMAND_FOR`] ago;
//!   else none). The forecast plans a file of each (`Forecast::target_known`); `why`
//!   shows their sum. Placement counts the host, not a node, so every adaptive target of
//!   that page size adds them; without Placement there are none;
//! - the refill rate: the worker's measured fault rate (bytes over seconds faulted), else
//!   the scrub rate, else [`DEFAULT_REFILL_RATE`], for every page size alike;
//! - the free share: what the pool holds of the kind (warm, dirty, filling), the kernel's
//!   free pages of it, and what the reserve may still add (the node's available memory
//!   less `reserve_margin`, within `reserve_limit`; nothing with `reserve = false`).
//!
//! What the forecasts have seen is kept across restarts (`store`): written to the state
//! directory hourly and at a clean stop, read back at start into the adaptive targets then
//! in force; a file that is damaged or foreign is refused (one log line with the path and
//! the field) and the daemon learns from nothing.

mod due;
mod registry;
pub mod store;
mod weigh;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use registry::{AdaptiveStatus, Key, Registry, Replan, REPLAN_S, STARTS_WHILE_PLANNING};
pub use weigh::{Starter, PRINCIPALS_PER_HOUR};

use super::{FileState, KindStatus, Pool};
use crate::page_size::PageSize;
use crate::policy::pool::Target;
use crate::pool::core::forecast::Inputs;

/// How often each adaptive target is looked at.
pub const LOOK_EVERY: Duration = Duration::from_secs(60);

/// How long after a start its look waits: as long as the lessee grace's default.
pub const AFTER_START: Duration = super::LESSEE_GRACE;

/// The refill rate assumed until the worker has faulted or scrubbed enough to measure one,
/// bytes/s (1 GiB/s, below what one CPU faults 2M pages at on the hosts measured).
pub const DEFAULT_REFILL_RATE: f64 = (1u64 << 30) as f64;

/// How often what the forecasts have seen is written to the state directory.
pub const SAVE_EVERY: Duration = Duration::from_secs(3600);

/// How long Placement's allocations, as the publisher last read them, count as known
/// demand: past it (Placement unreachable, the publisher stopped) they count for nothing.
pub const KNOWN_DEMAND_FOR: Duration = Duration::from_secs(300);

/// Seconds of faulting (or scrubbing) before its rate is trusted.
const MEASURED_AFTER_S: f64 = 0.5;

/// The adaptive targets' state inside the pool's settings.
#[derive(Debug, Default)]
pub(in crate::pool) struct Adaptive {
    registry: Mutex<Registry>,
    /// Wakes the looks after a start.
    wake: tokio::sync::Notify,
    /// Placement's consumers of the warm classes, as last read, and since when each is
    /// there (see [`Pool::set_placement_consumers`]).
    due: Mutex<due::Due>,
    /// Held while the forecasts are written.
    saving: Mutex<()>,
}

impl Adaptive {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows the targets in force and puts the adaptive ones' current bytes in their
    /// `warm` (called by `set_policy`, after the API's targets are applied).
    pub(in crate::pool) fn apply(&self, targets: &mut [Target]) {
        let mut r = self.lock();
        r.sync(targets);
        r.apply(targets);
    }
}

/// Local time now, in seconds since the epoch: the host's clock plus its UTC offset.
pub fn local_now_s() -> f64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    unix + crate::sys::localtime::utc_offset_s(unix as i64) as f64
}

impl Pool {
    fn adaptive_state(&self) -> &Adaptive {
        &self.settings.adaptive
    }

    /// A lease of `bytes` on `node` of `ps` pages was committed by `who`: a VM start for the
    /// adaptive target it counts for, if any, within `who`'s share. Cheap; the look it calls
    /// for runs on the looks' task.
    pub(in crate::pool) fn adaptive_started(
        &self,
        node: u32,
        ps: PageSize,
        who: Starter<'_>,
        bytes: u64,
    ) {
        let rate = self.refill_rate();
        let counted =
            self.adaptive_state()
                .lock()
                .started(node, ps, who, local_now_s(), bytes, rate);
        if counted {
            self.adaptive_state().wake.notify_one();
        }
    }

    /// The bytes per second the pool makes warm (see the module's doc).
    pub fn refill_rate(&self) -> f64 {
        let c = self.counters();
        if c.refill_fault_seconds >= MEASURED_AFTER_S && c.refill_faulted_bytes > 0 {
            c.refill_faulted_bytes as f64 / c.refill_fault_seconds
        } else if c.scrub_seconds >= MEASURED_AFTER_S && c.scrubbed_bytes > 0 {
            c.scrubbed_bytes as f64 / c.scrub_seconds
        } else {
            DEFAULT_REFILL_RATE
        }
    }

    /// What the host's free memory lets the pool hold of `k`'s kind (see the module's doc).
    fn free_share(&self, k: &KindStatus) -> u64 {
        let page = k.page_size.bytes();
        let policy = self.policy();
        let available = self.host.node_available(k.node);
        let added = self.kernel.reservations.added_bytes_on(k.node);
        let (room, _) = super::reserve::plan(
            u64::MAX / page,
            k.page_size,
            &policy.reserve,
            added,
            available,
        );
        let held = k.warm_bytes + k.dirty_bytes + k.scrubbing_bytes + k.filling_bytes;
        held.saturating_add(k.kernel_free_pages.saturating_mul(page))
            .saturating_add(room.saturating_mul(page))
    }

    /// Placement's consumers of the warm classes (UUID, bytes per page size), as the
    /// publisher just read them (`placement::publisher`): the known demand of the looks
    /// (see the module's doc). A consumer that appeared wakes the looks.
    pub fn set_placement_consumers(
        &self,
        consumers: impl IntoIterator<Item = (String, BTreeMap<PageSize, u64>)>,
    ) {
        let a = self.adaptive_state();
        let mut due = a.due.lock().unwrap_or_else(|e| e.into_inner());
        let appeared = due.record(Instant::now(), consumers);
        drop(due);
        if appeared {
            a.wake.notify_one();
        }
    }

    /// The domain UUIDs (in lower case) of the leases the libvirt hook made: an admin's
    /// lease named `libvirt-<uuid>-<alias>` (a tenant's names are refused such names, and
    /// journaled under its scope anyway).
    fn hook_leased(&self) -> HashSet<String> {
        let st = self.lock();
        st.core
            .files()
            .filter_map(|e| match &e.rec().state {
                FileState::Leased(l) => due::hook_uuid(&l.name).map(str::to_ascii_lowercase),
                _ => None,
            })
            .collect()
    }

    /// The known demand: the sizes of the VMs due per page size, Placement's consumers
    /// that appeared lately and have no lease of the hook's (a stopped VM keeps its own
    /// allocation: see `due`); none when the last reading is older than
    /// [`KNOWN_DEMAND_FOR`].
    fn known_demand(&self) -> BTreeMap<PageSize, Vec<u64>> {
        let due = || {
            let a = self.adaptive_state();
            a.due.lock().unwrap_or_else(|e| e.into_inner())
        };
        let now = Instant::now();
        let last = due().last();
        if !last.is_some_and(|at| now.saturating_duration_since(at) <= KNOWN_DEMAND_FOR) {
            return BTreeMap::new();
        }
        // The leases are read (under the pool's lock) only when there is a reading to
        // match them with: never on a host without Placement.
        let leased = self.hook_leased();
        let mut d = due();
        d.leased(&leased);
        d.pending(now)
    }

    /// Looks at every adaptive target now and installs the warm bytes that changed (through
    /// `set_policy`, as a reload). Returns whether any changed.
    pub fn adaptive_look(&self) -> bool {
        let keys = self.adaptive_state().lock().keys();
        if keys.is_empty() {
            return false;
        }
        let now_s = local_now_s();
        let looks = self.look_inputs(keys, now_s);
        // Plans are made on copies: lease commits never wait on one (see `registry`).
        let replans = self.adaptive_state().lock().take_due(now_s);
        for mut replan in replans {
            replan.make();
            self.adaptive_state().lock().install(replan);
        }
        let changed = {
            let mut r = self.adaptive_state().lock();
            let mut changed = false;
            for (key, inputs, pending) in looks {
                let before = r.installed(key);
                changed |= r.look(key, &inputs, &pending).is_some_and(|b| b != before);
            }
            changed
        };
        if changed {
            self.settings.reapply_adaptive();
            self.table.notify();
            tracing::info!(policy = %self.policy().describe(), "adaptive warm targets sized");
        }
        changed
    }

    /// The inputs of a look at each of `keys` at local time `now_s`, with the sizes of the
    /// VMs due (the known demand).
    fn look_inputs(&self, keys: Vec<Key>, now_s: f64) -> Vec<(Key, Inputs, Vec<u64>)> {
        let status = self.status();
        let refill_rate = self.refill_rate();
        let known = self.known_demand();
        let mut looks = Vec::new();
        for key @ (node, ps) in keys {
            // A target for every node is held on each: the least free of them bounds it.
            let free_share = status
                .kinds
                .iter()
                .filter(|k| k.page_size == ps && node.map_or(true, |n| n == k.node))
                .map(|k| self.free_share(k))
                .min()
                .unwrap_or(0);
            let pending = known.get(&ps).cloned().unwrap_or_default();
            let inputs = Inputs {
                now_s,
                pending: pending.iter().fold(0u64, |a, &b| a.saturating_add(b)),
                refill_rate,
                free_share,
            };
            looks.push((key, inputs, pending));
        }
        looks
    }

    /// Reads what the forecasts had seen before a restart from `state_dir` (see `store`)
    /// into the adaptive targets in force. Never fails: what cannot be used is logged, with
    /// the path and the field, and left out.
    pub fn adaptive_load(&self, state_dir: &Path) {
        let path = store::path(state_dir);
        let saved = match store::read(&path) {
            Ok(s) => s,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "adaptive forecasts not restored: learning from nothing");
                return;
            }
        };
        let outcomes = self.adaptive_state().lock().restore(saved, local_now_s());
        for ((node, ps), outcome) in outcomes {
            let node = node.map_or("all".to_string(), |n| n.to_string());
            match outcome {
                Some(Ok(())) => {
                    tracing::info!(path = %path.display(), %node, page_size = %ps, "adaptive forecast restored")
                }
                Some(Err(refused)) => {
                    tracing::warn!(path = %path.display(), %node, page_size = %ps, field = %refused.field, error = %refused.message, "adaptive forecast refused: learning from nothing")
                }
                None => {
                    tracing::info!(path = %path.display(), %node, page_size = %ps, "adaptive forecast saved for a target not adaptive now (or that counted starts already): left out")
                }
            }
        }
    }

    /// Writes what the forecasts have seen to `state_dir` (see `store`); a failure is
    /// logged. One write at a time (the hourly one and the stop's share the file).
    pub fn adaptive_save(&self, state_dir: &Path) {
        let _one = self
            .adaptive_state()
            .saving
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let targets = self.adaptive_state().lock().saved();
        if targets.is_empty() {
            // No adaptive target now: a file kept from before stays for when one returns.
            return;
        }
        let path = store::path(state_dir);
        if let Err(error) = store::write(&path, targets) {
            tracing::warn!(path = %path.display(), %error, "adaptive forecasts not saved");
        }
    }

    /// The adaptive targets, their goals and current targets with why.
    pub fn adaptive(&self) -> Vec<AdaptiveStatus> {
        self.adaptive_state().lock().report()
    }

    /// Waits for the next look: [`LOOK_EVERY`], or [`AFTER_START`] after a start (the
    /// starts of a deploy make one look, and the VM's own start goes first).
    async fn adaptive_wait(&self) {
        tokio::select! {
            _ = tokio::time::sleep(LOOK_EVERY) => {}
            _ = async {
                self.adaptive_state().wake.notified().await;
                tokio::time::sleep(AFTER_START).await;
            } => {}
        }
    }
}

/// Looks at the adaptive targets once a minute and after each start, and saves the
/// forecasts to `state_dir` every [`SAVE_EVERY`], on the runtime's blocking threads, until
/// the pool shuts down. (The daemon restores them, [`Pool::adaptive_load`], before it
/// serves a lease.)
pub fn spawn_looks(pool: Arc<Pool>, state_dir: PathBuf) {
    tokio::spawn(async move {
        let mut saved_at = Instant::now();
        loop {
            if pool.table.is_shut_down() {
                return;
            }
            let p = Arc::clone(&pool);
            let _ = tokio::task::spawn_blocking(move || p.adaptive_look()).await;
            if saved_at.elapsed() >= SAVE_EVERY {
                saved_at = Instant::now();
                let (p, dir) = (Arc::clone(&pool), state_dir.clone());
                let _ = tokio::task::spawn_blocking(move || p.adaptive_save(&dir)).await;
            }
            pool.adaptive_wait().await;
        }
    });
}
