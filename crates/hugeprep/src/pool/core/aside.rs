//! Released files still held by someone (an open descriptor, a mapping, an io_uring buffer
//! of a process other than the daemon): they wait aside instead of holding the worker.
//!
//! The worker proves a released file once. When the answer is "still held", the file goes
//! back to dirty and waits here; the worker proves it again after a backoff that doubles
//! from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`], and once [`BOUND`] has passed since the
//! first proof the file takes the kernel's path (truncated and deleted: every mapping of it
//! loses its pages, the refill faults new ones). Fresh releases go before files waiting
//! aside, so an honest release never queues behind a tenant's held files, but a file past
//! its bound goes before them: a stream of fresh releases cannot hold it past the bound.
//!
//! While a file waits aside its bytes count against its lessee's `held_bytes` limit (see
//! `pool::tenant`): a file whose lessee already has that much aside takes the kernel's path
//! at once, so the queue holds at most the sum of the principals' limits. Pure: the clock is
//! an argument.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The wait before the second proof of a held file.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(10);

/// The longest wait between two proofs of a held file.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long after its first proof a held file takes the kernel's path.
pub const BOUND: Duration = Duration::from_secs(10);

/// One released file waiting aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Aside {
    /// When it was first found held.
    pub(crate) since: Instant,
    /// When the worker proves it again.
    pub(crate) due: Instant,
    /// Proofs so far.
    pub(crate) tries: u32,
    /// The principal of its last lease (its `held_bytes` pay for it).
    pub(crate) principal: Option<String>,
    /// Its size.
    pub(crate) bytes: u64,
}

/// What to do with a file found held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Wait aside; prove it again at this time.
    Wait(Instant),
    /// Its bound has passed: the kernel's path.
    BoundPassed,
    /// Its lessee has `limit` bytes aside already (`held` with this file): the kernel's path.
    OverLimit {
        /// Bytes aside for the principal with this file.
        held: u64,
        /// The principal's limit.
        limit: u64,
    },
}

/// The files waiting aside, by file id.
#[derive(Debug, Default)]
pub(crate) struct AsideQueue {
    files: BTreeMap<u64, Aside>,
}

impl AsideQueue {
    /// File `id`'s proof found it held at `now`, holding `bytes` (its extent now): wait
    /// (with the next time) or the kernel's path. `limit`: the principal's `held_bytes`
    /// (`None`: no limit), checked at every proof with the file's current `bytes`.
    pub(crate) fn held(
        &mut self,
        id: u64,
        principal: Option<&str>,
        bytes: u64,
        limit: Option<u64>,
        now: Instant,
    ) -> Verdict {
        let known = self.files.get(&id).cloned();
        let since = known.as_ref().map_or(now, |a| a.since);
        if now.saturating_duration_since(since) >= BOUND {
            self.files.remove(&id);
            return Verdict::BoundPassed;
        }
        // At every proof, with what the file holds now (its lessee's holder may have grown
        // it since the first): the principal's other files aside, plus this one's extent.
        let others = self
            .held_bytes(principal)
            .saturating_sub(known.as_ref().map_or(0, |a| a.bytes));
        let held = others.saturating_add(bytes);
        if let Some(limit) = limit.filter(|&l| held > l) {
            self.files.remove(&id);
            return Verdict::OverLimit { held, limit };
        }
        let tries = known.as_ref().map_or(0, |a| a.tries) + 1;
        let wait = FIRST_BACKOFF
            .saturating_mul(1u32 << (tries - 1).min(16))
            .min(MAX_BACKOFF);
        let due = (now + wait).min(since + BOUND);
        self.files.insert(
            id,
            Aside {
                since,
                due,
                tries,
                principal: principal.map(str::to_owned),
                bytes,
            },
        );
        Verdict::Wait(due)
    }

    /// Whether file `id` waits aside and is not due at `now`.
    pub(crate) fn waiting(&self, id: u64, now: Instant) -> bool {
        self.files.get(&id).is_some_and(|a| a.due > now)
    }

    /// Whether file `id` waits aside and its [`BOUND`] has passed at `now`: its next proof
    /// goes before every fresh release, so a stream of them cannot hold its pages out of
    /// the pool past the bound.
    pub(crate) fn past_bound(&self, id: u64, now: Instant) -> bool {
        self.files
            .get(&id)
            .is_some_and(|a| now.saturating_duration_since(a.since) >= BOUND)
    }

    /// Whether file `id` waits aside at all.
    pub(crate) fn contains(&self, id: u64) -> bool {
        self.files.contains_key(&id)
    }

    /// The file is no longer held aside (proven, scrubbed, deleted, or given up for room).
    pub(crate) fn remove(&mut self, id: u64) {
        self.files.remove(&id);
    }

