//! Starts weighed per principal: how much one lessee may teach an adaptive target's
//! forecast. Every lease is a VM start, but a tenant's lease-and-release churn is not a
//! host's demand: counted whole, its churn could raise the plan to the `ceiling` (and,
//! through the pooled shape, keep it there for weeks), or its many small spaced leases could
//! lower it until honest VMs start cold. So a principal with the lease role counts at most
//! its `starts_per_hour` (`[pool.limits]`, by default
//! [`DEFAULT_STARTS_PER_HOUR`](crate::policy::tenants::DEFAULT_STARTS_PER_HOUR), one) starts
//! of each clock hour; its further starts that hour are leased as ever but not counted.
//! Admins (root), principals whose `starts_per_hour` is `"none"` (a control plane the
//! operator trusts) and the daemon's own callers count whole, except the libvirt hook's
//! leases (`libvirt-<uuid>-<alias>`): a cloud tenant can restart its own VM in a loop
//! (`openstack server reboot --hard`), and each restart is a hook lease, so each domain's
//! backend counts once per clock hour. At most [`PRINCIPALS_PER_HOUR`] lease-role
//! principals count in one hour: who may lease is the operator's choice (the socket's
//! group, tokens), and this bounds what the map holds even so. At most
//! [`VMS_PER_HOUR`] hook leases are told apart in one hour; the starts of further VMs count
//! whole (a tenant would need that many domains of its own to reach it).

use std::collections::{BTreeMap, BTreeSet};

/// Lease-role principals counted in one clock hour; the starts of any further ones that
/// hour are not counted.
pub const PRINCIPALS_PER_HOUR: usize = 256;

/// Hook leases (domain backends) told apart in one clock hour.
pub const VMS_PER_HOUR: usize = 4096;

/// Who made a start, as the forecast weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starter<'a> {
    /// An admin or the daemon's own caller: counts whole.
    Operator,
    /// A lease-role principal (`uid:N`, `token:NAME`, ...) and its starts counted per
    /// clock hour.
    Tenant(&'a str, u64),
    /// The libvirt hook's lease of one domain's backend (its lease name): counts once per
    /// clock hour.
    Vm(&'a str),
}

impl<'a> Starter<'a> {
    /// Who a lease named `name` made for `tenant` was made by (none: the daemon's own
    /// caller).
    pub fn of(tenant: Option<&'a crate::pool::tenant::Tenant>, name: &'a str) -> Starter<'a> {
        match tenant {
            Some(t) if !t.admin => match t.limits.starts_per_hour {
                Some(n) => Starter::Tenant(&t.principal, n),
                None => Starter::Operator,
            },
            _ if crate::vmm::libvirt::plan::lease_uuid(name).is_some() => Starter::Vm(name),
            _ => Starter::Operator,
        }
    }
}

/// The starts counted this clock hour, per lease-role principal.
#[derive(Debug, Clone, Default)]
pub struct Weigh {
    hour: i64,
    counted: BTreeMap<String, u64>,
    /// The hook leases counted this hour.
    vms: BTreeSet<String>,
    /// Starts not counted since the daemon started.
    pub dropped: u64,
}

impl Weigh {
    /// Whether a start by `who` at local time `at_s` counts (and, if so, notes it).
    pub fn counts(&mut self, who: Starter<'_>, at_s: f64) -> bool {
        let hour = (at_s / 3600.0).floor() as i64;
        if hour != self.hour {
            self.hour = hour;
            self.counted.clear();
            self.vms.clear();
        }
        let (principal, per_hour) = match who {
            Starter::Operator => return true,
            Starter::Vm(name) => return self.vm_counts(name),
            Starter::Tenant(principal, per_hour) => (principal, per_hour),
        };
        let full = self.counted.len() >= PRINCIPALS_PER_HOUR;
        let n = match self.counted.get_mut(principal) {
            Some(n) => n,
            None if full => {
                self.dropped += 1;
                return false;
            }
            None => self.counted.entry(principal.to_owned()).or_insert(0),
        };
        if *n >= per_hour {
            self.dropped += 1;
            return false;
        }
        *n += 1;
        true
    }

    /// Whether a hook lease counts: once per hour per name, whole past [`VMS_PER_HOUR`].
    fn vm_counts(&mut self, name: &str) -> bool {
        if self.vms.contains(name) {
            self.dropped += 1;
            return false;
        }
        if self.vms.len() < VMS_PER_HOUR {
            self.vms.insert(name.to_owned());
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_counts_its_share_of_each_hour_operators_count_whole() {
        let mut w = Weigh::default();
        let t = Starter::Tenant("uid:1000", 3);
        let counted = (0..100).filter(|i| w.counts(t, *i as f64)).count();
        assert_eq!(counted, 3);
        assert_eq!(w.dropped, 97);
        assert!((0..100).all(|i| w.counts(Starter::Operator, i as f64)));
        // Another tenant has its own share; the next hour each has a new one.
        assert!(w.counts(Starter::Tenant("uid:1001", 1), 200.0));
        assert!(w.counts(t, 3600.0));
    }

    #[test]
    fn a_hook_lease_counts_once_an_hour_per_domain_backend() {
        let mut w = Weigh::default();
        let a = "libvirt-0e1f2a3b-4c5d-4e6f-8091-a2b3c4d5e6f7-ram-node0";
        let b = "libvirt-0e1f2a3b-4c5d-4e6f-8091-a2b3c4d5e6f7-ram-node1";
        assert_eq!(Starter::of(None, a), Starter::Vm(a));
        assert_eq!(Starter::of(None, "vm-1"), Starter::Operator);
        // Hard reboots in a loop: the first counts, the rest of the hour not.
        let counted = (0..100)
            .filter(|i| w.counts(Starter::Vm(a), *i as f64))
            .count();
        assert_eq!(counted, 1);
        // The domain's other backend is part of the same start; the next hour counts again.
        assert!(w.counts(Starter::Vm(b), 100.0));
        assert!(w.counts(Starter::Vm(a), 3600.0));
    }

    #[test]
    fn principals_past_the_bound_do_not_count() {
        let mut w = Weigh::default();
        for i in 0..PRINCIPALS_PER_HOUR {
            assert!(w.counts(Starter::Tenant(&format!("uid:{i}"), 1), 10.0));
        }
        assert!(!w.counts(Starter::Tenant("uid:99999", 1), 10.0));
        assert!(w.counts(Starter::Tenant("uid:99999", 1), 3600.0));
        assert!(!w.counts(Starter::Tenant("uid:99999", 1), 3601.0));
    }
}
