//! systemd socket activation: the listening socket a service manager (or
//! `systemd-socket-activate`) opened for us and passed as file descriptor 3.

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, RawFd};
use std::os::unix::net::UnixListener;

use nix::sys::socket::{getsockname, getsockopt, sockopt, SockType, UnixAddr};

/// Takes the first socket passed by socket activation (`LISTEN_PID` naming this process,
/// `LISTEN_FDS` >= 1), if it is a unix stream socket; the variables are unset so that it is
/// taken once. `Ok(None)` when the process was not socket-activated.
pub fn inherited_unix_listener() -> io::Result<Option<UnixListener>> {
    let Some(fd) = sd_notify::listen_fds()?.next() else {
        return Ok(None);
    };
    check_unix_stream(fd)?;
    // SAFETY: the socket-activation protocol hands descriptors from 3 on to the process
    // named by LISTEN_PID, which sd_notify::listen_fds checked is us; it unset the variables,
    // so nothing else in this process adopts the same descriptor.
    Ok(Some(unsafe { UnixListener::from_raw_fd(fd) }))
}

fn check_unix_stream(fd: RawFd) -> io::Result<()> {
    let refuse = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket activation passed fd {fd}: {what}; a unix stream socket is needed"),
        )
    };
    // SAFETY: fd was passed to this process and stays open while borrowed here: only the
    // listener that adopts it after these checks closes it.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    match getsockopt(&borrowed, sockopt::SockType) {
        Ok(SockType::Stream) => {}
        Ok(other) => return Err(refuse(&format!("socket type {other:?}"))),
        Err(e) => return Err(refuse(&format!("not a socket ({e})"))),
    }
    getsockname::<UnixAddr>(fd).map_err(|e| refuse(&format!("not a unix socket ({e})")))?;
    Ok(())
}
