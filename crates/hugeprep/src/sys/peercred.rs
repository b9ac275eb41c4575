//! A unix socket peer's supplementary groups as the kernel recorded them when it connected
//! (`SO_PEERGROUPS`, Linux 4.13), so a role never depends on what a pid names later.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// `SO_PEERGROUPS` (`asm-generic/socket.h`; libc exports it only for some targets).
const SO_PEERGROUPS: libc::c_int = 59;

/// The most groups asked for (the kernel's `NGROUPS_MAX` is 65536; a peer in more than this
/// many groups gets `ERANGE`, an error, never a truncated list).
const MAX_GROUPS: usize = 65536;

/// The supplementary groups of the process that connected `socket`, from the credentials the
/// kernel stored at `connect` time.
pub fn peer_groups(socket: impl AsFd) -> io::Result<Vec<u32>> {
    let fd = socket.as_fd().as_raw_fd();
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = libc::socklen_t::try_from(groups.len() * std::mem::size_of::<libc::gid_t>())
            .map_err(|_| io::Error::from_raw_os_error(libc::ERANGE))?;
        // SAFETY: `groups` is a live, writable buffer of `len` bytes; the kernel writes at
        // most `len` bytes into it and stores the length it needs (or used) in `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ERANGE) && n > groups.len() && n <= MAX_GROUPS {
            groups.resize(n, 0);
            continue;
        }
        return Err(err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socketpair_peer_has_this_process_groups() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut mine: Vec<u32> = nix::unistd::getgroups()
            .unwrap()
            .iter()
            .map(|g| g.as_raw())
            .collect();
        let mut got = peer_groups(&a).unwrap();
        mine.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, mine);
    }
}
