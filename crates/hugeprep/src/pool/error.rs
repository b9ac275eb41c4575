//! Errors of pool operations. Each says which request field was wrong, when one was.

use crate::hugetlb::FileError;
use crate::journal::JournalError;
use crate::page_size::PageSize;
use crate::pool::fault::FaultError;

/// A pool operation failed. When it did, nothing was allocated or changed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A request field is invalid.
    #[error("{field}: {message}")]
    Field {
        /// The field, as named in the request.
        field: &'static str,
        /// What is wrong, with the limit.
        message: String,
    },
    /// A live lease already has this name.
    #[error("name: a lease named {name:?} already exists")]
    DuplicateName {
        /// The name.
        name: String,
    },
    /// The node cannot supply the memory, even counting warm and dirty files.
    #[error(
        "size: {size} bytes of {page_size} pages on node {node} asked for, at most {available} available"
    )]
    Insufficient {
        /// Bytes asked for.
        size: u64,
        /// Page size.
        page_size: PageSize,
        /// Node.
        node: u32,
        /// Bytes the node could supply (free pages plus warm and dirty pool files).
        available: u64,
    },
    /// A directory of the daemon's on a mount is missing, or is not the daemon's.
    #[error(transparent)]
    Dir(#[from] crate::hugetlb::dir::DirError),
    /// An idempotency key was used for a different request (the IETF idempotency-key draft's
    /// 422).
    #[error("idempotency_key: {message}")]
    KeyReused {
        /// What the key was used for.
        message: String,
    },
    /// The lease would take its principal over one of its limits (`[pool.limits]`), or the
    /// host over `reserve_limit`.
    #[error("{limit}: {in_use} in use, {asked} more asked for by {principal}; the limit is {max}")]
    OverLimit {
        /// The principal that asked.
        principal: String,
        /// The limit's name (`leased_bytes.2M`, `leases`, `descriptors`, `reserve_limit`).
        limit: String,
        /// The limit.
        max: u64,
        /// What the principal (for `reserve_limit`: the node) holds now.
        in_use: u64,
        /// What the request asked for on top.
        asked: u64,
    },
    /// No lease with this id.
    #[error("no lease with id {id}")]
    NotFound {
        /// The id.
        id: u64,
    },
    /// The daemon is shutting down.
    #[error("shutting down")]
    ShuttingDown,
    /// The journal could not record the change (so it was not made).
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// A file operation failed.
    #[error(transparent)]
    File(#[from] FileError),
    /// Raising or lowering a kernel pool, or its ledger, failed.
    #[error(transparent)]
    Reserve(#[from] crate::pool::reserve::ReserveError),
    /// Faulting pages failed.
    #[error(transparent)]
    Fault(#[from] FaultError),
    /// The long-term pin of a `pin: true` lease failed (memlock limit, ENOMEM, no io_uring).
    #[error(transparent)]
    Pin(#[from] crate::sys::pin::PinError),
    /// The pool directory could not be set up or read.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: std::path::PathBuf,
        /// The kernel's answer.
        source: std::io::Error,
    },
}

impl PoolError {
    /// The request field this error is about, if any (for the API's `field`).
    pub fn field(&self) -> Option<&'static str> {
        match self {
            PoolError::Field { field, .. } => Some(field),
            PoolError::DuplicateName { .. } => Some("name"),
            PoolError::Insufficient { .. } => Some("size"),
            PoolError::NotFound { .. } => Some("id"),
            PoolError::Pin(_) => Some("pin"),
            PoolError::KeyReused { .. } => Some("idempotency_key"),
            _ => None,
        }
    }
}

/// Result of pool operations.
pub type Result<T> = std::result::Result<T, PoolError>;
