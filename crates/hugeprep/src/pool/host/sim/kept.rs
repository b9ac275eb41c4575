//! The simulated host's [`Keeper`]: released files a lessee still holds (a read lease, or
//! pages it pins) are kept under their `kept-` name until it lets go, holding their pages.

use std::io;
use std::path::Path;

use super::{drop_unnamed, node_of, SimFile, SimHost, World};
use crate::page_size::PageSize;
use crate::pool::host::{FileAt, Keeper, KeptAt, Opened};
use crate::pool::reach::kernel::Pins;

/// What a lessee holds of its file past its release.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::pool) struct Hold {
    /// A read lease (`F_SETLEASE`): opens for writing fail with `EWOULDBLOCK`.
    pub(in crate::pool) read_lease: bool,
    /// Pages it pins (an io_uring fixed buffer, a pipe): the first so many of the file.
    pub(in crate::pool) pinned: u64,
}

impl SimFile {
    /// Whether anything names the file: the pool directory, a lease path, a kept name.
    pub(super) fn named(&self) -> bool {
        self.pooled || !self.links.is_empty() || self.kept.is_some()
    }
}

/// The host's keys of kept files start here (see [`Keeper::keep_as`]).
const KEPT_KEYS: u64 = 1 << 62;

fn not_found() -> io::Error {
    io::Error::from(io::ErrorKind::NotFound)
}

/// The id of kept file `kept`.
fn kept_id(w: &World, kept: &KeptAt) -> Option<u64> {
    w.files
        .iter()
        .find(|(_, (ps, f))| *ps == kept.page_size && f.kept.as_deref() == Some(&kept.name))
        .map(|(id, _)| *id)
}

/// Opens file `id` for writing: a read lease fails it.
fn open(w: &World, id: Option<u64>) -> io::Result<Opened> {
    let id = id.ok_or_else(not_found)?;
    let (_, f) = w.files.get(&id).ok_or_else(not_found)?;
    if f.held.read_lease {
        return Err(io::Error::from(io::ErrorKind::WouldBlock));
    }
    Ok(Opened::new(id, None))
}

impl SimHost {
    /// The lessee of the file `lease_path` names keeps holding it past its release: `hold`.
    pub(in crate::pool) fn hold(&self, lease_path: &Path, hold: Hold) {
        let mut w = self.world();
        let Some(&id) = w.lease_paths.get(lease_path) else {
            panic!("{} is not linked", lease_path.display());
        };
        if let Some((_, f)) = w.files.get_mut(&id) {
            f.held = hold;
        }
    }

    /// Every holder lets go of every file: leases given up, pins dropped.
    pub(in crate::pool) fn let_go(&self) {
        for (_, f) in self.world().files.values_mut() {
            f.held = Hold::default();
        }
    }

    /// Files kept past their release, by id, with their name.
    pub(in crate::pool) fn kept_files(&self) -> Vec<(u64, String)> {
        let w = self.world();
        let kept = w
            .files
            .iter()
            .filter_map(|(id, (_, f))| Some((*id, f.kept.clone()?)));
        kept.collect()
    }
}

impl Keeper for SimHost {
    fn open_released(&self, file: FileAt) -> io::Result<Opened> {
        let w = self.world();
        let pooled = w.files.get(&file.id).is_some_and(|(_, f)| f.pooled);
        open(&w, pooled.then_some(file.id))
    }

    fn open_kept(&self, kept: &KeptAt) -> io::Result<Opened> {
        let w = self.world();
        open(&w, kept_id(&w, kept))
    }

    fn pinned_pages(&self, opened: &Opened) -> Result<Option<Pins>, String> {
        let w = self.world();
        let Some((ps, f)) = w.files.get(&opened.id()) else {
            return Ok(None);
        };
        let pages = f.held.pinned.min(f.pages);
        Ok(Some(Pins {
            pages,
            reachable: false,
            at: Some((0..pages).map(|p| p * ps.bytes()).collect()),
        }))
    }

