//! A [`Pool`] on a [`SimHost`](super::sim::SimHost): the real driver without hugetlbfs,
//! BPF or root (the unit tests of the driver run as uid 65534).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::sim::SimHost;
use super::Host;
use crate::clear::{ClearPlan, Method};
use crate::page_size::PageSize;
use crate::pool::{parts, reach, Pool, PoolError, PoolMount, PoolPolicy, Result};
use crate::scrub::Scrubber;
use crate::topology::Topology;

impl Pool {
    /// A pool of `policy` whose every effect goes to `host`, with plain directories below
    /// `dir` standing for the mounts of `page_sizes` and holding its small state files (the
    /// tenants' key, the API's targets; the reservations' ledger is the host's). It recovers from what the
    /// host keeps (nothing, the first time; a crashed daemon's journal and files after),
    /// with the daemon's own recovery; no worker or keeper runs (tests drive the worker's
    /// jobs one at a time).
    pub(in crate::pool) fn with_host(
        host: Arc<SimHost>,
        dir: &Path,
        page_sizes: &[PageSize],
        policy: PoolPolicy,
    ) -> Result<Arc<Pool>> {
        let topology = Topology::detect().map_err(|e| PoolError::Io {
            op: "reading topology",
            path: "/sys/devices/system/node".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let state_dir = dir.join("state");
        create_dir(&state_dir)?;
        let mounts = Arc::new(sim_mounts(&host, dir, page_sizes)?);
        let pools = Arc::clone(&host) as Arc<dyn super::KernelPools>;
        let files = parts::StateFiles::open(&state_dir, pools, &mounts, &topology)?;
        // Recovery on what the host keeps (nothing, the first time), as `Pool::open` does.
        let recovered = crate::pool::recover_core(host.as_ref(), 1 << 20)?;
        let scrubber =
            Scrubber::new(ClearPlan::always(Method::WriteBytes)).map_err(|e| PoolError::Field {
                field: "method",
                message: e.to_string(),
            })?;
        let pool = parts::Build {
            mounts,
            topology,
            policy,
            host: host as Arc<dyn Host>,
            scrubber: Arc::new(scrubber),
            // The walk never loads the kernel counts' BPF probe; the proofs are the host's.
            reach: reach::Reach::proving(Some(reach::Method::ProcWalk)),
            files,
            recovered,
        }
        .finish();
        // As `Pool::open`; the tests run the keeper's turns themselves.
        pool.adopt_kept();
        Ok(pool)
    }
}

fn create_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|source| PoolError::Io {
        op: "creating",
        path: path.to_path_buf(),
        source,
    })
}

/// Plain directories below `dir` standing for the mounts of `page_sizes`, their lease
/// directories told to `host`.
fn sim_mounts(
    host: &SimHost,
    dir: &Path,
    page_sizes: &[PageSize],
) -> Result<BTreeMap<PageSize, PoolMount>> {
    let mut mounts = BTreeMap::new();
    for &ps in page_sizes {
        let root = dir.join(format!("mount-{}", ps.name()));
        create_dir(&root)?;
        let mount = PoolMount::new(&root, ps)?;
        host.set_lease_dir(ps, mount.lease_dir.clone());
        mounts.insert(ps, mount);
    }
    Ok(mounts)
}