    /// Keeps only the files `keep` says are still released and waiting.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        self.files.retain(|id, _| keep(*id));
    }

    /// The earliest time a file waiting aside is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.files.values().map(|a| a.due).min()
    }

    /// Bytes waiting aside for `principal`.
    pub(crate) fn held_bytes(&self, principal: Option<&str>) -> u64 {
        self.files
            .values()
            .filter(|a| a.principal.as_deref() == principal)
            .fold(0u64, |sum, a| sum.saturating_add(a.bytes))
    }

    /// Files and bytes waiting aside in all.
    pub(crate) fn totals(&self) -> (usize, u64) {
        (
            self.files.len(),
            self.files
                .values()
                .fold(0u64, |sum, a| sum.saturating_add(a.bytes)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn a_held_file_is_proven_again_with_a_doubling_backoff_until_its_bound() {
        let mut q = AsideQueue::default();
        let t0 = Instant::now();
        let mut now = t0;
        let mut waits = Vec::new();
        loop {
            match q.held(7, Some("uid:1000"), 2 * M, None, now) {
                Verdict::Wait(due) => {
                    assert!(q.waiting(7, now));
                    assert!(!q.waiting(7, due));
                    waits.push(due - now);
                    now = due;
                }
                Verdict::BoundPassed => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(waits[0], FIRST_BACKOFF);
        assert_eq!(waits[1], 2 * FIRST_BACKOFF);
        assert!(waits.iter().all(|w| *w <= MAX_BACKOFF), "{waits:?}");
        assert_eq!(now - t0, BOUND, "the last proof comes at the bound");
        assert!(!q.contains(7), "forgotten once it takes the kernel's path");
    }

    #[test]
    fn held_bytes_are_counted_per_principal_and_bounded_by_its_limit() {
        let mut q = AsideQueue::default();
        let now = Instant::now();
        let lim = Some(4 * M);
        assert!(matches!(
            q.held(1, Some("uid:1000"), 2 * M, lim, now),
            Verdict::Wait(_)
        ));
        assert!(matches!(
            q.held(2, Some("uid:1000"), 2 * M, lim, now),
            Verdict::Wait(_)
        ));
        assert_eq!(
            q.held(3, Some("uid:1000"), 2 * M, lim, now),
            Verdict::OverLimit {
                held: 6 * M,
                limit: 4 * M
            }
        );
        // Another tenant's files are its own.
        assert!(matches!(
            q.held(4, Some("uid:1001"), 2 * M, lim, now),
            Verdict::Wait(_)
        ));
        // A file already aside is proven again whatever the others hold.
        assert!(matches!(
            q.held(1, Some("uid:1000"), 2 * M, lim, now),
            Verdict::Wait(_)
        ));
        assert_eq!(q.held_bytes(Some("uid:1000")), 4 * M);
        assert_eq!(q.totals(), (3, 6 * M));
        q.remove(1);
        assert_eq!(q.held_bytes(Some("uid:1000")), 2 * M);
        q.retain(|id| id != 2);
        assert_eq!(q.next_due().is_some(), q.totals().0 > 0);
        assert_eq!(q.held_bytes(Some("uid:1000")), 0);
    }

    /// Review of issue 35: the limit was checked at a held file's first proof only, so a
    /// holder that grew the file (fallocate through a descriptor it kept) afterwards kept
    /// more than its lessee's limit aside until the bound.
    #[test]
    fn held_bytes_are_checked_again_with_the_extent_at_each_proof() {
        let mut q = AsideQueue::default();
        let now = Instant::now();
        let lim = Some(4 * M);
        assert!(matches!(
            q.held(1, Some("uid:1000"), 2 * M, lim, now),
            Verdict::Wait(_)
        ));
        assert!(matches!(
            q.held(2, Some("uid:1000"), 2 * M, lim, now),
            Verdict::Wait(_)
        ));
        // File 1 grew to 4M while it waited: 6M with file 2's, over the limit.
        assert_eq!(
            q.held(1, Some("uid:1000"), 4 * M, lim, now + FIRST_BACKOFF),
            Verdict::OverLimit {
                held: 6 * M,
                limit: 4 * M
            }
        );
        assert!(!q.contains(1), "forgotten once it takes the kernel's path");
        assert_eq!(q.held_bytes(Some("uid:1000")), 2 * M);
        // A file that shrank is counted at its new extent.
        assert!(matches!(
            q.held(2, Some("uid:1000"), M, lim, now + FIRST_BACKOFF),
            Verdict::Wait(_)
        ));
        assert_eq!(q.held_bytes(Some("uid:1000")), M);
    }
}
