//! The release proof from the kernel's own reference counts ([`crate::sys::reach_bpf`]):
//! its cost is bounded by the released file (its dentry, the mounts of its file system, its
//! pages) and the daemon's descriptors, never by the processes on the host.
//!
//! Everything that can reach a released file's pages holds a count the kernel keeps:
//!
//! - a name: `i_nlink`, and a dentry of the inode (an unlinked name someone still holds);
//! - an open file of it, of any kind (read, write, `O_PATH`), in any descriptor table, in
//!   flight in a unix socket, registered with an io_uring, or held by a mapping: one
//!   reference to its dentry per open file;
//! - a mount of the file (a bind mount, in any namespace, or a detached tree): a reference
//!   to its dentry; a mount of a directory of its file system shows as a mount whose root is
//!   not the file system's root;
//! - a page reference (a mapping, a long-term pin by io_uring, VFIO, iommufd or RDMA, a pipe
//!   buffer filled by `vmsplice`, any `get_page`): a reference to the folio, beyond the one
//!   per page the page cache holds. The kernel frees a hugetlb folio only when nobody holds
//!   one: this is the test it applies itself before it reuses a page.
//!
//! So the proof needs no record of who opened the file, no cgroups and no walk of `/proc`:
//! with the daemon's one descriptor open (and a fresh one, never handed to a lessee, so that
//! no mapping can hide behind it), the dentry must have the daemon's reference and the
//! one every linked hugetlbfs dentry holds, the inode no other dentry, the file system no
//! partial mount, and every folio exactly the page cache's references.
//!
//! Opens are refused (but the daemon's and root's) from before the counts are read until the
//! file is leased again: an open that had taken its dentry reference before is counted, one
//! after is refused.
//!
//! The counts of a quiet file are checked once against this model, on the first lease (a
//! file nobody but the daemon can reach): the dentry of one open file has 2 references, an
//! `O_PATH` descriptor adds one, every folio is at the page cache's count. A kernel that
//! differs fails every proof (the kernel's path), with one error in the log.

use std::fs::File;
use std::os::unix::fs::MetadataExt;

use std::os::fd::AsFd;
use std::time::Instant;

use std::sync::atomic::Ordering;

use super::{scan, Proof, Reach, Unproven};
use crate::sys::fanotify::OpenWatch;
use crate::sys::reach_bpf::{kernel_dev, Probe, Report};

/// References to the dentry of a linked hugetlbfs file that one open file (the daemon's)
/// holds: the file system's own pin of a linked dentry, and the open file's.
pub const QUIET_DENTRY_REFS: i32 = 2;

/// Whether the kernel's counts of a quiet file match the model the proof relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// Not checked yet (no file leased since the start).
    Unchecked,
    /// Checked on a quiet file: the proof may rely on it.
    Holds,
    /// A quiet file's counts differ: every proof fails.
    Differs,
}

/// Checks the model on `file`, a pool file that only the daemon can reach and that it holds
/// through this one open file. `None`: the file cannot tell now (no page in it, a walk that
/// could not finish, or a run that failed), or a count is higher than the model's while a
/// mount could explain it (a mount of the file seen, or more mounts than the walk reads:
/// any user can make such mounts in a namespace of its own). Mounts never fail the check:
/// they only put it off to a later lease, and a mount of a directory, which holds no
/// reference to the file, does not even do that.
pub fn check_model(probe: &Probe, file: &File) -> Result<Option<()>, String> {
    let quiet = match probe.report(file, true) {
        Ok(r) => r,
        Err(err) => {
            tracing::warn!(%err, "cannot read a quiet pool file's counts: the check of the release proof's model waits for a later lease");
            return Ok(None);
        }
    };
    if quiet.folios == 0 || quiet.incomplete {
        return Ok(None);
    }
    if quiet.other_aliases != 0 || quiet.dentry_count != QUIET_DENTRY_REFS || quiet.held_folios != 0
    {
        let mounted = quiet.file_mounts != 0 || quiet.mounts_truncated;
        if mounted
            && quiet.other_aliases == 0
            && quiet.held_folios == 0
            && quiet.dentry_count > QUIET_DENTRY_REFS
        {
            return Ok(None);
        }
        return Err(format!("a quiet file's counts: {quiet:?}"));
    }
    // One more open file of it (O_PATH) is one more reference.
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(file));
    let o_path = nix::fcntl::open(
        path.as_str(),
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("O_PATH open of the quiet file: {e}"))?;
    let held = probe.report(file, false);
    // The descriptor is gone whatever close says (Linux frees it even on EINTR), and the
    // probe's report was taken while it was open.
    let _ = nix::unistd::close(o_path);
    let held = match held {
        Ok(r) => r,
        Err(err) => {
            tracing::warn!(%err, "cannot read a quiet pool file's counts: the check of the release proof's model waits for a later lease");
            return Ok(None);
        }
    };
    if held.dentry_count != QUIET_DENTRY_REFS + 1 {
        return Err(format!(
            "an O_PATH descriptor did not count: {} references, {} expected",
            held.dentry_count,
            QUIET_DENTRY_REFS + 1
        ));
    }
    Ok(Some(()))
}

