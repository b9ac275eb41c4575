//! Errors of the libvirt hook. Each is one line, as virsh shows it to the user.

use std::path::PathBuf;

use crate::client::ClientError;

/// The hook could not give a domain its memory.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The document on stdin is not XML.
    #[error("domain XML on stdin is malformed: {message}")]
    Malformed {
        /// The parser's message, with line and column.
        message: String,
    },
    /// An element or attribute of the domain XML is missing or invalid.
    #[error("domain XML {field}: {message}")]
    Xml {
        /// The element or attribute.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The domain's memory cannot be served as configured.
    #[error("{0}")]
    Plan(String),
    /// The hook's configuration file is unreadable or invalid.
    #[error("config {path}: {message}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The pool cannot serve a backend.
    #[error("pool cannot serve {alias} of domain {domain:?}: {source}")]
    Shortage {
        /// Domain name.
        domain: String,
        /// Backend alias.
        alias: String,
        /// The daemon's answer.
        source: ClientError,
    },
    /// The daemon did not answer, or stayed busy.
    #[error(
        "hugeprep daemon unavailable for domain {domain:?} (retried for {retried_s} s): {source}"
    )]
    DaemonDown {
        /// Domain name.
        domain: String,
        /// How long the hook retried (`daemon_retry_s`).
        retried_s: u64,
        /// What failed.
        source: ClientError,
    },
    /// The daemon refused a request for another reason.
    #[error("daemon refused {what} for domain {domain:?}: {source}")]
    Daemon {
        /// What was asked.
        what: String,
        /// Domain name.
        domain: String,
        /// The daemon's answer.
        source: ClientError,
    },
    /// QEMU's user cannot reach the files the hook would link for it.
    #[error(
        "memory_backing_dir {dir}: QEMU runs as {qemu} and could not open its memory there: \
         {blocked}; give that user search permission on every directory down to it, or set \
         memory_backing_dir (qemu.conf and the hook's config) to a directory it can reach"
    )]
    Unreachable {
        /// The per-domain directory.
        dir: PathBuf,
        /// QEMU's user, for the message.
        qemu: String,
        /// Where the path is closed.
        blocked: Box<crate::perm::Blocked>,
    },
    /// A directory below `memory_backing_dir` is a link, not QEMU's, or writable by others.
    #[error(transparent)]
    Dir(#[from] crate::hugetlb::dir::DirError),
    /// A file system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

/// Result of hook actions.
pub type Result<T> = std::result::Result<T, HookError>;

impl HookError {
    /// Whether the daemon could not be reached, did not answer in time, or stayed busy
    /// (503) after the retries.
    pub fn is_unreachable(e: &ClientError) -> bool {
        matches!(
            e,
            ClientError::Connect { .. }
                | ClientError::Timeout { .. }
                | ClientError::Http { .. }
                | ClientError::Api { status: 503, .. }
        )
    }
}
