//! The API socket: one daemon per state directory (a lock file), a stale socket from a
//! crashed daemon removed, mode 0660 with an optional group.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use super::DaemonError;

/// Takes the daemon lock `<state_dir>/daemon.lock`; fails when another daemon holds it.
pub fn lock_state_dir(state_dir: &Path) -> Result<Flock<File>, DaemonError> {
    let io = |source| DaemonError::Io {
        op: "create",
        path: state_dir.to_path_buf(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .map_err(io)?;
    let path = state_dir.join("daemon.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| DaemonError::Io {
            op: "open",
            path: path.clone(),
            source,
        })?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock)
        .map_err(|_| DaemonError::AlreadyRunning { lock: path })
}

/// Binds the API socket at `path`: removes a stale socket (nobody answers on it), creates
/// the parent directory, sets mode 0660 and the group.
pub fn bind(path: &Path, group: Option<&str>) -> Result<tokio::net::UnixListener, DaemonError> {
    let io = |op: &'static str| {
        move |source| DaemonError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(io("mkdir"))?;
    }
    if fs::symlink_metadata(path).is_ok() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(DaemonError::SocketInUse {
                socket: path.to_path_buf(),
            });
        }
        fs::remove_file(path).map_err(io("remove stale socket"))?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(io("bind"))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o660)).map_err(io("chmod"))?;
    if let Some(group) = group {
        let gid = nix::unistd::Group::from_name(group)
            .ok()
            .flatten()
            .ok_or_else(|| DaemonError::UnknownGroup {
                group: group.to_string(),
            })?
            .gid;
        std::os::unix::fs::chown(path, None, Some(gid.as_raw())).map_err(io("chown"))?;
    }
    Ok(listener)
}
