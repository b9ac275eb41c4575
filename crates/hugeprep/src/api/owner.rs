//! Leases belong to the principal that made them ([`Caller::principal`], journaled with the
//! lease): only it or an admin may see a lease (its path is the VM's memory), release it or
//! change it. Anyone else is answered `404 Not Found`, exactly as for a lease that does not
//! exist, and `GET /v1/leases` lists only the caller's own: a `403` would confirm that the
//! id is live and someone else's, which is all a caller probing ids needs to learn.

use super::access::{Caller, Role};
use super::error::ApiError;
use crate::pool::{LeaseInfo, Pool, PoolError};

/// Whether `caller` may see, release or change the lease `info`.
pub fn may_touch(caller: &Caller, info: &LeaseInfo) -> bool {
    caller.role == Role::Admin || info.principal.as_deref() == Some(caller.principal.as_str())
}

/// The leases of `all` that `caller` may see.
pub fn visible(caller: &Caller, all: Vec<LeaseInfo>) -> Vec<LeaseInfo> {
    all.into_iter().filter(|l| may_touch(caller, l)).collect()
}

/// Lease `id` if `caller` may touch it; otherwise the same 404 as for no such lease. Runs
/// before [`Pool::release`], so a refused release changes nothing.
pub fn owned(pool: &Pool, caller: &Caller, id: u64) -> Result<LeaseInfo, ApiError> {
    let info = pool.get(id)?;
    if !may_touch(caller, &info) {
        tracing::warn!(lease = id, caller = %caller.principal, owner = ?info.principal, "lease of another principal: answered as not found");
        return Err(PoolError::NotFound { id }.into());
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(principal: Option<&str>) -> LeaseInfo {
        LeaseInfo {
            id: 1,
            name: "vm".into(),
            path: "/x".into(),
            size: 2 << 20,
            node: 0,
            page_size: crate::PageSize::Size2M,
            source: crate::pool::LeaseSource::Cold,
            ready_ms: 0.0,
            uid: None,
            pid: None,
            pinned: false,
            principal: principal.map(Into::into),
        }
    }

    #[test]
    fn only_the_maker_or_an_admin_may_touch_a_lease() {
        let caller = |p: &str, role| Caller {
            principal: p.into(),
            role,
        };
        let mine = lease(Some("uid:64055"));
        assert!(may_touch(&caller("uid:64055", Role::Lease), &mine));
        assert!(!may_touch(&caller("uid:64056", Role::Lease), &mine));
        assert!(may_touch(&caller("uid:0", Role::Admin), &mine));
        // Leases from before principals were journaled: admin only.
        assert!(!may_touch(&caller("uid:64055", Role::Lease), &lease(None)));
    }
}
