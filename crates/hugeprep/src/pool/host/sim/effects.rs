//! What the simulated host does for each effect the driver asks of it ([`Host`]).

use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{drop_unnamed, enospc, node_of, set_node, ProofMode, SimFile, SimHost};
use crate::hugetlb::Owner;
use crate::journal::JournalError;
use crate::page_size::PageSize;
use crate::pool::core::recovery::{Facts, Step};
use crate::pool::fault::FaultError;
use crate::pool::holes::{HoleError, Refill};
use crate::pool::host::{Background, FileAt, Handle, Host, HostError, Pin};
use crate::pool::on_node::{OnNodeError, Stray};
use crate::pool::reach::{Proof, Unproven};
use crate::pool::record::{FileRecord, FileState};
use crate::pool::state::Promised;
use crate::prefault::Taken;
use crate::scrub::{ScrubControl, ScrubError, ScrubOptions, ScrubReport};

impl Host for SimHost {
    fn now(&self) -> Instant {
        let mut w = self.world();
        let tick = w.faults.tick;
        w.elapsed += tick;
        self.start + w.elapsed
    }

    fn journal_write(&self, rec: &FileRecord) -> Result<(), JournalError> {
        self.effect(match rec.state {
            FileState::Filling => "journal filling",
            FileState::Warm => "journal warm",
            FileState::Leased(_) => "journal leased",
            FileState::Dirty => "journal dirty",
            FileState::Scrubbing => "journal scrubbing",
        });
        let mut w = self.world();
        if w.faults
            .journal_full_after
            .is_some_and(|n| w.journal_writes >= n)
        {
            return Err(enospc());
        }
        w.journal_writes += 1;
        let before = w.journal.insert(rec.id, rec.clone());
        w.journaled(rec.id, before);
        Ok(())
    }

    fn journal_remove(&self, id: u64) -> Result<(), JournalError> {
        self.effect("unjournal");
        let mut w = self.world();
        let torn = w.torn.contains(&id);
        if let Some(before) = w.journal.remove(&id) {
            w.journaled(id, Some(before));
        } else if torn {
            w.journaled(id, None);
        }
        Ok(())
    }

    fn journal_mark_clean(&self) -> Result<(), JournalError> {
        self.effect("journal the clean shutdown");
        let mut w = self.world();
        // The marker is written and synced with its directory after every record.
        w.synced();
        w.clean = true;
        Ok(())
    }

    fn file_size(&self, file: FileAt) -> Result<u64, HostError> {
        self.world()
            .files
            .get(&file.id)
            .map(|(_, f)| f.size)
            .ok_or(HostError::Io {
                id: file.id,
                source: io::Error::from(io::ErrorKind::NotFound),
            })
    }

    fn cut(&self, file: FileAt, size: u64) -> Result<(), HostError> {
        self.effect("cut a warm file");
        if self.io_fails() {
            return Err(HostError::Io {
                id: file.id,
                source: io::Error::from_raw_os_error(libc::EIO),
            });
        }
        let mut w = self.world();
        if !w.files.contains_key(&file.id) {
            return Err(HostError::Io {
                id: file.id,
                source: io::Error::from(io::ErrorKind::NotFound),
            });
        }
        let node = node_of(&w, file.id);
        SimHost::resize_in(&mut w, file, size, node);
        Ok(())
    }

    fn fill(
        &self,
        file: FileAt,
        size: u64,
        node: u32,
        _cpus: &[usize],
        _background: Background,
    ) -> Result<(), HostError> {
        self.effect("create and fault a refill");
        self.create(file, size)?;
        let mut w = self.world();
        set_node(&mut w, file.id, node);
        Ok(self.fault(&mut w, file, &(0..size), node)?)
    }

    fn available_after(&self, node: u32, page_size: PageSize, promised: &Promised) -> u64 {
        let page = page_size.bytes();
        let w = self.world();
        let free = w.free.get(&(node, page_size)).copied().unwrap_or(0) + w.faults.phantom_pages;
        free.saturating_sub(promised.unreserved / page) * page
    }