    fn punch_unpinned(&self, opened: &Opened, pins: &Pins, page_size: PageSize) {
        let Some(at) = &pins.at else {
            return;
        };
        let mut w = self.world();
        let id = opened.id();
        let node = node_of(&w, id);
        if let Some((_, f)) = w.files.get_mut(&id) {
            let back = f.pages.saturating_sub(at.len() as u64);
            f.pages -= back;
            *w.free.entry((node, page_size)).or_default() += back;
        }
    }

    fn held_bytes(&self, opened: &Opened) -> u64 {
        let w = self.world();
        w.files
            .get(&opened.id())
            .map_or(0, |(ps, f)| f.pages * ps.bytes())
    }

    fn held_bytes_at(&self, file: FileAt) -> u64 {
        self.held_bytes(&Opened::new(file.id, None))
    }

    fn leased_size(&self, file: FileAt) -> Option<(u64, u64)> {
        let w = self.world();
        let (ps, f) = w.files.get(&file.id)?;
        Some((f.size, f.pages * ps.bytes()))
    }

    fn keep_as(&self, file: FileAt, name: &str) -> io::Result<()> {
        self.effect("keep a released file");
        if self.io_fails() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let mut w = self.world();
        let clash = KeptAt {
            page_size: file.page_size,
            name: name.to_string(),
        };
        if kept_id(&w, &clash).is_some() {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        if !w.files.get(&file.id).is_some_and(|(_, f)| f.pooled) {
            return Err(not_found());
        }
        // Out of the pool directory's names: a later pool file may get the same id (the
        // host keys files by id; the real one by name, `p<id>` beside `kept-<id>-...`).
        let mut key = KEPT_KEYS + file.id;
        while w.files.contains_key(&key) {
            key += 1 << 40;
        }
        if let Some((ps, mut f)) = w.files.remove(&file.id) {
            f.pooled = false;
            f.kept = Some(name.to_string());
            w.files.insert(key, (ps, f));
        }
        for id in w.lease_paths.values_mut().filter(|id| **id == file.id) {
            *id = key;
        }
        Ok(())
    }

    fn truncate_kept(
        &self,
        opened: Opened,
        node: u32,
        page_size: PageSize,
    ) -> (io::Result<()>, u64) {
        self.effect("truncate a kept file");
        let mut w = self.world();
        let before = w.free.get(&(node, page_size)).copied().unwrap_or(0);
        let at = FileAt {
            page_size,
            id: opened.id(),
        };
        let file_node = node_of(&w, at.id);
        SimHost::resize_in(&mut w, at, 0, file_node);
        if let Some((_, f)) = w.files.get_mut(&at.id) {
            // The pages went back to the kernel, which zeroes them before reuse.
            f.marks.clear();
        }
        let after = w.free.get(&(node, page_size)).copied().unwrap_or(0);
        (Ok(()), after.saturating_sub(before))
    }

    fn kept_size(&self, kept: &KeptAt) -> Option<(u64, u64)> {
        let w = self.world();
        let (ps, f) = w.files.get(&kept_id(&w, kept)?)?;
        Some((f.size, f.pages * ps.bytes()))
    }

    fn remove_kept(&self, kept: &KeptAt) -> io::Result<()> {
        self.effect("remove a kept file");
        let mut w = self.world();
        let id = kept_id(&w, kept).ok_or_else(not_found)?;
        if let Some((_, f)) = w.files.get_mut(&id) {
            f.kept = None;
        }
        drop_unnamed(&mut w, id);
        Ok(())
    }

    fn kept_names(&self, page_size: PageSize) -> Vec<(String, u64)> {
        let w = self.world();
        w.files
            .values()
            .filter(|(ps, _)| *ps == page_size)
            .filter_map(|(ps, f)| Some((f.kept.clone()?, f.pages * ps.bytes())))
            .collect()
    }
}
