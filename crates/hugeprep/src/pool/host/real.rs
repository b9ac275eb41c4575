//! The host the daemon runs on: the journal in the state directory, files on the
//! hugetlbfs mounts, the kernel's free-page counters and the monotonic clock.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::ops::Range;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::{Background, FileAt, Handle, Host, HostError, RealPools};
use crate::hugetlb::{BackingFile, Owner};
use crate::journal::{Journal, JournalError};
use crate::page_size::PageSize;
use crate::pool::core::recovery::{Facts, Step};
use crate::pool::fault::FaultError;
use crate::pool::holes::{HoleError, Refill};
use crate::pool::kernel::Supply;
use crate::pool::on_node::{OnNodeError, Stray};
use crate::pool::reach::{Proof, Reach, Unproven};
use crate::pool::record::{file_key, FileRecord};
use crate::pool::state::Promised;
use crate::pool::{fault, PoolMount};
use crate::prefault::Taken;
use crate::scrub::{ScrubControl, ScrubError, ScrubOptions, ScrubReport, Scrubber};

/// The real host: what [`super::Host`] asks is done with syscalls.
#[derive(Debug)]
pub(in crate::pool) struct RealHost {
    pub(super) mounts: Arc<BTreeMap<PageSize, PoolMount>>,
    journal: Journal,
    supply: Supply,
    /// The kernel's pools and the reservations' ledger (shared with the ledger's owner).
    pub(super) pools: Arc<RealPools>,
    /// Set after recovery (the open watch starts then, as it always has).
    pub(super) reach: std::sync::OnceLock<Arc<Reach>>,
    scrubber: Arc<Scrubber>,
    /// Who released files go back to.
    daemon_owner: Owner,
}

impl RealHost {
    /// The host of `mounts`, journaling in `journal`, reading free pages from `supply`,
    /// resizing the kernel's pools through `pools`, scrubbing with `scrubber`; it proves
    /// releases once [`RealHost::set_reach`] gave it the open watch.
    pub(in crate::pool) fn new(
        mounts: Arc<BTreeMap<PageSize, PoolMount>>,
        journal: Journal,
        supply: Supply,
        pools: Arc<RealPools>,
        scrubber: Arc<Scrubber>,
    ) -> RealHost {
        RealHost {
            mounts,
            journal,
            supply,
            pools,
            reach: std::sync::OnceLock::new(),
            scrubber,
            daemon_owner: Owner {
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
            },
        }
    }

    /// Who opened leased files, and the proofs that released ones are out of reach.
    pub(in crate::pool) fn set_reach(&self, reach: Arc<Reach>) {
        if self.reach.set(reach).is_err() {
            tracing::warn!("the release proof was set twice: the first stays");
        }
    }

    pub(super) fn path(&self, file: FileAt) -> Result<std::path::PathBuf, HostError> {
        Ok(self.mount(file.page_size)?.file_path(file.id))
    }

    fn backing<'a>(&self, handle: &'a Handle) -> Result<&'a BackingFile, HostError> {
        handle.backing().ok_or(HostError::Foreign(handle.at().id))
    }

    fn mount(&self, page_size: PageSize) -> Result<&PoolMount, HostError> {
        self.mounts
            .get(&page_size)
            .ok_or(HostError::NoMount(page_size))
    }

    /// The mount root of `page_size` (empty when none serves it, as the callers had it).
    fn root(&self, page_size: PageSize) -> std::path::PathBuf {
        self.mounts
            .get(&page_size)
            .map(|m| m.root.clone())
            .unwrap_or_default()
    }
}

impl Host for RealHost {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn journal_write(&self, rec: &FileRecord) -> Result<(), JournalError> {
        self.journal.write(&rec.key(), rec)
    }

    fn journal_remove(&self, id: u64) -> Result<(), JournalError> {
        self.journal.remove(&file_key(id))
    }

    fn journal_mark_clean(&self) -> Result<(), JournalError> {
        self.journal.mark_clean_shutdown()
    }

