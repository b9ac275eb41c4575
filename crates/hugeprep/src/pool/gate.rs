//! The start gate: background work (refills, background scrubs) waits while a VM start the
//! daemon can see is under way.
//!
//! What a refill contends on with a start (measured in `docs/pool.md`): the CPUs first (a
//! refill keeps one worker per CPU of the node busy, at normal priority for each populate
//! call), then the hugetlb fault mutexes and `hugetlb_lock` that a cold lease's fault and a
//! VMM's prealloc take per page, and memory bandwidth. Idle priority alone does not keep it
//! out of the way: each populate call leaves `SCHED_IDLE` for its length (it holds those
//! mutexes), so the gate stops the work between extents instead.
//!
//! A start is under way, for the gate:
//! - while a lease is being taken (from choosing its file to its commit: a cold or grown
//!   lease faults meanwhile), which covers a hook's `prepare`;
//! - for [`OPEN_WAIT`] after a lease is committed, until a process other than the daemon
//!   opens it (the VMM being started);
//! - for [`SETTLE`] after that first open (the VMM maps and touches the memory, sets up
//!   its devices and answers its control socket).
//!
//! A lease waiting for memory (urgent) and shutdown open the gate. So does a gate that has
//! stayed shut for [`MAX_DEFER`]: a host that leases without pause still gets its pool
//! refilled rather than serve every lease cold.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::reach::Reach;
use crate::background::Yield;
use crate::scrub::ScrubControl;

/// How long after its commit a lease nobody has opened yet keeps its start under way (at
/// most the lessee grace: a grace of zero turns the gate off).
pub const OPEN_WAIT: Duration = Duration::from_millis(1000);

/// How long after the first open by its VMM a lease's start stays under way (at most the
/// lessee grace).
pub const SETTLE: Duration = Duration::from_millis(1000);

/// How long the gate stays shut at most before background work goes on anyway.
pub const MAX_DEFER: Duration = Duration::from_secs(10);

/// How often waiting background work looks at the gate again.
const POLL: Duration = Duration::from_millis(5);

#[derive(Debug, Default)]
struct Starts {
    /// Leases being taken.
    in_flight: usize,
    /// Committed leases whose start may still be under way, by file id: when committed.
    leased: BTreeMap<u64, Instant>,
    /// Since when the gate has been shut without a break.
    shut_since: Option<Instant>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct StartGate {
    starts: Mutex<Starts>,
    reach: Arc<Reach>,
    control: Arc<ScrubControl>,
    /// Off: background work never waits for starts (as before the gate; benchmarks compare).
    enabled: AtomicBool,
    /// The lessee grace, ms (the one the pool keeps): the windows above are cut to it.
    grace_ms: AtomicU64,
}

/// A lease being taken; dropping it ends that part of its start.
#[derive(Debug)]
pub struct InFlight<'a>(&'a StartGate);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
    }
}

impl StartGate {
    /// A gate that reads first opens from `reach`, and opens for urgency and cancellation in
    /// `control`.
    pub fn new(reach: Arc<Reach>, control: Arc<ScrubControl>) -> StartGate {
        StartGate {
            starts: Mutex::new(Starts::default()),
            reach,
            control,
            enabled: AtomicBool::new(true),
            grace_ms: AtomicU64::new(u64::MAX),
        }
    }

    /// Cuts the gate's windows to the lessee grace (`lessee_grace_ms`; zero: no gate).
    pub fn set_grace(&self, grace: Duration) {
        let ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        self.grace_ms.store(ms, Ordering::Relaxed);
    }

    /// The lessee grace in force (see [`StartGate::set_grace`]).
    pub fn grace(&self) -> Duration {
        Duration::from_millis(self.grace_ms.load(Ordering::Relaxed))
    }

    /// Turns the gate on or off (off: background work never waits for a start).
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Starts> {
        self.starts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A lease begins: its start is under way until the guard is dropped, and then as
    /// [`StartGate::leased`] says.
    pub fn taking(&self) -> InFlight<'_> {
        self.lock().in_flight += 1;
        InFlight(self)
    }

    /// File `id` was leased at `now`: its VMM's start follows.
    pub fn leased(&self, id: u64, now: Instant) {
        self.lock().leased.insert(id, now);
    }

    /// File `id` is no longer leased.
    pub fn forget(&self, id: u64) {
        self.lock().leased.remove(&id);
    }

