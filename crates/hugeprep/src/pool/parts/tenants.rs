//! The tenants: each principal's limits, the files kept aside on their account, the key that
//! names their lease directories, and the long-term pins of pinned leases.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::pool::{kept, tenant};

/// What the pool keeps per tenant (see the module).
#[derive(Debug)]
pub(in crate::pool) struct Tenants {
    /// The limits of each principal that asked for a lease since the start (see `tenant`).
    pub(in crate::pool) limits: Mutex<BTreeMap<String, crate::policy::tenants::Limits>>,
    /// Released files a read lease kept from the kernel's path, charged to their principal
    /// until they can be truncated (see `kept`).
    pub(in crate::pool) kept: kept::Kept,
    /// The key that names tenants' lease directories (see `tenant::scope_dir`).
    pub(in crate::pool) scope_key: tenant::ScopeKey,
    /// Long-term pins of pinned leases, by file id; dropped at release or shutdown.
    pub(in crate::pool) pins: Mutex<BTreeMap<u64, crate::pool::host::Pin>>,
}

impl Tenants {
    pub(super) fn new(scope_key: tenant::ScopeKey) -> Tenants {
        Tenants {
            limits: Mutex::new(BTreeMap::new()),
            kept: kept::Kept::default(),
            scope_key,
            pins: Mutex::new(BTreeMap::new()),
        }
    }
}