    fn file_size(&self, file: FileAt) -> Result<u64, HostError> {
        let path = self.mount(file.page_size)?.file_path(file.id);
        std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(|source| HostError::Io {
                id: file.id,
                source,
            })
    }

    fn cut(&self, file: FileAt, size: u64) -> Result<(), HostError> {
        let path = self.mount(file.page_size)?.file_path(file.id);
        let mut f = BackingFile::open(&path, file.page_size)?;
        Ok(f.set_len(size)?)
    }

    fn fill(
        &self,
        file: FileAt,
        size: u64,
        node: u32,
        cpus: &[usize],
        background: Background,
    ) -> Result<(), HostError> {
        let path = self.mount(file.page_size)?.file_path(file.id);
        let f = BackingFile::create(&path, size, file.page_size, None)?;
        fault::fault_range_background(&f, 0..size, node, cpus, background.gate, background.taken)?;
        Ok(())
    }

    fn available_after(&self, node: u32, page_size: PageSize, promised: &Promised) -> u64 {
        self.supply
            .available_after(node, page_size, &self.root(page_size), promised)
    }

    fn available_bytes(&self, node: u32, page_size: PageSize) -> u64 {
        self.supply
            .available_bytes(node, page_size, &self.root(page_size))
    }

    fn open(&self, file: FileAt) -> Result<Handle, HostError> {
        let f = BackingFile::open(&self.path(file)?, file.page_size)?;
        Ok(Handle::new(file, f.size(), Some(f)))
    }

    fn create(&self, file: FileAt, size: u64) -> Result<Handle, HostError> {
        let f = BackingFile::create(&self.path(file)?, size, file.page_size, None)?;
        Ok(Handle::new(file, size, Some(f)))
    }

    fn resize(&self, handle: &mut Handle, size: u64) -> Result<(), HostError> {
        let id = handle.at().id;
        let f = handle.backing_mut().ok_or(HostError::Foreign(id))?;
        Ok(f.set_len(size)?)
    }

    fn fault_lease(
        &self,
        handle: &Handle,
        range: Range<u64>,
        node: u32,
        cpus: &[usize],
        beside_others: bool,
        taken: Arc<Taken>,
    ) -> Result<(), FaultError> {
        let Some(f) = handle.backing() else {
            return Err(FaultError(crate::prefault::PrefaultError::Reserve {
                bytes: range.end.saturating_sub(range.start),
                page_size: handle.at().page_size,
                source: foreign(handle),
            }));
        };
        fault::fault_lease_range(f, range, node, cpus, beside_others, taken)
    }

    fn watch(&self, id: u64, handle: &Handle) {
        if let (Some(f), Some(reach)) = (handle.backing(), self.reach.get()) {
            reach.watch(id, f.file());
        }
    }

    fn forget(&self, id: u64) {
        if let Some(reach) = self.reach.get() {
            reach.forget(id);
        }
    }

    fn chown(&self, handle: &Handle, owner: Owner) -> Result<(), HostError> {
        Ok(self.backing(handle)?.chown(owner)?)
    }

    fn lease_path_taken(&self, lease_path: &Path) -> bool {
        fs::symlink_metadata(lease_path).is_ok()
    }

    fn tenant_dir(&self, page_size: PageSize, dir: &str) -> Result<(), HostError> {
        let uid = nix::unistd::geteuid().as_raw();
        self.mount(page_size)?
            .lease_dir_handle()
            .own_subdir(dir, 0o711, uid)?;
        Ok(())
    }

    fn link_lease(&self, handle: &Handle, lease_path: &Path) -> Result<(), HostError> {
        Ok(self.backing(handle)?.link(lease_path)?)
    }

    fn unlink_lease(&self, file: FileAt, lease_path: &Path) {
        let Ok(path) = self.path(file) else {
            return;
        };
        if let Ok(m) = fs::metadata(path) {
            crate::pool::unlink_if_same(lease_path, m.dev(), m.ino());
        }
    }