/// The counts' verdict on `file` (the daemon's only open file of a released pool file).
pub fn prove(probe: &Probe, file: &File) -> Result<Report, Unproven> {
    let fail = |step: &'static str| move |e: String| Unproven::Error { step, message: e };
    let r = probe
        .report(file, true)
        .map_err(|e| e.to_string())
        .map_err(fail("kernel counts"))?;
    let meta = file
        .metadata()
        .map_err(|e| e.to_string())
        .map_err(fail("fstat"))?;
    if (r.dev, r.ino) != (kernel_dev(meta.dev()), meta.ino()) {
        return Err(Unproven::Error {
            step: "kernel counts",
            message: format!(
                "the probe read inode {}:{}, not the file's {}:{}",
                r.dev,
                r.ino,
                kernel_dev(meta.dev()),
                meta.ino()
            ),
        });
    }
    if r.nlink != 1 {
        return Err(Unproven::Links {
            nlink: u64::from(r.nlink),
        });
    }
    // Beyond the walk's bound the rest of the mounts are checked by the caller
    // ([`Report::mounts_truncated`]); a mount of the file is a dentry reference anyway.
    if r.file_mounts > 0 || r.partial_mounts > 0 {
        return Err(Unproven::PartialMount {
            mounts: r.partial_mounts,
        });
    }
    if r.other_aliases > 0 || r.aliases_truncated || r.dentry_count != QUIET_DENTRY_REFS {
        return Err(Unproven::Referenced {
            extra: r.dentry_count - QUIET_DENTRY_REFS,
            names: r.other_aliases,
        });
    }
    if r.incomplete || r.odd_entries > 0 || !r.walked {
        return Err(Unproven::Error {
            step: "page cache walk",
            message: format!(
                "{} folios read, {} entries under change, finished: {}",
                r.folios, r.odd_entries, !r.incomplete
            ),
        });
    }
    if r.held_folios > 0 {
        let (refs, pins, maps) = r.first_held;
        return Err(Unproven::PagesHeld {
            folios: r.held_folios,
            refs,
            pins,
            maps: maps + 1,
        });
    }
    Ok(r)
}

impl Reach {
    /// The file system of `file` has more mounts than the counts' walk reads (any user can
    /// make that many in namespaces of its own): the rest are checked by a walk of every
    /// mount namespace in `/proc` ([`scan::find_mount`]), which costs what the fallback's
    /// walk costs, and counted ([`Reach::proofs_beyond_mount_bound`]). Neither a mount nor
    /// the bound turns the counts off: the next release is proven by them again.
    fn mounts_beyond_bound(&self, file: &File) -> Result<(), Unproven> {
        self.beyond_mount_bound.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            bound = crate::sys::reach_bpf::MAX_MOUNTS,
            "the pool's file system has more mounts than the release proof's kernel walk reads: the rest are read from /proc (slower; a local user may have made them)"
        );
        let fail = |e: std::io::Error| Unproven::Error {
            step: "scan of /proc for mounts",
            message: e.to_string(),
        };
        let dev = file.metadata().map_err(fail)?.dev();
        match scan::find_mount(dev).map_err(fail)? {
            None => Ok(()),
            Some(scan::Finding::Mount { pid }) => Err(Unproven::Mount { pid }),
            Some(other) => Err(Unproven::Error {
                step: "scan of /proc for mounts",
                message: format!("{other:?}"),
            }),
        }
    }

    /// [`Reach::watch`] with kernel counts: opens are no longer refused, and the first one
    /// is reported (for the start gate) without making the opener wait. On the first lease,
    /// the model of the counts is checked on the file, which only the daemon reaches yet.
    pub(super) fn watch_by_counts(&self, w: &OpenWatch, id: u64, file: &File) {
        self.check_model(file);
        let unwatched = match w.unwatch(file.as_fd()) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => other,
        };
        if let Err(err) = unwatched.and_then(|()| w.notify(file.as_fd())) {
            // Opens of it would be refused, or not seen by the start gate.
            tracing::warn!(id, %err, "cannot change a leased file's open watch: it will take the kernel's path");
            if let Some(r) = self.lock().files.get_mut(&id) {
                r.complete = false;
            }
        }
    }

    /// Checks once that the kernel's counts of a quiet file match the proof's model.
    fn check_model(&self, file: &File) {
        let Some(probe) = &self.probe else { return };
        let mut model = self.model.lock().unwrap_or_else(|e| e.into_inner());
        if *model != Model::Unchecked {
            return;
        }
        match check_model(probe, file) {
            Ok(Some(())) => {
                tracing::info!(
                    "the kernel's counts of a quiet pool file match the release proof's model"
                );
                *model = Model::Holds;
            }
            Ok(None) => {}
            Err(err) => {
                tracing::error!(%err, "the kernel's counts of a quiet pool file do not match the release proof's model: every release takes the kernel's path");
                *model = Model::Differs;
                *self.model_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(err);
            }
        }
    }

    /// [`Reach::prove`] from the kernel's counts ([`kernel`]).
    pub(super) fn prove_by_counts(
        &self,
        probe: &Probe,
        id: u64,
        file: &File,
        started: Instant,
    ) -> Result<Proof, Unproven> {
        let Some(w) = &self.watch else {
            return Err(Unproven::NotWatched);
        };
        // Refused from now until the next lease (but the daemon's and root's opens): an
        // open that took its dentry reference before is in the counts read below.
        let opens = {
            let mut st = self.lock();
            let record = st.files.get_mut(&id).ok_or(Unproven::NotWatched)?;
            if !record.complete {
                return Err(Unproven::Lost);
            }
            record.refusing = true;
            record.opens
        };
        w.watch(file.as_fd()).map_err(|e| Unproven::Error {
            step: "refusing opens",
            message: e.to_string(),
        })?;
        let model = *self.model.lock().unwrap_or_else(|e| e.into_inner());
        if model != Model::Holds {
            return Err(Unproven::Error {
                step: "kernel counts",
                message: match model {
                    Model::Unchecked => "not checked on a quiet file yet".into(),
                    _ => "a quiet file's counts differ from the model".into(),
                },
            });
        }
        let sole = crate::sys::lease::sole_open_file(file).map_err(|e| Unproven::Error {
            step: "write lease",
            message: e.to_string(),
        })?;
        if !sole {
            return Err(Unproven::OpenElsewhere);
        }
        let report = prove(probe, file)?;
        if report.mounts_truncated {
            self.mounts_beyond_bound(file)?;
        }
        if let Some(r) = self.lock().files.get_mut(&id) {
            r.recycled = true;
        }
        Ok(Proof {
            openers: opens,
            took: started.elapsed(),
        })
    }
}

