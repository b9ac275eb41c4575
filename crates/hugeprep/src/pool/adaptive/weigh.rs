//! Starts weighed per principal: how much one lessee may teach an adaptive target's
//! forecast. Every lease is a VM start, but a tenant's lease-and-release churn is not a
//! host's demand: counted whole, its churn could raise the plan to the `ceiling` (and,
//! through the pooled shape, keep it there for weeks), or its many small spaced leases could
//! lower it until honest VMs start cold. So a principal with the lease role counts at most
//! its `starts_per_hour` (`[pool.limits]`, by default
//! [`DEFAULT_STARTS_PER_HOUR`](crate::policy::tenants::DEFAULT_STARTS_PER_HOUR), one) starts
//! of each clock hour; its further starts that hour are leased as ever but not counted.
//! Admins (the libvirt hook, root), principals whose `starts_per_hour` is `"none"` (a
//! control plane the operator trusts) and the daemon's own callers count whole. At most
//! [`PRINCIPALS_PER_HOUR`] lease-role
//! principals count in one hour: who may lease is the operator's choice (the socket's
//! group, tokens), and this bounds what the map holds even so.

use std::collections::BTreeMap;

/// Lease-role principals counted in one clock hour; the starts of any further ones that
/// hour are not counted.
pub const PRINCIPALS_PER_HOUR: usize = 256;

/// Who made a start, as the forecast weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starter<'a> {
    /// An admin or the daemon's own caller: counts whole.
    Operator,
    /// A lease-role principal (`uid:N`, `token:NAME`, ...) and its starts counted per
    /// clock hour.
    Tenant(&'a str, u64),
}

impl<'a> Starter<'a> {
    /// Who a lease made for `tenant` was made by (none: the daemon's own caller).
    pub fn of(tenant: Option<&'a crate::pool::tenant::Tenant>) -> Starter<'a> {
        match tenant {
            Some(t) if !t.admin => match t.limits.starts_per_hour {
                Some(n) => Starter::Tenant(&t.principal, n),
                None => Starter::Operator,
            },
            _ => Starter::Operator,
        }
    }
}

/// The starts counted this clock hour, per lease-role principal.
#[derive(Debug, Clone, Default)]
pub struct Weigh {
    hour: i64,
    counted: BTreeMap<String, u64>,
    /// Starts not counted since the daemon started.
    pub dropped: u64,
}

impl Weigh {
    /// Whether a start by `who` at local time `at_s` counts (and, if so, notes it).
    pub fn counts(&mut self, who: Starter<'_>, at_s: f64) -> bool {
        let Starter::Tenant(principal, per_hour) = who else {
            return true;
        };
        let hour = (at_s / 3600.0).floor() as i64;
        if hour != self.hour {
            self.hour = hour;
            self.counted.clear();
        }
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
