//! Which of Placement's allocations are VMs about to start, per consumer (a VM; Nova's
//! instance UUID is Placement's consumer UUID and the libvirt domain's UUID).
//!
//! Nova keeps a stopped (`SHUTOFF`) instance's allocation with no lease behind it, so an
//! allocation alone would count every stopped VM as due for as long as it stays stopped,
//! and a tenant could raise the warm target just by stopping VMs. A VM that is due leases
//! within seconds of its allocation, so a consumer counts as due only for [`DUE_FOR`]
//! after it first appeared, and never when it was there at the first reading (allocated
//! before the daemon looked; so is every consumer of a reading that comes more than
//! [`DUE_FOR`] after the one before).
//!
//! A consumer stops being due when a lease of its own is seen: a name the libvirt hook
//! derives for its domain, `libvirt-<uuid>-<alias>` (only an admin may lease such names,
//! `pool::tenant`), the UUIDs compared without case. Once seen, it stays served. Other
//! leases (a tenant's, an operator's by another name) remove nobody's demand: a tenant
//! that leases cannot hide the VMs about to start.
//!
//! Nova moves allocations between consumers without starting anything: a resize or a
//! migration moves the source host's allocation to the migration record's UUID, and a
//! revert moves it back to the instance's. So a consumer that appears in the reading where
//! one with the same amounts left takes that one's place (due only if it was), and a UUID
//! that was here within [`REMEMBERED_FOR`] is never due when it comes back: a tenant cannot
//! keep a stopped VM due by resizing it and reverting, again and again.
//!
//! At most [`MAX_CONSUMERS`] consumers are kept, and as many gone UUIDs: past the bound the
//! oldest go first (a hostile or broken Placement cannot grow the daemon's memory; one that
//! lists more than that many on one host can make a forgotten consumer count again as new,
//! for [`DUE_FOR`], within the target's ceiling). At most [`MAX_DUE`] consumers of a page
//! size are due at once, the largest: a Placement that lists thousands of tiny consumers
//! cannot make the plan thousands of files no VM can use.
//!
//! Pure: the caller gives the time of each reading and of each question.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::page_size::PageSize;

/// How long a new allocation counts as a VM about to start.
pub const DUE_FOR: Duration = Duration::from_secs(120);

/// The most consumers kept (the oldest go first past it), and the most gone UUIDs.
pub const MAX_CONSUMERS: usize = 4096;

/// How long a consumer that left is remembered: back within it, it is not due.
pub const REMEMBERED_FOR: Duration = Duration::from_secs(3600);

/// The most consumers of a page size due at once (the largest): more VMs than this about
/// to start on one host within [`DUE_FOR`] are left to the forecast.
pub const MAX_DUE: usize = 64;

/// One consumer's allocations of the warm classes: bytes per page size.
pub type Allocated = BTreeMap<PageSize, u64>;

/// The domain UUID of a lease name the hook derives (`libvirt-<uuid>-<alias>`), as given:
/// `None` for any other name (a tenant's, journaled as `.<scope>/<name>`, never is one).
pub fn hook_uuid(journaled: &str) -> Option<&str> {
    crate::vmm::libvirt::plan::lease_uuid(journaled)
        .filter(|u| crate::vmm::libvirt::domain::is_uuid(u))
}

/// A consumer seen in Placement's readings.
#[derive(Debug, Clone)]
struct Consumer {
    /// When it first appeared.
    first_seen: Instant,
    /// Whether it was there at the first reading: never due.
    before: bool,
    /// Whether a lease of its own has been seen: due no more.
    leased: bool,
    allocated: Allocated,
}

/// Placement's consumers of the warm classes, as last read, and since when each is there.
#[derive(Debug, Default)]
pub struct Due {
    /// By UUID in lower case.
    consumers: HashMap<String, Consumer>,
    /// The UUIDs (in lower case) of consumers that left, and when.
    gone: HashMap<String, Instant>,
    /// When the last reading was made.
    last: Option<Instant>,
}

impl Due {
    /// When the last reading was made.
    pub fn last(&self) -> Option<Instant> {
        self.last
    }

