//! Preparing a claimed file outside the lock: resized or created and faulted, watched,
//! handed to its owner and linked at the lease path.

use super::*;

impl Pool {
    /// Resizes or creates and faults the file, links the lease path and hands it to the
    /// owner (outside the lock). On error says whether the link was made.
    pub(super) fn prepare(
        &self,
        v: &ValidRequest,
        id: u64,
        source: LeaseSource,
        old_size: u64,
        lease_path: &Path,
    ) -> std::result::Result<bool, (PoolError, Option<bool>)> {
        let file = self
            .lease_file(v, id, source, old_size)
            .map_err(|e| (e, None))?;
        // From before anyone else can open it until its release: who opens it.
        self.host.watch(id, &file);
        if let Some(owner) = v.owner {
            self.host
                .chown(&file, owner)
                .map_err(|e| (e.into(), Some(false)))?;
        }
        if self.host.lease_path_taken(lease_path) {
            return Err((
                PoolError::Field {
                    field: "name",
                    message: format!("{} already exists", lease_path.display()),
                },
                Some(false),
            ));
        }
        if let Some((dir, _)) = v.name.split_once('/') {
            // A tenant's directory (see `tenant::scope_dir`): others may pass through it to the
            // paths they were given, not list it.
            self.host
                .tenant_dir(v.page_size, dir)
                .map_err(|e| (e.into(), Some(false)))?;
        }
        self.host
            .link_lease(&file, lease_path)
            .map_err(|e| (e.into(), Some(false)))?;
        Ok(true)
    }

    /// The lease's file at its size, its new pages faulted: a warm one opened (and resized),
    /// a cold one created.
    fn lease_file(
        &self,
        v: &ValidRequest,
        id: u64,
        source: LeaseSource,
        old_size: u64,
    ) -> Result<host::Handle> {
        let at = host::FileAt {
            page_size: v.page_size,
            id,
        };
        let cpus = self.cpus(v.node);
        match source {
            LeaseSource::WarmExact => Ok(self.host.open(at)?),
            LeaseSource::WarmShrunk => {
                let mut f = self.host.open(at)?;
                self.host.resize(&mut f, v.size)?;
                Ok(f)
            }
            LeaseSource::WarmGrown => {
                let mut f = self.host.open(at)?;
                self.host.resize(&mut f, v.size)?;
                let t = self.host.now();
                let _long = long_work(v.size - old_size);
                let grown = self.fault_lease(id, &f, old_size..v.size, v.node, &cpus);
                if let Err(e) = grown {
                    // The abort journals the file dirty at the size it has on the mount,
                    // whichever that is.
                    let _ = self.host.resize(&mut f, old_size);
                    return Err(e.into());
                }
                let took = self.host.now().saturating_duration_since(t);
                self.table.counters.lease_faulted(v.size - old_size, took);
                Ok(f)
            }
            LeaseSource::Cold => {
                let f = self.host.create(at, v.size)?;
                let t = self.host.now();
                let _long = long_work(v.size);
                if let Err(e) = self.fault_lease(id, &f, 0..v.size, v.node, &cpus) {
                    // The abort removes it again (and its record), logging a failure.
                    let _ = self.host.unlink(at);
                    return Err(e.into());
                }
                let took = self.host.now().saturating_duration_since(t);
                self.table.counters.lease_faulted(v.size, took);
                Ok(f)
            }
        }
    }

    /// Faults a lease's new pages: with the node's workers when the fault is alone, with
    /// one `fallocate` worker beside other faults (see [`fault::fault_range_beside_others`]).
    fn fault_lease(
        &self,
        id: u64,
        file: &host::Handle,
        range: std::ops::Range<u64>,
        node: u32,
        cpus: &[usize],
    ) -> std::result::Result<(), fault::FaultError> {
        let (others, taken) = {
            let st = self.lock();
            // This lease's own fault is one of them.
            (st.faulting.len() > 1, st.taken(id).unwrap_or_default())
        };
        self.host
            .fault_lease(file, range, node, cpus, others, taken)
    }
}
