//! The reader thread of the open watch: it answers each open of a watched file once its
//! opener is recorded (or refuses it, for a recycled file), and keeps the heartbeat the
//! watchdog looks at.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use super::{cgroup, scan, Opener, Reach, MAX_OPENERS, READER_STALL};
use crate::sys::fanotify::{Event, Permission};

impl Reach {
    /// Answers every queued open, batch by batch (the reader thread's work).
    fn serve(&self) {
        let Some(w) = &self.watch else { return };
        loop {
            self.beat();
            match w.read() {
                Ok(events) if events.is_empty() => return,
                Ok(events) => self.answer(events),
                // Nothing is lost: the kernel refused the open it could not report.
                Err(err) => {
                    tracing::warn!(%err, "cannot read open events");
                    return;
                }
            }
        }
    }

    /// Records the openers of watched files, then lets their opens go on: an open that
    /// returned is in the record, so a proof needs no events still queued (an open not
    /// answered yet is an open file, which the proof's write lease sees). Opens of a
    /// recycled file are refused, except the daemon's and root's.
    fn answer(&self, events: Vec<Event>) {
        if self.probe.is_some() {
            return self.answer_by_counts(events);
        }
        let Sorted { lost, refuse, new } = self.sort(events);
        for (pid, pidfd, permission) in refuse {
            if !runs_as_root(pid, pidfd.as_ref()) {
                tracing::warn!(pid, "refused an open of a recycled pool file");
                permission.deny();
            }
        }
        // Read while each opener waits for its answer, so it still runs: only then does its
        // pid name it (a pidfd that says it exited was killed while waiting).
        let new: Vec<_> = new
            .into_iter()
            .map(|(id, pid, pidfd, permission)| {
                let cgroups = pidfd.as_ref().and_then(|fd| {
                    let cg = self.hierarchies.containing(pid).ok()?;
                    (!crate::sys::pidfd::exited(fd.as_fd()).ok()?).then_some(cg)
                });
                (id, pid, pidfd, cgroups, permission)
            })
            .collect();
        self.record_openers(lost, new);
    }

    /// Sorts a batch of events under the state lock: the daemon's own opens and opens of
    /// files not watched go on, opens of recycled files are to be refused, and the rest name
    /// openers to record.
    fn sort(&self, events: Vec<Event>) -> Sorted {
        let me = std::process::id();
        let mut sorted = Sorted::default();
        let st = self.lock();
        for event in events {
            match event {
                Event::Overflow => sorted.lost = true,
                // The daemon's own opens: let them go on (dropping the permission).
                Event::Open { pid, .. } if pid == me => {}
                Event::Open {
                    dev,
                    ino,
                    pid,
                    pidfd,
                    permission,
                } => {
                    let Some((&id, record)) = st
                        .by_inode
                        .get(&(dev, ino))
                        .and_then(|id| st.files.get(id).map(|r| (id, r)))
                    else {
                        continue;
                    };
                    if record.recycled {
                        sorted.refuse.push((pid, pidfd, permission));
                    } else if !record.complete || record.openers.iter().any(|o| o.same(pid)) {
                        // Nothing to learn: the proof fails anyway, or this process is
                        // recorded and still runs. Answered at once, however many come.
                    } else {
                        sorted.new.push((id, pid, pidfd, permission));
                    }
                }
            }
        }
        sorted
    }

    /// Records each new opener (with its cgroups) in its file's record, then answers the
    /// opens; `lost` events cost every watched file its proof.
    fn record_openers(&self, lost: bool, new: Vec<NewOpener>) {
        let mut answers = Vec::with_capacity(new.len());
        let mut st = self.lock();
        if lost {
            tracing::error!("open events lost: every watched file loses its proof");
            for r in st.files.values_mut() {
                r.complete = false;
            }
        }
        for (id, pid, pidfd, cgroups, permission) in new {
            let Some(record) = st.files.get_mut(&id) else {
                answers.push(permission);
                continue;
            };
            if record.recycled {
                // Proven meanwhile: the open came too late.
                if runs_as_root(pid, pidfd.as_ref()) {
                    answers.push(permission);
                } else {
                    tracing::warn!(pid, "refused an open of a recycled pool file");
                    permission.deny();
                }
                continue;
            }
            answers.push(permission);
            record.first_open.get_or_insert_with(Instant::now);
            if record
                .openers
                .iter()
                .any(|o| o.same(pid) && o.cgroups == cgroups)
            {
                continue;
            }
            if record.openers.len() >= MAX_OPENERS {
                record.complete = false;
                continue;
            }
            tracing::debug!(id, pid, ?cgroups, "leased file opened");
            record.openers.push(Opener {
                pid,
                pidfd,
                cgroups,
            });
        }
        // The opens go on only now, with every opener recorded.
        drop(st);
        drop(answers);
    }
}

