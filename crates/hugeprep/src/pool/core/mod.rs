//! The pool's core: every pool file's life as typed phases with explicit transitions, and no
//! I/O (the shape of quinn-proto's `Connection`).
//!
//! The core never reads the clock, a file or the journal. Each transition takes an event (a
//! lease chose a warm file, a journal write succeeded, a scrub ended, ...), checks that the
//! file is in a phase the event may leave, moves it, and returns the [`Action`]s the driver
//! must perform: journal a record, create and fault a file, truncate and unlink one, unlink
//! a lease path, reply. The driver (`lease.rs`, `worker.rs`, `drain.rs`) performs them,
//! outside the state lock wherever the file is busy meanwhile, and feeds the result back as
//! the next event. The invariants ([`Core::check`]) are checked in one place after every
//! transition; the simulator (`sim`, tests only) drives the same transitions with faults,
//! crashes and reorderings injected at every action, then recovers with [`recovery`] as
//! the daemon does.
//!
//! ```text
//!  refill:      Filling ──filled──> Warm ──take──> Leasing ──commit──> Leased
//!  cold lease:  ColdLeasing ─────────────────────────commit──────────> Leased
//!  release:     Leased ──release──> Releasing ──done──> Dirty ──scrub──> Scrubbing ──> Warm
//!  give back:   Warm | Dirty | Scrubbing | Cutting ──delete──> Deleting ──> gone
//!  cut:         Warm ──cut──> Cutting ──> Warm
//! ```
//!
//! See `docs/architecture.md` for where each transition is driven.

pub(crate) mod aside;
pub(crate) mod choice;
pub(crate) mod decide;
pub mod forecast;
mod forecast_files;
mod forecast_steps;
mod invariants;
mod order;
pub mod recovery;
pub(crate) mod reshape;
mod transitions;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use super::record::{FileRecord, FileState};
use crate::page_size::PageSize;
use crate::policy::pool::Recycle;

pub use invariants::Violation;

/// Work in progress on a file, outside the state lock. Only the worker or request that set
/// it touches the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// A lease request prepares the file (resize, fault, link).
    Leasing,
    /// A release journals the file dirty and takes it back.
    Releasing,
    /// The worker proves and scrubs it, or cuts a warm file.
    Scrub,
    /// The worker creates and faults it.
    Refill,
    /// It is being truncated and unlinked.
    Delete,
}

/// What the proof and the kernel's path need of a released lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Released {
    /// The lease id (0: a lease that failed before it was journaled).
    pub(crate) lease: u64,
    /// The lease's name.
    pub(crate) name: String,
    /// How its memory comes back.
    pub(crate) recycle: Recycle,
    /// Whether this daemon run watched the file's opens for the whole lease (it leased it):
    /// a restart loses the watch, and a file leased before it takes the kernel's path.
    pub(crate) watched: bool,
    /// The principal that made the lease (its `held_bytes` pay while the file waits aside).
    pub(crate) principal: Option<String>,
}

/// One pool file in memory: its journal record, who works on it, and its last lease.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    rec: FileRecord,
    busy: Option<Work>,
    /// A dirty file's last lease, while its proof is pending (see `reach`); `None` for a
    /// file whose history is not known (recovered after a restart), which is never proven.
    released: Option<Released>,
    /// Leased by this daemon run (its opens watched since its lease path was linked).
    watched: bool,
    /// While dirty: its place in the order of releases (0: recovered, before any release of
    /// this run). See `order`.
    released_at: u64,
}

/// Where a file is in its life: the pair (journaled state, work in progress) as one type.
/// Every pair not listed is a [`Violation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Created and faulted by the worker (journal: filling).
    Filling,
    /// A cold lease's new file, created and faulted by the request (journal: filling).
    ColdLeasing,
    /// Clean and idle: may be handed out.
    Warm,
    /// A warm file resized and linked for a lease; the journal still says warm, which is
    /// trusted only after a clean shutdown (which waits for this request).
    Leasing,
    /// Handed out.
    Leased,
    /// Being released: journaled dirty (or about to be), its lease path unlinked, taken back.
    Releasing,
    /// Released or unproven, idle: the worker scrubs it or gives it back.
    Dirty,
    /// The worker proves it out of reach and scrubs it (journal: scrubbing).
    Scrubbing,
    /// The worker cuts a warm file to a size in demand (journal: warm, larger).
    Cutting,
    /// Being truncated and unlinked.
    Deleting,
}

