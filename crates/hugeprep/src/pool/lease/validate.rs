//! A lease request checked against the limits, and the node of one that names none.

use super::super::placement::{self, NodeSupply};
use super::*;

impl Pool {
    /// Checks a request against the limits; allocates and changes nothing.
    pub fn validate(&self, req: &LeaseRequest) -> Result<ValidRequest> {
        check_name(&req.name)?;
        let page_size = req.page_size.unwrap_or(PageSize::Size2M);
        self.mount(page_size)?;
        let node = match req.node {
            Some(node) => node,
            None => self.default_node(req.pid, page_size),
        };
        self.settings
            .topology
            .node(node)
            .map_err(|e| PoolError::Field {
                field: "node",
                message: e.to_string(),
            })?;
        crate::hugetlb::check_size(req.size, page_size).map_err(|e| PoolError::Field {
            field: "size",
            message: e.to_string(),
        })?;
        let owner = match &req.owner {
            None => None,
            Some(user) => Some(Owner::lookup(user).map_err(|e| PoolError::Field {
                field: "owner",
                message: e.to_string(),
            })?),
        };
        let pid = match req.pid {
            None => None,
            Some(pid) => {
                let start =
                    crate::sys::pidfd::process_start_time(pid).ok_or_else(|| PoolError::Field {
                        field: "pid",
                        message: format!("no process with pid {pid}"),
                    })?;
                Some((pid, start))
            }
        };
        // The owner's rule by its uid, however the request named it (the libvirt hook sends
        // a number, a client may send a name).
        let recycle = self.policy().recycle_for(owner.map(|o| o.uid), req.recycle);
        Ok(ValidRequest {
            name: req.name.clone(),
            size: req.size,
            page_size,
            node,
            owner,
            pid,
            pin: req.pin,
            recycle,
            principal: None,
            tenant: None,
        })
    }

    /// The node of a request that names none ([`placement`] has the rule).
    fn default_node(&self, pid: Option<u32>, page_size: PageSize) -> u32 {
        let pid_cpus = pid.and_then(crate::sys::affinity::process_cpus);
        let warm: Vec<(u32, u64)> = {
            let st = self.lock();
            self.settings
                .topology
                .node_ids()
                .into_iter()
                .map(|node| {
                    let bytes = st
                        .of_kind(node, page_size)
                        .filter(|e| e.is_idle(&FileState::Warm))
                        .map(|e| e.rec().size)
                        .sum();
                    (node, bytes)
                })
                .collect()
        };
        let supply: Vec<NodeSupply> = warm
            .into_iter()
            .map(|(node, warm_bytes)| NodeSupply {
                node,
                warm_bytes,
                free_bytes: self.host.available_bytes(node, page_size),
            })
            .collect();
        let (node, why) =
            placement::choose_node(&self.settings.topology, pid_cpus.as_deref(), &supply);
        tracing::debug!(node, ?why, ?pid, "lease names no node");
        node
    }
}
