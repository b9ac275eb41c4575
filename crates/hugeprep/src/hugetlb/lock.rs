//! The machine-wide lock that hugepage borrowers hold: the test suite, benchmarks and one-shot
//! commands that raise the pool for a while. While one holds it, no other borrower on this
//! machine takes free pages it counted on, and no measurement is disturbed by another's
//! faults. The daemon does not take it: it owns its pool for its whole life.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The lock file.
pub const LOCK_PATH: &str = "/tmp/hugeprep-hugepage-tests.lock";

/// The lock could not be opened or taken.
#[derive(Debug, thiserror::Error)]
#[error("cannot lock {path}: {source}")]
pub struct LockError {
    /// The lock file.
    pub path: PathBuf,
    /// The error.
    pub source: io::Error,
}

fn lock_err(source: io::Error) -> LockError {
    LockError {
        path: PathBuf::from(LOCK_PATH),
        source,
    }
}

/// The machine-wide hugepage lock, released on drop.
#[derive(Debug)]
pub struct HugepageLock {
    _lock: Flock<File>,
}

impl HugepageLock {
    fn open() -> Result<File, LockError> {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_PATH)
            .map_err(lock_err)
    }

    /// Takes the lock if no other borrower holds it now; `None` when one does.
    pub fn try_acquire() -> Result<Option<HugepageLock>, LockError> {
        match Flock::lock(Self::open()?, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Some(HugepageLock { _lock: lock })),
            Err((_, Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(lock_err(e.into())),
        }
    }

    /// Takes the lock, waiting (and saying so in the log) while another borrower holds it.
    pub fn acquire() -> Result<HugepageLock, LockError> {
        match Flock::lock(Self::open()?, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(HugepageLock { _lock: lock }),
            Err((file, Errno::EWOULDBLOCK)) => {
                tracing::info!("waiting for {LOCK_PATH} (another hugepage borrower)");
                Flock::lock(file, FlockArg::LockExclusive)
                    .map(|lock| HugepageLock { _lock: lock })
                    .map_err(|(_, e)| lock_err(e.into()))
            }
            Err((_, e)) => Err(lock_err(e.into())),
        }
    }
}