    fn available_bytes(&self, node: u32, page_size: PageSize) -> u64 {
        let w = self.world();
        (w.free.get(&(node, page_size)).copied().unwrap_or(0) + w.faults.phantom_pages)
            * page_size.bytes()
    }

    fn open(&self, file: FileAt) -> Result<Handle, HostError> {
        let w = self.world();
        match w.files.get(&file.id) {
            Some((_, f)) if f.pooled => Ok(Handle::new(file, f.size, None)),
            _ => Err(HostError::Io {
                id: file.id,
                source: io::Error::from(io::ErrorKind::NotFound),
            }),
        }
    }

    fn create(&self, file: FileAt, size: u64) -> Result<Handle, HostError> {
        self.effect("create a lease's file");
        let mut w = self.world();
        if w.faults.create_fails {
            return Err(HostError::Io {
                id: file.id,
                source: io::Error::from_raw_os_error(libc::ENOSPC),
            });
        }
        if w.files.get(&file.id).is_some_and(|(_, f)| f.pooled) {
            return Err(HostError::Io {
                id: file.id,
                source: io::Error::from(io::ErrorKind::AlreadyExists),
            });
        }
        let f = SimFile {
            size,
            pooled: true,
            ..SimFile::default()
        };
        w.files.insert(file.id, (file.page_size, f));
        Ok(Handle::new(file, size, None))
    }

    fn resize(&self, handle: &mut Handle, size: u64) -> Result<(), HostError> {
        self.effect("resize a file");
        if self.io_fails() {
            return Err(HostError::Io {
                id: handle.at().id,
                source: io::Error::from_raw_os_error(libc::EIO),
            });
        }
        let at = handle.at();
        let mut w = self.world();
        let node = node_of(&w, at.id);
        SimHost::resize_in(&mut w, at, size, node);
        drop(w);
        handle.set_size(size);
        Ok(())
    }

    fn fault_lease(
        &self,
        handle: &Handle,
        range: Range<u64>,
        node: u32,
        _cpus: &[usize],
        _beside_others: bool,
        _taken: Arc<Taken>,
    ) -> Result<(), FaultError> {
        self.effect("fault a lease");
        let mut w = self.world();
        set_node(&mut w, handle.at().id, node);
        self.fault(&mut w, handle.at(), &range, node)
    }

    fn watch(&self, id: u64, _handle: &Handle) {
        if let Some((_, f)) = self.world().files.get_mut(&id) {
            f.watched = true;
        }
    }

    fn forget(&self, id: u64) {
        if let Some((_, f)) = self.world().files.get_mut(&id) {
            f.watched = false;
        }
    }

    fn chown(&self, handle: &Handle, owner: Owner) -> Result<(), HostError> {
        self.effect("hand a file to its owner");
        if self.io_fails() {
            return Err(HostError::Io {
                id: handle.at().id,
                source: io::Error::from_raw_os_error(libc::EIO),
            });
        }
        if let Some((_, f)) = self.world().files.get_mut(&handle.at().id) {
            f.owner = Some(owner.uid);
        }
        Ok(())
    }

    fn lease_path_taken(&self, lease_path: &Path) -> bool {
        self.world().lease_paths.contains_key(lease_path)
    }

    fn tenant_dir(&self, _page_size: PageSize, _dir: &str) -> Result<(), HostError> {
        Ok(())
    }