    /// Records a reading made at `now`: every consumer with allocations of a warm class
    /// (UUID, bytes per page size). Returns whether a consumer appeared that is due.
    pub fn record(
        &mut self,
        now: Instant,
        reading: impl IntoIterator<Item = (String, Allocated)>,
    ) -> bool {
        let first = self
            .last
            .map_or(true, |t| now.saturating_duration_since(t) > DUE_FOR);
        // The reading by UUID in lower case (the same UUID twice: the last amounts).
        let mut read: HashMap<String, Allocated> = HashMap::new();
        for (uuid, allocated) in reading {
            if allocated.values().any(|&b| b > 0) {
                read.insert(uuid.to_ascii_lowercase(), allocated);
            }
        }
        let mut old = std::mem::take(&mut self.consumers);
        // Those that left in this reading, by their amounts: a newcomer with the same
        // amounts is their allocation moved (see the module's doc).
        let mut moved: BTreeMap<Allocated, Vec<Consumer>> = BTreeMap::new();
        for (uuid, c) in old.iter().filter(|(k, _)| !read.contains_key(*k)) {
            self.gone.insert(uuid.clone(), now);
            moved
                .entry(c.allocated.clone())
                .or_default()
                .push(c.clone());
        }
        self.gone
            .retain(|_, &mut t| now.saturating_duration_since(t) <= REMEMBERED_FOR);
        let mut appeared = false;
        for (key, allocated) in read {
            let consumer = if let Some(c) = old.remove(&key) {
                Consumer { allocated, ..c }
            } else if let Some(c) = moved.get_mut(&allocated).and_then(Vec::pop) {
                self.gone.remove(&key);
                Consumer { allocated, ..c }
            } else {
                let back = self.gone.remove(&key).is_some();
                appeared |= !first && !back;
                Consumer {
                    first_seen: now,
                    before: first || back,
                    leased: false,
                    allocated,
                }
            };
            self.consumers.insert(key, consumer);
        }
        keep_newest(&mut self.consumers, |c| c.first_seen);
        keep_newest(&mut self.gone, |&t| t);
        self.last = Some(now);
        appeared
    }

    /// Notes the consumers (UUIDs in lower case) a lease of the hook's belongs to: they are
    /// due no more, now or later.
    pub fn leased(&mut self, uuids: &HashSet<String>) {
        for uuid in uuids {
            if let Some(c) = self.consumers.get_mut(uuid) {
                c.leased = true;
            }
        }
    }

    /// The sizes of the consumers due at `now`, per page size, largest first: appeared
    /// after the first reading, at most [`DUE_FOR`] ago, and no lease of theirs seen.
    pub fn pending(&self, now: Instant) -> BTreeMap<PageSize, Vec<u64>> {
        let mut out: BTreeMap<PageSize, Vec<u64>> = BTreeMap::new();
        let due = self.consumers.values().filter(|c| {
            !c.before && !c.leased && now.saturating_duration_since(c.first_seen) <= DUE_FOR
        });
        for c in due {
            for (&ps, &bytes) in c.allocated.iter().filter(|&(_, &b)| b > 0) {
                out.entry(ps).or_default().push(bytes);
            }
        }
        for sizes in out.values_mut() {
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            sizes.truncate(MAX_DUE);
        }
        out
    }

    /// How many consumers are kept.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.consumers.len()
    }
}

