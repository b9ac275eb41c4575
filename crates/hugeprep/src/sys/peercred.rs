//! A unix socket peer's supplementary groups as the kernel recorded them when it connected
//! (`SO_PEERGROUPS`, Linux 4.13), so a role never depends on what a pid names later.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

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

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that connected.
const SO_PEERPIDFD: libc::c_int = 77;
/// `PIDFD_GET_USER_NAMESPACE` (`linux/pidfd.h`, Linux 6.11): `_IO(0xFF, 9)`.
const PIDFD_GET_USER_NAMESPACE: libc::c_ulong = 0xFF09;
/// `NS_GET_PARENT` (`linux/nsfs.h`): `_IO(0xb7, 2)`.
const NS_GET_PARENT: libc::c_ulong = 0xb702;
/// `NS_GET_OWNER_UID` (`linux/nsfs.h`): `_IO(0xb7, 4)`.
const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;
/// User namespaces nest at most 32 deep.
const MAX_DEPTH: usize = 33;

fn ioctl_fd(fd: BorrowedFd<'_>, request: libc::c_ulong) -> io::Result<OwnedFd> {
    // SAFETY: the request takes no argument (0: the pidfd ioctls refuse any other) and
    // returns a new descriptor (or -1), which we own from here.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, 0 as libc::c_ulong) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `rc` is a descriptor the kernel just opened for us.
    Ok(unsafe { OwnedFd::from_raw_fd(rc) })
}

fn owner_uid(ns: BorrowedFd<'_>) -> io::Result<u32> {
    let mut uid: libc::uid_t = 0;
    // SAFETY: `uid` is a live, writable `uid_t`, which is what the request writes.
    let rc = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_OWNER_UID, &mut uid) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(uid)
}

fn same_file(a: &libc::stat, b: &libc::stat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

/// The user who controls the user namespace the process that connected `socket` runs in,
/// when that is not this daemon's: the owner (as this namespace sees it) of the namespace
/// nearest to this one, on the way from the peer's, that a user other than root created.
/// `Ok(None)`: the peer shares this namespace, or only root made the ones between (a
/// container runtime's, whose uid ranges the administrator hands out, one per container).
///
/// A user with a range of subordinate uids (`/etc/subuid`, `newuidmap`) can become any of
/// them inside a namespace of its own and keep its groups (no `setgroups`), so each of its
/// connections could be a new unix principal with new limits: counted by this owner, they
/// are all that user's. Reads the namespace through `SO_PEERPIDFD` (the process that
/// connected, never a pid reused since), so it needs Linux 6.11; older kernels give an
/// error.
pub fn peer_userns_owner(socket: impl AsFd) -> io::Result<Option<u32>> {
    let fd = socket.as_fd().as_raw_fd();
    let mut pidfd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `pidfd` is a live, writable int of `len` bytes; the kernel writes a new
    // descriptor into it.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut pidfd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc < 0 || pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel opened `pidfd` for us.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let mut ns = ioctl_fd(pidfd.as_fd(), PIDFD_GET_USER_NAMESPACE)?;
    let ours = nix::sys::stat::stat("/proc/self/ns/user").map_err(io::Error::from)?;
    let mut owner = None;
    for _ in 0..MAX_DEPTH {
        let here = nix::sys::stat::fstat(ns.as_raw_fd()).map_err(io::Error::from)?;
        if same_file(&here, &ours) {
            return Ok(owner);
        }
        let uid = owner_uid(ns.as_fd())?;
        if uid != 0 {
            owner = Some(uid);
        }
        ns = ioctl_fd(ns.as_fd(), NS_GET_PARENT)?;
    }
    Err(io::Error::other(
        "user namespaces nested deeper than the kernel allows",
    ))
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

    #[test]
    fn a_peer_in_this_namespace_has_no_other_owner() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        match peer_userns_owner(&a) {
            Ok(owner) => assert_eq!(owner, None),
            // Before Linux 6.11 (no pidfd namespace ioctl): an error, never a wrong owner.
            Err(err) => eprintln!("no user namespace of the peer here: {err}"),
        }
    }

    /// User 1000 makes a user namespace and becomes uid 100007 inside it (one of its
    /// subordinate uids; root writes the map here, as `newuidmap` would), keeping its
    /// groups, and connects: the peer's uid is 100007, its owner 1000. Needs root (to
    /// become that user and write the map) and `setpriv`/`unshare`.
    #[test]
    fn a_peer_in_a_users_own_namespace_is_that_users() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("hugeprep-userns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mode = |m| std::os::unix::fs::PermissionsExt::from_mode(m);
        std::fs::set_permissions(&dir, mode(0o755)).unwrap();
        std::fs::set_permissions(&path, mode(0o777)).unwrap();
        // The namespace is made in the process itself (an `exec` would drop the
        // capabilities it has in it before the map is written).
        let script = format!(
            "import ctypes,os,socket,time\nassert ctypes.CDLL(None).unshare(0x10000000) == 0\nwhile True:\n  try:\n    os.setuid(0); break\n  except OSError: time.sleep(0.01)\ns=socket.socket(socket.AF_UNIX); s.connect({:?}); time.sleep(5)",
            path.display().to_string()
        );
        let child = std::process::Command::new("setpriv")
            .args(["--reuid", "1000", "--regid", "1000", "--clear-groups"])
            .args(["/usr/bin/python3", "-c", &script])
            .spawn();
        let Ok(mut child) = child else {
            eprintln!("setpriv missing: skipped");
            return;
        };
        let stream = map_and_accept(&listener, child.id());
        let owner = stream.as_ref().map(|s| {
            let uid = nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials)
                .map(|c| c.uid());
            (uid.ok(), peer_userns_owner(s))
        });
        let _ = child.kill();
        let _ = child.wait();
        std::fs::remove_dir_all(&dir).unwrap();
        match owner {
            Some((uid, Ok(o))) => assert_eq!((uid, o), (Some(100007), Some(1000))),
            Some((_, Err(err))) => eprintln!("no user namespace of the peer here: {err}"),
            None => eprintln!("the peer in its own user namespace never connected: skipped"),
        }
    }

    /// Maps uid 0 of process `pid`'s new user namespace to 100007 once it has one, and
    /// accepts its connection (10 s at most: unprivileged user namespaces may be off).
    fn map_and_accept(
        listener: &std::os::unix::net::UnixListener,
        pid: u32,
    ) -> Option<std::os::unix::net::UnixStream> {
        let ours = std::fs::read_link("/proc/self/ns/user").ok();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        listener.set_nonblocking(true).unwrap();
        let mut mapped = false;
        while std::time::Instant::now() < deadline {
            let theirs = std::fs::read_link(format!("/proc/{pid}/ns/user")).ok();
            if !mapped && theirs.is_some() && theirs != ours {
                mapped = std::fs::write(format!("/proc/{pid}/uid_map"), "0 100007 1").is_ok();
            }
            if let Ok((stream, _)) = listener.accept() {
                return Some(stream);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        None
    }
}