    fn take_back(&self, file: FileAt) -> Result<(), HostError> {
        let path = self.path(file)?;
        // The pool directory (0700, the daemon's) keeps the file from anyone else by name,
        // but a warm file is linked under `leases/` again at its next lease, where the
        // owner and mode its last lessee left would let that lessee open it: a file not
        // taken back is never recycled.
        match take_back_file(&path, self.daemon_owner) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => {
                tracing::warn!(file = %path.display(), %err, "cannot take a released file back from its owner: it takes the kernel's path");
                Err(HostError::Io {
                    id: file.id,
                    source: err,
                })
            }
            _ => Ok(()),
        }
    }

    fn pin(&self, handle: &Handle, len: usize) -> Result<super::Pin, HostError> {
        let file = self.backing(handle)?;
        let pin =
            crate::sys::pin::LongTermPin::pin_file(std::os::fd::AsFd::as_fd(file.file()), len)?;
        Ok(super::Pin::new(handle.at().id, pin.took(), Some(pin)))
    }

    fn unpin(&self, pin: super::Pin) -> std::time::Duration {
        pin.into_real().map_or(
            std::time::Duration::ZERO,
            crate::sys::pin::LongTermPin::unpin,
        )
    }

    fn prove(&self, id: u64, handle: &Handle) -> Result<Proof, Unproven> {
        match (handle.backing(), self.reach.get()) {
            (Some(f), Some(reach)) => reach.prove(id, f.file()),
            _ => Err(Unproven::NotWatched),
        }
    }

    fn refill_holes(
        &self,
        handle: &Handle,
        node: u32,
        cpus: &[usize],
    ) -> Result<Refill, HoleError> {
        let f = handle
            .backing()
            .ok_or_else(|| HoleError::Map(foreign(handle)))?;
        crate::pool::holes::refill(f, node, cpus)
    }

    fn stray_page(
        &self,
        handle: &Handle,
        node: u32,
        page_bytes: u64,
    ) -> Result<Option<Stray>, OnNodeError> {
        match handle.backing() {
            Some(f) => crate::pool::on_node::stray_page(f, node, page_bytes),
            None => Ok(None),
        }
    }

    fn scrub(
        &self,
        handle: &Handle,
        ranges: &[Range<u64>],
        opts: &ScrubOptions,
        control: &ScrubControl,
    ) -> Result<ScrubReport, ScrubError> {
        let f = handle
            .backing()
            .ok_or_else(|| ScrubError::File(foreign(handle)))?;
        self.scrubber.scrub_file_ranges(f, ranges, opts, control)
    }

    fn truncate(&self, file: FileAt, node: u32) -> io::Result<u64> {
        let path = self.path(file).map_err(io::Error::other)?;
        // O_NONBLOCK: a lease someone else holds on the file fails the open at once (the
        // file is then only unlinked) instead of stalling the worker for lease-break-time.
        let f = super::real_keeper::open_for_write(&path)?;
        // The pages the file holds (hugetlbfs counts them in `st_blocks`), not its length:
        // pages a VMM punched out (`discard-data`, a balloon) went back to the kernel already.
        let pages = f.metadata()?.blocks() * 512 / file.page_size.bytes();
        let (truncated, returned) = super::real_keeper::truncate_counted(&f, node, file.page_size);
        truncated?;
        Ok(returned.map_or(0, |r| pages.saturating_sub(r)))
    }

    fn unlink(&self, file: FileAt) -> io::Result<()> {
        fs::remove_file(self.path(file).map_err(io::Error::other)?)
    }

    fn journal_was_clean(&self) -> bool {
        self.journal.was_clean_shutdown()
    }

    fn journal_clear_clean(&self) -> Result<(), JournalError> {
        self.journal.clear_clean_shutdown()
    }

    fn recovery_facts(&self, clean: bool) -> crate::pool::Result<Facts> {
        crate::pool::recover::facts(&self.journal, &self.mounts, clean)
    }

    fn recovery_step(&self, step: &Step) -> crate::pool::Result<bool> {
        crate::pool::recover::perform(&self.journal, &self.mounts, step)
    }

    fn recovery_finish(&self) {
        crate::pool::recover::remove_empty_scope_dirs(&self.mounts);
    }
}

