//! The order in which the worker takes released files: fair between principals, then in the
//! order of their releases.
//!
//! The worker has one thread, and a file's proof and scrub (or its deletion) take it for a
//! while. Taken by file id, a tenant that leases and releases many files (or many small
//! ones) kept an honest release waiting behind its own: file ids are given when a file is
//! made, not when it is released. Now the next released file is that of the principal
//! served longest ago (a principal never served first), and of that principal the one
//! released first. So when `k` principals have released files waiting, each of them is
//! served within `k` jobs, however many files any one of them released; and one
//! principal's files go in release order. Files whose history is not known (recovered
//! after a restart) and failed leases have no principal: they share one turn.
//!
//! Pure: the worker says which files it may take (fresh releases before those waiting
//! aside, see `pool::aside`), the core answers, and a dirty file leaving for a scrub or a
//! deletion counts as its principal's turn.

use std::collections::BTreeMap;

/// When each principal was last served, on a counter of jobs.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    /// The job counter at each principal's last turn (`None`: files without a principal).
    /// One entry per principal ever served: principals are the peers the access rules let
    /// lease (uids, tokens), the same bound as the daemon's table of their limits. An
    /// entry is not dropped when its principal has nothing waiting: it would come back as
    /// never served, ahead of everyone.
    last: BTreeMap<Option<String>, u64>,
    /// Jobs counted so far.
    clock: u64,
}

/// A released file the worker may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiting<'a> {
    /// The file.
    pub(crate) id: u64,
    /// Its place in the order of releases (smaller: released earlier).
    pub(crate) released: u64,
    /// The principal of its last lease.
    pub(crate) principal: Option<&'a str>,
}

impl Turns {
    /// The next file of `waiting`: the principal served longest ago, then its earliest
    /// release (ties between principals served at once, or never: the earlier release).
    pub(crate) fn pick<'a>(&self, waiting: impl IntoIterator<Item = Waiting<'a>>) -> Option<u64> {
        waiting
            .into_iter()
            .min_by_key(|w| (self.turn(w.principal), w.released, w.id))
            .map(|w| w.id)
    }

    /// `principal`'s file was taken: its turn is now the latest.
    pub(crate) fn served(&mut self, principal: Option<&str>) {
        self.clock += 1;
        self.last.insert(principal.map(str::to_owned), self.clock);
    }

    /// When `principal` was last served (0: never).
    fn turn(&self, principal: Option<&str>) -> u64 {
        // The map's key owns its string; look it up without building one for a miss.
        self.last
            .iter()
            .find(|(p, _)| p.as_deref() == principal)
            .map_or(0, |(_, t)| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: u64, released: u64, principal: &str) -> Waiting<'_> {
        Waiting {
            id,
            released,
            principal: Some(principal),
        }
    }

    /// Serves `files` (id, release order, principal) to the end: the ids in the order taken.
    fn drain(turns: &mut Turns, mut files: Vec<(u64, u64, &str)>) -> Vec<u64> {
        let mut order = Vec::new();
        while let Some(id) = turns.pick(files.iter().map(|f| w(f.0, f.1, f.2))) {
            let at = files.iter().position(|f| f.0 == id).unwrap();
            let (_, _, p) = files.remove(at);
            turns.served(Some(p));
            order.push(id);
        }
        order
    }

    #[test]
    fn one_principal_s_files_go_in_release_order_not_by_id() {
        let mut t = Turns::default();
        // File 9 was released first, file 2 last.
        let order = drain(
            &mut t,
            vec![(2, 30, "uid:1"), (5, 20, "uid:1"), (9, 10, "uid:1")],
        );
        assert_eq!(order, vec![9, 5, 2]);
    }

    #[test]
    fn an_honest_release_behind_a_tenant_s_many_waits_one_job_at_most() {
        let mut t = Turns::default();
        // The tenant released 50 files (ids 1..=50) before the honest one (id 51).
        let mut files: Vec<(u64, u64, &str)> = (1..=50).map(|i| (i, i, "uid:65534")).collect();
        files.push((51, 51, "uid:65533"));
        let order = drain(&mut t, files);
        let at = order.iter().position(|&id| id == 51).unwrap();
        assert!(at <= 1, "the honest release was taken {at}th: {order:?}");
        // The tenant's own files still go in their order.
        let tenant: Vec<u64> = order.iter().copied().filter(|&id| id != 51).collect();
        assert_eq!(tenant, (1..=50).collect::<Vec<_>>());
    }

    #[test]
    fn principals_take_turns_whoever_released_more() {
        let mut t = Turns::default();
        let mut files: Vec<(u64, u64, &str)> = (1..=6).map(|i| (i, i, "a")).collect();
        files.extend((7..=9).map(|i| (i, i, "b")));
        files.push((10, 10, "c"));
        let order = drain(&mut t, files);
        assert_eq!(order, vec![1, 7, 10, 2, 8, 3, 9, 4, 5, 6]);
    }

    #[test]
    fn a_tenant_cycling_leases_cannot_keep_a_waiting_release_behind_it() {
        // The tenant releases a new file after every job; the other principal's one file,
        // released after the tenant's first, is taken within two jobs of its release.
        let mut t = Turns::default();
        t.served(Some("b")); // served long ago
        let mut waiting: Vec<(u64, u64, &str)> = vec![(1, 1, "a"), (2, 2, "b")];
        let mut taken = Vec::new();
        for next in 3..7 {
            let id = t.pick(waiting.iter().map(|f| w(f.0, f.1, f.2))).unwrap();
            let at = waiting.iter().position(|f| f.0 == id).unwrap();
            let (_, _, p) = waiting.remove(at);
            t.served(Some(p));
            taken.push(id);
            waiting.push((next, next, "a"));
        }
        let at = taken.iter().position(|&id| id == 2).unwrap();
        assert!(at <= 1, "{taken:?}");
    }

    #[test]
    fn files_without_a_principal_share_one_turn() {
        let mut t = Turns::default();
        let anon = |id, released| Waiting {
            id,
            released,
            principal: None,
        };
        assert_eq!(t.pick([anon(4, 2), anon(3, 5)]), Some(4));
        t.served(None);
        assert_eq!(t.pick([anon(3, 5), w(8, 9, "a")]), Some(8));
        assert_eq!(t.pick(std::iter::empty()), None);
    }
}
