//! The invariants of the file table, checked in one place after every transition
//! ([`Core::check`]).
//!
//! - Every file is in a [`Phase`] (a journaled state and a work in progress that some
//!   transition makes): nothing dirty is ever warm, leased, or being leased.
//! - One owner per file and per name: a lease's name belongs to one live lease or to one
//!   request taking it, a lease id to one file, and a request taking a lease holds exactly
//!   one file.
//! - Exact accounting: every size is a whole number of pages, ids are below the next id (no
//!   id is ever given twice, across restarts), and a file's last lease is only remembered
//!   while its memory is released and unproven.

use std::collections::BTreeMap;

use super::{Core, Entry, Phase};
use crate::pool::record::FileState;

/// An invariant that does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A file's journaled state and work in progress match no phase.
    #[error("file {id}: state {state} with work {work} is no phase")]
    NoPhase {
        /// The file.
        id: u64,
        /// Its journaled state.
        state: &'static str,
        /// Its work.
        work: String,
    },
    /// A file is kept under another id than its record's.
    #[error("file {key} holds the record of file {id}")]
    Key {
        /// The table's key.
        key: u64,
        /// The record's id.
        id: u64,
    },
    /// An id at or above the next id to give.
    #[error("id {id} is not below the next id {next}")]
    Id {
        /// The id.
        id: u64,
        /// The next id.
        next: u64,
    },
    /// Two leases (live or being taken) share a name, or a lease id.
    #[error("lease {what} {value} is held twice")]
    Twice {
        /// "name" or "id".
        what: &'static str,
        /// The name or id.
        value: String,
    },
    /// A request taking a lease holds no file, or a file being leased has no request.
    #[error("file {id}: {why}")]
    Owner {
        /// The file.
        id: u64,
        /// What is wrong.
        why: &'static str,
    },
    /// A size that is zero or not a whole number of pages.
    #[error("file {id}: size {size} is not a whole number of {page} byte pages")]
    Size {
        /// The file.
        id: u64,
        /// Its size.
        size: u64,
        /// Its page size in bytes.
        page: u64,
    },
}

impl Core {
    /// Checks every invariant (see the module documentation); the first that fails.
    pub fn check(&self) -> Result<(), Violation> {
        let mut names: BTreeMap<&str, u64> = BTreeMap::new();
        let mut lease_ids: BTreeMap<u64, u64> = BTreeMap::new();
        let mut leasing = 0usize;
        for (&key, e) in &self.files {
            let phase = self.check_file(key, e)?;
            if let FileState::Leased(l) = &e.rec.state {
                if l.id >= self.next_id {
                    return Err(Violation::Id {
                        id: l.id,
                        next: self.next_id,
                    });
                }
                if names.insert(l.name.as_str(), key).is_some() {
                    return Err(twice("name", &l.name));
                }
                if lease_ids.insert(l.id, key).is_some() {
                    return Err(twice("id", &l.id));
                }
            }
            if matches!(phase, Phase::Leasing | Phase::ColdLeasing) {
                leasing += 1;
                if !self.pending.values().any(|&f| f == key) {
                    return Err(Violation::Owner {
                        id: key,
                        why: "being leased by no request",
                    });
                }
            }
        }
        for (name, &id) in &self.pending {
            if names.insert(name.as_str(), id).is_some() {
                return Err(twice("name", name));
            }
            let leasing_it = self
                .files
                .get(&id)
                .and_then(|e| e.phase())
                .is_some_and(|p| matches!(p, Phase::Leasing | Phase::ColdLeasing));
            if !leasing_it {
                return Err(Violation::Owner {
                    id,
                    why: "a request taking a lease holds a file it is not leasing",
                });
            }
        }
        if leasing != self.pending.len() {
            return Err(Violation::Owner {
                id: 0,
                why: "one request holds two files",
            });
        }
        Ok(())
    }

    /// The invariants of one file on its own; its phase.
    fn check_file(&self, key: u64, e: &Entry) -> Result<Phase, Violation> {
        let rec = &e.rec;
        if key != rec.id {
            return Err(Violation::Key { key, id: rec.id });
        }
        if rec.id >= self.next_id {
            return Err(Violation::Id {
                id: rec.id,
                next: self.next_id,
            });
        }
        let Some(phase) = e.phase() else {
            return Err(Violation::NoPhase {
                id: key,
                state: rec.state.name(),
                work: format!("{:?}", e.busy),
            });
        };
        let page = rec.page_size.bytes();
        if rec.size == 0 || rec.size % page != 0 {
            return Err(Violation::Size {
                id: key,
                size: rec.size,
                page,
            });
        }
        let may_remember = matches!(
            phase,
            Phase::Releasing | Phase::Dirty | Phase::Scrubbing | Phase::Deleting
        );
        if e.released.is_some() && !may_remember {
            return Err(Violation::Owner {
                id: key,
                why: "remembers a released lease while its memory is not released",
            });
        }
        Ok(phase)
    }
}

fn twice(what: &'static str, value: &dyn std::fmt::Display) -> Violation {
    Violation::Twice {
        what,
        value: value.to_string(),
    }
}