    fn link_lease(&self, handle: &Handle, lease_path: &Path) -> Result<(), HostError> {
        self.effect("link a lease path");
        if self.io_fails() {
            return Err(HostError::Io {
                id: handle.at().id,
                source: io::Error::from_raw_os_error(libc::EIO),
            });
        }
        let mut w = self.world();
        let id = handle.at().id;
        let Some((_, f)) = w.files.get_mut(&id) else {
            return Err(HostError::Io {
                id,
                source: io::Error::from(io::ErrorKind::NotFound),
            });
        };
        f.links.insert(lease_path.to_path_buf());
        if !f.marks.is_empty() {
            let leak = format!(
                "{} linked to file {id} holding bytes of {:?}",
                lease_path.display(),
                f.marks
            );
            w.leaks.push(leak);
        }
        w.lease_paths.insert(lease_path.to_path_buf(), id);
        Ok(())
    }

    fn unlink_lease(&self, file: FileAt, lease_path: &Path) {
        self.effect("unlink a lease path");
        let mut w = self.world();
        if w.lease_paths.get(lease_path) != Some(&file.id) {
            return;
        }
        w.lease_paths.remove(lease_path);
        if let Some((_, f)) = w.files.get_mut(&file.id) {
            f.links.remove(lease_path);
        }
        drop_unnamed(&mut w, file.id);
    }

    fn take_back(&self, file: FileAt) -> Result<(), HostError> {
        self.effect("take a released file back");
        // As a chown: it may fail, and the file stays its lessee's.
        let refused = self.world().faults.take_back_fails;
        if refused || self.io_fails() {
            return Err(HostError::Io {
                id: file.id,
                source: io::Error::from_raw_os_error(libc::EIO),
            });
        }
        if let Some((_, f)) = self.world().files.get_mut(&file.id) {
            f.owner = None;
        }
        Ok(())
    }

    fn pin(&self, handle: &Handle, len: usize) -> Result<Pin, HostError> {
        self.effect("pin a lease");
        let id = handle.at().id;
        if self.io_fails() {
            let source = io::Error::from_raw_os_error(libc::ENOMEM);
            let chunks = 1;
            let err = crate::sys::pin::PinError::Register {
                len,
                chunks,
                source,
            };
            return Err(HostError::Pin(err));
        }
        self.world().pins.insert(id);
        Ok(Pin::new(id, Duration::ZERO, None))
    }

    fn unpin(&self, pin: Pin) -> Duration {
        self.world().pins.remove(&pin.id());
        Duration::ZERO
    }

    fn prove(&self, id: u64, _handle: &Handle) -> Result<Proof, Unproven> {
        self.effect("prove out of reach");
        let slow = self.world().faults.proof == ProofMode::Slow;
        if slow {
            self.slow_proof();
        }
        let w = self.world();
        let watched = w.files.get(&id).is_some_and(|(_, f)| f.watched);
        let held = w.files.get(&id).map(|(_, f)| f.held).unwrap_or_default();
        match w.faults.proof {
            _ if !watched => Err(Unproven::NotWatched),
            ProofMode::Held => Err(Unproven::OpenElsewhere),
            ProofMode::Fail => Err(Unproven::Trust),
            _ if held.read_lease => Err(Unproven::OpenElsewhere),
            _ if held.pinned > 0 => Err(Unproven::PagesHeld {
                folios: held.pinned,
                refs: 2,
                pins: 1,
                maps: 0,
            }),
            ProofMode::Pass | ProofMode::Slow => Ok(Proof {
                openers: 0,
                took: Duration::ZERO,
            }),
        }
    }

    fn refill_holes(
        &self,
        handle: &Handle,
        node: u32,
        _cpus: &[usize],
    ) -> Result<Refill, HoleError> {
        self.effect("refill holes");
        let at = handle.at();
        let page = at.page_size.bytes();
        let mut w = self.world();
        let (size, pages) = w
            .files
            .get(&at.id)
            .map_or((0, 0), |(_, f)| (f.size, f.pages));
        let holes = size.div_ceil(page).saturating_sub(pages);
        if holes > 0 {
            self.fault(&mut w, at, &(0..holes * page), node)?;
        }
        Ok(Refill {
            // The pages a lessee left are all at the front: the sim punches no holes.
            present: (pages > 0).then_some(0..pages * page).into_iter().collect(),
            filled: holes * page,
        })
    }