/// Forgets the oldest entries of `map` (by `at`) past [`MAX_CONSUMERS`].
fn keep_newest<V>(map: &mut HashMap<String, V>, at: impl Fn(&V) -> Instant) {
    let excess = map.len().saturating_sub(MAX_CONSUMERS);
    if excess == 0 {
        return;
    }
    let mut by_age: Vec<(Instant, &String)> = map.iter().map(|(k, v)| (at(v), k)).collect();
    by_age.select_nth_unstable(excess - 1);
    let oldest: Vec<String> = by_age[..excess].iter().map(|&(_, k)| k.clone()).collect();
    for k in oldest {
        map.remove(&k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;
    const PS: PageSize = PageSize::Size2M;

    fn uuid(n: u32) -> String {
        format!("5b1e7c2a-4444-4d6f-9a8b-{n:012x}")
    }

    fn reading(vms: &[(u32, u64)]) -> Vec<(String, Allocated)> {
        vms.iter()
            .map(|&(n, b)| (uuid(n), BTreeMap::from([(PS, b)])))
            .collect()
    }

    fn at(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    fn sizes(due: &Due, now: Instant) -> Vec<u64> {
        due.pending(now).remove(&PS).unwrap_or_default()
    }

    #[test]
    fn the_first_reading_is_not_due_and_a_new_consumer_is_until_the_window_ends() {
        let t0 = Instant::now();
        let mut due = Due::default();
        // Stopped VMs' 8 GiB were allocated before the daemon read them: never due.
        assert!(!due.record(t0, reading(&[(1, 4 * G), (2, 4 * G)])));
        assert!(sizes(&due, t0).is_empty());
        assert!(!due.record(at(t0, 60), reading(&[(1, 4 * G), (2, 4 * G)])));
        assert!(sizes(&due, at(t0, 60)).is_empty());
        // Nova allocates 4 GiB and 2 GiB: each due at once, with its size.
        assert!(due.record(at(t0, 65), reading(&[(1, 4 * G), (2, 4 * G), (3, 4 * G)])));
        assert!(due.record(
            at(t0, 70),
            reading(&[(1, 4 * G), (2, 4 * G), (3, 4 * G), (4, 2 * G)])
        ));
        assert_eq!(sizes(&due, at(t0, 70)), [4 * G, 2 * G]);
        assert_eq!(sizes(&due, at(t0, 185)), [4 * G, 2 * G]);
        // Two minutes on, each is not coming any more (stopped, or never started).
        assert_eq!(sizes(&due, at(t0, 186)), [2 * G]);
        assert!(sizes(&due, at(t0, 191)).is_empty());
        // A deleted VM's allocation going away is not due either.
        assert!(!due.record(at(t0, 200), reading(&[(1, 4 * G)])));
        assert!(sizes(&due, at(t0, 200)).is_empty());
        assert!(!due.pending(at(t0, 200)).contains_key(&PageSize::Size1G));
    }

    #[test]
    fn only_a_lease_of_its_own_removes_a_consumer_and_for_good() {
        let t0 = Instant::now();
        let mut due = Due::default();
        due.record(t0, reading(&[]));
        due.record(at(t0, 5), reading(&[(1, 4 * G), (2, 2 * G)]));
        // A tenant's lease (any other name) is no consumer's: nothing is noted.
        due.leased(&HashSet::new());
        assert_eq!(sizes(&due, at(t0, 10)), [4 * G, 2 * G]);
        // The hook leases VM 1's memory: it is served, and stays so after its release.
        due.leased(&HashSet::from([uuid(1)]));
        assert_eq!(sizes(&due, at(t0, 10)), [2 * G]);
        due.leased(&HashSet::new());
        due.record(at(t0, 15), reading(&[(1, 4 * G), (2, 2 * G)]));
        assert_eq!(sizes(&due, at(t0, 15)), [2 * G]);
    }

    #[test]
    fn only_the_hooks_names_give_a_uuid() {
        let u = uuid(7);
        assert_eq!(hook_uuid(&format!("libvirt-{u}-ua-ram")), Some(u.as_str()));
        let upper = u.to_ascii_uppercase();
        assert_eq!(
            hook_uuid(&format!("libvirt-{upper}-ram-node0")),
            Some(upper.as_str())
        );
        for name in [
            format!("libvirt-{u}"),
            format!("libvirt-{u}-"),
            format!("vm-{u}-ua-ram"),
            format!(".uid-1000/libvirt-{u}-ua-ram"),
            "libvirt-not-a-uuid-at-all-but-36-bytes-long-ua-ram".to_string(),
        ] {
            assert_eq!(hook_uuid(&name), None, "{name}");
        }
    }

    #[test]
    fn uuids_are_compared_without_case() {
        let t0 = Instant::now();
        let mut due = Due::default();
        due.record(t0, reading(&[]));
        let upper = uuid(7).to_ascii_uppercase();
        assert!(due.record(at(t0, 5), [(upper.clone(), BTreeMap::from([(PS, G)]))]));
        assert_eq!(sizes(&due, at(t0, 5)), [G]);
        // Read again in lower case: the same consumer, not a new one.
        assert!(!due.record(at(t0, 10), reading(&[(7, G)])));
        due.leased(&HashSet::from([uuid(7)]));
        assert!(sizes(&due, at(t0, 10)).is_empty());
    }

    #[test]
    fn a_reading_after_a_long_gap_counts_as_a_first() {
        let t0 = Instant::now();
        let mut due = Due::default();
        due.record(t0, reading(&[]));
        // Placement was unreachable for three minutes: what appeared meanwhile is not known
        // to be new.
        assert!(!due.record(at(t0, 180), reading(&[(1, G)])));
        assert!(sizes(&due, at(t0, 180)).is_empty());
    }

    #[test]
    fn consumers_are_bounded_and_the_oldest_go_first() {
        let t0 = Instant::now();
        let mut due = Due::default();
        due.record(t0, reading(&[]));
        let n = MAX_CONSUMERS as u32;
        let old: Vec<(u32, u64)> = (0..n).map(|i| (i, G)).collect();
        due.record(at(t0, 5), reading(&old));
        assert_eq!(due.kept(), MAX_CONSUMERS);
        // Ten more appear: the ten oldest of the first go.
        let mut all = old.clone();
        all.extend((n..n + 10).map(|i| (i, 2 * G)));
        due.record(at(t0, 10), reading(&all));
        assert_eq!(due.kept(), MAX_CONSUMERS);
        let pending = sizes(&due, at(t0, 10));
        assert_eq!(pending.len(), MAX_DUE, "the largest due, no more");
        assert_eq!(pending.iter().filter(|&&b| b == 2 * G).count(), 10);
        // A reading far past the bound keeps no more than it either.
        let many: Vec<(u32, u64)> = (0..3 * n).map(|i| (i, G)).collect();
        due.record(at(t0, 15), reading(&many));
        assert_eq!(due.kept(), MAX_CONSUMERS);
    }

    #[test]
    fn a_moved_allocation_is_no_start_and_a_uuid_back_within_the_hour_is_not_due() {
        let t0 = Instant::now();
        let mut due = Due::default();
        // VM 1 is stopped (allocated before the daemon looked).
        due.record(t0, reading(&[(1, 4 * G)]));
        // A resize moves its allocation to the migration's UUID (100), and a revert moves
        // it back: neither is a VM about to start, however often the tenant repeats it.
        for (i, moved) in [100, 1, 101, 1].into_iter().enumerate() {
            let s = 5 * (i as u64 + 1);
            assert!(
                !due.record(at(t0, s), reading(&[(moved, 4 * G)])),
                "step {i}"
            );
            assert!(sizes(&due, at(t0, s)).is_empty(), "step {i}");
        }
        // A migration UUID that left comes back with other amounts (a resize to another
        // flavor reverted): remembered, not due.
        assert!(!due.record(at(t0, 30), reading(&[(1, 4 * G), (100, 2 * G)])));
        assert!(sizes(&due, at(t0, 30)).is_empty());
        // A VM due when its allocation moves stays due, for what is left of its window.
        assert!(due.record(at(t0, 35), reading(&[(1, 4 * G), (100, 2 * G), (2, G)])));
        assert!(!due.record(at(t0, 40), reading(&[(1, 4 * G), (100, 2 * G), (102, G)])));
        assert_eq!(sizes(&due, at(t0, 40)), [G]);
        assert!(sizes(&due, at(t0, 35 + 121)).is_empty());
        // An hour after it left, a UUID is new again.
        let later = 40 + REMEMBERED_FOR.as_secs() + 5;
        due.record(
            at(t0, later - 5),
            reading(&[(1, 4 * G), (100, 2 * G), (102, G)]),
        );
        assert!(due.record(
            at(t0, later),
            reading(&[(1, 4 * G), (100, 2 * G), (102, G), (2, 3 * G)])
        ));
        assert_eq!(sizes(&due, at(t0, later)), [3 * G]);
    }

    #[test]
    fn thousands_of_tiny_consumers_make_no_more_than_the_largest_due() {
        let t0 = Instant::now();
        let mut due = Due::default();
        due.record(t0, reading(&[]));
        let mut vms: Vec<(u32, u64)> = (0..2000).map(|i| (i, 2 << 20)).collect();
        vms.push((5000, 8 * G));
        due.record(at(t0, 5), reading(&vms));
        let pending = sizes(&due, at(t0, 5));
        assert_eq!(pending.len(), MAX_DUE);
        assert_eq!(pending[0], 8 * G, "the largest first");
    }
}