/// Gives the regular file at `path` to `owner`, mode 0600, through a descriptor opened
/// `O_PATH | O_NOFOLLOW`: a symbolic link is not followed, and a name swapped between the
/// check and the change cannot redirect it, since both act on that very inode. `O_PATH`
/// opens nothing for reading, so a file lease the lessee holds on the file neither fails
/// the call nor is broken by it (an `O_RDONLY` open would fail with `EWOULDBLOCK` and
/// signal the lessee). The owner changes by `fchownat(AT_EMPTY_PATH)` and the mode through
/// the descriptor's `/proc/self/fd` link, which names the inode itself.
fn take_back_file(path: &Path, owner: Owner) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let st = rustix::fs::fstat(&f)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    rustix::fs::chownat(
        &f,
        "",
        Some(rustix::fs::Uid::from_raw(owner.uid)),
        Some(rustix::fs::Gid::from_raw(owner.gid)),
        rustix::fs::AtFlags::EMPTY_PATH,
    )?;
    let by_fd = format!("/proc/self/fd/{}", f.as_raw_fd());
    rustix::fs::chmod(by_fd.as_str(), rustix::fs::Mode::from_raw_mode(0o600))?;
    Ok(())
}

/// A handle this host did not make (never: the pool has one host).
fn foreign(handle: &Handle) -> crate::hugetlb::FileError {
    crate::hugetlb::FileError::Io {
        op: "using a handle of another host for",
        path: file_key(handle.at().id).into(),
        source: io::Error::other("the handle is not this host's"),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("hugeprep-take-back-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn me() -> Owner {
        Owner {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        }
    }

    #[test]
    fn take_back_makes_the_file_the_daemons_mode_0600() {
        let d = dir("file");
        let f = d.join("p1");
        fs::write(&f, b"").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
        take_back_file(&f, me()).unwrap();
        let m = fs::metadata(&f).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o600);
        assert_eq!((m.uid(), m.gid()), (me().uid, me().gid));
        fs::remove_dir_all(&d).unwrap();
    }

    /// Review of issue 35: `chown` and `chmod` by path follow a symbolic link put in the
    /// file's place; through a descriptor opened `O_NOFOLLOW` they act on nothing but the
    /// pool file.
    #[test]
    fn take_back_follows_no_symbolic_link_and_changes_no_other_inode() {
        let d = dir("link");
        let target = d.join("elsewhere");
        fs::write(&target, b"").unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o644)).unwrap();
        let link = d.join("p1");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        // `O_PATH | O_NOFOLLOW` opens the link itself, which is no regular file.
        let err = take_back_file(&link, me()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o644);
        // Nor a directory in its place.
        let sub = d.join("p2");
        fs::create_dir(&sub).unwrap();
        let err = take_back_file(&sub, me()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
        fs::remove_dir_all(&d).unwrap();
    }

    /// Attacker's review of this session: an `O_RDONLY` open to take a file back failed
    /// with `EWOULDBLOCK` while its lessee held a write lease on it (and signalled the
    /// lessee, who could then let go before the proof), leaving the file its lessee's, mode
    /// 0666, to be recycled. `O_PATH` neither fails on the lease nor breaks it.
    #[test]
    fn take_back_neither_fails_on_nor_breaks_a_lessees_file_lease() {
        let d = dir("lease");
        let f = d.join("p1");
        fs::write(&f, b"").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
        let held = fs::File::open(&f).unwrap();
        crate::sys::lease::set_lease(&held, libc::F_WRLCK).unwrap();
        take_back_file(&f, me()).unwrap();
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o600);
        assert_eq!(crate::sys::lease::lease_of(&held).unwrap(), libc::F_WRLCK);
        crate::sys::lease::set_lease(&held, libc::F_UNLCK).unwrap();
        fs::remove_dir_all(&d).unwrap();
    }
}
