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

/// The API socket and where it came from.
#[derive(Debug)]
pub struct ApiSocket {
    /// The listener.
    pub listener: tokio::net::UnixListener,
    /// Passed by socket activation: the service manager owns the path, its mode and group,
    /// and keeps queueing connections while the daemon restarts, so the daemon must neither
    /// chmod nor remove it.
    pub activated: bool,
}

/// The socket systemd passed (socket activation), or a new one bound at `path` (see [`bind`]).
pub fn listen(path: &Path, group: Option<&str>) -> Result<ApiSocket, DaemonError> {
    let inherited =
        crate::sys::activation::inherited_unix_listener().map_err(|source| DaemonError::Io {
            op: "take the socket-activated listener",
            path: path.to_path_buf(),
            source,
        })?;
    let Some(listener) = inherited else {
        return Ok(ApiSocket {
            listener: bind(path, group)?,
            activated: false,
        });
    };
    let adopt = |source| DaemonError::Io {
        op: "adopt the socket-activated listener",
        path: path.to_path_buf(),
        source,
    };
    listener.set_nonblocking(true).map_err(adopt)?;
    let listener = tokio::net::UnixListener::from_std(listener).map_err(adopt)?;
    tracing::info!("serving on the socket passed by socket activation");
    Ok(ApiSocket {
        listener,
        activated: true,
    })
}
