//! Choosing the lease's file under the lock ([`core::choice::choose`] decides) and claiming it.

use super::super::core::choice::{choose, Choice, LeaseView};
use super::*;

/// A claimed file: its id, where it comes from, its size before the lease.
type Claimed = (u64, LeaseSource, u64);

impl Pool {
    /// Chooses and claims the file under the lock, then journals a new file's filling record
    /// outside it: a new file's record is written once claimed, in the same hold that checked
    /// the limits, busy (cold leasing) with its name taken, so nothing else writes its record
    /// or counts it free meanwhile.
    pub(super) fn reserve(&self, v: &ValidRequest) -> Result<Claimed> {
        let (claimed, journal) = self.choose_and_claim(v)?;
        if let Some(journal) = journal {
            if let Err(err) = self.perform(&journal) {
                self.unclaim_cold(claimed.0);
                return Err(action_error(err));
            }
        }
        Ok(claimed)
    }

    /// Chooses the file under the lock, waiting, raising the kernel's pool or making room
    /// as [`choose`] says, and claims it; the lock is released on return.
    fn choose_and_claim(&self, v: &ValidRequest) -> Result<(Claimed, Option<core::Action>)> {
        let mount = self.mount(v.page_size)?;
        let deadline = self.host.now() + LEASE_WAIT;
        let extents = self.tenant_extents(v);
        let mut st = self.lock();
        let mut waiting = false;
        // The kernel's pool is raised for this lease at most once (see `raise_for_lease`).
        let mut raised = false;
        let mut capped = None;
        let result = loop {
            if self.table.is_shut_down() {
                break Err(PoolError::ShuttingDown);
            }
            if st.core.name_in_use(&v.name) {
                break Err(PoolError::DuplicateName {
                    name: super::record::display_name(&v.name).to_string(),
                });
            }
            // Checked again at every turn: the same lock hold claims the file below.
            if let Err(e) = self.check_limits(&st, v, &extents) {
                break Err(e);
            }
            let view = self.view(&st, v, deadline);
            match choose(&view) {
                // More than the kind can supply: raise the node's kernel pool by what the
                // kernel's free pages lack for the whole lease, once, then choose again.
                Choice::Refuse { .. } if !raised => {
                    raised = true;
                    drop(st);
                    capped = self
                        .raise_for_lease(
                            v.node,
                            v.page_size,
                            &mount.root,
                            v.size.saturating_sub(view.avail),
                        )
                        .capped;
                    st = self.lock();
                }
                Choice::Refuse { available } => break Err(self.refused(v, available, capped)),
                Choice::Wait { for_faults } => {
                    if for_faults && !waiting {
                        tracing::debug!(name = %v.name, size = v.size, "lease waits for faults in progress");
                    }
                    self.wait_urgently(&mut waiting);
                    st = st.wait_timeout(&self.table.changed, Duration::from_millis(50));
                }
                // Room for the lease: the victim's truncate and unlink run outside the lock.
                Choice::MakeRoom(victim) => st = self.give_up(st, victim),
                Choice::Take { file, source, need } => {
                    break self.claim(&mut st, v, file, source, need);
                }
            }
        };
        if waiting {
            self.clearing.control.end_urgent();
        }
        result
    }

    /// The lengths of the request's tenant's leased files, read before the lock (see
    /// `Pool::extents_of`); an admin (the libvirt hook, root) has no limit, and none are
    /// read for it.
    fn tenant_extents(&self, v: &ValidRequest) -> super::super::tenant::Extents {
        match &v.tenant {
            Some(t) if !t.limits.admits_anything() => self.extents_of(&t.principal),
            _ => Default::default(),
        }
    }

    /// A cold lease whose filling record could not be written: the file, never created, is
    /// forgotten with its name, its promise and its tenant's count.
    fn unclaim_cold(&self, id: u64) {
        let mut st = self.lock();
        if let Err(refused) = st.core.forget_unjournaled(id) {
            tracing::error!(%refused, "pool core refused to forget a cold lease");
        }
        st.end_faulting(id);
        st.taking.remove(&id);
        drop(st);
        self.table.changed.notify_all();
    }

    /// A lease refused with `available` bytes: remembered for /health and doctor, and the
    /// error to return.
    fn refused(
        &self,
        v: &ValidRequest,
        available: u64,
        capped: Option<(u64, u64, u64)>,
    ) -> PoolError {
        self.note_refused(v.node, v.page_size, v.size, available);
        match capped {
            // `reserve_limit` kept the kernel's pool from growing for it: a limit, as for a
            // tenant's (429); the host's own limit kept a VM from starting.
            Some((max, in_use, asked)) => PoolError::OverLimit {
                principal: v.principal.clone().unwrap_or_else(|| "the daemon".into()),
                limit: format!("reserve_limit (node {})", v.node),
                max,
                in_use,
                asked,
            },
            None => PoolError::Insufficient {
                size: v.size,
                page_size: v.page_size,
                node: v.node,
                available,
            },
        }
    }

    /// What the lease sees of its kind: the pool's files under the lock, the kernel's free
    /// pages and the clock ([`core::choice::choose`] decides from it).
    fn view(&self, st: &State, v: &ValidRequest, deadline: Instant) -> LeaseView {
        let promised = st.promised(v.node, v.page_size);
        let idle = |state: FileState| -> Vec<(u64, u64)> {
            st.of_kind(v.node, v.page_size)
                .filter(|e| e.is_idle(&state))
                .map(|e| (e.rec().id, e.rec().size))
                .collect()
        };
        LeaseView {
            size: v.size,
            // The kernel's counters are read under the lock with the promises they are
            // reduced by, once per turn (see `KernelFigures` in `worker` for why and the cost).
            avail: self.host.available_after(v.node, v.page_size, &promised),
            faulting: promised.bytes,
            warm: idle(FileState::Warm),
            dirty: idle(FileState::Dirty),
            pending: st.pending_clean_bytes(v.node, v.page_size),
            may_wait: self.host.now() < deadline,
        }
    }

    /// Makes the chosen file the request's (a warm one as it is, a new one with the filling
    /// record to journal before it is created) and promises the pages its fault needs.
    fn claim(
        &self,
        st: &mut State,
        v: &ValidRequest,
        file: Option<(u64, u64)>,
        source: LeaseSource,
        need: u64,
    ) -> Result<(Claimed, Option<core::Action>)> {
        let core_err = |e: core::CoreError| PoolError::Field {
            field: "name",
            message: e.to_string(),
        };
        let (claimed, journal) = match file {
            Some((id, old)) => {
                st.core.take_warm(id, &v.name).map_err(core_err)?;
                ((id, source, old), None)
            }
            None => {
                let (id, journal) = st
                    .core
                    .new_cold(v.node, v.page_size, v.size, &v.name)
                    .map_err(core_err)?;
                ((id, source, 0), Some(journal))
            }
        };
        if need > 0 {
            st.start_faulting(claimed.0, v.node, v.page_size, need);
        }
        self.start_taking(st, v, claimed.0);
        st.note_demand(v.node, v.page_size, v.size);
        if source != LeaseSource::WarmExact {
            st.schedule.missed();
        }
        Ok((claimed, journal))
    }

    /// A lease starts waiting for background work (once per lease; `reserve` ends it):
    /// scrubs and refills run at full speed and through the start gate meanwhile.
    fn wait_urgently(&self, waiting: &mut bool) {
        if !*waiting {
            *waiting = true;
            self.clearing.control.begin_urgent();
            self.table.changed.notify_all();
        }
    }
}