    fn stray_page(
        &self,
        _handle: &Handle,
        _node: u32,
        _page_bytes: u64,
    ) -> Result<Option<Stray>, OnNodeError> {
        Ok(None)
    }

    fn scrub(
        &self,
        handle: &Handle,
        ranges: &[Range<u64>],
        opts: &ScrubOptions,
        _control: &ScrubControl,
    ) -> Result<ScrubReport, ScrubError> {
        self.effect("scrub");
        let mut w = self.world();
        let id = handle.at().id;
        if w.faults.scrub_fails {
            return Err(ScrubError::Verify {
                path: crate::pool::file_key(id),
                offset: 0,
                value: 0xff,
            });
        }
        if let Some((_, f)) = w.files.get_mut(&id) {
            f.marks.clear();
        }
        Ok(ScrubReport {
            bytes: ranges.iter().map(|r| r.end - r.start).sum(),
            seconds: 0.0,
            threads: 1,
            affinity: Vec::new(),
            method: crate::clear::Method::WriteBytes,
            verify: opts.verify,
        })
    }

    fn truncate(&self, file: FileAt, _node: u32) -> io::Result<u64> {
        self.effect("truncate");
        if self.io_fails() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let mut w = self.world();
        match w.files.get(&file.id) {
            None => return Err(io::Error::from(io::ErrorKind::NotFound)),
            // A lessee's read lease fails the open for writing.
            Some((_, f)) if f.held.read_lease => {
                return Err(io::Error::from(io::ErrorKind::WouldBlock))
            }
            Some(_) => {}
        }
        let node = node_of(&w, file.id);
        SimHost::resize_in(&mut w, file, 0, node);
        if let Some((_, f)) = w.files.get_mut(&file.id) {
            // The pages went back to the kernel, which zeroes them before reuse.
            f.marks.clear();
        }
        Ok(0)
    }

    fn unlink(&self, file: FileAt) -> io::Result<()> {
        self.effect("unlink a pool file");
        let pooled = |w: &super::World| w.files.get(&file.id).is_some_and(|(_, f)| f.pooled);
        if !pooled(&self.world()) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        if let Some(err) = self.unlink_fails("unlink a pool file fails") {
            return Err(err);
        }
        let mut w = self.world();
        if let Some((_, f)) = w.files.get_mut(&file.id) {
            f.pooled = false;
        }
        drop_unnamed(&mut w, file.id);
        Ok(())
    }

    fn journal_was_clean(&self) -> bool {
        self.world().clean
    }

    fn journal_clear_clean(&self) -> Result<(), JournalError> {
        self.effect("clear the clean shutdown");
        let mut w = self.world();
        w.synced();
        w.clean = false;
        Ok(())
    }

    fn recovery_facts(&self, clean: bool) -> crate::pool::Result<Facts> {
        Ok(super::recovery::facts(&self.world(), clean))
    }

    fn recovery_step(&self, step: &Step) -> crate::pool::Result<bool> {
        self.effect(match step {
            Step::Unjournal(_) => "recovery: unjournal",
            Step::Journal(_) => "recovery: journal dirty",
            Step::RemovePoolEntry(..) | Step::RemoveFile(..) => "recovery: remove a file",
            Step::Relink(..) => "recovery: relink a lease path",
            Step::RemoveLeasePath(..) => "recovery: remove a lease path",
        });
        // Recovery's removal of a recorded file fails as the worker's do.
        if let Step::RemoveFile(_, id) = step {
            let there = self.world().files.get(id).is_some_and(|(_, f)| f.pooled);
            if there
                && self
                    .unlink_fails("recovery: unlink a pool file fails")
                    .is_some()
            {
                return Ok(false);
            }
        }
        super::recovery::step(&mut self.world(), step);
        Ok(true)
    }

    fn recovery_finish(&self) {
        // The simulated host keeps no tenant directories: lease paths are names only.
    }
}
