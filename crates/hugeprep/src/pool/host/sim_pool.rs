//! A [`Pool`] on a [`SimHost`](super::sim::SimHost): the real driver without hugetlbfs,
//! BPF or root (the unit tests of the driver run as uid 65534).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};

use super::sim::SimHost;
use super::Host;
use crate::clear::{ClearPlan, Method};
use crate::page_size::PageSize;
use crate::pool::state::State;
use crate::pool::{
    core, counters, gate, kept, reach, reserve, shortfall, targets, tenant, Pool, PoolMount,
    PoolPolicy, Result,
};
use crate::scrub::{ScrubControl, Scrubber};
use crate::topology::Topology;

impl Pool {
    /// A pool of `policy` whose every effect goes to `host`, with plain directories below
    /// `dir` standing for the mounts of `page_sizes` and holding its small state files (the
    /// reservations' ledger, the tenants' key, the API's targets). It recovers from what the
    /// host keeps (nothing, the first time; a crashed daemon's journal and files after),
    /// with the daemon's own recovery; no worker or keeper runs (tests drive the worker's
    /// jobs one at a time).
    pub(in crate::pool) fn with_host(
        host: Arc<SimHost>,
        dir: &Path,
        page_sizes: &[PageSize],
        policy: PoolPolicy,
    ) -> Result<Arc<Pool>> {
        let io = |op: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| crate::pool::PoolError::Io { op, path, source }
        };
        let topology = Topology::detect().map_err(|e| crate::pool::PoolError::Io {
            op: "reading topology",
            path: "/sys/devices/system/node".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let state_dir = dir.join("state");
        std::fs::create_dir_all(&state_dir).map_err(io("creating", &state_dir))?;
        let mut mounts = BTreeMap::new();
        for &ps in page_sizes {
            let root = dir.join(format!("mount-{}", ps.name()));
            std::fs::create_dir_all(&root).map_err(io("creating", &root))?;
            let mount = PoolMount::new(&root, ps)?;
            host.set_lease_dir(ps, mount.lease_dir.clone());
            mounts.insert(ps, mount);
        }
        // Recovery on what the host keeps (nothing, the first time), as `Pool::open` does.
        let clean = host.journal_was_clean();
        let (files, max_id, _) = crate::pool::recover::reconcile(host.as_ref(), clean)?;
        host.journal_clear_clean()?;
        let reservations = reserve::Reservations::open(&state_dir)?;
        let scope_key = tenant::ScopeKey::open(&state_dir)?;
        let api_targets = targets::ApiTargets::open(
            &state_dir,
            &page_sizes.iter().copied().collect(),
            &topology,
        )?;
        let mut policy = policy;
        api_targets.apply(&mut policy);
        let control = Arc::new(ScrubControl::default());
        // The walk never loads the kernel counts' BPF probe; the proofs are the host's.
        let reach = reach::Reach::proving(Some(reach::Method::ProcWalk));
        let gate = Arc::new(gate::StartGate::new(
            Arc::clone(&reach),
            Arc::clone(&control),
        ));
        gate.set_grace(policy.lessee_grace);
        let scrubber = Scrubber::new(ClearPlan::always(Method::WriteBytes)).map_err(|e| {
            crate::pool::PoolError::Field {
                field: "method",
                message: e.to_string(),
            }
        })?;
        Ok(Arc::new(Pool {
            mounts: Arc::new(mounts),
            topology,
            policy: std::sync::RwLock::new(Arc::new(policy)),
            host: host as Arc<dyn Host>,
            scrubber: Arc::new(scrubber),
            control,
            gate,
            state: Mutex::new(State {
                core: core::Core::with_files(files, (max_id + 1).max(1 << 20)),
                ..State::default()
            }),
            changed: Condvar::new(),
            shutdown: AtomicBool::new(false),
            clean_start: clean,
            reservations,
            reserve_gate: Mutex::new(()),
            refusals: shortfall::Refusals::default(),
            counters: counters::Counters::default(),
            pins: Mutex::new(BTreeMap::new()),
            api_targets,
            reach,
            tenant_limits: Mutex::new(BTreeMap::new()),
            kept: kept::Kept::default(),
            scope_key,
        }))
    }
}