impl Phase {
    /// Short name for errors and the simulator's trace.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Filling => "filling",
            Phase::ColdLeasing => "cold-leasing",
            Phase::Warm => "warm",
            Phase::Leasing => "leasing",
            Phase::Leased => "leased",
            Phase::Releasing => "releasing",
            Phase::Dirty => "dirty",
            Phase::Scrubbing => "scrubbing",
            Phase::Cutting => "cutting",
            Phase::Deleting => "deleting",
        }
    }
}

impl Entry {
    fn new(rec: FileRecord, busy: Option<Work>) -> Entry {
        Entry {
            rec,
            busy,
            released: None,
            watched: false,
            released_at: 0,
        }
    }

    /// The file's record as the journal has it (or is about to).
    pub(crate) fn rec(&self) -> &FileRecord {
        &self.rec
    }

    /// Who works on the file, if anyone.
    pub(crate) fn busy(&self) -> Option<Work> {
        self.busy
    }

    /// The file's last lease, while it is dirty and its history known.
    pub(crate) fn released(&self) -> Option<&Released> {
        self.released.as_ref()
    }

    /// Idle and in journaled state `state`.
    pub(crate) fn is_idle(&self, state: &FileState) -> bool {
        self.busy.is_none() && self.rec.state == *state
    }

    /// The phase, `None` for a pair no transition makes.
    pub fn phase(&self) -> Option<Phase> {
        use FileState as S;
        Some(match (&self.rec.state, self.busy) {
            (S::Filling, Some(Work::Refill)) => Phase::Filling,
            (S::Filling, Some(Work::Leasing)) => Phase::ColdLeasing,
            (S::Warm, None) => Phase::Warm,
            (S::Warm, Some(Work::Leasing)) => Phase::Leasing,
            (S::Warm, Some(Work::Scrub)) => Phase::Cutting,
            (S::Leased(_), None) => Phase::Leased,
            (S::Leased(_) | S::Dirty, Some(Work::Releasing)) => Phase::Releasing,
            (S::Dirty, None) => Phase::Dirty,
            (S::Scrubbing, Some(Work::Scrub)) => Phase::Scrubbing,
            (S::Warm | S::Dirty | S::Scrubbing, Some(Work::Delete)) => Phase::Deleting,
            _ => return None,
        })
    }
}

/// What the driver must do for a transition, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Replace the file's journal record (it survives a crash of the daemon once written).
    Journal(FileRecord),
    /// Remove the file's journal record.
    Unjournal(u64),
    /// Truncate (when `released` memory may be in it: the kernel's path) and unlink the
    /// pool file.
    RemoveFile {
        /// The record as it was when the file was given up.
        rec: FileRecord,
        /// Its last lease, for the log.
        released: Option<Released>,
    },
}

/// A transition asked of a file in a phase it may not leave that way: a bug in the driver
/// (the core refuses it and changes nothing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// No file with this id.
    #[error("pool core: {event} of file {id}, which does not exist")]
    NoFile {
        /// The event.
        event: &'static str,
        /// The file.
        id: u64,
    },
    /// The file is not in a phase the event may leave.
    #[error("pool core: {event} of file {id} in phase {phase:?}")]
    Phase {
        /// The event.
        event: &'static str,
        /// The file.
        id: u64,
        /// Its phase.
        phase: Option<Phase>,
    },
    /// A size that is zero or not a whole number of the file's pages.
    #[error("pool core: {event} of file {id} at size {size}, not a whole number of pages")]
    Size {
        /// The event.
        event: &'static str,
        /// The file.
        id: u64,
        /// The size asked for.
        size: u64,
    },
    /// A lease of this name is live or being taken.
    #[error("pool core: name {name:?} in use")]
    Name {
        /// The name.
        name: String,
    },
}

/// Every pool file, the names of leases being taken, and the next id.
#[derive(Debug, Default)]
pub(crate) struct Core {
    files: BTreeMap<u64, Entry>,
    /// Names of leases being taken (not journaled yet), with their file.
    pending: BTreeMap<String, u64>,
    next_id: u64,
    /// Releases so far (the order of dirty files, see `order`).
    releases: u64,
    /// Whose released file the worker takes next.
    turns: order::Turns,
}