impl Reach {
    /// Pages of `file` (an open file of a released pool file that the daemon will not
    /// recycle) that the kernel counts as referenced beyond the page cache and a mapping: a
    /// long-term pin (an io_uring fixed buffer, VFIO, RDMA), a pipe buffer (`vmsplice`), any
    /// other `get_page`. A truncate takes a page out of every mapping and returns it, but
    /// such a page it leaves with its holder, where no count of the daemon's sees it any
    /// more. `Ok(None)`: the daemon cannot see them (no kernel counts: the walk proves
    /// releases; or a quiet file's counts differ from the model). `Err`: the counts could
    /// not be read completely now (read again later). Cost: one run of the probe, bounded
    /// by the file's pages.
    pub fn pinned_pages(&self, file: &File) -> Result<Option<Pins>, String> {
        let Some(probe) = &self.probe else {
            return Ok(None);
        };
        if *self.model.lock().unwrap_or_else(|e| e.into_inner()) == Model::Differs {
            return Ok(None);
        }
        let r = probe.report(file, true).map_err(|e| e.to_string())?;
        if r.incomplete || r.odd_entries > 0 || !r.walked {
            return Err(format!(
                "{} folios read, {} entries under change, finished: {}",
                r.folios, r.odd_entries, !r.incomplete
            ));
        }
        let at = (r.pinned_folios as usize <= crate::sys::reach_bpf::PINNED_AT
            && base_page_index())
        .then(|| {
            // The index counts the kernel's base pages: 4 KiB on x86, 16 or 64 KiB on some
            // arm64 and ppc64 kernels.
            let base = rustix::param::page_size() as u64;
            r.pinned_at[..r.pinned_folios as usize]
                .iter()
                .map(|&i| i.saturating_mul(base))
                .collect()
        });
        Ok(Some(Pins {
            pages: r.pinned_folios,
            at,
            // A mapping holds an open file (a dentry reference) of its own.
            reachable: r.other_aliases > 0
                || r.aliases_truncated
                || r.file_mounts > 0
                || r.dentry_count != QUIET_DENTRY_REFS,
        }))
    }
}

/// What [`Reach::pinned_pages`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pins {
    /// Pages referenced beyond the page cache and any mapping (a pin, a pipe buffer).
    pub pages: u64,
    /// Whether anything but the caller's one open file still reaches the file or a page
    /// of it (another open file, a mapping, a mount, another name): it could pin again.
    pub reachable: bool,
    /// The byte offsets of the pinned pages in the file, when all are known (at most
    /// [`crate::sys::reach_bpf::PINNED_AT`], on a kernel that indexes hugetlb's page cache
    /// in base pages, 6.7 and later).
    pub at: Option<Vec<u64>>,
}

impl Pins {
    /// Whether a released file with these counts is kept untruncated, charged to its
    /// lessee (see `pool::kept`): only while pages of it are pinned and nothing else reaches
    /// it. A file something else still reaches (an open file, a mapping) is truncated
    /// whether pinned or not: kept, every page would stay with that holder, who could fault
    /// more in up to its length or pin them, for as long as it likes; truncated, only the
    /// pages already pinned stay with it (docs/security.md, "Gaps still open"). The one rule
    /// for the release and for every later look of the keeper.
    pub fn keep_file(&self) -> bool {
        self.pages > 0 && !self.reachable
    }
}

/// Whether this kernel indexes hugetlb's page cache in base pages (6.7 and later).
fn base_page_index() -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut parts = release.trim().split(['.', '-']);
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (6, 7)
}
