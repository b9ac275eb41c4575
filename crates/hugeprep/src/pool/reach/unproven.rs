//! Why a release is not proven out of everyone else's reach, one variant per check that can
//! fail (the file then takes the kernel's path), with the small fixed set of labels the
//! metrics count them by.

/// Why a released file takes the kernel's path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unproven {
    /// The lease's owner, or the lease, asked for the kernel's path.
    #[error("recycle = \"kernel\" for this lease")]
    Trust,
    /// The file was not watched for the whole lease (a daemon restart, no fanotify, or the
    /// mark failed).
    #[error("the file's opens were not watched for the whole lease")]
    NotWatched,
    /// The kernel dropped open events, or more processes opened it than are recorded.
    #[error("open events were lost or too many processes opened the file")]
    Lost,
    /// Another name links to the file.
    #[error("the file has {nlink} names, the daemon's only 1")]
    Links {
        /// `st_nlink`.
        nlink: u64,
    },
    /// Some process, somewhere, still has it open or mapped, or in flight.
    #[error("another open file or mapping of it exists")]
    OpenElsewhere,
    /// A process opened it while the proof ran.
    #[error("a process opened it while the proof ran")]
    OpenedMeanwhile,
    /// An opener is still running.
    #[error("process {pid}, which opened it, is still running")]
    OpenerAlive {
        /// The opener.
        pid: u32,
    },
    /// An opener's cgroups are not known (it was killed while its open waited for the
    /// answer, or they could not be read).
    #[error("the cgroups of process {pid}, which opened it, are not known")]
    OpenerUnknown {
        /// The opener.
        pid: u32,
    },
    /// None of an exited opener's cgroups has emptied (or it was in none but the roots).
    #[error(
        "process {pid}, which opened it, has exited, but none of its cgroups is empty ({cgroups})"
    )]
    OpenerCgroup {
        /// The opener.
        pid: u32,
        /// Its cgroup directories.
        cgroups: String,
    },
    /// A process other than the daemon holds an io_uring with registered buffers.
    #[error("process {pid} holds an io_uring with registered buffers")]
    IoUring {
        /// The process.
        pid: u32,
    },
    /// A process holds a descriptor of the file (an `O_PATH` one counts as no open file).
    #[error("process {pid} holds a descriptor of it")]
    Descriptor {
        /// The process.
        pid: u32,
    },
    /// A mount namespace holds a mount of it, or of the mount's inside, or is held by a
    /// descriptor alone.
    #[error("the mount namespace of process {pid} holds a mount inside the hugetlbfs, or one no process is in")]
    Mount {
        /// The process.
        pid: u32,
    },
    /// Open files or mounts of the file exist beside the daemon's one (the kernel's count of
    /// references to its dentry), or another dentry of it does (a name unlinked while held).
    #[error("{extra} open files or mounts of it exist beside the daemon's (O_PATH and in flight ones included), and {names} other dentries")]
    Referenced {
        /// References beyond the daemon's.
        extra: i32,
        /// Other dentries of the inode.
        names: u32,
    },
    /// A mount of its file system shows less than the whole (a bind mount of the file or of
    /// a directory), in some mount namespace or none.
    #[error("{mounts} mounts of its file system show a part of it (a bind mount)")]
    PartialMount {
        /// Such mounts.
        mounts: u32,
    },
    /// Pages of the file are referenced beyond the page cache: mapped, pinned (io_uring,
    /// VFIO, RDMA), in a pipe, or otherwise held.
    #[error("{folios} of its huge pages are held beyond the page cache (the first: {refs} references, {pins} pins, {maps} mappings)")]
    PagesHeld {
        /// Folios held.
        folios: u64,
        /// The first one's reference count.
        refs: i64,
        /// Its long-term pins.
        pins: i64,
        /// Its mappings.
        maps: i64,
    },
    /// A page of the file is on another node than the file's (the lessee moved it, e.g.
    /// `mbind(MPOL_MF_MOVE)`): recycled in place, the next lease would get it there.
    #[error("page {page} of it is on node {found}, the file's node is {node}")]
    Node {
        /// The page's index.
        page: u64,
        /// Where it is.
        found: u32,
        /// The file's node.
        node: u32,
    },
    /// A step could not be carried out; the proof fails closed.
    #[error("{step}: {message}")]
    Error {
        /// The step.
        step: &'static str,
        /// What failed.
        message: String,
    },
}

impl Unproven {
    /// A short label for metrics and logs (a small fixed set).
    pub fn label(&self) -> &'static str {
        match self {
            Unproven::Trust => "trust",
            Unproven::NotWatched => "not-watched",
            Unproven::Lost => "lost-events",
            Unproven::Links { .. } => "links",
            Unproven::OpenElsewhere => "open-elsewhere",
            Unproven::OpenedMeanwhile => "opened-meanwhile",
            Unproven::OpenerAlive { .. } => "opener-alive",
            Unproven::OpenerUnknown { .. } => "opener-unknown",
            Unproven::OpenerCgroup { .. } => "opener-cgroup",
            Unproven::IoUring { .. } => "io-uring",
            Unproven::Descriptor { .. } => "descriptor",
            Unproven::Mount { .. } => "mount",
            Unproven::Referenced { .. } => "descriptor",
            Unproven::PartialMount { .. } => "mount",
            Unproven::PagesHeld { .. } => "pages-held",
            Unproven::Node { .. } => "node",
            Unproven::Error { .. } => "error",
        }
    }

    /// Every label, for metrics that list them all.
    pub const LABELS: [&'static str; 15] = [
        "trust",
        "not-watched",
        "lost-events",
        "links",
        "open-elsewhere",
        "opened-meanwhile",
        "opener-alive",
        "opener-unknown",
        "opener-cgroup",
        "io-uring",
        "descriptor",
        "mount",
        "pages-held",
        "node",
        "error",
    ];
}