impl Core {
    /// A core holding the records recovery kept, ids starting at `next_id`.
    pub(crate) fn with_files(records: Vec<FileRecord>, next_id: u64) -> Core {
        let core = Core {
            files: records
                .into_iter()
                .map(|rec| (rec.id, Entry::new(rec, None)))
                .collect(),
            pending: BTreeMap::new(),
            next_id,
            releases: 0,
            turns: order::Turns::default(),
        };
        core.assert_valid("recovered");
        core
    }

    /// The file `id`.
    pub(crate) fn get(&self, id: u64) -> Option<&Entry> {
        self.files.get(&id)
    }

    /// Every file, by id.
    pub(crate) fn files(&self) -> impl Iterator<Item = &Entry> + '_ {
        self.files.values()
    }

    /// The files of one kind.
    pub(crate) fn of_kind(&self, node: u32, ps: PageSize) -> impl Iterator<Item = &Entry> + '_ {
        self.files
            .values()
            .filter(move |e| e.rec.node == node && e.rec.page_size == ps)
    }

    /// A new id for a file or a lease (unique across restarts: recovery starts above every
    /// id journaled).
    pub(crate) fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Whether a live lease or one being taken has this name.
    pub(crate) fn name_in_use(&self, name: &str) -> bool {
        self.pending.contains_key(name)
            || self.files.values().any(|e| match &e.rec.state {
                FileState::Leased(l) => l.name == name,
                _ => false,
            })
    }

    /// The released file the worker takes next among the idle dirty files `eligible`
    /// says it may take: fair between principals, then in release order (see `order`).
    pub(crate) fn next_dirty(&self, eligible: impl Fn(u64) -> bool) -> Option<u64> {
        self.turns.pick(
            self.files
                .values()
                .filter(|e| e.is_idle(&FileState::Dirty) && eligible(e.rec.id))
                .map(|e| order::Waiting {
                    id: e.rec.id,
                    released: e.released_at,
                    principal: e.released.as_ref().and_then(|r| r.principal.as_deref()),
                }),
        )
    }

    /// The next place in the order of releases.
    fn next_release(&mut self) -> u64 {
        self.releases += 1;
        self.releases
    }

    /// A dirty file leaves for a scrub or a deletion: its principal's turn.
    fn serve(&mut self, id: u64) {
        let Some(e) = self.files.get(&id) else {
            return;
        };
        if e.is_idle(&FileState::Dirty) {
            let principal = e.released.as_ref().and_then(|r| r.principal.clone());
            self.turns.served(principal.as_deref());
        }
    }

    /// Whether any file is being worked on (a clean shutdown waits until none is).
    pub(crate) fn any_busy(&self) -> bool {
        self.files.values().any(|e| e.busy.is_some())
    }

    /// What to journal before a clean shutdown is marked (the marker makes the next start
    /// trust every warm record): every dirty file's record again, since a dirty file whose
    /// write failed (a lease aborted after its file was linked, while the journal refused
    /// writes) may still be journaled warm. Marking clean is safe only once all succeed.
    pub(crate) fn prepare_clean_shutdown(&self) -> Vec<Action> {
        self.files
            .values()
            .filter(|e| e.is_idle(&FileState::Dirty))
            .map(|e| Action::Journal(e.rec.clone()))
            .collect()
    }

    /// The file `id` in one of `phases`, mutably, or why not.
    fn expect(&mut self, event: &'static str, id: u64, phases: &[Phase]) -> Result<&mut Entry> {
        let e = self
            .files
            .get_mut(&id)
            .ok_or(CoreError::NoFile { event, id })?;
        match e.phase() {
            Some(p) if phases.contains(&p) => Ok(e),
            phase => Err(CoreError::Phase { event, id, phase }),
        }
    }

    /// Checks the invariants after a transition: a violation is a bug in the core, reported
    /// loudly (a panic in tests and debug builds, an error in the log otherwise) rather than
    /// carried on silently.
    fn assert_valid(&self, after: &'static str) {
        if let Err(v) = self.check() {
            if cfg!(debug_assertions) {
                panic!("pool core invariant broken after {after}: {v}");
            }
            tracing::error!(after, violation = %v, "pool core invariant broken");
        }
    }
}

/// Result of core transitions.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;
