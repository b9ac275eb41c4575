//! The journal's error.

use std::io;
use std::path::PathBuf;

/// A journal operation failed; the state change it guarded must not happen.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A file system call failed.
    #[error("journal: {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The kernel's answer.
        source: io::Error,
    },
    /// A record key that would escape the journal directory.
    #[error("journal: invalid record key {key:?}")]
    Key {
        /// The key.
        key: String,
    },
    /// The directory holds records of a format this build does not read (written by a
    /// newer hugeprep); nothing in it was changed.
    #[error("journal {dir}: format {found} was written by a newer hugeprep; this build reads formats up to {supported}. Nothing was changed: run the newer build again (its records, leases among them, are all still there)")]
    Format {
        /// The journal directory.
        dir: PathBuf,
        /// The format its `format` file names (or the file's text when it names none).
        found: String,
        /// The newest format this build reads.
        supported: u32,
    },
    /// A record could not be encoded.
    #[error("journal: encoding record {key}: {source}")]
    Encode {
        /// The record's key.
        key: String,
        /// The encoder's message.
        source: serde_json::Error,
    },
}

/// Result of journal operations.
pub type Result<T> = std::result::Result<T, JournalError>;
