//! Whether another user could reach a path: the kernel's discretionary check (owner, group,
//! mode bits) on every directory on the way and on the last component, evaluated from `stat`
//! for credentials other than this process's. `doctor` and the libvirt hook run as root and
//! must know what QEMU's user, or a member of the socket's group, will be allowed.
//!
//! Not evaluated: POSIX ACLs (a component that carries one is reported, since its mode bits
//! no longer tell the whole answer) and LSMs (AppArmor, SELinux), which can only refuse more.
//!
//! ```
//! use hugeprep::perm::{self, Access, Credentials};
//! let nobody = Credentials { uid: 65534, gid: 65534, groups: vec![] };
//! // Everyone may search / ...
//! assert!(perm::check(std::path::Path::new("/"), &nobody, Access::SEARCH).is_ok());
//! // ... and root may do anything DAC decides.
//! assert!(perm::check(std::path::Path::new("/root"), &Credentials::root(), Access::SEARCH).is_ok());
//! ```

use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// The ids a process runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary group ids.
    pub groups: Vec<u32>,
}

impl Credentials {
    /// Root's.
    pub fn root() -> Credentials {
        Credentials {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
    }

    /// `uid` and `gid` with the supplementary groups the group database gives user `name`
    /// (what `initgroups` would set, as libvirt does for QEMU); none when `name` is unknown.
    pub fn with_groups_of(uid: u32, gid: u32, name: Option<&str>) -> Credentials {
        let groups = name
            .and_then(|n| CString::new(n).ok())
            .and_then(|n| nix::unistd::getgrouplist(&n, nix::unistd::Gid::from_raw(gid)).ok())
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default();
        Credentials { uid, gid, groups }
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Whether these credentials get `want` (bits of [`Access`]) on an object of `owner`,
    /// `group` and `mode`, as the kernel's `generic_permission` decides without ACLs or
    /// capabilities other than root's.
    pub fn allows(&self, owner: u32, group: u32, mode: u32, want: Access) -> bool {
        if self.uid == 0 {
            return true;
        }
        let class = if self.uid == owner {
            (mode >> 6) & 7
        } else if self.in_group(group) {
            (mode >> 3) & 7
        } else {
            mode & 7
        };
        class & want.0 == want.0
    }
}

/// Permission bits wanted (`r` 4, `w` 2, `x` 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    /// Search a directory (`x`).
    pub const SEARCH: Access = Access(1);
    /// Open a file for reading and writing (`rw`), as QEMU opens a shared memory backend.
    pub const READ_WRITE: Access = Access(6);
    /// Write (connect to a unix socket).
    pub const WRITE: Access = Access(2);

    fn describe(self) -> &'static str {
        match self.0 {
            1 => "search it",
            2 => "write to it",
            6 => "open it for reading and writing",
            _ => "use it",
        }
    }
}

/// Where the path is closed to the credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path} ({owner}:{group}, mode {mode:04o}{acl}) does not let uid {uid} {what}")]
pub struct Blocked {
    /// The component that refuses.
    pub path: PathBuf,
    /// Its owner (name, or number without one).
    pub owner: String,
    /// Its group (name, or number without one).
    pub group: String,
    /// Its mode bits.
    pub mode: u32,
    /// `, with a POSIX ACL` when it carries one (the answer may differ).
    pub acl: String,
    /// The uid checked.
    pub uid: u32,
    /// What was refused.
    pub what: String,
}

/// Why a path could not be checked at all.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct Unreadable {
    /// The component.
    pub path: PathBuf,
    /// The kernel's answer.
    pub source: std::io::Error,
}

/// What [`check`] found.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A component refuses the credentials.
    #[error(transparent)]
    Blocked(Box<Blocked>),
    /// A component could not be examined (missing, or `stat` failed).
    #[error(transparent)]
    Unreadable(#[from] Unreadable),
}

fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

fn group_name(gid: u32) -> String {
    nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
        .ok()
        .flatten()
        .map_or_else(|| gid.to_string(), |g| g.name)
}

fn has_acl(path: &Path) -> bool {
    rustix::fs::getxattr(path, "system.posix_acl_access", &mut [0u8; 0]).is_ok()
}

/// Checks that `who` may search every directory from `/` down to `path`'s parent and get
/// `last` on `path` itself. Symbolic links are resolved first (the kernel checks the
/// directories of the target's path). The first component that refuses is returned.
pub fn check(path: &Path, who: &Credentials, last: Access) -> Result<(), CheckError> {
    let real = std::fs::canonicalize(path).map_err(|source| Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    let mut at = PathBuf::new();
    let parts: Vec<Component> = real.components().collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let want = if i + 1 == parts.len() {
            last
        } else {
            Access::SEARCH
        };
        let meta = std::fs::metadata(&at).map_err(|source| Unreadable {
            path: at.clone(),
            source,
        })?;
        if !who.allows(meta.uid(), meta.gid(), meta.mode() & 0o7777, want) {
            return Err(CheckError::Blocked(Box::new(Blocked {
                path: at.clone(),
                owner: user_name(meta.uid()),
                group: group_name(meta.gid()),
                mode: meta.mode() & 0o7777,
                acl: if has_acl(&at) {
                    ", with a POSIX ACL".into()
                } else {
                    String::new()
                },
                uid: who.uid,
                what: want.describe().to_string(),
            })));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Credentials {
        Credentials {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn owner_then_group_then_others() {
        let a = user(1000, 1000, &[107]);
        // Owner bits decide for the owner even when group or others would allow more.
        assert!(!a.allows(1000, 107, 0o070, Access::SEARCH));
        assert!(a.allows(1000, 0, 0o100, Access::SEARCH));
        // A supplementary group counts.
        assert!(a.allows(0, 107, 0o010, Access::SEARCH));
        assert!(!a.allows(0, 108, 0o010, Access::SEARCH));
        assert!(a.allows(0, 108, 0o001, Access::SEARCH));
        assert!(!a.allows(0, 107, 0o040, Access::READ_WRITE));
        assert!(a.allows(1000, 0, 0o600, Access::READ_WRITE));
        assert!(Credentials::root().allows(5, 5, 0, Access::READ_WRITE));
    }

    #[test]
    fn the_first_closed_directory_is_named() {
        let dir = std::env::temp_dir().join(format!("hugeprep-perm-{}", std::process::id()));
        let inner = dir.join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(dir.join("a"), std::fs::Permissions::from_mode(0o700)).unwrap();
        let nobody = user(65534, 65534, &[]);
        let e = check(&inner, &nobody, Access::SEARCH).unwrap_err();
        match e {
            CheckError::Blocked(b) => {
                assert_eq!(b.path, std::fs::canonicalize(dir.join("a")).unwrap());
                assert_eq!(b.mode, 0o700);
                assert!(
                    b.to_string().contains("does not let uid 65534 search"),
                    "{b}"
                );
            }
            other => panic!("{other}"),
        }
        std::fs::set_permissions(dir.join("a"), std::fs::Permissions::from_mode(0o711)).unwrap();
        check(&inner, &nobody, Access::SEARCH).unwrap();
        let e = check(&dir.join("missing"), &nobody, Access::SEARCH).unwrap_err();
        assert!(matches!(e, CheckError::Unreadable(_)), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