    /// Whether a start is under way at `now` (see the module documentation). Forgets starts
    /// that are over.
    pub fn under_way(&self, now: Instant) -> bool {
        let grace = self.grace();
        if !self.enabled.load(Ordering::Relaxed) || grace.is_zero() {
            return false;
        }
        let (open_wait, settle) = (OPEN_WAIT.min(grace), SETTLE.min(grace));
        let mut st = self.lock();
        let reach = &self.reach;
        st.leased
            .retain(|&id, &mut committed| match reach.first_open(id) {
                Some(opened) => now < opened + settle,
                None => now < committed + open_wait,
            });
        let shut = st.in_flight > 0 || !st.leased.is_empty();
        if !shut {
            st.shut_since = None;
            return false;
        }
        let since = *st.shut_since.get_or_insert(now);
        now < since + MAX_DEFER
    }

    /// Whether background work may run at `now`: no start under way, or a lease waits for
    /// the work, or the daemon is stopping.
    pub fn open(&self, now: Instant) -> bool {
        self.control.is_urgent() || self.control.is_cancelled() || !self.under_way(now)
    }
}

impl Yield for StartGate {
    fn wait_turn(&self) {
        let began = Instant::now();
        let mut now = began;
        while !self.open(now) {
            std::thread::sleep(POLL);
            now = Instant::now();
        }
        let waited = now.saturating_duration_since(began);
        if waited >= POLL {
            tracing::debug!(
                waited_ms = waited.as_millis() as u64,
                "background work waited for VM starts"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> StartGate {
        StartGate::new(Reach::new(), Arc::new(ScrubControl::default()))
    }

    #[test]
    fn a_lease_in_flight_shuts_the_gate_until_it_ends() {
        let g = gate();
        let now = Instant::now();
        assert!(g.open(now));
        let taking = g.taking();
        assert!(!g.open(now));
        drop(taking);
        assert!(g.open(now));
    }

    #[test]
    fn an_unopened_lease_shuts_the_gate_for_the_open_wait() {
        let g = gate();
        let now = Instant::now();
        g.leased(7, now);
        assert!(!g.open(now));
        g.forget(7);
        assert!(g.open(now));
    }

    #[test]
    fn a_zero_grace_turns_the_gate_off() {
        let g = gate();
        let now = Instant::now();
        g.set_grace(Duration::ZERO);
        let _taking = g.taking();
        g.leased(7, now);
        assert!(g.open(now));
        g.set_grace(Duration::from_millis(1));
        assert!(!g.open(now));
    }

    #[test]
    fn urgency_and_cancellation_open_the_gate() {
        let control = Arc::new(ScrubControl::default());
        let g = StartGate::new(Reach::new(), Arc::clone(&control));
        let now = Instant::now();
        let _taking = g.taking();
        assert!(!g.open(now));
        control.begin_urgent();
        assert!(g.open(now));
        control.end_urgent();
        assert!(!g.open(now));
        control.cancel();
        assert!(g.open(now));
        // Returns at once when open.
        g.wait_turn();
    }

    #[test]
    fn an_unopened_lease_keeps_the_gate_shut_for_the_open_wait_of_its_commit_time() {
        let g = gate();
        let t0 = Instant::now();
        g.leased(7, t0);
        assert!(!g.open(t0 + OPEN_WAIT - Duration::from_millis(1)));
        assert!(g.open(t0 + OPEN_WAIT), "the open wait ran out");
        // Forgotten once over: a later look finds the gate open.
        assert!(g.open(t0));
    }

    #[test]
    fn a_grace_shorter_than_the_open_wait_cuts_it() {
        let g = gate();
        g.set_grace(Duration::from_millis(100));
        let t0 = Instant::now();
        g.leased(7, t0);
        assert!(!g.open(t0 + Duration::from_millis(99)));
        assert!(g.open(t0 + Duration::from_millis(100)));
    }

    #[test]
    fn a_gate_shut_without_a_break_opens_after_the_longest_deferral() {
        let g = gate();
        let _taking = g.taking();
        let t0 = Instant::now();
        assert!(!g.open(t0), "shut since t0");
        assert!(!g.open(t0 + MAX_DEFER - Duration::from_millis(1)));
        assert!(g.open(t0 + MAX_DEFER));
    }
}
