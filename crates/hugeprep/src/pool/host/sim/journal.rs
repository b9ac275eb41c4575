//! The simulated journal's model of what a crash loses (see [`super::Faults::lose_unsynced`])
//! and the fault stream the host draws its failures from.

use super::World;
use crate::pool::record::FileRecord;

/// Journal writes and removals not yet on disk that a crash may lose, at most (older ones
/// count as written back).
const UNSYNCED: usize = 8;

impl World {
    /// The next number of the fault stream (splitmix64 on `io_seed`).
    pub(super) fn draw(&mut self) -> u64 {
        self.faults.io_seed = self.faults.io_seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.faults.io_seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(super) fn inject(&mut self, what: &'static str) {
        *self.injected.entry(what).or_default() += 1;
    }

    /// A change of file `id`'s record, not synced yet: `before` is what a crash may restore.
    pub(super) fn journaled(&mut self, id: u64, before: Option<FileRecord>) {
        self.torn.remove(&id);
        self.unsynced.push((id, before));
        if self.unsynced.len() > UNSYNCED {
            self.unsynced.remove(0);
        }
    }

    /// Everything journaled so far is on disk.
    pub(super) fn synced(&mut self) {
        self.unsynced.clear();
    }

    /// A crash: with [`Faults::lose_unsynced`], the last of the unsynced changes are lost
    /// (in reverse order, each record back to what it was) and the last one kept, if it
    /// wrote a record, may be cut short.
    pub(super) fn crash(&mut self) {
        if !self.faults.lose_unsynced || self.unsynced.is_empty() {
            self.synced();
            return;
        }
        let lose = (self.draw() % (self.unsynced.len() as u64 + 1)) as usize;
        for _ in 0..lose {
            let Some((id, before)) = self.unsynced.pop() else {
                break;
            };
            match before {
                Some(rec) => self.journal.insert(id, rec),
                None => self.journal.remove(&id),
            };
            self.torn.remove(&id);
        }
        if lose > 0 {
            self.inject("lost journal writes");
        }
        let last = self.unsynced.last().map(|(id, _)| *id);
        if let Some(id) = last.filter(|id| self.journal.contains_key(id)) {
            if self.draw() % 2 == 0 {
                self.journal.remove(&id);
                self.torn.insert(id);
                self.inject("torn journal write");
            }
        }
        self.synced();
    }
}