impl Reach {
    /// [`Reach::answer`] when releases are proven from the kernel's counts: nobody's open
    /// waits during a lease (the first one is noted, for the start gate, and no more are
    /// reported); from a proof until the next lease, opens are refused but the daemon's and
    /// root's.
    fn answer_by_counts(&self, events: Vec<Event>) {
        let me = std::process::id();
        let mut refuse = Vec::new();
        let mut noted = Vec::new();
        {
            let mut st = self.lock();
            for event in events {
                // A lost notification loses a start gate hint, never a proof.
                let Event::Open {
                    dev,
                    ino,
                    pid,
                    pidfd,
                    permission,
                } = event
                else {
                    continue;
                };
                if pid == me {
                    continue;
                }
                let Some(&id) = st.by_inode.get(&(dev, ino)) else {
                    continue;
                };
                let Some(record) = st.files.get_mut(&id) else {
                    continue;
                };
                if permission.waits() {
                    if record.refusing {
                        refuse.push((pid, pidfd, permission));
                    }
                    continue;
                }
                record.opens += 1;
                record.first_open.get_or_insert_with(Instant::now);
                noted.push(permission);
            }
        }
        if let Some(w) = &self.watch {
            for event in noted {
                if let Err(err) = w.unnotify(event.file()) {
                    tracing::debug!(%err, "cannot stop reporting a leased file's opens");
                }
            }
        }
        for (pid, pidfd, permission) in refuse {
            if !runs_as_root(pid, pidfd.as_ref()) {
                tracing::warn!(pid, "refused an open of a released pool file");
                permission.deny();
            }
        }
    }
}

/// How long since the reader's last turn at `beat`, `now` after it started, when that is
/// longer than [`READER_STALL`].
pub(super) fn stalled(now: Duration, beat: Duration) -> Option<Duration> {
    let since = now.saturating_sub(beat);
    (since > READER_STALL).then_some(since)
}

impl Opener {
    /// Whether this is process `pid`, still running (a pidfd names one process for good).
    fn same(&self, pid: u32) -> bool {
        self.pid == pid
            && self
                .pidfd
                .as_ref()
                .is_some_and(|fd| crate::sys::pidfd::exited(fd.as_fd()).is_ok_and(|gone| !gone))
    }
}

/// Whether process `pid`, one of whose threads waits in `open(2)`, is root in every thread
/// ([`scan::runs_as_root`]): the trusted base. The event names the process, not the
/// thread, and a thread's credentials may differ from its leader's, so a process with any
/// thread that is not root is no root opener. `false` when that cannot be read. The
/// opening thread cannot change its credentials while it waits for the answer.
fn runs_as_root(pid: u32, pidfd: Option<&OwnedFd>) -> bool {
    let Some(pidfd) = pidfd else { return false };
    let root = scan::runs_as_root(std::path::Path::new(&format!("/proc/{pid}")));
    root && crate::sys::pidfd::exited(pidfd.as_fd()).is_ok_and(|gone| !gone)
}

/// The reader thread: answers and records opens as they come, until the [`Reach`] is gone
/// (then the group's descriptor closes and the kernel lets any open still waiting go on).
pub(super) fn read_events(reach: std::sync::Weak<Reach>) {
    // An open waits for this thread: a short slice, so that it runs as soon as an open
    // wakes it. No more weight than an ordinary process: a lessee opening its file in a
    // loop makes it work, and must not make it crowd out others.
    if let Err(err) = crate::sys::priority::set_current_thread_short_slice() {
        tracing::debug!(%err, "open watch reader keeps the default priority");
    }
    while let Some(reach) = reach.upgrade() {
        reach.beat();
        let ready = reach
            .watch
            .as_ref()
            .map_or(Ok(false), |w| w.wait(Duration::from_millis(250)));
        match ready {
            Ok(true) => reach.serve(),
            Ok(false) => {}
            Err(err) => {
                tracing::error!(%err, "open watch failed: every watched file loses its proof");
                reach.lose_all();
                drop(reach);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// An open of a watched file whose opener is to be recorded: file id, pid, pidfd, its
/// cgroups (read while it waits), and the open's answer.
type NewOpener = (
    u64,
    u32,
    Option<OwnedFd>,
    Option<Vec<cgroup::Cgroup>>,
    Permission,
);

/// A batch of open events sorted under the state lock ([`Reach::sort`]).
#[derive(Default)]
struct Sorted {
    /// The kernel dropped events.
    lost: bool,
    /// Opens of recycled files: pid, pidfd, answer.
    refuse: Vec<(u32, Option<OwnedFd>, Permission)>,
    /// Opens whose opener is to be recorded: file id, pid, pidfd, answer.
    new: Vec<(u64, u32, Option<OwnedFd>, Permission)>,
}
